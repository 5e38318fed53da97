//! Micro-benchmarks of the pure wire layer: GSO train planning, control
//! message encoding and decoding, and GRO splitting. No syscalls.
//!
//! Run with `cargo bench -p fastudp-io --bench wire` (add `-- --quick` for a
//! faster, rougher run).

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fastudp_tools::wire::cmsg::{CmsgBuf, Encoder};
use fastudp_tools::wire::consts::{IP_PKTINFO, IP_TOS, SOL_IP, SOL_UDP, UDP_GRO};
use fastudp_tools::wire::control::EcnCodepoint;
use fastudp_tools::wire::control::{decode_recv, encode_send, SendControl};
use fastudp_tools::wire::gro::Datagrams;
use fastudp_tools::wire::plan::{plan, Limits};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

/// Datagrams per planning run.
const PLAN_LEN: usize = 1024;

/// A mixed length pattern: runs of full-size datagrams, short tails, a
/// datagram too large for one segment and tiny ones, repeated.
fn mixed_lengths(n: usize) -> Vec<usize> {
    const PATTERN: [usize; 16] = [
        1200, 1200, 1200, 1200, 1200, 1200, 1200, 800, 1472, 1472, 1472, 1472, 100, 2000, 1200, 60,
    ];
    PATTERN.iter().copied().cycle().take(n).collect()
}

fn bench_plan(c: &mut Criterion) {
    let mut g = c.benchmark_group("plan");
    g.throughput(Throughput::Elements(PLAN_LEN as u64));
    let uniform = vec![1200usize; PLAN_LEN];
    let mixed = mixed_lengths(PLAN_LEN);
    for segs in [64usize, 128] {
        let limits = Limits::new(segs, false, 1500);
        g.bench_with_input(
            BenchmarkId::new("uniform_1200", segs),
            &uniform,
            |b, lens| b.iter(|| plan(black_box(lens), black_box(limits)).expect("valid lengths")),
        );
        g.bench_with_input(BenchmarkId::new("mixed", segs), &mixed, |b, lens| {
            b.iter(|| plan(black_box(lens), black_box(limits)).expect("valid lengths"))
        });
    }
    g.finish();
}

fn bench_encode_send(c: &mut Criterion) {
    let ctl = SendControl {
        segment_size: Some(1200),
        ecn: Some(EcnCodepoint::Ect0),
        src_ip: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        txtime: None,
    };
    let mut buf = CmsgBuf::default();
    c.bench_function("control/encode_send seg+ecn+src_v4", |b| {
        b.iter(|| {
            encode_send(
                black_box(&mut buf.0[..]),
                black_box(&ctl),
                black_box(true),
                black_box(false),
            )
            .expect("fits a CmsgBuf")
        })
    });
}

fn bench_decode_recv(c: &mut Criterion) {
    let mut buf = CmsgBuf::default();
    let n = {
        let mut enc = Encoder::new(&mut buf.0);
        enc.push_i32(SOL_UDP, UDP_GRO, 1200).expect("room");
        enc.push(SOL_IP, IP_TOS, &[0x02]).expect("room");
        // struct in_pktinfo { ipi_ifindex = 1, ipi_spec_dst, ipi_addr = 127.0.0.1 }
        let mut pi = [0u8; 12];
        pi[..4].copy_from_slice(&1i32.to_ne_bytes());
        pi[8..].copy_from_slice(&[127, 0, 0, 1]);
        enc.push(SOL_IP, IP_PKTINFO, &pi).expect("room");
        enc.len()
    };
    let msg = &buf.0[..n];
    let check = decode_recv(msg).expect("well-formed");
    assert_eq!(check.stride, Some(1200));
    assert_eq!(check.ecn, Some(EcnCodepoint::Ect0));
    c.bench_function("control/decode_recv gro+tos+pktinfo", |b| {
        b.iter(|| decode_recv(black_box(msg)).expect("well-formed"))
    });
}

fn bench_gro_split(c: &mut Criterion) {
    const SEG: usize = 1200;
    const COUNT: usize = 64;
    let buf = vec![0xabu8; SEG * COUNT];
    let mut g = c.benchmark_group("gro");
    g.throughput(Throughput::Elements(COUNT as u64));
    g.bench_function("split 64x1200", |b| {
        b.iter(|| {
            let mut total = 0usize;
            for d in Datagrams::new(black_box(&buf), black_box(SEG)) {
                total += black_box(d).len();
            }
            assert_eq!(total, SEG * COUNT);
            total
        })
    });
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500))
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_plan, bench_encode_send, bench_decode_recv, bench_gro_split
}
criterion_main!(benches);
