//! The `SIOCETHTOOL` ioctl's request and reply layouts, as byte buffers.
//!
//! Used by fastudp-tools' `host` module (through `sys::ethtool_ioctl`,
//! feature `tools`) to read and set device features (the ones
//! `ethtool -k/-K` shows), channels (`ethtool -l/-L`) and the driver name,
//! without running the ethtool program.

/// `SIOCETHTOOL`.
pub const SIOCETHTOOL: u64 = 0x8946;
/// `ETHTOOL_GDRVINFO`.
pub const GDRVINFO: u32 = 0x03;
/// `ETHTOOL_GSTRINGS`.
pub const GSTRINGS: u32 = 0x1b;
/// `ETHTOOL_GSSET_INFO`.
pub const GSSET_INFO: u32 = 0x37;
/// `ETHTOOL_GFEATURES`.
pub const GFEATURES: u32 = 0x3a;
/// `ETHTOOL_SFEATURES`.
pub const SFEATURES: u32 = 0x3b;
/// `ETHTOOL_GCHANNELS`.
pub const GCHANNELS: u32 = 0x3c;
/// `ETHTOOL_SCHANNELS`.
pub const SCHANNELS: u32 = 0x3d;
/// `ETH_SS_FEATURES`: the string set of netdev feature names.
pub const SS_FEATURES: u32 = 4;
/// `ETH_GSTRING_LEN`.
pub const GSTRING_LEN: usize = 32;
/// Size of `struct ethtool_drvinfo`.
pub const DRVINFO_LEN: usize = 196;
/// Size of `struct ethtool_channels`.
pub const CHANNELS_LEN: usize = 36;

fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    b.get(o..o + 4)
        .map(|s| u32::from_ne_bytes(s.try_into().expect("4 bytes")))
}

fn put_u32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_ne_bytes());
}

/// A `struct ethtool_sset_info` request for the feature-name count.
pub fn sset_info_request() -> Vec<u8> {
    let mut b = vec![0u8; 16 + 4];
    put_u32(&mut b, 0, GSSET_INFO);
    b[8..16].copy_from_slice(&(1u64 << SS_FEATURES).to_ne_bytes());
    b
}

/// The feature-name count from a `GSSET_INFO` reply, if the kernel has
/// the set.
pub fn sset_info_count(reply: &[u8]) -> Option<usize> {
    let mask = u64::from_ne_bytes(reply.get(8..16)?.try_into().ok()?);
    (mask & (1 << SS_FEATURES) != 0).then(|| u32_at(reply, 16).map(|c| c as usize))?
}

/// A `struct ethtool_gstrings` request with room for `count` names.
pub fn gstrings_request(count: usize) -> Vec<u8> {
    let mut b = vec![0u8; 12 + count * GSTRING_LEN];
    put_u32(&mut b, 0, GSTRINGS);
    put_u32(&mut b, 4, SS_FEATURES);
    put_u32(&mut b, 8, count as u32);
    b
}

/// The names in a `GSTRINGS` reply.
pub fn gstrings_names(reply: &[u8]) -> Vec<String> {
    let n = u32_at(reply, 8).unwrap_or(0) as usize;
    reply
        .get(12..)
        .unwrap_or(&[])
        .chunks_exact(GSTRING_LEN)
        .take(n)
        .map(|c| {
            let end = c.iter().position(|&b| b == 0).unwrap_or(c.len());
            String::from_utf8_lossy(&c[..end]).into_owned()
        })
        .collect()
}

/// 32-bit blocks needed for `count` feature bits.
pub fn blocks(count: usize) -> usize {
    count.div_ceil(32)
}

/// A `struct ethtool_gfeatures` request for `count` features.
pub fn gfeatures_request(count: usize) -> Vec<u8> {
    let mut b = vec![0u8; 8 + blocks(count) * 16];
    put_u32(&mut b, 0, GFEATURES);
    put_u32(&mut b, 4, blocks(count) as u32);
    b
}

/// One feature's state bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FeatureBits {
    /// The device can change it.
    pub available: bool,
    /// Asked for.
    pub requested: bool,
    /// In effect.
    pub active: bool,
    /// Never changes ("fixed" in ethtool).
    pub never_changed: bool,
}

/// Feature `i`'s bits in a `GFEATURES` reply.
pub fn gfeatures_bit(reply: &[u8], i: usize) -> Option<FeatureBits> {
    let o = 8 + (i / 32) * 16;
    let bit = 1u32 << (i % 32);
    Some(FeatureBits {
        available: u32_at(reply, o)? & bit != 0,
        requested: u32_at(reply, o + 4)? & bit != 0,
        active: u32_at(reply, o + 8)? & bit != 0,
        never_changed: u32_at(reply, o + 12)? & bit != 0,
    })
}

/// A `struct ethtool_sfeatures` request that sets feature `i` to `on` for
/// each `(i, on)`, leaving the others alone.
pub fn sfeatures_request(count: usize, changes: &[(usize, bool)]) -> Vec<u8> {
    let n = blocks(count);
    let mut b = vec![0u8; 8 + n * 8];
    put_u32(&mut b, 0, SFEATURES);
    put_u32(&mut b, 4, n as u32);
    for &(i, on) in changes {
        if i >= count {
            continue;
        }
        let o = 8 + (i / 32) * 8;
        let bit = 1u32 << (i % 32);
        let valid = u32_at(&b, o).unwrap_or(0) | bit;
        put_u32(&mut b, o, valid);
        let req = u32_at(&b, o + 4).unwrap_or(0);
        put_u32(&mut b, o + 4, if on { req | bit } else { req & !bit });
    }
    b
}

/// `struct ethtool_channels`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Channels {
    /// Most RX queues.
    pub max_rx: u32,
    /// Most TX queues.
    pub max_tx: u32,
    /// Most other queues.
    pub max_other: u32,
    /// Most combined queues.
    pub max_combined: u32,
    /// RX queues now.
    pub rx: u32,
    /// TX queues now.
    pub tx: u32,
    /// Other queues now.
    pub other: u32,
    /// Combined queues now.
    pub combined: u32,
}

impl Channels {
    /// A `GCHANNELS` request.
    pub fn get_request() -> Vec<u8> {
        let mut b = vec![0u8; CHANNELS_LEN];
        put_u32(&mut b, 0, GCHANNELS);
        b
    }

    /// Decodes a `GCHANNELS` reply.
    pub fn decode(reply: &[u8]) -> Option<Channels> {
        let f = |i: usize| u32_at(reply, 4 + 4 * i);
        Some(Channels {
            max_rx: f(0)?,
            max_tx: f(1)?,
            max_other: f(2)?,
            max_combined: f(3)?,
            rx: f(4)?,
            tx: f(5)?,
            other: f(6)?,
            combined: f(7)?,
        })
    }

    /// An `SCHANNELS` request for these counts.
    pub fn set_request(&self) -> Vec<u8> {
        let mut b = vec![0u8; CHANNELS_LEN];
        put_u32(&mut b, 0, SCHANNELS);
        let v = [
            self.max_rx,
            self.max_tx,
            self.max_other,
            self.max_combined,
            self.rx,
            self.tx,
            self.other,
            self.combined,
        ];
        for (i, x) in v.iter().enumerate() {
            put_u32(&mut b, 4 + 4 * i, *x);
        }
        b
    }
}

/// A `GDRVINFO` request.
pub fn drvinfo_request() -> Vec<u8> {
    let mut b = vec![0u8; DRVINFO_LEN];
    put_u32(&mut b, 0, GDRVINFO);
    b
}

/// The driver name in a `GDRVINFO` reply.
pub fn drvinfo_driver(reply: &[u8]) -> String {
    let d = reply.get(4..36).unwrap_or(&[]);
    let end = d.iter().position(|&b| b == 0).unwrap_or(d.len());
    String::from_utf8_lossy(&d[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sset_info_round_trip() {
        let mut r = sset_info_request();
        assert_eq!(u32_at(&r, 0), Some(GSSET_INFO));
        assert_eq!(sset_info_count(&r), Some(0));
        put_u32(&mut r, 16, 66);
        assert_eq!(sset_info_count(&r), Some(66));
        r[8..16].copy_from_slice(&0u64.to_ne_bytes());
        assert_eq!(sset_info_count(&r), None, "the kernel lacks the set");
    }

    #[test]
    fn names_from_a_recorded_reply() {
        let mut r = gstrings_request(3);
        for (i, n) in ["tx-scatter-gather", "rx-gro", "tx-udp-segmentation"]
            .iter()
            .enumerate()
        {
            r[12 + i * 32..12 + i * 32 + n.len()].copy_from_slice(n.as_bytes());
        }
        assert_eq!(
            gstrings_names(&r),
            vec!["tx-scatter-gather", "rx-gro", "tx-udp-segmentation"]
        );
        put_u32(&mut r, 8, 2);
        assert_eq!(gstrings_names(&r).len(), 2, "the kernel's count wins");
        assert!(gstrings_names(&[1, 2]).is_empty());
    }

    #[test]
    fn feature_bits() {
        let mut r = gfeatures_request(40);
        assert_eq!(r.len(), 8 + 2 * 16);
        // Feature 33: available and active, not requested; block 1.
        put_u32(&mut r, 8 + 16, 1 << 1);
        put_u32(&mut r, 8 + 16 + 8, 1 << 1);
        assert_eq!(
            gfeatures_bit(&r, 33),
            Some(FeatureBits {
                available: true,
                requested: false,
                active: true,
                never_changed: false
            })
        );
        assert_eq!(gfeatures_bit(&r, 32), Some(FeatureBits::default()));
        assert_eq!(gfeatures_bit(&r, 64), None);
    }

    #[test]
    fn set_features_marks_only_the_changed_bits() {
        let r = sfeatures_request(40, &[(1, true), (33, false), (99, true)]);
        assert_eq!(r.len(), 8 + 2 * 8);
        assert_eq!(u32_at(&r, 8), Some(1 << 1)); // valid, block 0
        assert_eq!(u32_at(&r, 12), Some(1 << 1)); // requested on
        assert_eq!(u32_at(&r, 16), Some(1 << 1)); // valid, block 1
        assert_eq!(u32_at(&r, 20), Some(0)); // requested off
    }

    #[test]
    fn channels_and_driver() {
        let c = Channels {
            max_rx: 2,
            max_tx: 2,
            rx: 1,
            tx: 1,
            ..Default::default()
        };
        let mut r = c.set_request();
        assert_eq!(u32_at(&r, 0), Some(SCHANNELS));
        assert_eq!(Channels::decode(&r), Some(c));
        put_u32(&mut r, 0, GCHANNELS);
        assert_eq!(Channels::decode(&r[..20]), None);
        let mut d = drvinfo_request();
        d[4..8].copy_from_slice(b"veth");
        assert_eq!(drvinfo_driver(&d), "veth");
    }
}
