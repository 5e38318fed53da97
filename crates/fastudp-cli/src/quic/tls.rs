//! TLS 1.3 set-up: the server's certificate (self-signed with rcgen unless
//! given) and the rustls configurations of the servers and clients.

use super::hq::ALPN;
use crate::failure::usage;
use anyhow::anyhow;
use rustls::pki_types::pem::{self, PemObject, SectionKind};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// A certificate chain and its key.
pub struct Identity {
    /// The chain, leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// Its private key.
    pub key: PrivateKeyDer<'static>,
    /// SHA-256 of the leaf's SubjectPublicKeyInfo, base64: the form
    /// Chromium's `--ignore-certificate-errors-spki-list` takes.
    pub spki_sha256: String,
    /// Whether the certificate was made here (no `--cert`/`--key`).
    pub self_signed: bool,
}

/// The names a self-signed certificate is made for.
pub const SELF_SIGNED_NAMES: &[&str] = &["localhost"];

/// Loads `--cert`/`--key` (PEM), or makes a self-signed certificate for
/// `localhost` when neither is given.
///
/// The certificate file holds one or more `CERTIFICATE` blocks, leaf
/// first (RSA, ECDSA P-256/P-384 or Ed25519 keys). The key file holds one
/// unencrypted key: PKCS#8 (`PRIVATE KEY`), SEC1 (`EC PRIVATE KEY`) or
/// PKCS#1 (`RSA PRIVATE KEY`). A missing file, a file with no such block,
/// an encrypted key, or a key that is not the certificate's is an error
/// that names the file: a usage error (the files are input). A
/// self-signed certificate that cannot be made is a runtime error.
pub fn identity(cert: Option<&Path>, key: Option<&Path>) -> anyhow::Result<Identity> {
    let (chain, der, self_signed) = match (cert, key) {
        (Some(c), Some(k)) => (read_chain(c)?, read_key(k)?, false),
        (None, None) => {
            let names: Vec<String> = SELF_SIGNED_NAMES.iter().map(|n| n.to_string()).collect();
            let c = rcgen::generate_simple_self_signed(names)
                .map_err(|e| anyhow!("cannot make a certificate: {e}"))?;
            let der = PrivatePkcs8KeyDer::from(c.key_pair.serialize_der()).into();
            (vec![c.cert.der().clone()], der, true)
        }
        _ => bail_usage!("--cert and --key go together"),
    };
    // A fault of the files given is theirs; one of the certificate made
    // here is this program's.
    let bad = |msg: String| {
        if self_signed {
            anyhow!(msg)
        } else {
            usage(msg)
        }
    };
    let cert_name = || match cert {
        Some(c) => format!("--cert {}", c.display()),
        None => "the self-signed certificate".into(),
    };
    let key_name = || match key {
        Some(k) => format!("--key {}", k.display()),
        None => "the self-signed certificate's key".into(),
    };
    let leaf = rustls::server::ParsedCertificate::try_from(&chain[0])
        .map_err(|e| bad(format!("{}: its first certificate: {e}", cert_name())))?;
    let spki = ring::digest::digest(
        &ring::digest::SHA256,
        leaf.subject_public_key_info().as_ref(),
    );
    // The key must be the certificate's: rustls compares the key's public
    // half with the leaf's (a mismatch would fail every handshake).
    rustls::sign::CertifiedKey::from_der(chain.clone(), der.clone_key(), &provider()).map_err(
        |e| match e {
            rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => bad(format!(
                "{} does not belong to {}: their public keys differ",
                key_name(),
                cert_name()
            )),
            e => bad(format!("{}: unusable key: {e}", key_name())),
        },
    )?;
    Ok(Identity {
        chain,
        key: der,
        spki_sha256: base64(spki.as_ref()),
        self_signed,
    })
}

/// Reads a whole PEM file, naming it (by its option) in the error; a
/// file that cannot be read is a usage error, as one that is not PEM.
fn read_pem(opt: &str, path: &Path) -> anyhow::Result<Vec<u8>> {
    let data = std::fs::read(path).map_err(|e| usage!("{opt} {}: {e}", path.display()))?;
    if data.iter().all(u8::is_ascii_whitespace) {
        bail_usage!("{opt} {}: the file is empty", path.display());
    }
    Ok(data)
}

/// The sections of a PEM file, each with its kind; what is not PEM is an
/// error.
fn sections(opt: &str, path: &Path, data: &[u8]) -> anyhow::Result<Vec<(SectionKind, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut rest = data;
    loop {
        match pem::from_buf(&mut rest) {
            Ok(Some(section)) => out.push(section),
            Ok(None) => break,
            Err(e) => bail_usage!("{opt} {}: not valid PEM: {e}", path.display()),
        }
    }
    Ok(out)
}

/// `--cert`: every `CERTIFICATE` block, in order.
fn read_chain(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let data = read_pem("--cert", path)?;
    let chain: Vec<CertificateDer<'static>> = sections("--cert", path, &data)?
        .into_iter()
        .filter(|(k, _)| *k == SectionKind::Certificate)
        .map(|(_, der)| CertificateDer::from(der))
        .collect();
    if chain.is_empty() {
        bail_usage!(
            "--cert {}: no certificate in it (a PEM file with \"-----BEGIN CERTIFICATE-----\" blocks, leaf first)",
            path.display()
        );
    }
    Ok(chain)
}

/// `--key`: the one private key, PKCS#8, SEC1 or PKCS#1.
fn read_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    let data = read_pem("--key", path)?;
    if String::from_utf8_lossy(&data).contains("ENCRYPTED") {
        bail_usage!(
            "--key {}: the key is encrypted; give it unencrypted (openssl pkey -in FILE -out PLAIN)",
            path.display()
        );
    }
    let mut keys: Vec<PrivateKeyDer<'static>> = Vec::new();
    for (kind, der) in sections("--key", path, &data)? {
        if let Some(k) = PrivateKeyDer::from_pem(kind, der) {
            keys.push(k);
        }
    }
    match keys.len() {
        1 => Ok(keys.remove(0)),
        0 => bail_usage!(
            "--key {}: no private key in it (a PEM \"PRIVATE KEY\", \"EC PRIVATE KEY\" or \"RSA PRIVATE KEY\" block)",
            path.display()
        ),
        n => bail_usage!(
            "--key {}: {n} private keys in it; give the one of the certificate",
            path.display()
        ),
    }
}

/// Standard base64 with padding (RFC 4648 section 4).
fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                s.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// Prints the certificate in force on the server's start-up lines: its
/// SPKI SHA-256 lets a browser trust it (Chromium's
/// `--ignore-certificate-errors-spki-list`), and, when self-signed, the
/// names it is made for.
pub fn announce(id: &Identity, json: bool) -> anyhow::Result<()> {
    if json {
        out!(
            "{}",
            serde_json::json!({
                "kind": "certificate",
                "self_signed": id.self_signed,
                "names": if id.self_signed { SELF_SIGNED_NAMES } else { &[] },
                "spki_sha256": id.spki_sha256,
            })
        )
    } else if id.self_signed {
        out!(
            "certificate: self-signed for {}; SPKI SHA-256 {} (chromium --ignore-certificate-errors-spki-list={})",
            SELF_SIGNED_NAMES.join(", "),
            id.spki_sha256,
            id.spki_sha256
        )
    } else {
        out!("certificate: SPKI SHA-256 {}", id.spki_sha256)
    }
}

static CRYPTO: std::sync::OnceLock<super::Crypto> = std::sync::OnceLock::new();

/// Picks the provider of every configuration made after it (once per
/// process; ring when never called).
pub fn use_crypto(c: super::Crypto) {
    let _ = CRYPTO.set(c);
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(match CRYPTO.get().copied().unwrap_or_default() {
        // rustls 0.23.48 deprecates ring's provider (no post-quantum key
        // exchange); it stays selectable here, on request.
        #[allow(deprecated)]
        super::Crypto::Ring => rustls::crypto::ring::default_provider(),
        super::Crypto::AwsLcRs => rustls::crypto::aws_lc_rs::default_provider(),
    })
}

/// The rustls server configuration: TLS 1.3, ALPN `hq-interop` (for TLS
/// over TCP too, so both carry the same protocol). With `early_data`, a
/// resuming client may send 0-RTT data (QUIC only: quinn-proto requires
/// `max_early_data_size` to be 0 or `u32::MAX`); see docs/SECURITY.md on
/// replay. A certificate and key given that rustls refuses are a usage
/// error.
pub fn server(id: &Identity, early_data: bool) -> anyhow::Result<rustls::ServerConfig> {
    server_reloadable(id, early_data).map(|(c, _)| c)
}

/// [`server`], with the certificate behind a [`Certs`]: every
/// configuration cloned from it (the QUIC engine's, the TLS/TCP
/// listener's) takes the certificate of [`Certs::reload`] at its next
/// handshake.
pub fn server_reloadable(
    id: &Identity,
    early_data: bool,
) -> anyhow::Result<(rustls::ServerConfig, Arc<Certs>)> {
    let key = certified(id).map_err(|e| {
        let msg = format!("the certificate and key do not fit: {e}");
        if id.self_signed {
            anyhow!(msg)
        } else {
            usage(msg)
        }
    })?;
    let certs = Arc::new(Certs {
        current: RwLock::new((Arc::new(key), id.spki_sha256.clone())),
    });
    let mut c = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| anyhow!("TLS set-up: {e}"))?
        .with_no_client_auth()
        .with_cert_resolver(certs.clone());
    c.alpn_protocols = vec![ALPN.to_vec()];
    c.max_early_data_size = if early_data { u32::MAX } else { 0 };
    Ok((c, certs))
}

/// The identity as rustls signs with it (the key loaded by the provider,
/// and checked against the leaf's public key).
fn certified(id: &Identity) -> Result<rustls::sign::CertifiedKey, rustls::Error> {
    rustls::sign::CertifiedKey::from_der(id.chain.clone(), id.key.clone_key(), &provider())
}

/// The server's certificate and key in force, which every new handshake
/// asks for (rustls' `ResolvesServerCert`), whatever the client's name:
/// [`Certs::reload`] swaps them, and connections already open keep the
/// keys they agreed.
#[derive(Debug)]
pub struct Certs {
    /// The key, and the SPKI SHA-256 of its certificate.
    current: RwLock<(Arc<rustls::sign::CertifiedKey>, String)>,
}

impl Certs {
    /// Reads `cert` and `key` again (as `--cert` and `--key` at start)
    /// and, when they are good, serves them from the next handshake on;
    /// returns the new certificate's SPKI SHA-256. A file that cannot be
    /// read or parsed, or a key that is not the certificate's, is an
    /// error, and the certificate in force stays.
    pub fn reload(&self, cert: &Path, key: &Path) -> anyhow::Result<String> {
        let id = identity(Some(cert), Some(key))?;
        let k = certified(&id).map_err(|e| anyhow!("the certificate and key do not fit: {e}"))?;
        let mut g = self.current.write().unwrap_or_else(|e| e.into_inner());
        *g = (Arc::new(k), id.spki_sha256.clone());
        Ok(id.spki_sha256)
    }

    /// The SPKI SHA-256 (base64) of the certificate in force.
    pub fn spki_sha256(&self) -> String {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }
}

impl rustls::server::ResolvesServerCert for Certs {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .0
                .clone(),
        )
    }
}

/// The files `--cert` and `--key` name, to read again on SIGHUP.
#[derive(Debug, Clone)]
pub struct Files {
    /// `--cert`.
    pub cert: PathBuf,
    /// `--key`.
    pub key: PathBuf,
}

/// The rustls client configuration of the load generator: TLS 1.3, ALPN
/// `hq-interop`, and one cipher suite, TLS_AES_128_GCM_SHA256, so that
/// every server it measures (rustls prefers AES-256-GCM, Go's crypto/tls
/// AES-128-GCM, and neither lets the other side choose) does the same
/// AEAD work. It does not verify the server's certificate (a measurement
/// tool pointed at a server with a throw-away certificate); the handshake
/// signature is still checked.
pub fn client() -> rustls::ClientConfig {
    let mut p = (*provider()).clone();
    p.cipher_suites
        .retain(|s| s.suite() == rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    let mut c = rustls::ClientConfig::builder_with_provider(Arc::new(p))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3 is supported")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider())))
        .with_no_client_auth();
    c.alpn_protocols = vec![ALPN.to_vec()];
    c
}

/// Accepts any certificate; checks handshake signatures.
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory for one test's files.
    fn dir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("fastudp-tls-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// An ECDSA P-256 certificate for localhost, as PEM: (cert, key, the
    /// key's SubjectPublicKeyInfo).
    fn ecdsa() -> (String, String, Vec<u8>) {
        let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        (
            c.cert.pem(),
            c.key_pair.serialize_pem(),
            c.key_pair.public_key_der(),
        )
    }

    fn write(d: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let p = d.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn sha256_b64(data: &[u8]) -> String {
        base64(ring::digest::digest(&ring::digest::SHA256, data).as_ref())
    }

    /// A reload takes good files and serves them from the next
    /// handshake on; bad files are refused and the certificate in force
    /// stays.
    #[test]
    fn a_reload_swaps_the_certificate_and_refuses_bad_files() {
        let d = dir("reload");
        let (cert, key, spki) = ecdsa();
        let (cert2, key2, spki2) = ecdsa();
        let (c, k) = (write(&d, "c.pem", &cert), write(&d, "k.pem", &key));
        let id = identity(Some(&c), Some(&k)).unwrap();
        let (cfg, certs) = server_reloadable(&id, false).unwrap();
        let cfg = Arc::new(cfg);
        let served = |cfg: &Arc<rustls::ServerConfig>| {
            let mut srv = rustls::ServerConnection::new(cfg.clone()).unwrap();
            let name = ServerName::try_from("localhost").unwrap();
            let mut cli = rustls::ClientConnection::new(Arc::new(client()), name).unwrap();
            let mut buf = Vec::new();
            for _ in 0..10 {
                buf.clear();
                cli.write_tls(&mut buf).unwrap();
                srv.read_tls(&mut &buf[..]).unwrap();
                srv.process_new_packets().unwrap();
                buf.clear();
                srv.write_tls(&mut buf).unwrap();
                cli.read_tls(&mut &buf[..]).unwrap();
                cli.process_new_packets().unwrap();
            }
            let leaf = cli.peer_certificates().unwrap()[0].clone();
            let p = rustls::server::ParsedCertificate::try_from(&leaf).unwrap();
            sha256_b64(p.subject_public_key_info().as_ref())
        };
        assert_eq!(served(&cfg), sha256_b64(&spki));
        // Bad new files: refused, the old certificate stays.
        std::fs::write(&c, "not a certificate\n").unwrap();
        assert!(certs.reload(&c, &k).is_err());
        std::fs::write(&c, &cert2).unwrap();
        let e = certs.reload(&c, &k).unwrap_err();
        assert!(format!("{e:#}").contains("does not belong"), "{e:#}");
        assert_eq!(certs.spki_sha256(), sha256_b64(&spki));
        assert_eq!(served(&cfg), sha256_b64(&spki));
        // Good ones: the next handshake gets them.
        std::fs::write(&k, &key2).unwrap();
        assert_eq!(certs.reload(&c, &k).unwrap(), sha256_b64(&spki2));
        assert_eq!(served(&cfg), sha256_b64(&spki2));
    }

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (raw, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(raw.as_bytes()), enc, "{raw:?}");
        }
        assert_eq!(base64(&[0xfb, 0xff, 0xbf]), "+/+/");
    }

    #[test]
    fn given_files_load_and_the_spki_hash_is_the_keys() {
        let d = dir("ok");
        let (cert, key, spki) = ecdsa();
        let id = identity(
            Some(&write(&d, "c.pem", &cert)),
            Some(&write(&d, "k.pem", &key)),
        )
        .unwrap();
        assert!(!id.self_signed);
        assert_eq!(id.chain.len(), 1);
        assert_eq!(id.spki_sha256, sha256_b64(&spki));
        // 32 bytes: 44 characters with one '='.
        assert_eq!(id.spki_sha256.len(), 44);
        server(&id, false).unwrap();
    }

    #[test]
    fn a_chain_keeps_its_order() {
        let d = dir("chain");
        let (leaf, key, _) = ecdsa();
        let (other, _, _) = ecdsa();
        let id = identity(
            Some(&write(&d, "c.pem", &format!("{leaf}\n{other}"))),
            Some(&write(&d, "k.pem", &key)),
        )
        .unwrap();
        assert_eq!(id.chain.len(), 2);
        assert_eq!(
            id.chain[0],
            CertificateDer::from_pem_slice(leaf.as_bytes()).unwrap()
        );
    }

    #[test]
    fn self_signed_prints_the_spki_of_its_own_key() {
        let id = identity(None, None).unwrap();
        assert!(id.self_signed);
        let leaf = rustls::server::ParsedCertificate::try_from(&id.chain[0]).unwrap();
        assert_eq!(
            id.spki_sha256,
            sha256_b64(leaf.subject_public_key_info().as_ref())
        );
        // Two runs make two keys.
        assert_ne!(id.spki_sha256, identity(None, None).unwrap().spki_sha256);
    }

    #[test]
    fn bad_inputs_give_clear_errors() {
        let d = dir("bad");
        let (cert, key, _) = ecdsa();
        let (_, other_key, _) = ecdsa();
        let c = write(&d, "c.pem", &cert);
        let k = write(&d, "k.pem", &key);
        let cases: Vec<(Option<std::path::PathBuf>, Option<std::path::PathBuf>, &str)> = vec![
            (Some(c.clone()), None, "--cert and --key go together"),
            (None, Some(k.clone()), "--cert and --key go together"),
            (Some(d.join("missing.pem")), Some(k.clone()), "No such file"),
            (Some(c.clone()), Some(d.join("missing.pem")), "No such file"),
            (Some(write(&d, "empty.pem", "\n \n")), Some(k.clone()), "the file is empty"),
            (Some(k.clone()), Some(k.clone()), "no certificate in it"),
            (Some(c.clone()), Some(c.clone()), "no private key in it"),
            (
                Some(c.clone()),
                Some(write(&d, "other.pem", &other_key)),
                "does not belong to --cert",
            ),
            (
                Some(c.clone()),
                Some(write(&d, "two.pem", &format!("{key}{other_key}"))),
                "2 private keys",
            ),
            (
                Some(c.clone()),
                Some(write(
                    &d,
                    "enc.pem",
                    "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n",
                )),
                "encrypted",
            ),
            (
                Some(write(
                    &d,
                    "broken.pem",
                    "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
                )),
                Some(k.clone()),
                "not valid PEM",
            ),
            (
                Some(write(&d, "text.pem", "not a certificate\n")),
                Some(k.clone()),
                "no certificate in it",
            ),
        ];
        for (c, k, want) in cases {
            let e = match identity(c.as_deref(), k.as_deref()) {
                Ok(_) => panic!("{c:?} {k:?}: accepted"),
                Err(e) => e,
            };
            assert_eq!(crate::failure::exit_status(&e), 2, "{c:?} {k:?}: {e:#}");
            let e = format!("{e:#}");
            assert!(e.contains(want), "{c:?} {k:?}: {e}");
        }
    }

    /// The load generator's client and every server's configuration agree
    /// on AES-128-GCM, though the server's provider prefers AES-256-GCM.
    #[test]
    fn the_load_client_negotiates_aes_128_gcm() {
        let id = identity(None, None).unwrap();
        let mut srv = rustls::ServerConnection::new(Arc::new(server(&id, false).unwrap())).unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        let mut cli = rustls::ClientConnection::new(Arc::new(client()), name).unwrap();
        let mut buf = Vec::new();
        for _ in 0..10 {
            if !cli.is_handshaking() && !srv.is_handshaking() {
                break;
            }
            buf.clear();
            cli.write_tls(&mut buf).unwrap();
            srv.read_tls(&mut &buf[..]).unwrap();
            srv.process_new_packets().unwrap();
            buf.clear();
            srv.write_tls(&mut buf).unwrap();
            cli.read_tls(&mut &buf[..]).unwrap();
            cli.process_new_packets().unwrap();
        }
        for suite in [srv.negotiated_cipher_suite(), cli.negotiated_cipher_suite()] {
            assert_eq!(
                suite.map(|s| s.suite()),
                Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256)
            );
        }
    }

    #[test]
    fn zero_rtt_is_opt_in_and_uses_the_value_quic_requires() {
        let id = identity(None, None).unwrap();
        assert_eq!(server(&id, false).unwrap().max_early_data_size, 0);
        let c = server(&id, true).unwrap();
        assert_eq!(c.max_early_data_size, u32::MAX);
        // quinn-proto takes it (it refuses values other than 0 and MAX).
        quinn_proto::crypto::rustls::QuicServerConfig::try_from(c).unwrap();
    }
}
