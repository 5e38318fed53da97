//! Embedding the engine: a server with its own application, an echo
//! server (ALPN `echo`), and a quinn client that sends it 4 MB on one
//! stream and checks every byte that comes back.
//!
//! ```text
//! cargo run -p fastudp-quic --example embed
//! ```
//!
//! The application reads what arrives and writes it back, and follows the
//! interface's one rule for writing: write until `Blocked`, then wait for
//! `Writable`. While its write is blocked it reads nothing more, so flow
//! control holds the client back: the echo holds at most one read's
//! worth of bytes per stream.

use bytes::Bytes;
use fastudp_quic::app::{
    AppCx, AppEvent, Application, ConnApp, ConnInfo, Read, StreamId, WorkerApp, Write,
};
use fastudp_quic::{Engine, EngineConfig};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Bytes the client sends (and gets back).
pub const BYTES: usize = 4 << 20;
/// The protocol.
const ALPN: &[u8] = b"echo";

/// The echo application: one per server.
struct Echo;

impl Application for Echo {
    fn alpn(&self) -> Vec<Vec<u8>> {
        vec![ALPN.to_vec()]
    }

    fn worker(&self, _worker: usize) -> Box<dyn WorkerApp> {
        Box::new(EchoWorker)
    }
}

/// The echo application on one worker thread.
struct EchoWorker;

impl WorkerApp for EchoWorker {
    fn accept(&mut self, _alpn: &[u8], _info: &ConnInfo) -> Option<Box<dyn ConnApp>> {
        Some(Box::new(EchoConn::default()))
    }
}

/// One stream being echoed.
#[derive(Default)]
struct Echoing {
    /// Read and not yet written back.
    pending: Option<Bytes>,
    /// Bytes written back so far.
    echoed: u64,
    /// The client has finished its side.
    fin: bool,
}

/// One connection's streams.
#[derive(Default)]
struct EchoConn {
    streams: HashMap<StreamId, Echoing>,
}

impl EchoConn {
    /// Writes back what is pending, reads more while writes are taken, and
    /// finishes the stream once the client's side has ended and all is
    /// written back.
    fn pump(&mut self, cx: &mut AppCx<'_>, id: StreamId) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        loop {
            if let Some(b) = s.pending.take() {
                let mut data = [b];
                match cx.write(id, &mut data) {
                    Write::All(n) => s.echoed += n as u64,
                    Write::Blocked(n) => {
                        // The rest waits for Writable.
                        s.echoed += n as u64;
                        let [rest] = data;
                        s.pending = Some(rest);
                        return;
                    }
                    _ => {
                        self.streams.remove(&id);
                        return;
                    }
                }
            }
            if s.fin {
                cx.finish(id, s.echoed);
                self.streams.remove(&id);
                return;
            }
            match cx.read(id, 64 * 1024) {
                Read::Data(b) => s.pending = Some(b),
                Read::Fin => s.fin = true,
                Read::Blocked => return,
                _ => {
                    cx.reset(id, 1);
                    self.streams.remove(&id);
                    return;
                }
            }
        }
    }
}

impl ConnApp for EchoConn {
    fn on_event(&mut self, cx: &mut AppCx<'_>, ev: AppEvent) {
        match ev {
            AppEvent::Opened(id) => {
                self.streams.insert(id, Echoing::default());
                self.pump(cx, id);
            }
            AppEvent::Readable(id) | AppEvent::Writable(id) => self.pump(cx, id),
            AppEvent::Stopped(id, _) => {
                self.streams.remove(&id);
            }
            _ => {}
        }
    }
}

/// What a run did.
#[derive(Debug)]
pub struct Outcome {
    /// Bytes that came back, each checked.
    pub echoed: usize,
    /// What the engine counted as delivered (acknowledged) bytes.
    pub goodput: u64,
}

/// Starts the engine on loopback with the echo application, echoes
/// `bytes` through it with a quinn client, and stops the engine.
pub fn run(bytes: usize) -> Result<Outcome, Box<dyn std::error::Error>> {
    // A self-signed certificate for `localhost`.
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()])?;
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der());
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let tls = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key.into())?;

    let cfg = EngineConfig::new("127.0.0.1:0".parse()?, Arc::new(tls)).workers(2);
    let engine = Engine::start(cfg, Arc::new(Echo))?;
    let addr = engine.local_addr();

    let echoed = client(addr, cert.cert.der().clone(), provider, bytes);
    // The last acknowledgement may still be on its way to the server.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let counters = engine.counters().clone();
    while counters
        .app_bytes
        .load(std::sync::atomic::Ordering::Relaxed)
        < bytes as u64
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    engine.stop();
    engine.join()?;
    Ok(Outcome {
        echoed: echoed?,
        goodput: counters
            .app_bytes
            .load(std::sync::atomic::Ordering::Relaxed),
    })
}

/// The client: sends `bytes` of a pattern on one stream and checks what
/// comes back.
fn client(
    addr: SocketAddr,
    cert: rustls::pki_types::CertificateDer<'static>,
    provider: Arc<rustls::crypto::CryptoProvider>,
    bytes: usize,
) -> Result<usize, Box<dyn std::error::Error>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert)?;
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let cfg = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(tls)?,
    ));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
        ep.set_default_client_config(cfg);
        let conn = ep.connect(addr, "localhost")?.await?;
        let (mut send, mut recv) = conn.open_bi().await?;
        let data: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
        let writer = async move {
            send.write_all(&data).await?;
            send.finish()?;
            Ok::<_, Box<dyn std::error::Error>>(())
        };
        let reader = async move {
            let back = recv.read_to_end(bytes + 1).await?;
            Ok::<_, Box<dyn std::error::Error>>(back)
        };
        let (w, back) = tokio::join!(writer, reader);
        w?;
        let back = back?;
        if back.len() != bytes {
            return Err(format!("{} bytes came back of {bytes}", back.len()).into());
        }
        if let Some(i) = (0..bytes).find(|&i| back[i] != (i % 251) as u8) {
            return Err(format!("byte {i} came back wrong").into());
        }
        conn.close(0u32.into(), b"done");
        ep.wait_idle().await;
        Ok(back.len())
    })
}

fn main() {
    match run(BYTES) {
        Ok(o) => println!(
            "echoed {} bytes, each checked; the engine counted {} bytes acknowledged",
            o.echoed, o.goodput
        ),
        Err(e) => {
            eprintln!("embed: {e}");
            std::process::exit(1);
        }
    }
}
