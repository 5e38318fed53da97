//! TLS 1.3 set-up: the server's certificate (self-signed with rcgen unless
//! given) and the rustls configurations of the servers and clients.

use super::hq::ALPN;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use std::path::Path;
use std::sync::Arc;

/// A certificate chain and its key.
pub struct Identity {
    /// The chain, leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// Its private key.
    pub key: PrivateKeyDer<'static>,
}

/// Loads `--cert`/`--key` (PEM), or makes a self-signed certificate for
/// `localhost` when neither is given.
pub fn identity(cert: Option<&Path>, key: Option<&Path>) -> Result<Identity, String> {
    match (cert, key) {
        (Some(c), Some(k)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(c)
                .map_err(|e| format!("--cert {}: {e}", c.display()))?
                .collect::<Result<_, _>>()
                .map_err(|e| format!("--cert {}: {e}", c.display()))?;
            if chain.is_empty() {
                return Err(format!("--cert {}: no certificate in it", c.display()));
            }
            let key = PrivateKeyDer::from_pem_file(k)
                .map_err(|e| format!("--key {}: {e}", k.display()))?;
            Ok(Identity { chain, key })
        }
        (None, None) => {
            let c = rcgen::generate_simple_self_signed(vec!["localhost".into()])
                .map_err(|e| format!("cannot make a certificate: {e}"))?;
            Ok(Identity {
                chain: vec![c.cert.der().clone()],
                key: PrivatePkcs8KeyDer::from(c.key_pair.serialize_der()).into(),
            })
        }
        _ => Err("--cert and --key go together".into()),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls server configuration: TLS 1.3, ALPN `hq-interop` (for TLS
/// over TCP too, so both carry the same protocol).
pub fn server(id: &Identity) -> Result<rustls::ServerConfig, String> {
    let mut c = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(id.chain.clone(), id.key.clone_key())
        .map_err(|e| format!("the certificate and key do not fit: {e}"))?;
    c.alpn_protocols = vec![ALPN.to_vec()];
    c.max_early_data_size = 0;
    Ok(c)
}

/// The rustls client configuration of the load generator: TLS 1.3, ALPN
/// `hq-interop`. It does not verify the server's certificate (a
/// measurement tool pointed at a server with a throw-away certificate);
/// the handshake signature is still checked.
pub fn client() -> rustls::ClientConfig {
    let mut c = rustls::ClientConfig::builder_with_provider(provider())
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
