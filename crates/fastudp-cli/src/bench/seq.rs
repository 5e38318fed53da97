//! Sequence numbers: each datagram from `fastudp tx` and `fastudp bench`
//! carries its number in its first 8 bytes (little-endian).

/// Sequence-number bookkeeping for `rx -v` and the bench receivers.
#[derive(Debug, Default)]
pub struct Verifier {
    seen: Vec<u64>,
    max: Option<u64>,
    unique: u64,
    /// Datagrams seen twice.
    pub duplicates: u64,
    /// Datagrams that arrived after a later one.
    pub reordered: u64,
    /// Datagrams shorter than 8 bytes, or with an implausible number.
    pub unsequenced: u64,
}

/// Sequence numbers from here on are taken for foreign traffic (and not
/// tracked): the bitmap stays under 32 MiB whatever a stranger sends.
pub const MAX_SEQ: u64 = 1 << 28;

impl Verifier {
    /// Records one datagram.
    pub fn datagram(&mut self, d: &[u8]) {
        let Some(seq) = d
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        else {
            self.unsequenced += 1;
            return;
        };
        if seq >= MAX_SEQ {
            self.unsequenced += 1;
            return;
        }
        let (w, bit) = ((seq / 64) as usize, 1u64 << (seq % 64));
        if w >= self.seen.len() {
            self.seen.resize(w + 1, 0);
        }
        if self.seen[w] & bit != 0 {
            self.duplicates += 1;
            return;
        }
        self.seen[w] |= bit;
        self.unique += 1;
        match self.max {
            Some(m) if seq < m => self.reordered += 1,
            _ => self.max = Some(seq),
        }
    }

    /// Distinct sequence numbers seen.
    pub fn unique(&self) -> u64 {
        self.unique
    }

    /// Sequence numbers below the highest seen that never arrived.
    pub fn lost(&self) -> u64 {
        self.max.map(|m| m + 1 - self.unique).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(seq: u64) -> Vec<u8> {
        let mut v = seq.to_le_bytes().to_vec();
        v.extend_from_slice(&[0; 100]);
        v
    }

    #[test]
    fn verifier_counts_loss_duplicates_and_reordering() {
        let mut v = Verifier::default();
        for s in [0, 1, 2, 4, 3, 3, 7] {
            v.datagram(&d(s));
        }
        v.datagram(b"x");
        v.datagram(&u64::MAX.to_le_bytes());
        assert_eq!(v.lost(), 2); // 5 and 6
        assert_eq!(v.duplicates, 1);
        assert_eq!(v.reordered, 1);
        assert_eq!(v.unsequenced, 2);
        assert_eq!(Verifier::default().lost(), 0);
    }
}
