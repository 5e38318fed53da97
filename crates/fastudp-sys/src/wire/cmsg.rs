//! The control-message (ancillary data) buffer layout, without syscalls.
//!
//! A control buffer is a sequence of `struct cmsghdr` headers, each followed
//! by its data and padded to the platform's alignment. [`Encoder`] writes such
//! a buffer and [`Decoder`] walks one the kernel filled in. Both are checked:
//! a buffer that is too small or a header that lies about its length gives a
//! [`CmsgError`], never a panic or an out-of-bounds read.

use std::mem::size_of;

/// Width of the `cmsg_len` field.
#[cfg(any(target_os = "linux", target_os = "android"))]
const LEN_FIELD: usize = size_of::<usize>();
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const LEN_FIELD: usize = size_of::<u32>();

/// Alignment of headers and data (`CMSG_ALIGN`).
#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
pub const ALIGN: usize = size_of::<usize>();
/// Alignment of headers and data (`CMSG_ALIGN`).
#[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
pub const ALIGN: usize = size_of::<u32>();

/// Size of `struct cmsghdr` once aligned: where the data starts.
pub const HEADER: usize = align(LEN_FIELD + 2 * size_of::<i32>());

/// `CMSG_ALIGN`: round `len` up to the control-message alignment.
pub const fn align(len: usize) -> usize {
    (len + ALIGN - 1) & !(ALIGN - 1)
}

/// `CMSG_LEN`: the `cmsg_len` value for `data_len` bytes of data.
pub const fn len(data_len: usize) -> usize {
    HEADER + data_len
}

/// `CMSG_SPACE`: the room one control message with `data_len` bytes takes.
pub const fn space(data_len: usize) -> usize {
    HEADER + align(data_len)
}

/// A control buffer with the alignment the kernel requires of `msg_control`.
///
/// 256 bytes hold every combination fastudp sends (UDP_SEGMENT, ECN,
/// PKTINFO and SCM_TXTIME) and every one it asks to receive: a dual-stack
/// socket can get UDP_GRO, SO_RXQ_OVFL, IP_PKTINFO, IPV6_PKTINFO and IP_TOS
/// on one IPv4 datagram, 144 bytes.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub struct CmsgBuf(pub [u8; CMSG_BUF_LEN]);

/// Size of a [`CmsgBuf`].
pub const CMSG_BUF_LEN: usize = 256;

impl Default for CmsgBuf {
    fn default() -> Self {
        CmsgBuf([0; CMSG_BUF_LEN])
    }
}

impl std::fmt::Debug for CmsgBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CmsgBuf(..)")
    }
}

/// Errors from encoding or decoding a control buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CmsgError {
    /// The buffer has no room for another control message.
    #[error("control buffer full: {needed} bytes needed, {available} available")]
    NoSpace {
        /// Bytes the message needs (`CMSG_SPACE`).
        needed: usize,
        /// Bytes left in the buffer.
        available: usize,
    },
    /// A header's `cmsg_len` is shorter than a header or runs past the buffer.
    #[error("malformed control message: cmsg_len {cmsg_len} at offset {offset} in a {buf_len}-byte buffer")]
    BadLength {
        /// Offset of the header in the buffer.
        offset: usize,
        /// The length the header claims.
        cmsg_len: usize,
        /// Length of the whole control buffer.
        buf_len: usize,
    },
    /// An IPv6 source address (not v4-mapped) was given for an IPv4 socket.
    #[error("source address {0} cannot be used on an IPv4 socket")]
    SourceFamily(std::net::Ipv6Addr),
}

/// Writes control messages into a buffer.
#[derive(Debug)]
pub struct Encoder<'a> {
    buf: &'a mut [u8],
    used: usize,
}

impl<'a> Encoder<'a> {
    /// Starts an empty control buffer over `buf`.
    pub fn new(buf: &'a mut [u8]) -> Self {
        Encoder { buf, used: 0 }
    }

    /// Appends one control message with `data` as its payload.
    pub fn push(&mut self, level: i32, ty: i32, data: &[u8]) -> Result<(), CmsgError> {
        let need = space(data.len());
        let available = self.buf.len() - self.used;
        if need > available {
            return Err(CmsgError::NoSpace {
                needed: need,
                available,
            });
        }
        let msg = &mut self.buf[self.used..self.used + need];
        msg.fill(0);
        let l = len(data.len());
        #[cfg(any(target_os = "linux", target_os = "android"))]
        msg[..LEN_FIELD].copy_from_slice(&l.to_ne_bytes());
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        msg[..LEN_FIELD].copy_from_slice(&(l as u32).to_ne_bytes());
        msg[LEN_FIELD..LEN_FIELD + 4].copy_from_slice(&level.to_ne_bytes());
        msg[LEN_FIELD + 4..LEN_FIELD + 8].copy_from_slice(&ty.to_ne_bytes());
        msg[HEADER..HEADER + data.len()].copy_from_slice(data);
        self.used += need;
        Ok(())
    }

    /// Appends a control message whose data is a native-endian `u16`.
    pub fn push_u16(&mut self, level: i32, ty: i32, v: u16) -> Result<(), CmsgError> {
        self.push(level, ty, &v.to_ne_bytes())
    }

    /// Appends a control message whose data is a native-endian `i32`.
    pub fn push_i32(&mut self, level: i32, ty: i32, v: i32) -> Result<(), CmsgError> {
        self.push(level, ty, &v.to_ne_bytes())
    }

    /// Appends a control message whose data is a native-endian `u64`.
    pub fn push_u64(&mut self, level: i32, ty: i32, v: u64) -> Result<(), CmsgError> {
        self.push(level, ty, &v.to_ne_bytes())
    }

    /// Bytes written so far: the value for `msg_controllen`.
    pub fn len(&self) -> usize {
        self.used
    }

    /// True when no control message was written.
    pub fn is_empty(&self) -> bool {
        self.used == 0
    }
}

/// One control message seen by a [`Decoder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cmsg<'a> {
    /// `cmsg_level`.
    pub level: i32,
    /// `cmsg_type`.
    pub ty: i32,
    /// The data after the header, `cmsg_len - CMSG_LEN(0)` bytes.
    pub data: &'a [u8],
}

/// Walks the control messages in a buffer the kernel filled in.
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    buf: &'a [u8],
    offset: usize,
}

impl<'a> Decoder<'a> {
    /// Reads `buf[..msg_controllen]`.
    pub fn new(buf: &'a [u8]) -> Self {
        Decoder { buf, offset: 0 }
    }
}

impl<'a> Iterator for Decoder<'a> {
    type Item = Result<Cmsg<'a>, CmsgError>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self.buf.len().checked_sub(self.offset)?;
        if rest < HEADER {
            return None;
        }
        let h = &self.buf[self.offset..];
        let mut lenb = [0u8; LEN_FIELD];
        lenb.copy_from_slice(&h[..LEN_FIELD]);
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let cmsg_len = usize::from_ne_bytes(lenb);
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let cmsg_len = u32::from_ne_bytes(lenb) as usize;
        if cmsg_len < HEADER || cmsg_len > rest {
            let err = CmsgError::BadLength {
                offset: self.offset,
                cmsg_len,
                buf_len: self.buf.len(),
            };
            self.offset = self.buf.len();
            return Some(Err(err));
        }
        let level = i32::from_ne_bytes(h[LEN_FIELD..LEN_FIELD + 4].try_into().ok()?);
        let ty = i32::from_ne_bytes(h[LEN_FIELD + 4..LEN_FIELD + 8].try_into().ok()?);
        let data = &h[HEADER..cmsg_len];
        self.offset += align(cmsg_len).min(rest);
        Some(Ok(Cmsg { level, ty, data }))
    }
}

#[cfg(all(test, target_os = "linux", target_pointer_width = "64"))]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_kernel() {
        assert_eq!(HEADER, 16);
        assert_eq!(space(2), 24);
        assert_eq!(len(2), 18);
        assert_eq!(space(4), 24);
        assert_eq!(space(8), 24);
        assert_eq!(space(12), 32);
        assert_eq!(HEADER, std::mem::size_of::<libc::cmsghdr>());
    }

    #[test]
    fn encodes_literal_bytes() {
        let mut buf = [0xffu8; 64];
        let mut enc = Encoder::new(&mut buf);
        enc.push_u16(17, 103, 1216).unwrap();
        assert_eq!(enc.len(), 24);
        let mut want = vec![18, 0, 0, 0, 0, 0, 0, 0, 17, 0, 0, 0, 103, 0, 0, 0];
        want.extend_from_slice(&1216u16.to_le_bytes());
        want.extend_from_slice(&[0; 6]);
        assert_eq!(&buf[..24], &want[..]);
        assert_eq!(buf[24], 0xff, "bytes past the message are untouched");
    }

    #[test]
    fn round_trips_several_messages() {
        let mut buf = CmsgBuf::default();
        let mut enc = Encoder::new(&mut buf.0);
        enc.push_u16(17, 103, 1400).unwrap();
        enc.push_i32(0, 1, 2).unwrap();
        enc.push(41, 50, &[7; 20]).unwrap();
        let n = enc.len();
        let got: Vec<_> = Decoder::new(&buf.0[..n]).collect::<Result<_, _>>().unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(
            (got[0].level, got[0].ty, got[0].data),
            (17, 103, &1400u16.to_ne_bytes()[..])
        );
        assert_eq!(got[1].data, &2i32.to_ne_bytes()[..]);
        assert_eq!(got[2].data, &[7u8; 20][..]);
    }

    #[test]
    fn full_buffer_is_an_error() {
        let mut buf = [0u8; 20];
        let mut enc = Encoder::new(&mut buf);
        assert_eq!(
            enc.push_i32(0, 1, 1),
            Err(CmsgError::NoSpace {
                needed: 24,
                available: 20
            })
        );
        assert!(enc.is_empty());
    }

    #[test]
    fn lying_length_is_an_error_not_a_panic() {
        let mut buf = [0u8; 32];
        buf[..8].copy_from_slice(&999usize.to_ne_bytes());
        let mut d = Decoder::new(&buf);
        assert!(matches!(
            d.next(),
            Some(Err(CmsgError::BadLength { cmsg_len: 999, .. }))
        ));
        assert!(d.next().is_none());
        buf[..8].copy_from_slice(&3usize.to_ne_bytes());
        assert!(matches!(Decoder::new(&buf).next(), Some(Err(_))));
    }

    #[test]
    fn short_tail_ends_the_walk() {
        let buf = [0u8; 10];
        assert!(Decoder::new(&buf).next().is_none());
    }
}
