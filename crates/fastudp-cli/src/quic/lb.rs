//! `fastudp quic lb-rules`: the nftables ruleset of a stateless QUIC-LB
//! load balancer in front of a fleet of `quic serve --server-id`.
//!
//! Every packet to the public address is routed on its own, in the
//! kernel, with no connection tracking:
//! - a short header (first bit 0) by the server ID of its destination
//!   connection ID (a map of server ID to server address); one whose ID
//!   maps to no server is dropped and counted (the draft's "SHOULD drop");
//! - a long header whose destination connection ID is a server's (the
//!   configuration's length and first octet: a client's Handshake, its
//!   later Initials) by the same map;
//! - any other long header (a client's first Initials and 0-RTT, under
//!   its own random ID) by a hash of the client's address and port over a
//!   fixed table of buckets, each bucket a server ("the fallback").
//!
//! The destination address is rewritten to the server's (the port stays),
//! and the servers' answers get the public address back on their way out.
//! docs/SCALE-OUT.md explains the choices.

use super::LbRulesArgs;
use crate::failure::usage;
use fastudp_quic::lb::{LbConfig, ServerId};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

/// The hash's seed: fixed, so that loading the rules again (to drain a
/// server, say) moves no bucket the change does not move.
pub const SEED: u32 = 0xfa57_0001;

/// The most hash buckets.
pub const MAX_BUCKETS: u32 = 4096;

/// One server of the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// Its server ID.
    pub id: ServerId,
    /// Its address (it listens on the public port).
    pub addr: IpAddr,
}

/// What the ruleset is made from.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The public address and port.
    pub public: SocketAddr,
    /// The fleet's configuration.
    pub config: LbConfig,
    /// The servers, in the order given.
    pub servers: Vec<Server>,
    /// Server IDs that get no new connections.
    pub drain: Vec<ServerId>,
    /// Route every packet by the client's address and port only.
    pub by_address: bool,
    /// Hash buckets.
    pub buckets: u32,
    /// The table's name.
    pub table: String,
}

/// Parses `ID=ADDR` or `ID=ADDR:PORT` (the port must be `public_port`).
pub fn parse_server(s: &str, public: SocketAddr) -> anyhow::Result<Server> {
    let (id, addr) = s
        .split_once('=')
        .ok_or_else(|| usage(format!("--server {s}: give ID=ADDR, such as 01=10.0.0.11")))?;
    let id = ServerId::parse_hex(id).map_err(|e| usage(format!("--server {s}: {e}")))?;
    let addr = match addr.parse::<SocketAddr>() {
        Ok(sa) if sa.port() == public.port() => sa.ip(),
        Ok(sa) => {
            return Err(usage(format!(
                "--server {s}: port {} is not the public port {}: the balancer rewrites addresses, not ports, so each server listens on the public port",
                sa.port(),
                public.port()
            )))
        }
        Err(_) => addr
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .map_err(|_| usage(format!("--server {s}: {addr:?} is not an address")))?,
    };
    if addr.is_ipv4() != public.is_ipv4() {
        return Err(usage(format!(
            "--server {s}: one address family for the public address and the servers"
        )));
    }
    Ok(Server { id, addr })
}

impl Plan {
    /// The plan of `fastudp quic lb-rules`'s arguments; what cannot work is
    /// a usage error.
    pub fn from_args(a: &LbRulesArgs) -> anyhow::Result<Plan> {
        let config =
            LbConfig::parse(&a.lb_config).map_err(|e| usage(format!("--lb-config {e}")))?;
        let servers = a
            .servers
            .iter()
            .map(|s| parse_server(s, a.public))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let drain = a
            .drain
            .iter()
            .map(|d| ServerId::parse_hex(d).map_err(|e| usage(format!("--drain {e}"))))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let p = Plan {
            public: a.public,
            config,
            servers,
            drain,
            by_address: a.by_address,
            buckets: a.buckets,
            table: a.table.clone(),
        };
        p.check()?;
        Ok(p)
    }

    /// Checks the plan: IDs of the configuration's length, each once; a
    /// drained ID that is a server's; a server left for new connections.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.servers.is_empty() {
            return Err(usage("no --server: give at least one ID=ADDR"));
        }
        if !(1..=MAX_BUCKETS).contains(&self.buckets) {
            return Err(usage(format!(
                "--buckets {}: 1 to {MAX_BUCKETS}",
                self.buckets
            )));
        }
        if self.table.is_empty()
            || self.table.len() > 64
            || !self
                .table
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
            || self.table.as_bytes()[0].is_ascii_digit()
        {
            return Err(usage(format!(
                "--table {:?}: letters, digits and _ (not first), at most 64",
                self.table
            )));
        }
        let want = self.config.server_id_len();
        for (i, s) in self.servers.iter().enumerate() {
            if s.id.as_bytes().len() != want {
                return Err(usage(format!(
                    "--server {}={}: the ID is {} bytes; --lb-config {} says {want}",
                    s.id,
                    s.addr,
                    s.id.as_bytes().len(),
                    self.config
                )));
            }
            if self.servers[..i].iter().any(|o| o.id == s.id) {
                return Err(usage(format!("--server: ID {} given twice", s.id)));
            }
        }
        for d in &self.drain {
            if !self.servers.iter().any(|s| &s.id == d) {
                return Err(usage(format!("--drain {d}: no --server has that ID")));
            }
        }
        if self.active().is_empty() {
            return Err(usage(
                "every server is drained: new connections would have nowhere to go",
            ));
        }
        Ok(())
    }

    /// The servers' distinct addresses, in the order given.
    fn addrs(&self) -> Vec<IpAddr> {
        let mut v: Vec<IpAddr> = Vec::new();
        for s in &self.servers {
            if !v.contains(&s.addr) {
                v.push(s.addr);
            }
        }
        v
    }

    /// The addresses that take new connections: not a drained ID's.
    fn active(&self) -> Vec<IpAddr> {
        let drained: Vec<IpAddr> = self
            .servers
            .iter()
            .filter(|s| self.drain.contains(&s.id))
            .map(|s| s.addr)
            .collect();
        self.addrs()
            .into_iter()
            .filter(|a| !drained.contains(a))
            .collect()
    }

    /// The server of each hash bucket: bucket `i` is address `i % n` of
    /// all the servers' addresses, and a drained one's buckets go to the
    /// active ones in turn, so that draining a server moves its buckets
    /// only.
    pub fn bucket_map(&self) -> Vec<IpAddr> {
        let (all, active) = (self.addrs(), self.active());
        let drained = |a: &IpAddr| !active.contains(a);
        let mut moved = 0;
        (0..self.buckets as usize)
            .map(|i| {
                let a = all[i % all.len()];
                if drained(&a) {
                    moved += 1;
                    active[(moved - 1) % active.len()]
                } else {
                    a
                }
            })
            .collect()
    }
}

/// Bit offsets of the fields the rules read, from the start of the UDP
/// header (nftables' `@th`): the UDP payload starts at bit 64.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offsets {
    /// A short header's first octet of its connection ID (payload byte 1).
    pub short_first_octet: u32,
    /// A short header's server ID (payload byte 2).
    pub short_server_id: u32,
    /// A long header's DCID length byte (payload byte 5).
    pub long_dcid_len: u32,
    /// A long header's first octet of its connection ID (payload byte 6).
    pub long_first_octet: u32,
    /// A long header's server ID (payload byte 7).
    pub long_server_id: u32,
    /// The server ID's length, bits.
    pub server_id_bits: u32,
}

/// Where the rules read, for `config`.
pub fn offsets(config: &LbConfig) -> Offsets {
    let payload = 64;
    let at = |byte: u32| payload + 8 * byte;
    let sid = LbConfig::SERVER_ID_AT as u32;
    Offsets {
        short_first_octet: at(1),
        short_server_id: at(1 + sid),
        long_dcid_len: at(5),
        long_first_octet: at(6),
        long_server_id: at(6 + sid),
        server_id_bits: 8 * config.server_id_len() as u32,
    }
}

/// The ruleset, as `nft -f` reads it.
pub fn ruleset(p: &Plan) -> String {
    let (fam, ip) = match p.public {
        SocketAddr::V4(_) => ("ip", "ip"),
        SocketAddr::V6(_) => ("ip6", "ip6"),
    };
    let o = offsets(&p.config);
    let c = &p.config;
    let (vip, port, t) = (p.public.ip(), p.public.port(), &p.table);
    let list = |v: &[IpAddr]| {
        v.iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let servers = list(&p.addrs());
    let buckets = p
        .bucket_map()
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{i} : {a}"))
        .collect::<Vec<_>>()
        .join(", ");
    let hash = format!(
        "jhash {ip} saddr . udp sport mod {} seed 0x{SEED:08x}",
        p.buckets
    );
    let mut r = String::new();
    let w = &mut r;
    let _ = writeln!(
        w,
        "# fastudp quic lb-rules: {} servers behind {}, QUIC-LB config {c} ({}-byte connection IDs, first octet 0x{:02x}){}",
        p.servers.len(),
        p.public,
        c.cid_len(),
        c.first_octet(),
        if p.by_address {
            "; routed by client address and port only (--by-address)"
        } else {
            ""
        }
    );
    for s in &p.servers {
        let _ = writeln!(
            w,
            "#   server ID {} -> {}{}",
            s.id,
            s.addr,
            if p.drain.contains(&s.id) {
                " (draining: no new connections)"
            } else {
                ""
            }
        );
    }
    let _ = writeln!(
        w,
        "# Load on the balancer, the servers' gateway: nft -f FILE. Loading again replaces the table in one transaction."
    );
    let _ = writeln!(
        w,
        "table {fam} {t}\ndelete table {fam} {t}\ntable {fam} {t} {{"
    );
    if !p.by_address {
        let sid_map = |name: &str, at: u32, what: &str| {
            let els = p
                .servers
                .iter()
                .map(|s| format!("0x{} : {}", s.id, s.addr))
                .collect::<Vec<_>>()
                .join(", ");
            format!(
                "\t# Server ID -> server, read from a {what}.\n\tmap {name} {{\n\t\ttypeof @th,{at},{} : {ip} daddr\n\t\telements = {{ {els} }}\n\t}}\n",
                o.server_id_bits
            )
        };
        w.push_str(&sid_map(
            "server_short",
            o.short_server_id,
            "short header's destination connection ID",
        ));
        w.push_str(&sid_map(
            "server_long",
            o.long_server_id,
            "long header's destination connection ID (a server's)",
        ));
    }
    for (name, what) in [
        ("by_server_id", "packets routed by server ID"),
        (
            "unroutable",
            "short headers whose server ID maps to no server: dropped",
        ),
        (
            "by_hash",
            "packets routed by the hash of the client's address and port",
        ),
        (
            "answers",
            "the servers' packets to clients, sent from the public address",
        ),
    ] {
        let _ = writeln!(w, "\t# {what}\n\tcounter {name} {{}}");
    }
    let _ = writeln!(
        w,
        "\tchain prerouting {{\n\t\ttype filter hook prerouting priority raw; policy accept;\n\t\t{ip} daddr {vip} udp dport {port} notrack goto quic\n\t\t{ip} saddr {{ {servers} }} udp sport {port} notrack\n\t}}"
    );
    let _ = writeln!(w, "\tchain quic {{");
    if !p.by_address {
        let _ = writeln!(
            w,
            "\t\t# Short header (first bit 0): by the server ID after the first octet 0x{fo:02x}.\n\t\t@th,64,1 0 @th,{sfo},8 0x{fo:02x} {ip} daddr set @th,{ssid},{bits} map @server_short counter name by_server_id accept\n\t\t@th,64,1 0 counter name unroutable drop\n\t\t# Long header with a server's connection ID ({len} bytes, first octet 0x{fo:02x}).\n\t\t@th,{ldl},8 {len} @th,{lfo},8 0x{fo:02x} {ip} daddr set @th,{lsid},{bits} map @server_long counter name by_server_id accept",
            fo = c.first_octet(),
            sfo = o.short_first_octet,
            ssid = o.short_server_id,
            bits = o.server_id_bits,
            len = c.cid_len(),
            ldl = o.long_dcid_len,
            lfo = o.long_first_octet,
            lsid = o.long_server_id,
        );
        let _ = writeln!(
            w,
            "\t\t# Any other long header (a client's first Initials, 0-RTT): by a hash of its address and port."
        );
    } else {
        let _ = writeln!(
            w,
            "\t\t# Every packet: by a hash of the client's address and port."
        );
    }
    let _ = writeln!(
        w,
        "\t\t{ip} daddr set {hash} map {{ {buckets} }} counter name by_hash accept\n\t}}"
    );
    let _ = writeln!(
        w,
        "\tchain postrouting {{\n\t\ttype filter hook postrouting priority srcnat; policy accept;\n\t\t# The servers' answers leave from the public address.\n\t\t{ip} saddr {{ {servers} }} udp sport {port} {ip} saddr set {vip} counter name answers\n\t}}\n}}"
    );
    r
}

/// The plan of the fleet testbed (`testbed up fleet`): its three servers
/// behind its public address, with its configuration.
pub fn fleet_plan() -> Plan {
    use crate::testbed::fleet;
    Plan {
        public: SocketAddr::new(fleet::PUBLIC_ADDR.into(), fleet::PORT),
        config: LbConfig::parse(fleet::LB_CONFIG).expect("the fleet's configuration is valid"),
        servers: fleet::SERVERS
            .iter()
            .map(|s| Server {
                id: ServerId::parse_hex(s.id).expect("the fleet's server IDs are valid"),
                addr: s.addr.into(),
            })
            .collect(),
        drain: Vec::new(),
        by_address: false,
        buckets: 64,
        table: "fastudp_lb".into(),
    }
}

/// Runs `fastudp quic lb-rules`.
pub fn run(a: LbRulesArgs) -> anyhow::Result<()> {
    let p = Plan::from_args(&a)?;
    out!("{}", ruleset(&p).trim_end())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(servers: &[(&str, &str)], drain: &[&str]) -> Plan {
        let public: SocketAddr = "10.201.0.2:4433".parse().unwrap();
        let p = Plan {
            public,
            config: LbConfig::parse("0:1:8").unwrap(),
            servers: servers
                .iter()
                .map(|(id, a)| parse_server(&format!("{id}={a}"), public).unwrap())
                .collect(),
            drain: drain
                .iter()
                .map(|d| ServerId::parse_hex(d).unwrap())
                .collect(),
            by_address: false,
            buckets: 6,
            table: "fastudp_lb".into(),
        };
        p.check().unwrap();
        p
    }

    #[test]
    fn the_fleet_plan_is_valid() {
        let p = fleet_plan();
        p.check().unwrap();
        assert_eq!(p.servers.len(), 3);
    }

    #[test]
    fn offsets_count_bits_from_the_udp_header() {
        let o = offsets(&LbConfig::parse("0:2:6").unwrap());
        // Short header: flags at payload byte 0, the DCID's first octet at
        // byte 1, its server ID at byte 2.
        assert_eq!(o.short_first_octet, 64 + 8);
        assert_eq!(o.short_server_id, 64 + 16);
        // Long header: flags, 4 bytes of version, DCID length at byte 5,
        // the DCID at byte 6.
        assert_eq!(o.long_dcid_len, 64 + 40);
        assert_eq!(o.long_first_octet, 64 + 48);
        assert_eq!(o.long_server_id, 64 + 56);
        assert_eq!(o.server_id_bits, 16);
    }

    #[test]
    fn rules_name_the_fields_and_servers() {
        let p = plan(&[("01", "10.202.1.2"), ("02", "10.202.2.2")], &[]);
        let r = ruleset(&p);
        assert!(r.contains("typeof @th,80,8 : ip daddr"), "{r}");
        assert!(r.contains("typeof @th,120,8 : ip daddr"), "{r}");
        assert!(
            r.contains("elements = { 0x01 : 10.202.1.2, 0x02 : 10.202.2.2 }"),
            "{r}"
        );
        assert!(
            r.contains("@th,64,1 0 @th,72,8 0x09 ip daddr set @th,80,8 map @server_short"),
            "{r}"
        );
        assert!(
            r.contains("@th,104,8 10 @th,112,8 0x09 ip daddr set @th,120,8 map @server_long"),
            "{r}"
        );
        assert!(r.contains("jhash ip saddr . udp sport mod 6 seed 0xfa570001 map { 0 : 10.202.1.2, 1 : 10.202.2.2, 2 : 10.202.1.2"), "{r}");
        assert!(
            r.contains(
                "ip saddr { 10.202.1.2, 10.202.2.2 } udp sport 4433 ip saddr set 10.201.0.2 counter name answers"
            ),
            "{r}"
        );
        assert!(
            r.contains("ip daddr 10.201.0.2 udp dport 4433 notrack goto quic"),
            "{r}"
        );
    }

    /// Every counter and map a rule names is declared in the table.
    #[test]
    fn every_name_a_rule_uses_is_declared() {
        for by_address in [false, true] {
            let mut p = plan(&[("01", "10.202.1.2"), ("02", "10.202.2.2")], &[]);
            p.by_address = by_address;
            let r = ruleset(&p);
            for (used, declared) in [("counter name ", "counter "), ("map @", "map ")] {
                for (i, _) in r.match_indices(used) {
                    let name: String = r[i + used.len()..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    assert!(
                        r.contains(&format!("{declared}{name} {{")),
                        "{name} is used, not declared:\n{r}"
                    );
                }
            }
        }
    }

    #[test]
    fn by_address_has_no_server_id_maps() {
        let mut p = plan(&[("01", "10.202.1.2"), ("02", "10.202.2.2")], &[]);
        p.by_address = true;
        let r = ruleset(&p);
        assert!(!r.contains("server_short") && !r.contains("@th"), "{r}");
        assert!(
            r.contains("ip daddr set jhash ip saddr . udp sport mod 6"),
            "{r}"
        );
    }

    /// Draining moves the drained server's buckets only, to the others in
    /// turn; its server ID still routes.
    #[test]
    fn drain_moves_only_the_drained_buckets() {
        let all = [("01", "10.0.0.1"), ("02", "10.0.0.2"), ("03", "10.0.0.3")];
        let before = plan(&all, &[]).bucket_map();
        let after = plan(&all, &["02"]).bucket_map();
        let two: IpAddr = "10.0.0.2".parse().unwrap();
        assert!(before.contains(&two));
        assert!(!after.contains(&two));
        for (b, a) in before.iter().zip(&after) {
            if *b != two {
                assert_eq!(a, b, "a bucket of a server not drained moved");
            }
        }
        let r = ruleset(&plan(&all, &["02"]));
        assert!(r.contains("0x02 : 10.0.0.2"), "{r}");
        // Two IDs at one address (one taken over by a peer) count once.
        let p = plan(&[("01", "10.0.0.1"), ("02", "10.0.0.1")], &[]);
        assert_eq!(
            p.bucket_map(),
            vec!["10.0.0.1".parse::<IpAddr>().unwrap(); 6]
        );
    }

    #[test]
    fn bad_plans_are_usage_errors() {
        let public: SocketAddr = "10.201.0.2:4433".parse().unwrap();
        for (s, want) in [
            ("01", "give ID=ADDR"),
            ("zz=10.0.0.1", "hexadecimal"),
            ("01=10.0.0.1:4434", "not the public port"),
            ("01=fd00::1", "one address family"),
            ("01=nowhere", "not an address"),
        ] {
            let e = parse_server(s, public).unwrap_err();
            assert!(format!("{e:#}").contains(want), "{s}: {e:#}");
            assert_eq!(crate::failure::exit_status(&e), 2);
        }
        assert!(parse_server("01=10.0.0.1:4433", public).is_ok());
        let mut p = plan(&[("01", "10.0.0.1")], &[]);
        p.drain = vec![ServerId::parse_hex("01").unwrap()];
        assert!(format!("{:#}", p.check().unwrap_err()).contains("every server is drained"));
        p.drain = vec![ServerId::parse_hex("09").unwrap()];
        assert!(format!("{:#}", p.check().unwrap_err()).contains("no --server has that ID"));
        p.drain.clear();
        p.servers.push(p.servers[0].clone());
        assert!(format!("{:#}", p.check().unwrap_err()).contains("given twice"));
        p.servers.pop();
        p.servers[0].id = ServerId::parse_hex("0102").unwrap();
        assert!(format!("{:#}", p.check().unwrap_err()).contains("says 1"));
        let mut p = plan(&[("01", "10.0.0.1")], &[]);
        p.table = "a b".into();
        assert!(p.check().is_err());
    }

    #[test]
    fn ipv6_uses_the_ip6_family() {
        let public: SocketAddr = "[fd00::2]:443".parse().unwrap();
        let p = Plan {
            public,
            config: LbConfig::parse("1:2:6").unwrap(),
            servers: vec![parse_server("0a0b=[fd00:1::2]:443", public).unwrap()],
            drain: vec![],
            by_address: false,
            buckets: 4,
            table: "t".into(),
        };
        p.check().unwrap();
        let r = ruleset(&p);
        assert!(r.contains("table ip6 t {"), "{r}");
        assert!(r.contains("typeof @th,80,16 : ip6 daddr"), "{r}");
        assert!(r.contains("0x0a0b : fd00:1::2"), "{r}");
        assert!(r.contains("@th,72,8 0x28"), "{r}");
        assert!(r.contains("jhash ip6 saddr . udp sport mod 4"), "{r}");
    }
}
