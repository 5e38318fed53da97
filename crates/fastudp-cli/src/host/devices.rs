//! The network devices of this namespace, from sysfs.

/// The gro_flush_timeout `tune` sets on a veth, in ns.
pub const GRO_FLUSH_NS: u64 = 50_000;
/// The `napi_defer_hard_irqs` tune sets on a veth: with
/// `gro_flush_timeout`, the NAPI poll waits for the timer instead of
/// running for every few packets (BENCHMARKS §15: UDP GSO+GRO at equal
/// segmentation).
pub const NAPI_DEFER: u64 = 2;

/// Reads `/sys/class/net/<dev>/<file>`, trimmed.
pub fn sysfs(dev: &str, file: &str) -> anyhow::Result<String> {
    use anyhow::Context;
    let p = format!("/sys/class/net/{dev}/{file}");
    std::fs::read_to_string(&p)
        .map(|v| v.trim().to_string())
        .with_context(|| format!("cannot read {p}"))
}

/// Devices that are up in this namespace.
pub fn up_devices() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.retain(|d| {
        sysfs(d, "flags")
            .ok()
            .and_then(|f| u32::from_str_radix(f.trim_start_matches("0x"), 16).ok())
            .is_some_and(|f| f & 1 != 0)
    });
    v.sort();
    v
}

/// A kernel interface name as the kernel accepts it (`dev_valid_name`):
/// 1 to 15 bytes, not `.` or `..`, no `/`, `:` or white space.
pub fn valid_dev_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() < 16
        && name != "."
        && name != ".."
        && !name.contains(['/', ':'])
        && !name.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// Whether `name` is a network device of this namespace: a valid
/// interface name (1 to 15 bytes, no `/`, whitespace or `:`, not `.` or
/// `..`) that sysfs lists.
pub fn is_device(name: &str) -> bool {
    valid_dev_name(name) && std::path::Path::new(&format!("/sys/class/net/{name}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_are_checked() {
        assert!(is_device("lo"));
        for bad in [
            "",
            ".",
            "..",
            "lo/..",
            "../lo",
            "nonexistent0",
            "a b",
            "0123456789abcdefg",
        ] {
            assert!(!is_device(bad), "{bad:?}");
        }
    }
}
