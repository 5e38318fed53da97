//! QUIC-LB connection IDs (draft-ietf-quic-load-balancers, the plaintext
//! form): a server of a fleet puts its server ID at a fixed place in every
//! connection ID it issues, so that a load balancer that reads the ID from
//! a packet's destination connection ID sends it to that server, whatever
//! the client's address and port.
//!
//! ```text
//! QUIC-LB Connection ID {
//!   First Octet {
//!     Config Rotation (3),     0 to 6; 7 (0b111) means "unroutable"
//!     CID Length (5),          the length of the rest: server ID + nonce
//!   },
//!   Server ID (8..120),        1 to 15 bytes, the same in every ID
//!   Nonce (32..),              4 bytes or more; its first is the worker's
//! }                            (1 + server ID + nonce: at most 20 bytes)
//! ```
//!
//! The first octet's low five bits carry the length (the draft's "length
//! self-description"), so the octet is the same in every ID of one
//! configuration and a balancer can check it. The nonce's first byte is
//! the worker's index modulo the number of workers (as the first byte of
//! the engine's IDs without QUIC-LB), so one ID routes across hosts (the
//! balancer reads the server ID) and within one (the reuseport program
//! reads byte `1 + server ID length`: [`LbConfig::worker_byte`]); the
//! rest of the nonce is random.
//!
//! Plaintext server IDs let an observer tell which server a connection
//! is on, and link a client's connection IDs across a migration to that
//! server's set (the draft's encrypted forms avoid that; not built).

use std::fmt;
#[cfg(test)]
use std::sync::Arc;

/// The longest server ID, bytes: 19 bytes of server ID and nonce at most,
/// less the shortest nonce.
pub const MAX_SERVER_ID_LEN: usize = 15;
/// The shortest nonce, bytes (the draft's minimum).
pub const MIN_NONCE_LEN: usize = 4;
/// The longest connection ID of QUIC version 1 (RFC 9000 17.2), bytes.
pub const MAX_CID_LEN: usize = 20;
/// The config rotation codepoint that marks an ID as unroutable: a server
/// never issues it, a balancer routes it by its fallback.
pub const UNROUTABLE: u8 = 0b111;

/// A QUIC-LB setting that cannot be used, said plainly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LbError {
    /// The config rotation codepoint is not 0 to 6.
    #[error("config rotation {0}: 0 to 6 (7 marks unroutable IDs)")]
    Rotation(u8),
    /// The server ID length is not 1 to [`MAX_SERVER_ID_LEN`].
    #[error("server ID length {0}: 1 to {MAX_SERVER_ID_LEN} bytes")]
    ServerIdLen(usize),
    /// The nonce is shorter than [`MIN_NONCE_LEN`].
    #[error("nonce length {0}: at least {MIN_NONCE_LEN} bytes")]
    NonceLen(usize),
    /// Server ID and nonce together exceed 19 bytes.
    #[error("server ID {sid} + nonce {nonce} bytes: at most 19 together (a connection ID is at most 20 bytes with its first octet)")]
    TooLong {
        /// Server ID length.
        sid: usize,
        /// Nonce length.
        nonce: usize,
    },
    /// The configuration's text is not `ROTATION:SID_LEN:NONCE_LEN`.
    #[error("{0:?}: give ROTATION:SERVER_ID_LEN:NONCE_LEN, such as 0:1:8")]
    Syntax(String),
    /// A server ID that is not hexadecimal bytes.
    #[error("server ID {0:?}: hexadecimal bytes, such as 01 or 0a0b")]
    ServerIdHex(String),
    /// A stateless-reset secret of the wrong size.
    #[error("stateless-reset key of {0} bytes: {MIN_RESET_KEY} to {MAX_RESET_KEY} bytes (or twice as many hexadecimal digits)")]
    ResetKeyLen(usize),
    /// A server ID whose length is not the configuration's.
    #[error("server ID {id} is {got} bytes; the configuration says {want}")]
    ServerIdMismatch {
        /// The server ID, hexadecimal.
        id: String,
        /// Its length.
        got: usize,
        /// The configuration's server ID length.
        want: usize,
    },
}

/// A QUIC-LB configuration: its config rotation codepoint and the lengths
/// of the server ID and nonce. Every server and balancer of a fleet has the
/// same one (per codepoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LbConfig {
    rotation: u8,
    server_id_len: u8,
    nonce_len: u8,
}

impl LbConfig {
    /// A configuration; lengths in bytes.
    ///
    /// ```
    /// use fastudp_quic::lb::LbConfig;
    /// let c = LbConfig::new(0, 1, 8)?;
    /// assert_eq!(c.cid_len(), 10);
    /// assert_eq!(c.first_octet(), 0x09);
    /// assert!(LbConfig::new(7, 1, 8).is_err());
    /// # Ok::<(), fastudp_quic::lb::LbError>(())
    /// ```
    pub fn new(rotation: u8, server_id_len: usize, nonce_len: usize) -> Result<Self, LbError> {
        if rotation >= UNROUTABLE {
            return Err(LbError::Rotation(rotation));
        }
        if !(1..=MAX_SERVER_ID_LEN).contains(&server_id_len) {
            return Err(LbError::ServerIdLen(server_id_len));
        }
        if nonce_len < MIN_NONCE_LEN {
            return Err(LbError::NonceLen(nonce_len));
        }
        if server_id_len + nonce_len > MAX_CID_LEN - 1 {
            return Err(LbError::TooLong {
                sid: server_id_len,
                nonce: nonce_len,
            });
        }
        Ok(LbConfig {
            rotation,
            server_id_len: server_id_len as u8,
            nonce_len: nonce_len as u8,
        })
    }

    /// Parses `ROTATION:SERVER_ID_LEN:NONCE_LEN` (such as `0:1:8`).
    pub fn parse(s: &str) -> Result<Self, LbError> {
        let bad = || LbError::Syntax(s.to_string());
        let mut it = s.trim().split(':');
        let mut next = || -> Result<usize, LbError> {
            let t = it.next().ok_or_else(bad)?;
            t.trim().parse::<usize>().map_err(|_| bad())
        };
        let (r, sid, nonce) = (next()?, next()?, next()?);
        if it.next().is_some() {
            return Err(bad());
        }
        let r = u8::try_from(r).map_err(|_| LbError::Rotation(u8::MAX))?;
        LbConfig::new(r, sid, nonce)
    }

    /// The config rotation codepoint, 0 to 6.
    pub fn rotation(&self) -> u8 {
        self.rotation
    }

    /// The server ID's length, bytes.
    pub fn server_id_len(&self) -> usize {
        usize::from(self.server_id_len)
    }

    /// The nonce's length, bytes.
    pub fn nonce_len(&self) -> usize {
        usize::from(self.nonce_len)
    }

    /// The connection IDs' length: 1 + server ID + nonce.
    pub fn cid_len(&self) -> usize {
        1 + self.server_id_len() + self.nonce_len()
    }

    /// The first octet of every ID: the rotation codepoint in the top three
    /// bits, the length of the rest in the low five.
    pub fn first_octet(&self) -> u8 {
        (self.rotation << 5) | (self.cid_len() - 1) as u8
    }

    /// Where the server ID starts in an ID: right after the first octet.
    pub const SERVER_ID_AT: usize = 1;

    /// The index in an ID of the worker's byte (the nonce's first), which
    /// the reuseport program steers by within a host.
    pub fn worker_byte(&self) -> usize {
        1 + self.server_id_len()
    }

    /// The server ID of `cid` if `cid` is routable under this
    /// configuration (its length and first octet are this
    /// configuration's); `None` otherwise (a client's own ID, another
    /// configuration's, or an unroutable one).
    pub fn server_id<'a>(&self, cid: &'a [u8]) -> Option<&'a [u8]> {
        if cid.len() != self.cid_len() || cid[0] != self.first_octet() {
            return None;
        }
        cid.get(Self::SERVER_ID_AT..Self::SERVER_ID_AT + self.server_id_len())
    }
}

impl fmt::Display for LbConfig {
    /// As [`LbConfig::parse`] reads it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}",
            self.rotation, self.server_id_len, self.nonce_len
        )
    }
}

/// A server ID: 1 to [`MAX_SERVER_ID_LEN`] bytes.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServerId(Vec<u8>);

impl ServerId {
    /// Parses hexadecimal bytes (`01`, `0a0b`; an optional `0x` prefix).
    pub fn parse_hex(s: &str) -> Result<Self, LbError> {
        let bad = || LbError::ServerIdHex(s.to_string());
        let t = s.trim();
        let t = t
            .strip_prefix("0x")
            .or_else(|| t.strip_prefix("0X"))
            .unwrap_or(t);
        if t.is_empty() || t.len() % 2 != 0 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let bytes: Vec<u8> = (0..t.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&t[i..i + 2], 16).map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        if bytes.len() > MAX_SERVER_ID_LEN {
            return Err(LbError::ServerIdLen(bytes.len()));
        }
        Ok(ServerId(bytes))
    }

    /// The ID's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Display for ServerId {
    /// Lower-case hexadecimal, as [`ServerId::parse_hex`] reads it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ServerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServerId({self})")
    }
}

/// One server's QUIC-LB identity: the fleet's configuration and this
/// server's ID in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuicLb {
    config: LbConfig,
    server_id: ServerId,
}

impl QuicLb {
    /// `server_id` under `config`; its length must be the configuration's.
    pub fn new(config: LbConfig, server_id: ServerId) -> Result<Self, LbError> {
        if server_id.0.len() != config.server_id_len() {
            return Err(LbError::ServerIdMismatch {
                id: server_id.to_string(),
                got: server_id.0.len(),
                want: config.server_id_len(),
            });
        }
        Ok(QuicLb { config, server_id })
    }

    /// The configuration.
    pub fn config(&self) -> LbConfig {
        self.config
    }

    /// The server ID.
    pub fn server_id(&self) -> &ServerId {
        &self.server_id
    }

    /// Writes a connection ID into `out` (exactly
    /// [`LbConfig::cid_len`] bytes): the first octet, the server ID,
    /// `worker` as the nonce's first byte, and `random` (at least the
    /// nonce's length less one) for the rest of the nonce.
    pub(crate) fn write_cid(&self, worker: u8, random: &[u8], out: &mut [u8]) {
        let c = self.config;
        let sid = c.server_id_len();
        out[0] = c.first_octet();
        out[LbConfig::SERVER_ID_AT..LbConfig::SERVER_ID_AT + sid]
            .copy_from_slice(&self.server_id.0);
        out[c.worker_byte()] = worker;
        let rest = c.nonce_len() - 1;
        out[c.worker_byte() + 1..c.cid_len()].copy_from_slice(&random[..rest]);
    }
}

/// The shortest stateless-reset secret, bytes (128 bits).
pub const MIN_RESET_KEY: usize = 16;
/// The longest stateless-reset secret, bytes.
pub const MAX_RESET_KEY: usize = 4096;

/// A secret the servers of a fleet share, from which each derives the key
/// of its stateless-reset tokens (RFC 9000 10.3) instead of a random one:
/// the token of a connection ID is then the same on every server, so any
/// server can end a connection another server lost (one that crashed or
/// restarted) with a stateless reset the client accepts, instead of the
/// client waiting for its idle timeout. Whoever has the secret can end
/// any connection of the fleet: keep it as a TLS key is kept.
#[derive(Clone, PartialEq, Eq)]
pub struct ResetKey(Vec<u8>);

impl ResetKey {
    /// The secret's bytes: [`MIN_RESET_KEY`] to [`MAX_RESET_KEY`].
    pub fn new(secret: &[u8]) -> Result<Self, LbError> {
        if !(MIN_RESET_KEY..=MAX_RESET_KEY).contains(&secret.len()) {
            return Err(LbError::ResetKeyLen(secret.len()));
        }
        Ok(ResetKey(secret.to_vec()))
    }

    /// A key file's contents: hexadecimal digits (`openssl rand -hex 32`;
    /// white space around them ignored), or else raw bytes (`head -c 32
    /// /dev/urandom`), taken as they are.
    pub fn from_file_contents(contents: &[u8]) -> Result<Self, LbError> {
        let t = contents.trim_ascii();
        if !t.is_empty() && t.len() % 2 == 0 && t.iter().all(u8::is_ascii_hexdigit) {
            let bytes: Vec<u8> = t
                .chunks(2)
                .map(|p| {
                    let h = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
                    (h(p[0]) << 4) | h(p[1])
                })
                .collect();
            return ResetKey::new(&bytes);
        }
        ResetKey::new(contents)
    }

    /// The HMAC-SHA256 key of the reset tokens: HKDF-SHA256 of the secret,
    /// so the secret itself never keys a token.
    pub(crate) fn hmac_key(&self) -> ring::hmac::Key {
        let prk = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, b"fastudp-quic stateless reset")
            .extract(&self.0);
        let okm = prk
            .expand(&[b"reset token key v1"], ring::hmac::HMAC_SHA256)
            .expect("HKDF-SHA256 expands to one SHA-256 length");
        ring::hmac::Key::from(okm)
    }
}

impl fmt::Debug for ResetKey {
    /// Never the secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ResetKey({} bytes)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_the_drafts() {
        assert!(LbConfig::new(0, 1, 4).is_ok());
        assert!(LbConfig::new(6, 15, 4).is_ok());
        assert!(LbConfig::new(0, 1, 18).is_ok());
        assert_eq!(LbConfig::new(7, 1, 8), Err(LbError::Rotation(7)));
        assert_eq!(LbConfig::new(0, 0, 8), Err(LbError::ServerIdLen(0)));
        assert_eq!(LbConfig::new(0, 16, 4), Err(LbError::ServerIdLen(16)));
        assert_eq!(LbConfig::new(0, 1, 3), Err(LbError::NonceLen(3)));
        assert_eq!(
            LbConfig::new(0, 2, 18),
            Err(LbError::TooLong { sid: 2, nonce: 18 })
        );
        let e = LbConfig::new(0, 16, 4).unwrap_err().to_string();
        assert_eq!(e, "server ID length 16: 1 to 15 bytes");
    }

    #[test]
    fn config_text() {
        let c = LbConfig::parse("2:3:6").unwrap();
        assert_eq!((c.rotation(), c.server_id_len(), c.nonce_len()), (2, 3, 6));
        assert_eq!(c.to_string(), "2:3:6");
        assert_eq!(LbConfig::parse(&c.to_string()), Ok(c));
        for bad in ["", "0:1", "0:1:8:9", "a:1:8", "0:-1:8", "0:1:8 x"] {
            assert!(
                matches!(LbConfig::parse(bad), Err(LbError::Syntax(_))),
                "{bad}"
            );
        }
        assert_eq!(LbConfig::parse("300:1:8"), Err(LbError::Rotation(255)));
        assert_eq!(LbConfig::parse("7:1:8"), Err(LbError::Rotation(7)));
    }

    #[test]
    fn first_octet_carries_rotation_and_length() {
        // Rotation 0b010, 2 + 6 bytes after the first octet.
        let c = LbConfig::new(2, 2, 6).unwrap();
        assert_eq!(c.cid_len(), 9);
        assert_eq!(c.first_octet(), 0b010_01000);
        assert_eq!(c.worker_byte(), 3);
        // The longest: 19 bytes after the first octet, rotation 6.
        let c = LbConfig::new(6, 15, 4).unwrap();
        assert_eq!(c.cid_len(), MAX_CID_LEN);
        assert_eq!(c.first_octet(), 0b110_10011);
        assert_eq!(c.worker_byte(), 16);
    }

    #[test]
    fn server_ids_in_hex() {
        assert_eq!(ServerId::parse_hex("0a0B").unwrap().as_bytes(), [10, 11]);
        assert_eq!(ServerId::parse_hex("0x01").unwrap().as_bytes(), [1]);
        assert_eq!(ServerId::parse_hex("ab").unwrap().to_string(), "ab");
        for bad in ["", "0", "0g", "0x", "1 2", "+1"] {
            assert!(
                matches!(ServerId::parse_hex(bad), Err(LbError::ServerIdHex(_))),
                "{bad}"
            );
        }
        assert_eq!(
            ServerId::parse_hex(&"01".repeat(16)),
            Err(LbError::ServerIdLen(16))
        );
        let c = LbConfig::new(0, 2, 8).unwrap();
        let e = QuicLb::new(c, ServerId::parse_hex("01").unwrap()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "server ID 01 is 1 bytes; the configuration says 2"
        );
    }

    /// Encoding then reading back, on literal bytes: where each field lands.
    #[test]
    fn encode_and_parse() {
        let c = LbConfig::new(1, 2, 5).unwrap();
        let lb = QuicLb::new(c, ServerId::parse_hex("abcd").unwrap()).unwrap();
        let mut cid = [0u8; 8];
        lb.write_cid(7, &[1, 2, 3, 4, 99], &mut cid);
        assert_eq!(cid, [0b001_00111, 0xAB, 0xCD, 7, 1, 2, 3, 4]);
        assert_eq!(c.server_id(&cid), Some(&[0xAB, 0xCD][..]));
        // Another configuration's first octet, a wrong length, a client's
        // random ID: unroutable here.
        let mut other = cid;
        other[0] = 0b010_00111;
        assert_eq!(c.server_id(&other), None);
        assert_eq!(c.server_id(&cid[..7]), None);
        assert_eq!(c.server_id(&[0x27, 1, 2, 3, 4, 5, 6, 7, 8]), None);
        assert_eq!(c.server_id(&[]), None);
    }

    /// Every valid configuration round-trips, its ID's length and worker
    /// byte within bounds.
    #[test]
    fn every_configuration_round_trips() {
        let random: Vec<u8> = (100..120).collect();
        for r in 0..UNROUTABLE {
            for sid in 1..=MAX_SERVER_ID_LEN {
                for nonce in MIN_NONCE_LEN..=MAX_CID_LEN - 1 - sid {
                    let c = LbConfig::new(r, sid, nonce).unwrap();
                    let id = ServerId((0..sid as u8).map(|b| b ^ 0x5A).collect());
                    let lb = QuicLb::new(c, id.clone()).unwrap();
                    let mut cid = vec![0u8; c.cid_len()];
                    lb.write_cid(0xEE, &random, &mut cid);
                    assert!(cid.len() <= MAX_CID_LEN);
                    assert_eq!(cid[0] >> 5, r);
                    assert_eq!(usize::from(cid[0] & 0x1F), cid.len() - 1);
                    assert_eq!(c.server_id(&cid), Some(id.as_bytes()));
                    assert_eq!(cid[c.worker_byte()], 0xEE);
                    assert_eq!(&cid[c.worker_byte() + 1..], &random[..nonce - 1]);
                    assert_eq!(LbConfig::parse(&c.to_string()), Ok(c));
                }
            }
        }
    }

    #[test]
    fn reset_key_files() {
        let hex = ResetKey::from_file_contents(b"  000102030405060708090a0b0c0d0e0F\n").unwrap();
        assert_eq!(hex, ResetKey::new(&(0..16).collect::<Vec<u8>>()).unwrap());
        // Not all hexadecimal: the bytes as they are, new line included.
        let raw = ResetKey::from_file_contents(b"0123456789abcdefXY\n").unwrap();
        assert_eq!(raw, ResetKey::new(b"0123456789abcdefXY\n").unwrap());
        assert_eq!(
            ResetKey::from_file_contents(b"00112233"),
            Err(LbError::ResetKeyLen(4))
        );
        assert_eq!(ResetKey::new(&[]), Err(LbError::ResetKeyLen(0)));
        assert!(ResetKey::new(&[0; MAX_RESET_KEY + 1]).is_err());
        assert_eq!(format!("{hex:?}"), "ResetKey(16 bytes)");
    }

    /// Two keys from the same secret sign alike, from another secret not.
    #[test]
    fn the_same_secret_gives_the_same_hmac_key() {
        let a = ResetKey::new(&[7; 32]).unwrap().hmac_key();
        let b = ResetKey::new(&[7; 32]).unwrap().hmac_key();
        let c = ResetKey::new(&[8; 32]).unwrap().hmac_key();
        let cid = [0x09, 1, 2, 3, 4, 5, 6, 7, 8, 9];
        let sig = |k: &ring::hmac::Key| ring::hmac::sign(k, &cid).as_ref().to_vec();
        assert_eq!(sig(&a), sig(&b));
        assert_ne!(sig(&a), sig(&c));
        // Derived, not the secret itself.
        assert_ne!(sig(&a), sig(&crate::cid::ring_hmac(&[7; 32])));
    }

    /// Two engines' endpoints with the same secret answer a short-header
    /// packet for a connection ID neither holds with a stateless reset
    /// whose token is the same: the one the client learnt from the
    /// server that issued the ID. Another secret gives another token.
    #[test]
    fn servers_with_the_same_secret_reset_alike() {
        let c = LbConfig::new(0, 1, 8).unwrap();
        let lb = |id: &str| {
            Some(Arc::new(
                QuicLb::new(c, ServerId::parse_hex(id).unwrap()).unwrap(),
            ))
        };
        let endpoint = |secret: &[u8], id: &str| {
            let key = Arc::new(ResetKey::new(secret).unwrap().hmac_key());
            let fallback = Arc::new((
                crate::cid::ring_hmac(&[3; 32]),
                std::sync::atomic::AtomicU64::new(0),
            ));
            let cfg = crate::engine::endpoint_config(0, 2, key, fallback, lb(id));
            quinn_proto::Endpoint::new(Arc::new(cfg), None, false, None)
        };
        // A connection ID of server 01 and the token it hands out with it.
        let cid = {
            use quinn_proto::ConnectionIdGenerator;
            let mut g = crate::cid::WorkerCids {
                worker: 0,
                workers: 2,
                rng: ring::rand::SystemRandom::new(),
                fallback: Arc::new((crate::cid::ring_hmac(&[3; 32]), Default::default())),
                lb: lb("01"),
            };
            g.generate_cid()
        };
        let token = |secret: &[u8]| {
            let k = ResetKey::new(secret).unwrap().hmac_key();
            ring::hmac::sign(&k, &cid).as_ref()[..16].to_vec()
        };
        let reset_from = |ep: &mut quinn_proto::Endpoint| {
            let mut pkt = vec![0x40];
            pkt.extend_from_slice(&cid);
            pkt.resize(1200, 0xAA);
            let mut buf = Vec::new();
            let ev = ep.handle(
                std::time::Instant::now(),
                "192.0.2.1:5000".parse().unwrap(),
                None,
                None,
                bytes::BytesMut::from(&pkt[..]),
                &mut buf,
            );
            assert!(
                matches!(ev, Some(quinn_proto::DatagramEvent::Response(_))),
                "a stateless reset"
            );
            buf[buf.len() - 16..].to_vec()
        };
        // Servers 02 and 03 share 01's secret: the same token.
        assert_eq!(reset_from(&mut endpoint(&[5; 32], "02")), token(&[5; 32]));
        assert_eq!(reset_from(&mut endpoint(&[5; 32], "03")), token(&[5; 32]));
        // Another secret: a token the client would not take.
        assert_ne!(reset_from(&mut endpoint(&[6; 32], "02")), token(&[5; 32]));
    }
}
