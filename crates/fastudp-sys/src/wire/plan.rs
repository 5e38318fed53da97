//! GSO train planning: which consecutive datagrams can share one send.
//!
//! A train is one buffer that the kernel cuts into datagrams of
//! `segment_size` bytes; only the last may be shorter. A train must respect
//! every kernel limit at once: the segment count (`UDP_MAX_SEGMENTS`), the
//! total payload of one call (65507 bytes on IPv4, 65527 on IPv6) and a
//! segment size that fits the path MTU.

/// The limits a GSO train must respect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most segments per train; 1 means GSO is off.
    pub max_segments: usize,
    /// Most payload bytes per send call.
    pub max_payload: usize,
    /// Largest segment that fits the path MTU. Larger datagrams travel
    /// alone, without GSO.
    pub max_segment_size: usize,
}

impl Limits {
    /// Limits for an address family with `max_segments` segments and a path
    /// MTU of `mtu` bytes.
    pub fn new(max_segments: usize, ipv6: bool, mtu: usize) -> Self {
        Limits {
            max_segments: max_segments.max(1),
            max_payload: super::max_payload(ipv6),
            max_segment_size: super::max_segment_for_mtu(mtu, ipv6),
        }
    }
}

/// One planned train: `count` datagrams starting at datagram `start`.
#[cfg(any(test, feature = "tools"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Train {
    /// Index of the first datagram.
    pub start: usize,
    /// Number of datagrams (segments).
    pub count: usize,
    /// Size of every segment but the last.
    pub segment_size: usize,
    /// Total payload bytes.
    pub bytes: usize,
}

/// Why a datagram cannot be sent at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "payload of {len} bytes is larger than the UDP maximum of {max} bytes for this address family"
)]
pub struct Oversized {
    /// The datagram's length.
    pub len: usize,
    /// The family's maximum.
    pub max: usize,
}

/// Builds one train at a time from datagrams offered in order.
#[derive(Debug, Clone)]
pub struct TrainBuilder {
    limits: Limits,
    segment_size: usize,
    count: usize,
    bytes: usize,
    closed: bool,
}

impl TrainBuilder {
    /// An empty builder.
    pub fn new(limits: Limits) -> Self {
        TrainBuilder {
            limits,
            segment_size: 0,
            count: 0,
            bytes: 0,
            closed: false,
        }
    }

    /// The limits in force.
    #[cfg(feature = "tools")]
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Changes the limits; takes effect from the next train.
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// Offers the next datagram of `len` bytes.
    ///
    /// Returns `Ok(true)` when it joined the current train, `Ok(false)` when
    /// the current train must be sent first (call [`TrainBuilder::take`] and
    /// offer it again: an empty builder always accepts a valid datagram).
    pub fn offer(&mut self, len: usize) -> Result<bool, Oversized> {
        if len > self.limits.max_payload {
            return Err(Oversized {
                len,
                max: self.limits.max_payload,
            });
        }
        if self.count == 0 {
            self.segment_size = len;
            self.count = 1;
            self.bytes = len;
            // A zero-length datagram or one too large for a segment travels alone.
            self.closed =
                len == 0 || len > self.limits.max_segment_size || self.limits.max_segments <= 1;
            return Ok(true);
        }
        let fits = !self.closed
            && len > 0
            && len <= self.segment_size
            && self.count < self.limits.max_segments
            && self.bytes + len <= self.limits.max_payload;
        if !fits {
            return Ok(false);
        }
        self.count += 1;
        self.bytes += len;
        // A shorter datagram can only be the last one of a train.
        if len < self.segment_size {
            self.closed = true;
        }
        Ok(true)
    }

    /// Number of datagrams in the current train.
    #[cfg(feature = "tools")]
    pub fn count(&self) -> usize {
        self.count
    }

    /// True when the current train is empty.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Ends the current train and returns `(count, segment_size, bytes)`,
    /// or `None` if it was empty.
    pub fn take(&mut self) -> Option<(usize, usize, usize)> {
        if self.count == 0 {
            return None;
        }
        let t = (self.count, self.segment_size, self.bytes);
        self.count = 0;
        self.bytes = 0;
        self.segment_size = 0;
        self.closed = false;
        Some(t)
    }
}

/// Plans trains for datagrams of the given lengths, all to one destination.
#[cfg(any(test, feature = "tools"))]
pub fn plan(lens: &[usize], limits: Limits) -> Result<Vec<Train>, Oversized> {
    let mut out = Vec::new();
    let mut b = TrainBuilder::new(limits);
    let mut start = 0;
    for (i, &len) in lens.iter().enumerate() {
        if !b.offer(len)? {
            let (count, segment_size, bytes) = b.take().expect("non-empty train");
            out.push(Train {
                start,
                count,
                segment_size,
                bytes,
            });
            start = i;
            let joined = b.offer(len)?;
            debug_assert!(joined);
        }
    }
    if let Some((count, segment_size, bytes)) = b.take() {
        out.push(Train {
            start,
            count,
            segment_size,
            bytes,
        });
    }
    Ok(out)
}

/// How many GSO segments a message of `len` bytes with `segment_size`
/// produces (1 for a plain datagram).
pub fn segments(len: usize, segment_size: Option<usize>) -> usize {
    match segment_size {
        Some(s) if s > 0 && len > s => len.div_ceil(s),
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lim(segs: usize) -> Limits {
        Limits::new(segs, false, 1500)
    }

    #[test]
    fn equal_sizes_pack_up_to_the_segment_limit() {
        let t = plan(&[1000; 100], lim(64)).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].count, t[0].bytes), (64, 64_000));
        assert_eq!((t[1].start, t[1].count), (64, 36));
    }

    #[test]
    fn byte_limit_cuts_trains() {
        let t = plan(&[1472; 128], lim(128)).unwrap();
        // 44 * 1472 = 64768 fits; 45 would be 66240 > 65507.
        assert_eq!(t[0].count, 44);
        assert!(t.iter().all(|t| t.bytes <= MAX));
    }
    const MAX: usize = crate::wire::MAX_PAYLOAD_V4;

    #[test]
    fn shorter_datagram_ends_a_train_and_longer_starts_one() {
        let t = plan(&[100, 100, 50, 100, 200, 200], lim(64)).unwrap();
        let shape: Vec<_> = t
            .iter()
            .map(|t| (t.start, t.count, t.segment_size))
            .collect();
        assert_eq!(shape, vec![(0, 3, 100), (3, 1, 100), (4, 2, 200)]);
    }

    #[test]
    fn over_mtu_datagrams_travel_alone() {
        let t = plan(&[2000, 2000, 1472, 1472], lim(64)).unwrap();
        let counts: Vec<_> = t.iter().map(|t| t.count).collect();
        assert_eq!(counts, vec![1, 1, 2]);
    }

    #[test]
    fn zero_length_and_oversized() {
        let t = plan(&[0, 0, 5], lim(64)).unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(
            plan(&[65_508], lim(64)),
            Err(Oversized {
                len: 65_508,
                max: MAX
            })
        );
        assert_eq!(plan(&[65_507], lim(64)).unwrap().len(), 1);
    }

    #[test]
    fn gso_off_means_one_per_train() {
        let t = plan(&[10; 5], lim(1)).unwrap();
        assert_eq!(t.len(), 5);
    }

    #[test]
    fn segment_count() {
        assert_eq!(segments(10, None), 1);
        assert_eq!(segments(10, Some(10)), 1);
        assert_eq!(segments(10, Some(20)), 1);
        assert_eq!(segments(11, Some(10)), 2);
        assert_eq!(segments(128, Some(1)), 128);
    }

    proptest! {
        /// Any plan covers every datagram once, in order, and every train
        /// respects every kernel limit.
        #[test]
        fn every_train_respects_every_limit(
            lens in proptest::collection::vec(prop_oneof![
                0usize..4, 1000usize..1500, Just(1472usize), 1400usize..2000, 60_000usize..65_508
            ], 0..300),
            segs in prop_oneof![Just(1usize), Just(64), Just(128), 2usize..200],
            ipv6 in any::<bool>(),
            mtu in prop_oneof![Just(1500usize), Just(9000), Just(65_536), 1280usize..1500],
        ) {
            let limits = Limits::new(segs, ipv6, mtu);
            let trains = plan(&lens, limits).unwrap();
            let mut next = 0;
            for t in &trains {
                prop_assert_eq!(t.start, next);
                next += t.count;
                let ds = &lens[t.start..t.start + t.count];
                prop_assert!(t.count >= 1);
                prop_assert!(t.count <= limits.max_segments);
                prop_assert!(t.bytes <= limits.max_payload);
                prop_assert_eq!(t.bytes, ds.iter().sum::<usize>());
                if t.count > 1 {
                    prop_assert!(t.segment_size <= limits.max_segment_size);
                    prop_assert!(t.segment_size > 0);
                    prop_assert!(ds[..t.count - 1].iter().all(|&l| l == t.segment_size));
                    prop_assert!(ds[t.count - 1] <= t.segment_size && ds[t.count - 1] > 0);
                    // The kernel must see exactly these segments back.
                    prop_assert_eq!(segments(t.bytes, Some(t.segment_size)), t.count);
                }
            }
            prop_assert_eq!(next, lens.len());
        }
    }
}
