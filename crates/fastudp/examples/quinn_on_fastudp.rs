//! A quinn server and client on fastudp sockets: one stream, echoed back.
//!
//! ```sh
//! cargo run -p fastudp --features quinn --example quinn_on_fastudp
//! ```

use quinn::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use quinn::{ClientConfig, Endpoint, EndpointConfig, ServerConfig, TokioRuntime};
use std::error::Error;
use std::sync::Arc;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    // A self-signed certificate for the demo.
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()])?;
    let cert_der = cert.cert.der().clone();
    let key = PrivateKeyDer::from(PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der()));

    // The server's endpoint on a fastudp socket.
    let server_socket = fastudp::quinn::Socket::bind("127.0.0.1:0".parse()?)?;
    let server = Endpoint::new_with_abstract_socket(
        EndpointConfig::default(),
        Some(ServerConfig::with_single_cert(vec![cert_der.clone()], key)?),
        Arc::new(server_socket),
        Arc::new(TokioRuntime),
    )?;
    let server_addr = server.local_addr()?;
    let echo = tokio::spawn(async move {
        let conn = server.accept().await.expect("a client").await?;
        let (mut send, mut recv) = conn.accept_bi().await?;
        let msg = recv.read_to_end(1 << 20).await?;
        send.write_all(&msg).await?;
        send.finish()?;
        conn.closed().await;
        Ok::<(), Box<dyn Error + Send + Sync>>(())
    });

    // The client's endpoint on another fastudp socket.
    let client_socket = Arc::new(fastudp::quinn::Socket::bind("127.0.0.1:0".parse()?)?);
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
    send.write_all(b"hello over fastudp").await?;
    send.finish()?;
    let back = recv.read_to_end(1 << 20).await?;
    println!("echoed: {}", String::from_utf8_lossy(&back));
    conn.close(0u32.into(), b"bye");
    echo.await?.map_err(|e| e.to_string())?;

    let st = client_socket.stats();
    println!(
        "client socket: {} send calls, {} receive calls, GSO segments now {}, ECN on: {}",
        st.send_calls,
        st.recv_calls,
        client_socket.state().max_gso_segments(),
        client_socket.state().ecn_enabled()
    );
    Ok(())
}
