//! A quinn client and server for the tests and the benchmark: a
//! self-signed certificate, endpoints on any `AsyncUdpSocket`, and bulk
//! streams whose every byte is checked.
#![allow(dead_code)]

use quinn::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use quinn::{AsyncUdpSocket, ClientConfig, Connection, Endpoint, ServerConfig, TransportConfig};
use std::sync::Arc;
use std::time::Duration;

/// The server name in the certificate.
pub const SERVER_NAME: &str = "localhost";

/// A self-signed certificate for [`SERVER_NAME`] and its key.
pub fn certificate() -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
    let c = rcgen::generate_simple_self_signed(vec![SERVER_NAME.into()]).expect("rcgen");
    let key = PrivatePkcs8KeyDer::from(c.key_pair.serialize_der());
    (c.cert.der().clone(), key.into())
}

/// Windows large enough for a bulk transfer on a fast path.
fn transport() -> Arc<TransportConfig> {
    let mut t = TransportConfig::default();
    t.stream_receive_window((16u32 << 20).into())
        .receive_window((32u32 << 20).into())
        .send_window(32 << 20)
        .max_idle_timeout(Some(Duration::from_secs(20).try_into().unwrap()));
    Arc::new(t)
}

/// The server's configuration.
pub fn server_config(cert: CertificateDer<'static>, key: PrivateKeyDer<'static>) -> ServerConfig {
    let mut c = ServerConfig::with_single_cert(vec![cert], key).expect("server config");
    c.transport_config(transport());
    c
}

/// A client configuration that trusts `cert`.
pub fn client_config(cert: CertificateDer<'static>) -> ClientConfig {
    let mut roots = quinn::rustls::RootCertStore::empty();
    roots.add(cert).expect("root certificate");
    let mut c = ClientConfig::with_root_certificates(Arc::new(roots)).expect("client config");
    c.transport_config(transport());
    c
}

/// An endpoint on `socket` (a server when `server` is given).
pub fn endpoint(socket: Arc<dyn AsyncUdpSocket>, server: Option<ServerConfig>) -> Endpoint {
    Endpoint::new_with_abstract_socket(
        quinn::EndpointConfig::default(),
        server,
        socket,
        Arc::new(quinn::TokioRuntime),
    )
    .expect("endpoint")
}

/// The byte at `offset` of stream `seed`: a position-dependent pattern,
/// so that a lost, repeated or misplaced byte is caught.
fn word(seed: u64, i: u64) -> u64 {
    let mut z = seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fills `buf` with stream `seed`'s bytes from `offset` (a multiple of 8).
pub fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
    assert_eq!(offset % 8, 0);
    for (k, chunk) in buf.chunks_mut(8).enumerate() {
        let w = word(seed, offset / 8 + k as u64).to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
}

/// Checks that `data` is stream `seed`'s bytes from `offset`.
pub fn check(seed: u64, offset: u64, data: &[u8]) {
    let mut i = 0;
    // Up to the next multiple of 8, byte by byte; then word by word.
    while i < data.len() && (offset + i as u64) % 8 != 0 {
        let at = offset + i as u64;
        let want = word(seed, at / 8).to_le_bytes()[(at % 8) as usize];
        assert!(data[i] == want, "stream {seed}: wrong byte at offset {at}");
        i += 1;
    }
    let words = data[i..].chunks_exact(8);
    let tail = words.remainder();
    let first = (offset + i as u64) / 8;
    for (k, w) in words.enumerate() {
        let got = u64::from_le_bytes(w.try_into().unwrap());
        if got != word(seed, first + k as u64) {
            panic!(
                "stream {seed}: wrong bytes at offset {}",
                (first + k as u64) * 8
            );
        }
    }
    let at = offset + (data.len() - tail.len()) as u64;
    let w = word(seed, at / 8).to_le_bytes();
    assert!(
        tail == &w[..tail.len()],
        "stream {seed}: wrong bytes at offset {at}"
    );
}

/// Sends `bytes` of stream `seed` on a new unidirectional stream, waits
/// for the server's reply (on a stream of its own, so it is retransmitted
/// if lost) that it checked them all, and closes the connection.
pub async fn send(conn: &Connection, seed: u64, bytes: u64) {
    let mut s = conn.open_uni().await.expect("open stream");
    s.write_all(&seed.to_le_bytes()).await.expect("write");
    let mut buf = vec![0u8; 256 << 10];
    let mut off = 0u64;
    while off < bytes {
        let n = (bytes - off).min(buf.len() as u64) as usize;
        fill(seed, off, &mut buf[..n]);
        s.write_all(&buf[..n]).await.expect("write");
        off += n as u64;
    }
    s.finish().expect("finish");
    let mut reply = conn.accept_uni().await.expect("the server's reply");
    let checked = reply.read_to_end(8).await.expect("read the reply");
    assert_eq!(
        checked,
        bytes.to_le_bytes(),
        "the server checked a different number of bytes"
    );
    conn.close(0u32.into(), b"done");
}

/// Takes one connection's stream, checks every byte, replies with the
/// number of bytes checked, and returns it once the client has the reply.
pub async fn check_connection(incoming: quinn::Incoming) -> u64 {
    let conn = incoming.await.expect("handshake");
    let mut r = conn.accept_uni().await.expect("a stream");
    let mut head = [0u8; 8];
    r.read_exact(&mut head).await.expect("stream header");
    let seed = u64::from_le_bytes(head);
    let mut off = 0u64;
    while let Some(chunk) = r.read_chunk(usize::MAX, true).await.expect("read") {
        assert_eq!(chunk.offset, off + 8, "chunks in order");
        check(seed, off, &chunk.bytes);
        off += chunk.bytes.len() as u64;
    }
    let mut reply = conn.open_uni().await.expect("reply stream");
    reply.write_all(&off.to_le_bytes()).await.expect("reply");
    reply.finish().expect("finish the reply");
    // Acknowledged by the client (or the client closed, having read it).
    let _ = reply.stopped().await;
    off
}

/// Serves `n` connections at once; returns the bytes of each.
pub async fn serve(endpoint: Endpoint, n: usize) -> Vec<u64> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let incoming = endpoint.accept().await.expect("a connection");
        tasks.push(tokio::spawn(check_connection(incoming)));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("server task"));
    }
    out
}
