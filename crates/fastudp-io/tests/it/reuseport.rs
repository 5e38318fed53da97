//! Reuseport steering on loopback: each connection ID stays on one socket.

use fastudp_io::UdpIo;
use fastudp_io::{Config, RecvBatch, ReuseportGroup, Socket, Steering};
use std::collections::HashMap;
use std::time::Duration;

#[test]
fn each_connection_id_lands_on_one_socket() {
    const N: usize = 4;
    let g = ReuseportGroup::bind(
        "127.0.0.1:0".parse().unwrap(),
        N,
        Steering::Payload { offset: 1 },
        Config::default(),
    )
    .expect("reuseport group");
    let dest = g.sockets()[0].as_std().local_addr().unwrap();
    // Several senders (source ports) per connection ID: the source must not matter.
    let senders: Vec<Socket> = (0..6)
        .map(|_| Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap())
        .collect();
    let cids: Vec<u32> = (0..32u32).map(|i| i.wrapping_mul(0x9E37_79B9)).collect();
    for (k, &cid) in cids.iter().enumerate() {
        for s in &senders {
            let mut d = vec![0x40u8];
            d.extend_from_slice(&cid.to_be_bytes());
            d.extend_from_slice(&(k as u32).to_be_bytes());
            s.send(&[fastudp_io::Transmit::new(dest, &d)]).unwrap();
        }
    }
    let mut seen: HashMap<u32, usize> = HashMap::new();
    let mut total = 0;
    for (i, s) in g.sockets().iter().enumerate() {
        s.as_std()
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut b = RecvBatch::new(32);
        while s.recv(&mut b).is_ok() {
            for (_, d) in b.datagrams() {
                let cid = u32::from_be_bytes(d[1..5].try_into().unwrap());
                total += 1;
                let prev = *seen.entry(cid).or_insert(i);
                assert_eq!(
                    prev, i,
                    "connection ID {cid:#x} arrived on sockets {prev} and {i}"
                );
                assert_eq!(i, (cid % N as u32) as usize, "steered by the program");
            }
        }
    }
    assert_eq!(total, cids.len() * senders.len(), "every datagram arrived");
    let used: std::collections::HashSet<usize> = seen.values().copied().collect();
    assert!(used.len() > 1, "the group spreads connection IDs");
}

#[test]
fn empty_group_is_an_error() {
    let e = ReuseportGroup::bind(
        "127.0.0.1:0".parse().unwrap(),
        0,
        Steering::Cpu,
        Config::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("at least one"), "{e}");
}

#[test]
fn cpu_steering_delivers_everything() {
    let g = ReuseportGroup::bind(
        "127.0.0.1:0".parse().unwrap(),
        2,
        Steering::Cpu,
        Config::default(),
    )
    .unwrap();
    let dest = g.sockets()[0].as_std().local_addr().unwrap();
    let s = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
    for i in 0..100u32 {
        s.send(&[fastudp_io::Transmit::new(dest, &i.to_be_bytes())])
            .unwrap();
    }
    let mut total = 0;
    for sock in g.sockets() {
        sock.as_std()
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut b = RecvBatch::new(32);
        while sock.recv(&mut b).is_ok() {
            total += b.datagrams().count();
        }
    }
    assert_eq!(total, 100);
}

#[test]
fn a_second_group_on_a_taken_port_is_refused() {
    let first = ReuseportGroup::bind(
        "127.0.0.1:0".parse().unwrap(),
        2,
        Steering::Hash,
        Config::default(),
    )
    .expect("first group");
    let at = first.sockets()[0].as_std().local_addr().unwrap();
    let second = ReuseportGroup::bind(at, 2, Steering::Hash, Config::default());
    let msg = second.expect_err("the port is taken").to_string();
    assert!(msg.contains("bound there already"), "{msg}");
    // A plain socket there is refused as well.
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let at = taken.local_addr().unwrap();
    assert!(ReuseportGroup::bind(at, 2, Steering::Hash, Config::default()).is_err());
}

#[test]
fn quic_cid_steering_reads_long_and_short_headers() {
    const N: usize = 3;
    let g = ReuseportGroup::bind(
        "127.0.0.1:0".parse().unwrap(),
        N,
        Steering::QuicCid,
        Config::default(),
    )
    .expect("reuseport group");
    let dest = g.sockets()[0].as_std().local_addr().unwrap();
    assert!(
        g.sockets()
            .iter()
            .all(|s| s.as_std().local_addr().unwrap() == dest),
        "one address for the whole group"
    );
    let senders: Vec<Socket> = (0..4)
        .map(|_| Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap())
        .collect();
    // Each datagram carries its expected socket in its last byte.
    let mut sent = 0;
    for id in 0..12u8 {
        for s in &senders {
            // Long header (Initial, QUIC v1): flags, version, DCID length, DCID.
            let long = [0xC0, 0, 0, 0, 1, 8, id, 0xEE, 0xEE, 0xEE, id % N as u8];
            // Short header: flags, DCID; byte 6 (the long-header DCID
            // offset) holds something else, to show it is not read.
            let short = [0x40, id, 0xFF, 0xFF, 0xFF, 0xFF, 0x01, id % N as u8];
            s.send(&[
                fastudp_io::Transmit::new(dest, &long),
                fastudp_io::Transmit::new(dest, &short),
            ])
            .unwrap();
            sent += 2;
        }
    }
    let mut total = 0;
    for (i, s) in g.sockets().iter().enumerate() {
        s.as_std()
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut b = RecvBatch::new(64);
        while s.recv(&mut b).is_ok() {
            for (_, d) in b.datagrams() {
                total += 1;
                assert_eq!(*d.last().unwrap() as usize, i, "{d:?} on socket {i}");
                assert_eq!(
                    fastudp_tools::wire::bpf::quic_cid_index(d, N as u32) as usize,
                    i,
                    "the direct computation agrees"
                );
            }
        }
    }
    assert_eq!(total, sent, "every datagram arrived");
}

/// Steering by a byte further into the connection ID (a QUIC-LB ID's
/// nonce, after its first octet and a 2-byte server ID): the kernel's run
/// of the program puts each datagram on the socket its byte names, and an
/// index past the longest connection ID is refused.
#[test]
fn quic_cid_steering_at_a_byte_of_the_nonce() {
    const N: usize = 3;
    let g = ReuseportGroup::bind(
        "127.0.0.1:0".parse().unwrap(),
        N,
        Steering::QuicCidAt { index: 3 },
        Config::default(),
    )
    .expect("reuseport group");
    let dest = g.sockets()[0].as_std().local_addr().unwrap();
    let s = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
    let mut sent = 0;
    for w in 0..12u8 {
        // First octet and server ID the same in every datagram: they
        // alone would put all on one socket.
        let long = [
            0xC0,
            0,
            0,
            0,
            1,
            9,
            0x28,
            0xAB,
            0xCD,
            w,
            1,
            2,
            3,
            w % N as u8,
        ];
        let short = [0x40, 0x28, 0xAB, 0xCD, w, 1, 2, 3, w % N as u8];
        s.send(&[
            fastudp_io::Transmit::new(dest, &long),
            fastudp_io::Transmit::new(dest, &short),
        ])
        .unwrap();
        sent += 2;
    }
    let mut total = 0;
    for (i, s) in g.sockets().iter().enumerate() {
        s.as_std()
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut b = RecvBatch::new(64);
        while s.recv(&mut b).is_ok() {
            for (_, d) in b.datagrams() {
                total += 1;
                assert_eq!(*d.last().unwrap() as usize, i, "{d:?} on socket {i}");
                assert_eq!(Steering::QuicCidAt { index: 3 }.owner(d, N), Some(i));
            }
        }
    }
    assert_eq!(total, sent, "every datagram arrived");
    let e = ReuseportGroup::bind(
        "127.0.0.1:0".parse().unwrap(),
        2,
        Steering::QuicCidAt { index: 20 },
        Config::default(),
    )
    .expect_err("index 20 is past a connection ID");
    assert_eq!(e.kind(), fastudp_io::ErrorKind::Config);
    assert!(e.to_string().contains("at most 20 bytes"), "{e}");
}
