//! Asking the kernel over rtnetlink, without the tc and ip programs: the
//! qdiscs (`RTM_GETQDISC`), and the route to a destination
//! (`RTM_GETROUTE`, as `ip route get` asks it).

use std::io::{self, Read};
use std::net::IpAddr;

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

/// The bytes of an `RTM_GETROUTE` request for the route to `dest`:
/// `nlmsghdr`, `rtmsg` and an `RTA_DST` attribute, as `ip route get`
/// sends it. The kernel answers with the one route it would use, after
/// its policy rules and across every table.
pub fn route_request(seq: u32, dest: IpAddr) -> Vec<u8> {
    let (family, addr) = match dest {
        IpAddr::V4(a) => (libc::AF_INET as u8, a.octets().to_vec()),
        IpAddr::V6(a) => (libc::AF_INET6 as u8, a.octets().to_vec()),
    };
    let attr_len = 4 + addr.len();
    let len = 16 + 12 + align4(attr_len);
    let mut b = Vec::with_capacity(len);
    b.extend_from_slice(&(len as u32).to_ne_bytes());
    b.extend_from_slice(&libc::RTM_GETROUTE.to_ne_bytes());
    b.extend_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    b.extend_from_slice(&seq.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes()); // port id
                                              // rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type,
                                              // flags.
    b.extend_from_slice(&[family, (addr.len() * 8) as u8, 0, 0, 0, 0, 0, 0]);
    b.extend_from_slice(&0u32.to_ne_bytes());
    b.extend_from_slice(&(attr_len as u16).to_ne_bytes());
    b.extend_from_slice(&libc::RTA_DST.to_ne_bytes());
    b.extend_from_slice(&addr);
    b.resize(len, 0);
    b
}

/// What the kernel answered to a route request.
#[derive(Debug, PartialEq, Eq)]
pub enum RouteReply {
    /// The route leaves through the device of this index (`RTA_OIF`).
    Device(u32),
    /// A route without an output device (a blackhole, say).
    NoDevice,
    /// The kernel refused, with this (positive) errno: `ENETUNREACH`
    /// when no route matches.
    Error(i32),
}

/// Parses the answer to [`route_request`]; `None` if it holds no route
/// message or error (or lies about its lengths).
pub fn parse_route(buf: &[u8]) -> Option<RouteReply> {
    let mut o = 0;
    while o + 16 <= buf.len() {
        let len = u32_at(buf, o)? as usize;
        let ty = u16_at(buf, o + 4)?;
        if len < 16 || o + len > buf.len() {
            return None;
        }
        let msg = &buf[o..o + len];
        match ty {
            NLMSG_ERROR => {
                let e = u32_at(msg, 16)? as i32;
                // An error of 0 is an acknowledgement: keep looking.
                if e != 0 {
                    return Some(RouteReply::Error(-e));
                }
            }
            libc::RTM_NEWROUTE => {
                // The attributes follow the 12-byte rtmsg.
                let mut a = 16 + 12;
                while a + 4 <= msg.len() {
                    let alen = u16_at(msg, a)? as usize;
                    let aty = u16_at(msg, a + 2)?;
                    if alen < 4 || a + alen > msg.len() {
                        return None;
                    }
                    if aty == libc::RTA_OIF && alen >= 8 {
                        return Some(RouteReply::Device(u32_at(msg, a + 4)?));
                    }
                    a += align4(alen);
                }
                return Some(RouteReply::NoDevice);
            }
            _ => {}
        }
        o += align4(len);
    }
    None
}

/// Asks the kernel which device carries traffic to `dest`: its index.
pub fn route_device(dest: IpAddr) -> io::Result<u32> {
    let s = socket2::Socket::new(
        socket2::Domain::from(libc::AF_NETLINK),
        socket2::Type::RAW,
        Some(socket2::Protocol::from(libc::NETLINK_ROUTE)),
    )?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(2)))?;
    s.send(&route_request(1, dest))?;
    let mut buf = vec![0u8; 16 * 1024];
    let n = (&s).read(&mut buf)?;
    match parse_route(&buf[..n]) {
        Some(RouteReply::Device(i)) => Ok(i),
        Some(RouteReply::NoDevice) => Err(io::Error::other(format!(
            "the route to {dest} leaves through no device"
        ))),
        Some(RouteReply::Error(e)) => Err(io::Error::from_raw_os_error(e)),
        None => Err(io::Error::other("the kernel's answer held no route")),
    }
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
        while !t.len().is_multiple_of(4) {
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

    fn route(attrs: &[(u16, &[u8])]) -> Vec<u8> {
        let mut body = vec![libc::AF_INET as u8, 32, 0, 0, 254, 2, 0, 1];
        body.extend_from_slice(&0u32.to_ne_bytes());
        for (ty, v) in attrs {
            body.extend_from_slice(&((4 + v.len()) as u16).to_ne_bytes());
            body.extend_from_slice(&ty.to_ne_bytes());
            body.extend_from_slice(v);
            while body.len() % 4 != 0 {
                body.push(0);
            }
        }
        msg(libc::RTM_NEWROUTE, &body)
    }

    #[test]
    fn route_request_layout() {
        let r = route_request(9, "10.9.1.5".parse().unwrap());
        assert_eq!(r.len(), 16 + 12 + 8);
        assert_eq!(u32_at(&r, 0), Some(36));
        assert_eq!(u16_at(&r, 4), Some(libc::RTM_GETROUTE));
        assert_eq!(u16_at(&r, 6), Some(libc::NLM_F_REQUEST as u16));
        assert_eq!(u32_at(&r, 8), Some(9));
        assert_eq!(r[16], libc::AF_INET as u8);
        assert_eq!(r[17], 32, "dst_len: a host route");
        assert_eq!(u16_at(&r, 28), Some(8));
        assert_eq!(u16_at(&r, 30), Some(libc::RTA_DST));
        assert_eq!(&r[32..36], &[10, 9, 1, 5]);
        let r6 = route_request(1, "fd00::2".parse().unwrap());
        assert_eq!(r6.len(), 16 + 12 + 20);
        assert_eq!(r6[16], libc::AF_INET6 as u8);
        assert_eq!(r6[17], 128);
    }

    #[test]
    fn parses_route_replies() {
        // RTA_TABLE, RTA_DST, then RTA_OIF: the device is found past the others.
        let r = route(&[
            (15, &254u32.to_ne_bytes()),
            (libc::RTA_DST, &[10, 9, 1, 5]),
            (libc::RTA_OIF, &7u32.to_ne_bytes()),
        ]);
        assert_eq!(parse_route(&r), Some(RouteReply::Device(7)));
        assert_eq!(
            parse_route(&route(&[(15, &254u32.to_ne_bytes())])),
            Some(RouteReply::NoDevice)
        );
        let e = msg(NLMSG_ERROR, &(-libc::ENETUNREACH).to_ne_bytes());
        assert_eq!(parse_route(&e), Some(RouteReply::Error(libc::ENETUNREACH)));
        // Lying lengths: no answer, and no panic.
        let mut lying = r.clone();
        lying[0] = 200;
        assert_eq!(parse_route(&lying), None);
        let mut bad_attr = r;
        let n = bad_attr.len();
        bad_attr[n - 8] = 60; // the last attribute's length past the message
        assert_eq!(parse_route(&bad_attr), None);
        assert_eq!(parse_route(&[0; 10]), None);
    }
}
