//! fastudp on tokio: GSO trains out, GRO trains in, counters at the end.
//!
//! ```sh
//! cargo run -p fastudp-io --features tokio --example tokio_gso
//! ```
//!
//! The tests' module `examples` (`cargo test -p fastudp-io --all-features
//! --test it -- examples::`) runs [`run`] and checks that every datagram
//! arrived.

use fastudp_io::tokio::UdpSocket;
use fastudp_io::UdpIo;
use fastudp_io::{Config, RecvBatch, Transmit};
use std::net::SocketAddr;
use std::time::Duration;

/// Trains sent, and datagrams (of [`SEGMENT`] bytes) in each.
pub const TRAINS: usize = 10;
/// Datagrams per train.
pub const PER_TRAIN: usize = 10;
/// Bytes per datagram.
pub const SEGMENT: usize = 1200;

/// What one run moved.
#[derive(Debug)]
pub struct Outcome {
    /// Datagrams the sender handed to the kernel.
    pub sent: usize,
    /// Datagrams received, each checked: its length, its source, and its
    /// bytes (datagram `i` of a train is filled with `i`).
    pub received: usize,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), fastudp_io::Error> {
    let outcome = run().await?;
    println!(
        "sent {} datagrams, received {}",
        outcome.sent, outcome.received
    );
    Ok(())
}

/// Sends [`TRAINS`] GSO trains over loopback and receives them.
pub async fn run() -> Result<Outcome, fastudp_io::Error> {
    let any: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    // Room for the whole burst: UDP drops what does not fit.
    let rx = UdpSocket::bind(any, Config::default().recv_buffer(4 << 20))?;
    let tx = UdpSocket::bind(any, Config::default())?;
    let dest = rx.as_tokio().local_addr()?;

    // Each train: PER_TRAIN datagrams of SEGMENT bytes in one buffer,
    // datagram i filled with the byte i.
    let payload: Vec<u8> = (0..PER_TRAIN)
        .flat_map(|i| std::iter::repeat_n(i as u8, SEGMENT))
        .collect();
    let trains: Vec<Transmit<'_>> = (0..TRAINS)
        .map(|_| Transmit::train(dest, &payload, SEGMENT))
        .collect();
    let source = tx.as_tokio().local_addr()?;
    let receiver = async {
        let mut batch = RecvBatch::new(32);
        let mut received = 0;
        // Until all arrived, or nothing more came for a second.
        while received < TRAINS * PER_TRAIN {
            match tokio::time::timeout(Duration::from_secs(1), rx.recv(&mut batch)).await {
                Ok(r) => {
                    r?;
                    for (meta, datagram) in batch.datagrams() {
                        // A GRO train keeps the order of its datagrams,
                        // and trains arrive whole on loopback.
                        let i = received % PER_TRAIN;
                        if meta.source != source
                            || datagram.len() != SEGMENT
                            || datagram.iter().any(|&b| b != i as u8)
                        {
                            let e = format!("datagram {received} is not what was sent");
                            return Err(std::io::Error::other(e).into());
                        }
                        received += 1;
                    }
                }
                Err(_) => break,
            }
        }
        Ok::<usize, fastudp_io::Error>(received)
    };
    // send_all waits whenever the socket is full and resumes a train the
    // kernel took only part of.
    let (sent, received) = tokio::join!(tx.send_all(&trains), receiver);
    let outcome = Outcome {
        sent: sent?,
        received: received?,
    };

    let (t, r) = (tx.stats(), rx.stats());
    println!(
        "sender: {} send calls; receiver: {} receive calls for {} messages, {} dropped by the kernel; fallbacks: {:?}",
        t.send_calls, r.recv_calls, r.recv_messages, r.kernel_drops, t.fallbacks
    );
    Ok(outcome)
}
