//! The error-queue parser (`wire::errqueue::parse`) on any control data
//! and destination.
//!
//! Input: byte 0 picks the destination `msg_name` gave (bit 0..1: none,
//! IPv4, IPv6) and the family of the wrapped message (bit 2: IPv6); then
//! the address (4 or 16 bytes) and port (2, little-endian) if any; the rest
//! is parsed twice: as a whole control buffer, and as the
//! `sock_extended_err` of one `IP_RECVERR` / `IPV6_RECVERR` message.
//!
//! Checks: no panic; an error only for a buffer the decoder refuses; a
//! `sock_extended_err` of 16 bytes or more is always understood; the
//! destination reported is the one given or none; an error this host raised
//! names no reporter; every result can be displayed.

#![no_main]

use fastudp_fuzz::input::Input;
use fastudp_tools::wire::cmsg::{Decoder, Encoder};
use fastudp_tools::wire::consts::{IPV6_RECVERR, IP_RECVERR, SOL_IP, SOL_IPV6};
use fastudp_tools::wire::errqueue::{parse, SocketError};
use libfuzzer_sys::fuzz_target;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

fn check(e: &SocketError, destination: Option<SocketAddr>) {
    assert!(e.destination().is_none() || e.destination() == destination);
    if let SocketError::PacketTooBig {
        local: true,
        reporter,
        ..
    } = e
    {
        assert_eq!(*reporter, None, "{e:?}");
        assert!(!e.is_icmp());
    }
    assert!(!e.to_string().is_empty());
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input::new(data);
    let pick = inp.u8();
    let destination = match pick & 3 {
        1 => Some(SocketAddr::from((
            Ipv4Addr::from(inp.array::<4>()),
            inp.u16(),
        ))),
        2 => Some(SocketAddr::from((
            Ipv6Addr::from(inp.array::<16>()),
            inp.u16(),
        ))),
        _ => None,
    };
    let rest = inp.rest();

    // The whole buffer: an error exactly when the decoder refuses it before
    // the first error message it could read.
    let refused = Decoder::new(rest)
        .take_while(|m| {
            !matches!(m, Ok(c) if c.data.len() >= 16
                && ((c.level, c.ty) == (SOL_IP, IP_RECVERR)
                    || (c.level, c.ty) == (SOL_IPV6, IPV6_RECVERR)))
        })
        .any(|m| m.is_err());
    match parse(rest, destination) {
        Ok(Some(e)) => {
            assert!(!refused);
            check(&e, destination);
        }
        Ok(None) => assert!(!refused),
        Err(_) => assert!(refused),
    }

    // The rest as one error message's data.
    let (level, ty) = if pick & 4 != 0 {
        (SOL_IPV6, IPV6_RECVERR)
    } else {
        (SOL_IP, IP_RECVERR)
    };
    let mut buf = vec![0u8; fastudp_tools::wire::cmsg::space(rest.len())];
    let mut enc = Encoder::new(&mut buf);
    enc.push(level, ty, rest).expect("room for the message");
    match parse(&buf, destination) {
        Ok(Some(e)) => check(&e, destination),
        Ok(None) => assert!(rest.len() < 16, "a full sock_extended_err ignored"),
        Err(e) => panic!("an encoded message refused: {e}"),
    }
});
