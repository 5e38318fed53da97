//! Paces many flows from one thread in user space, over loopback, and
//! shows what each flow received:
//! `cargo run --release -p fastudp-tools --example paced -- [FLOWS] [RATE_BYTES_PER_SEC]`.
//!
//! The pieces: a [`Scheduler`] says which flows' trains are due and when
//! to ask again, a [`Waiter`] waits for that time, and one
//! `Socket::send` (one `sendmmsg`, GSO per train) sends each batch.

use fastudp_io::pacing::{choose_mode, monotonic_ns, PacingMode};
use fastudp_io::UdpIo;
use fastudp_io::{RecvBatch, Socket, Transmit};
use fastudp_tools::pacing::{
    Scheduler, SchedulerConfig, Waiter, DEFAULT_BATCH_BYTES, DEFAULT_SLACK,
};
use std::time::Duration;

const SEGMENT: usize = 1200;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let flows: usize = args.next().map_or(Ok(100), |a| a.parse())?;
    let rate: u64 = args.next().map_or(Ok(100_000), |a| a.parse())?;
    let rx = Socket::bind("127.0.0.1:0".parse()?, fastudp_io::Config::default())?;
    rx.as_std()
        .set_read_timeout(Some(Duration::from_millis(200)))?;
    let tx = Socket::bind("127.0.0.1:0".parse()?, fastudp_io::Config::default())?;
    let to = rx.as_std().local_addr()?;

    // Loopback's qdisc ignores SO_TXTIME, so a wish for kernel pacing comes
    // back as user space, with the reason.
    let (mode, why) = choose_mode(
        PacingMode::Kernel,
        tx.capabilities().supports(fastudp_io::Feature::Txtime),
        None,
    );
    println!("pacing: {mode} ({why})");
    let mut sched = Scheduler::new(
        &SchedulerConfig::new(flows, rate, Duration::from_millis(8), SEGMENT)
            .max_burst(16)
            .mode(mode)
            .batch_bytes(DEFAULT_BATCH_BYTES),
        monotonic_ns(),
    )?;
    let mut waiter = Waiter::tolerating(DEFAULT_SLACK);

    // The receiver counts bytes per flow (the flow id leads each datagram).
    let receiver = std::thread::spawn(move || {
        let mut got = vec![0u64; flows];
        let mut batch = RecvBatch::new(64);
        while rx.recv(&mut batch).is_ok() {
            for (_, d) in batch.datagrams() {
                // Anything else on the port (not led by a flow id) is skipped.
                let flow = d
                    .first_chunk::<4>()
                    .map(|id| u32::from_be_bytes(*id) as usize);
                if let Some(bytes) = flow.and_then(|f| got.get_mut(f)) {
                    *bytes += d.len() as u64;
                }
            }
        }
        got
    });

    let end = monotonic_ns() + 1_000_000_000;
    let mut dues = Vec::new();
    let mut buf = Vec::new();
    let mut calls = 0u64;
    loop {
        let now = monotonic_ns();
        if now >= end {
            break;
        }
        dues.clear();
        if sched.due(now, &mut dues) == 0 {
            waiter.wait_until(sched.next_at().min(end));
            continue;
        }
        // One buffer for the batch; each train is its flow's segments.
        buf.clear();
        for d in &dues {
            for _ in 0..d.departure.segments {
                let start = buf.len();
                buf.resize(start + SEGMENT, 0);
                buf[start..start + 4].copy_from_slice(&(d.flow as u32).to_be_bytes());
            }
        }
        let mut off = 0;
        let trains: Vec<Transmit<'_>> = dues
            .iter()
            .map(|d| {
                let len = d.departure.segments * SEGMENT;
                off += len;
                Transmit::train(to, &buf[off - len..off], SEGMENT)
            })
            .collect::<Vec<_>>();
        let mut trains = trains;
        let mut k = 0;
        while k < trains.len() {
            // Resume exactly where the last call stopped.
            let sent = tx.send(&trains[k..])?;
            k += sent.transmits;
            if sent.datagrams > 0 {
                trains[k] = trains[k].skip_datagrams(sent.datagrams);
            }
            calls += 1;
        }
    }
    let got = receiver.join().map_err(|_| "receiver panicked")?;
    let within = got
        .iter()
        .filter(|&&b| (b as f64 - rate as f64).abs() <= rate as f64 * 0.05)
        .count();
    println!(
        "{flows} flows of {rate} B/s for 1 s in {calls} send calls: {within} within 5% of their rate, min {} B, max {} B",
        got.iter().min().unwrap_or(&0),
        got.iter().max().unwrap_or(&0)
    );
    Ok(())
}
