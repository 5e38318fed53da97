//! Reading qdiscs over rtnetlink (`RTM_GETQDISC`), without the tc program.

use std::io::{self, Read};

/// `RTM_GETQDISC`.
pub const RTM_GETQDISC: u16 = 38;
/// `RTM_NEWQDISC` (the type of each reply).
pub const RTM_NEWQDISC: u16 = 36;
/// `NLMSG_DONE`.
pub const NLMSG_DONE: u16 = 3;
/// `NLMSG_ERROR`.
pub const NLMSG_ERROR: u16 = 2;
/// `NLM_F_REQUEST | NLM_F_DUMP`.
pub const DUMP_FLAGS: u16 = 0x1 | 0x300;
/// `TCA_KIND`.
pub const TCA_KIND: u16 = 1;
/// `TC_H_ROOT`: the parent of a root qdisc.
pub const TC_H_ROOT: u32 = 0xFFFF_FFFF;

/// One qdisc from a dump.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qdisc {
    /// Device index.
    pub ifindex: i32,
    /// Its handle.
    pub handle: u32,
    /// Its parent (`TC_H_ROOT` for a root qdisc).
    pub parent: u32,
    /// `fq`, `etf`, `noqueue`, `pfifo_fast`, `htb`, ...
    pub kind: String,
}

/// The bytes of an `RTM_GETQDISC` dump request: `nlmsghdr` + `tcmsg`.
pub fn dump_request(seq: u32) -> Vec<u8> {
    let len = 16 + 20;
    let mut b = Vec::with_capacity(len);
    b.extend_from_slice(&(len as u32).to_ne_bytes());
    b.extend_from_slice(&RTM_GETQDISC.to_ne_bytes());
    b.extend_from_slice(&DUMP_FLAGS.to_ne_bytes());
    b.extend_from_slice(&seq.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes()); // port id
    b.extend_from_slice(&[0u8; 20]); // tcmsg: family, pads, ifindex, handle, parent, info
    b
}

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    b.get(o..o + 2)
        .map(|s| u16::from_ne_bytes(s.try_into().expect("2 bytes")))
}

fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    b.get(o..o + 4)
        .map(|s| u32::from_ne_bytes(s.try_into().expect("4 bytes")))
}

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// What one read of the dump held.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Qdiscs found.
    pub qdiscs: Vec<Qdisc>,
    /// `NLMSG_DONE` was seen: the dump is complete.
    pub done: bool,
    /// An `NLMSG_ERROR` with this (negative) errno.
    pub error: Option<i32>,
}

/// Parses netlink messages from one `recv`.
pub fn parse(buf: &[u8]) -> Parsed {
    let mut out = Parsed::default();
    let mut o = 0;
    while o + 16 <= buf.len() {
        let Some(len) = u32_at(buf, o).map(|l| l as usize) else {
            break;
        };
        let ty = u16_at(buf, o + 4).unwrap_or(0);
        if len < 16 || o + len > buf.len() {
            break;
        }
        let msg = &buf[o..o + len];
        match ty {
            NLMSG_DONE => out.done = true,
            NLMSG_ERROR => {
                let e = u32_at(msg, 16).map(|e| e as i32).unwrap_or(-1);
                if e != 0 {
                    out.error = Some(e);
                }
            }
            RTM_NEWQDISC if len >= 36 => {
                let ifindex = u32_at(msg, 20).unwrap_or(0) as i32;
                let handle = u32_at(msg, 24).unwrap_or(0);
                let parent = u32_at(msg, 28).unwrap_or(0);
                let mut kind = String::new();
                let mut a = 36;
                while a + 4 <= msg.len() {
                    let alen = u16_at(msg, a).unwrap_or(0) as usize;
                    let aty = u16_at(msg, a + 2).unwrap_or(0);
                    if alen < 4 || a + alen > msg.len() {
                        break;
                    }
                    if aty == TCA_KIND {
                        let v = &msg[a + 4..a + alen];
                        let end = v.iter().position(|&c| c == 0).unwrap_or(v.len());
                        kind = String::from_utf8_lossy(&v[..end]).into_owned();
                    }
                    a += align4(alen);
                }
                out.qdiscs.push(Qdisc {
                    ifindex,
                    handle,
                    parent,
                    kind,
                });
            }
            _ => {}
        }
        o += align4(len);
    }
    out
}

/// Dumps every qdisc in the caller's network namespace.
pub fn qdiscs() -> io::Result<Vec<Qdisc>> {
    let s = socket2::Socket::new(
        socket2::Domain::from(libc::AF_NETLINK),
        socket2::Type::RAW,
        Some(socket2::Protocol::from(libc::NETLINK_ROUTE)),
    )?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(2)))?;
    // With no address, netlink sends to the kernel.
    s.send(&dump_request(1))?;
    let mut all = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut r = &s;
    for _ in 0..10_000 {
        let n = r.read(&mut buf)?;
        let p = parse(&buf[..n]);
        if let Some(e) = p.error {
            return Err(io::Error::from_raw_os_error(-e));
        }
        all.extend(p.qdiscs);
        if p.done || n == 0 {
            return Ok(all);
        }
    }
    Err(io::Error::other("the qdisc dump did not end"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(ty: u16, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&2u16.to_ne_bytes());
        m.extend_from_slice(&1u32.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(body);
        while m.len() % 4 != 0 {
            m.push(0);
        }
        m
    }

    fn qdisc(ifindex: i32, parent: u32, kind: &str) -> Vec<u8> {
        let mut t = vec![0u8; 4];
        t.extend_from_slice(&ifindex.to_ne_bytes());
        t.extend_from_slice(&0x8001_0000u32.to_ne_bytes());
        t.extend_from_slice(&parent.to_ne_bytes());
        t.extend_from_slice(&2u32.to_ne_bytes());
        let k = [kind.as_bytes(), &[0]].concat();
        t.extend_from_slice(&((4 + k.len()) as u16).to_ne_bytes());
        t.extend_from_slice(&TCA_KIND.to_ne_bytes());
        t.extend_from_slice(&k);
        while t.len() % 4 != 0 {
            t.push(0);
        }
        // A second attribute after the kind, to walk past.
        t.extend_from_slice(&8u16.to_ne_bytes());
        t.extend_from_slice(&2u16.to_ne_bytes());
        t.extend_from_slice(&[1, 2, 3, 4]);
        msg(RTM_NEWQDISC, &t)
    }

    #[test]
    fn request_layout() {
        let r = dump_request(7);
        assert_eq!(r.len(), 36);
        assert_eq!(u32_at(&r, 0), Some(36));
        assert_eq!(u16_at(&r, 4), Some(RTM_GETQDISC));
        assert_eq!(u16_at(&r, 6), Some(0x301));
        assert_eq!(u32_at(&r, 8), Some(7));
    }

    #[test]
    fn parses_a_recorded_dump() {
        let mut b = qdisc(2, TC_H_ROOT, "noqueue");
        b.extend(qdisc(3, TC_H_ROOT, "fq"));
        b.extend(qdisc(3, 0x8001_0001, "pfifo"));
        b.extend(msg(NLMSG_DONE, &[0; 4]));
        let p = parse(&b);
        assert!(p.done);
        assert_eq!(p.qdiscs.len(), 3);
        assert_eq!(
            p.qdiscs[1],
            Qdisc {
                ifindex: 3,
                handle: 0x8001_0000,
                parent: TC_H_ROOT,
                kind: "fq".into()
            }
        );
        assert_eq!(p.qdiscs[2].parent, 0x8001_0001);
    }

    #[test]
    fn errors_and_garbage() {
        let e = msg(NLMSG_ERROR, &(-1i32).to_ne_bytes());
        assert_eq!(parse(&e).error, Some(-1));
        assert_eq!(parse(&[1, 2, 3]), Parsed::default());
        let mut lying = qdisc(1, TC_H_ROOT, "fq");
        lying[0] = 200; // length past the buffer
        assert!(parse(&lying).qdiscs.is_empty());
    }
}
