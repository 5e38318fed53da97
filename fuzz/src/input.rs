//! Structured fuzz inputs: fixed-width fields read from the front of the
//! bytes libFuzzer gives, so that a seed file can be written by hand.

/// Reads little-endian fields from the front of a fuzz input. Past the
/// end, every field reads as zero: any input is a valid one.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// Starts at the front of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Input { data }
    }

    /// Takes up to `n` bytes (fewer at the end).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        head
    }

    /// Takes an `N`-byte array, zero-filled past the end.
    pub fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut a = [0u8; N];
        let b = self.bytes(N);
        a[..b.len()].copy_from_slice(b);
        a
    }

    /// Takes a `u8`.
    pub fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    /// Takes a little-endian `u16`.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    /// Takes a little-endian `u32`.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    /// Takes a little-endian `u64`.
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    /// The bytes not taken yet, all of them.
    pub fn rest(&mut self) -> &'a [u8] {
        self.bytes(self.data.len())
    }

    /// True when every byte has been taken.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}
