//! Splitting a coalesced (GRO) receive buffer into its datagrams.
//!
//! With `UDP_GRO`, one read returns several datagrams laid end to end, each
//! `stride` bytes long except the last, which may be shorter. The stride comes
//! from the `UDP_GRO` control message; without one, the buffer is a single
//! datagram.

/// Iterator over the datagrams of one received message.
#[derive(Debug, Clone)]
pub struct Datagrams<'a> {
    buf: &'a [u8],
    stride: usize,
    /// Set for an empty buffer, which still holds one (zero-length) datagram.
    empty_pending: bool,
}

impl<'a> Datagrams<'a> {
    /// Splits `buf` into datagrams of `stride` bytes (the last may be
    /// shorter). A stride of 0, or one at least as long as the buffer,
    /// yields the buffer as one datagram. (The library's users split
    /// through `RecvMeta::datagrams`.)
    #[cfg(feature = "tools")]
    pub fn new(buf: &'a [u8], stride: usize) -> Self {
        Self::split(buf, stride)
    }

    /// `Datagrams::new`, as the library itself calls it.
    pub fn split(buf: &'a [u8], stride: usize) -> Self {
        let stride = if stride == 0 {
            buf.len().max(1)
        } else {
            stride
        };
        Datagrams {
            buf,
            stride,
            empty_pending: buf.is_empty(),
        }
    }

    /// How many datagrams are left ([`ExactSizeIterator::len`]).
    fn remaining(&self) -> usize {
        if self.empty_pending {
            1
        } else {
            self.buf.len().div_ceil(self.stride)
        }
    }
}

impl<'a> Iterator for Datagrams<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.empty_pending {
            self.empty_pending = false;
            return Some(self.buf);
        }
        if self.buf.is_empty() {
            return None;
        }
        let n = self.stride.min(self.buf.len());
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(head)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.remaining();
        (n, Some(n))
    }
}

impl ExactSizeIterator for Datagrams<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn splits_with_a_short_tail() {
        let buf: Vec<u8> = (0..10).collect();
        let parts: Vec<_> = Datagrams::split(&buf, 4).collect();
        assert_eq!(parts, vec![&[0, 1, 2, 3][..], &[4, 5, 6, 7], &[8, 9]]);
        assert_eq!(Datagrams::split(&buf, 4).len(), 3);
    }

    #[test]
    fn no_stride_is_one_datagram() {
        let buf = [1u8; 7];
        assert_eq!(
            Datagrams::split(&buf, 0).collect::<Vec<_>>(),
            vec![&buf[..]]
        );
        assert_eq!(
            Datagrams::split(&buf, 100).collect::<Vec<_>>(),
            vec![&buf[..]]
        );
    }

    #[test]
    fn empty_datagram_is_still_a_datagram() {
        let v: Vec<&[u8]> = Datagrams::split(&[0u8; 0], 0).collect();
        assert_eq!(v, vec![&[0u8; 0][..]]);
    }

    proptest! {
        /// Concatenating equal-size datagrams (last one shorter) and splitting
        /// at the stride gives back exactly the originals.
        #[test]
        fn split_inverts_concatenation(
            stride in 1usize..2000,
            count in 1usize..64,
            last in 1usize..2000,
            seed in any::<u8>(),
        ) {
            let last = last.min(stride);
            let mut originals = Vec::new();
            for i in 0..count {
                let len = if i + 1 == count { last } else { stride };
                originals.push((0..len).map(|j| (j as u8).wrapping_mul(31) ^ seed ^ i as u8).collect::<Vec<u8>>());
            }
            let buf: Vec<u8> = originals.concat();
            let got: Vec<Vec<u8>> = Datagrams::split(&buf, stride).map(|d| d.to_vec()).collect();
            prop_assert_eq!(got, originals);
        }
    }
}
