//! fastudp on tokio: a GSO train out, GRO trains in, counters at the end.
//!
//! ```sh
//! cargo run -p fastudp --features tokio --example tokio_gso
//! ```

use fastudp::tokio::UdpSocket;
use fastudp::{Config, RecvBatch, Transmit};
use std::time::Duration;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), fastudp::Error> {
    // Room for the whole burst: UDP drops what does not fit.
    let rx = UdpSocket::bind_with(
        "127.0.0.1:0".parse().unwrap(),
        Config::default().recv_buffer(4 << 20),
    )?;
    let tx = UdpSocket::bind("127.0.0.1:0".parse().unwrap())?;
    let dest = rx.local_addr()?;

    // 100 trains of ten 1200-byte datagrams; send_all waits whenever the
    // socket is full and resumes a train the kernel took only part of.
    let payload = vec![0x5a_u8; 12_000];
    let trains: Vec<Transmit<'_>> = (0..100)
        .map(|_| Transmit::train(dest, &payload, 1200))
        .collect();
    let receiver = async {
        let mut batch = RecvBatch::new(32);
        let mut datagrams = 0;
        // Until all arrived, or nothing more came for half a second.
        while datagrams < 1000 {
            match tokio::time::timeout(Duration::from_millis(500), rx.recv(&mut batch)).await {
                Ok(r) => {
                    r?;
                    datagrams += batch.datagrams().count();
                }
                Err(_) => break,
            }
        }
        Ok::<usize, fastudp::Error>(datagrams)
    };
    let (sent, received) = tokio::join!(tx.send_all(&trains), receiver);
    println!("sent {} datagrams, received {}", sent?, received?);

    let (t, r) = (tx.stats(), rx.stats());
    println!(
        "sender: {} send calls; receiver: {} receive calls for {} messages, {} dropped by the kernel; fallbacks: {:?}",
        t.send_calls, r.recv_calls, r.recv_messages, r.kernel_drops, t.fallbacks
    );
    Ok(())
}
