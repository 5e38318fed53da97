//! The crate's example programs, run as they are documented: each example
//! file is compiled into this test as a module, and its `run` is called.

#[cfg(feature = "tokio")]
#[path = "../../examples/tokio_gso.rs"]
#[allow(dead_code)] // its `main`
mod tokio_gso;

#[cfg(feature = "quinn")]
#[path = "../../examples/quinn_on_fastudp.rs"]
#[allow(dead_code)] // its `main`
mod quinn_on_fastudp;

/// `examples/tokio_gso.rs`: every datagram of every train arrives, intact.
#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread")]
async fn tokio_gso_example_delivers_every_datagram() {
    let o = tokio_gso::run().await.expect("the example runs");
    let all = tokio_gso::TRAINS * tokio_gso::PER_TRAIN;
    assert_eq!(o.sent, all, "datagrams sent");
    assert_eq!(o.received, all, "datagrams received (each checked)");
}

/// `examples/quinn_on_fastudp.rs`: 8 MB echoed over quinn on fastudp
/// sockets, every byte checked by the example.
#[cfg(feature = "quinn")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quinn_example_echoes_eight_megabytes() {
    let o = quinn_on_fastudp::run(quinn_on_fastudp::BYTES)
        .await
        .expect("the example runs");
    assert_eq!(o.echoed, quinn_on_fastudp::BYTES);
    assert!(o.send_calls > 0 && o.recv_calls > 0, "{o:?}");
}
