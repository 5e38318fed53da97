//! What a QUIC stack that wants its own receive buffers (quinn's
//! `AsyncUdpSocket::poll_recv` hands fastudp `IoSliceMut`s) pays on the
//! io_uring backend: the receiver's CPU per byte on loopback for three
//! receivers of the same GRO trains, in one run.
//!
//! * `recvmmsg`: today's `fastudp_io::quinn` path, `UdpIo::recv_slices`
//!   on the syscall backend; the kernel copies each train into the
//!   caller's buffer.
//! * `ring+copy`: a borrowed receive on the io_uring backend
//!   (`UdpState::recv_borrowed`), each message then copied from the ring's
//!   provided buffer into the caller's buffer, as quinn would need.
//! * `ring`: the borrowed receive alone, read in place (what a stack that
//!   can read from the ring pays).
//!
//! Each receiver reads the first 8 bytes of every datagram. A sender
//! thread on CPU 0 sends 42-segment trains of 1472-byte datagrams as fast
//! as it can; the receiver runs on CPU 1. The receivers alternate within
//! each round (order rotated per round); ratios are taken within a round.
//!
//! ```sh
//! cargo run --release -p fastudp-io --features uring --example uring_copy -- [ROUNDS] [SECONDS] [RING_BUFFERS, 0: the default] [ONLY_RECEIVER]
//! ```

use fastudp_io::UdpIo;
use fastudp_io::{Config, RecvBatch, RecvMeta, Socket, Transmit};
use std::io::IoSliceMut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SEG: usize = 1472;
const SEGS: usize = 42;
/// quinn's receive batch.
const BATCH: usize = 32;
/// Bytes per caller buffer: a 64-segment train of 1472-byte datagrams.
const BUF: usize = 64 * SEG;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    Recvmmsg,
    RingCopy,
    Ring,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Recvmmsg => "recvmmsg",
            Mode::RingCopy => "ring+copy",
            Mode::Ring => "ring",
        }
    }
}

/// One receiver for `secs`: receiver CPU ns per byte and bytes per second.
fn run(mode: Mode, secs: f64, ring_buffers: u16) -> (f64, f64) {
    let c = Config::default()
        .gro(true)
        .recv_buffer(8 << 20)
        .uring(mode != Mode::Recvmmsg)
        .uring_recv_buffers(ring_buffers);
    let mut rx = Socket::bind("127.0.0.1:0".parse().unwrap(), c).unwrap();
    rx.as_std()
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let dest = rx.as_std().local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let _ = fastudp_tools::os::pin_to_cpu(0);
            let tx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
            let payload = vec![0x5au8; SEG * SEGS];
            let ts: Vec<Transmit<'_>> = (0..8)
                .map(|_| Transmit::train(dest, &payload, SEG))
                .collect();
            while !stop.load(Ordering::Relaxed) {
                let _ = tx.send(&ts);
            }
        })
    };
    let _ = fastudp_tools::os::pin_to_cpu(1);
    let mut bufs: Vec<Vec<u8>> = (0..BATCH).map(|_| vec![0u8; BUF]).collect();
    let mut metas = [RecvMeta::default(); BATCH];
    let mut scratch = RecvBatch::new(BATCH);
    let (mut bytes, mut sum) = (0u64, 0u64);
    let t0 = Instant::now();
    let cpu0 = fastudp_tools::os::thread_cpu_time();
    while t0.elapsed().as_secs_f64() < secs {
        match mode {
            Mode::Recvmmsg => {
                let mut slices: Vec<IoSliceMut<'_>> =
                    bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
                let Ok(n) = rx.recv_slices(&mut slices, &mut metas) else {
                    continue;
                };
                for (m, b) in metas[..n].iter().zip(&bufs) {
                    for d in m.datagrams(&b[..m.len]) {
                        sum += u64::from(d[0]) + u64::from(d[7]);
                        bytes += d.len() as u64;
                    }
                }
            }
            Mode::RingCopy => {
                let Ok(view) = rx.recv_borrowed(&mut scratch) else {
                    continue;
                };
                let mut n = 0;
                for (i, (m, p)) in view.iter().enumerate() {
                    bufs[i][..p.len()].copy_from_slice(p);
                    metas[i] = *m;
                    n += 1;
                }
                drop(view);
                for (m, b) in metas[..n].iter().zip(&bufs) {
                    for d in m.datagrams(&b[..m.len]) {
                        sum += u64::from(d[0]) + u64::from(d[7]);
                        bytes += d.len() as u64;
                    }
                }
            }
            Mode::Ring => {
                let Ok(view) = rx.recv_borrowed(&mut scratch) else {
                    continue;
                };
                for (_, d) in view.datagrams() {
                    sum += u64::from(d[0]) + u64::from(d[7]);
                    bytes += d.len() as u64;
                }
            }
        }
    }
    let cpu = fastudp_tools::os::thread_cpu_time() - cpu0;
    let wall = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    sender.join().unwrap();
    if mode != Mode::Recvmmsg {
        let u = rx.state().uring_stats().unwrap();
        assert!(
            u.recv_active && u.recv_messages > 0,
            "not on the ring: {:?}",
            rx.stats().fallbacks
        );
    }
    assert!(sum > 0 && bytes > 0);
    (cpu.as_nanos() as f64 / bytes as f64, bytes as f64 / wall)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().map_or(3, |a| a.parse().expect("ROUNDS"));
    let secs: f64 = args.next().map_or(2.0, |a| a.parse().expect("SECONDS"));
    let ring_buffers: u16 = args.next().map_or(0, |a| a.parse().expect("RING_BUFFERS"));
    let only = args.next();
    let modes = [Mode::Recvmmsg, Mode::RingCopy, Mode::Ring];
    if let Some(name) = only {
        // One receiver alone, for a profile.
        let m = *modes
            .iter()
            .find(|m| m.name() == name)
            .expect("a receiver name");
        let (ns, bps) = run(m, secs, ring_buffers);
        println!("{name}: {ns:.4} rx ns/B, {:.0} MB/s", bps / 1e6);
        return;
    }
    println!("round  receiver   rx ns/B  MB/s    ns/B vs recvmmsg  MB/s vs recvmmsg");
    for round in 0..rounds {
        let mut order = modes;
        order.rotate_left(round % modes.len());
        let mut got = Vec::new();
        for m in order {
            got.push((m, run(m, secs, ring_buffers)));
        }
        let base = got.iter().find(|(m, _)| *m == Mode::Recvmmsg).unwrap().1;
        for (m, (ns, bps)) in got {
            println!(
                "{round:<6} {:<10} {ns:>7.4} {:>7.0}  {:>6.2}x            {:>6.2}x",
                m.name(),
                bps / 1e6,
                ns / base.0,
                bps / base.1
            );
        }
    }
}
