//! Which device a destination is routed through, from /proc/net/route and
//! /proc/net/ipv6_route (the main table, longest prefix first).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One route: a prefix and the device it leaves through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Network address.
    pub dest: IpAddr,
    /// Prefix length.
    pub prefix: u8,
    /// Device name.
    pub dev: String,
}

/// Parses `/proc/net/route` (IPv4; addresses in the kernel's byte order).
pub fn parse_v4(text: &str) -> Vec<Route> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let dest = u32::from_str_radix(f.get(1)?, 16).ok()?;
            let mask = u32::from_str_radix(f.get(7)?, 16).ok()?;
            Some(Route {
                dest: IpAddr::V4(Ipv4Addr::from(dest.to_le_bytes())),
                prefix: mask.count_ones() as u8,
                dev: f[0].to_string(),
            })
        })
        .collect()
}

/// Parses `/proc/net/ipv6_route`.
pub fn parse_v6(text: &str) -> Vec<Route> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let hex = f.first()?;
            if hex.len() != 32 {
                return None;
            }
            let mut b = [0u8; 16];
            for (i, x) in b.iter_mut().enumerate() {
                *x = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
            }
            Some(Route {
                dest: IpAddr::V6(Ipv6Addr::from(b)),
                prefix: u8::from_str_radix(f.get(1)?, 16).ok()?,
                dev: f.get(9)?.to_string(),
            })
        })
        .collect()
}

fn matches(r: &Route, ip: IpAddr) -> bool {
    match (r.dest, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = if r.prefix == 0 {
                0
            } else {
                u32::MAX << (32 - r.prefix.min(32))
            };
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = if r.prefix == 0 {
                0
            } else {
                u128::MAX << (128 - r.prefix.min(128) as u32)
            };
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

/// The device of the longest matching prefix (loopback and this host's
/// own addresses, which live in the local table, are the caller's to
/// handle first).
pub fn lookup(routes: &[Route], ip: IpAddr) -> Option<&Route> {
    routes
        .iter()
        .filter(|r| r.dev != "lo" || ip.is_loopback())
        .filter(|r| matches(r, ip))
        .max_by_key(|r| r.prefix)
}

/// The device that carries traffic to `ip` in this network namespace.
pub fn device_for(ip: IpAddr) -> Result<String, String> {
    if ip.is_loopback() {
        return Ok("lo".into());
    }
    // A destination that is one of this host's own addresses goes over lo.
    let probe = std::net::UdpSocket::bind(if ip.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" })
        .and_then(|s| s.connect((ip, 9)).map(|()| s))
        .map_err(|e| format!("no route to {ip}: {e}"))?;
    if probe.local_addr().map(|a| a.ip() == ip).unwrap_or(false) {
        return Ok("lo".into());
    }
    let (path, routes) = match ip {
        IpAddr::V4(_) => (
            "/proc/net/route",
            std::fs::read_to_string("/proc/net/route").map(|t| parse_v4(&t)),
        ),
        IpAddr::V6(_) => (
            "/proc/net/ipv6_route",
            std::fs::read_to_string("/proc/net/ipv6_route").map(|t| parse_v6(&t)),
        ),
    };
    let routes = routes.map_err(|e| format!("cannot read {path}: {e}"))?;
    lookup(&routes, ip)
        .map(|r| r.dev.clone())
        .ok_or_else(|| format!("no route to {ip} in {path}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4: &str =
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
eth0\t00000000\t0102A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
eth0\t0002A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n\
fu-rx\t0000C80A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";

    const V6: &str = "fd00fa57000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001    fu-rx\n\
00000000000000000000000000000001 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000002 00000000 80200001       lo\n\
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003     eth0\n";

    #[test]
    fn v4_longest_prefix() {
        let r = parse_v4(V4);
        assert_eq!(r.len(), 3);
        assert_eq!(r[1].dest, "192.168.2.0".parse::<IpAddr>().unwrap());
        assert_eq!(r[1].prefix, 24);
        assert_eq!(
            lookup(&r, "10.200.0.2".parse().unwrap()).unwrap().dev,
            "fu-rx"
        );
        assert_eq!(
            lookup(&r, "192.168.2.7".parse().unwrap()).unwrap().dev,
            "eth0"
        );
        assert_eq!(lookup(&r, "8.8.8.8".parse().unwrap()).unwrap().prefix, 0);
        assert!(lookup(&r, "::1".parse().unwrap()).is_none());
    }

    #[test]
    fn v6_longest_prefix() {
        let r = parse_v6(V6);
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].prefix, 64);
        assert_eq!(
            lookup(&r, "fd00:fa57::2".parse().unwrap()).unwrap().dev,
            "fu-rx"
        );
        assert_eq!(
            lookup(&r, "2001:db8::1".parse().unwrap()).unwrap().dev,
            "eth0"
        );
        assert!(parse_v6("garbage line\n").is_empty());
    }
}
