//! A quinn server and client on fastudp sockets: the client sends 8 MB on
//! a stream, the server echoes them, the client checks every byte.
//!
//! ```sh
//! cargo run -p fastudp-io --features quinn --example quinn_on_fastudp
//! ```
//!
//! The certificate is self-signed for `localhost`, made at start with
//! rcgen; the client trusts exactly that certificate. The tests' module
//! `examples` (`cargo test -p fastudp-io --all-features --test it --
//! examples::`) runs [`run`].

use fastudp_io::UdpIo;
use quinn::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use quinn::{ClientConfig, Endpoint, EndpointConfig, ServerConfig, TokioRuntime};
use std::error::Error;
use std::sync::Arc;

/// An error that can cross tasks.
pub type BoxError = Box<dyn Error + Send + Sync>;

/// Bytes the client sends (and gets back): 8 MB.
pub const BYTES: usize = 8_000_000;

/// What one run moved, as the client and its fastudp socket saw it.
#[derive(Debug)]
pub struct Outcome {
    /// Bytes the server echoed, every one checked by the client.
    pub echoed: usize,
    /// `sendmsg`/`sendmmsg` calls of the client's socket.
    pub send_calls: u64,
    /// Receive calls of the client's socket.
    pub recv_calls: u64,
    /// GSO segments the client's socket allows now (1: GSO is off).
    pub gso_segments: usize,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let o = run(BYTES).await?;
    println!(
        "echoed {} bytes, every one checked; client socket: {} send calls, {} receive calls, GSO segments {}",
        o.echoed, o.send_calls, o.recv_calls, o.gso_segments
    );
    Ok(())
}

/// Byte `i` of the message.
fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

/// Starts a server and a client on loopback, each on a fastudp socket,
/// and has `bytes` echoed on one bidirectional stream.
pub async fn run(bytes: usize) -> Result<Outcome, BoxError> {
    // A self-signed certificate for `localhost`.
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()])?;
    let cert_der = cert.cert.der().clone();
    let key = PrivateKeyDer::from(PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der()));

    // The server's endpoint on a fastudp socket.
    let server_socket =
        fastudp_io::quinn::Socket::bind("127.0.0.1:0".parse()?, fastudp_io::Config::default())?;
    let server = Endpoint::new_with_abstract_socket(
        EndpointConfig::default(),
        Some(ServerConfig::with_single_cert(vec![cert_der.clone()], key)?),
        Arc::new(server_socket),
        Arc::new(TokioRuntime),
    )?;
    let server_addr = server.local_addr()?;
    let echo = tokio::spawn(async move {
        let incoming = server.accept().await.ok_or("the endpoint closed")?;
        let conn = incoming.await?;
        let (mut send, mut recv) = conn.accept_bi().await?;
        // Echo as it arrives: no need to hold the whole message.
        let mut buf = vec![0u8; 64 * 1024];
        while let Some(n) = recv.read(&mut buf).await? {
            send.write_all(&buf[..n]).await?;
        }
        send.finish()?;
        conn.closed().await;
        server.wait_idle().await;
        Ok::<(), BoxError>(())
    });

    // The client's endpoint on another fastudp socket, trusting the
    // server's certificate.
    let client_socket = Arc::new(fastudp_io::quinn::Socket::bind(
        "127.0.0.1:0".parse()?,
        fastudp_io::Config::default(),
    )?);
    let client = Endpoint::new_with_abstract_socket(
        EndpointConfig::default(),
        None,
        client_socket.clone(),
        Arc::new(TokioRuntime),
    )?;
    let mut roots = quinn::rustls::RootCertStore::empty();
    roots.add(cert_der)?;
    let config = ClientConfig::with_root_certificates(Arc::new(roots))?;
    let conn = client
        .connect_with(config, server_addr, "localhost")?
        .await?;
    let (mut send, mut recv) = conn.open_bi().await?;

    // Send and receive at once: the echo comes back while the client is
    // still sending, and flow control would stall one without the other.
    let message: Vec<u8> = (0..bytes).map(pattern).collect();
    let writer = async {
        send.write_all(&message).await?;
        send.finish()?;
        Ok::<(), BoxError>(())
    };
    let reader = async {
        let back = recv.read_to_end(bytes).await?;
        Ok::<Vec<u8>, BoxError>(back)
    };
    let ((), back) = tokio::try_join!(writer, reader)?;
    if back.len() != bytes {
        return Err(format!("{} bytes echoed, {bytes} sent", back.len()).into());
    }
    if let Some(i) = (0..bytes).find(|&i| back[i] != pattern(i)) {
        return Err(format!("byte {i} of the echo is wrong").into());
    }
    conn.close(0u32.into(), b"done");
    echo.await??;
    client.wait_idle().await;

    let st = client_socket.stats();
    Ok(Outcome {
        echoed: back.len(),
        send_calls: st.send_calls,
        recv_calls: st.recv_calls,
        gso_segments: client_socket.state().max_gso_segments(),
    })
}
