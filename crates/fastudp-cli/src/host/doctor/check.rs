//! A finding of `fastudp doctor`: its verdict, why, and the fix.

use serde::Serialize;
use std::collections::BTreeMap;

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    /// Good.
    Pass,
    /// Works, but slower than it could be.
    Warn,
    /// Broken.
    Fail,
    /// Does not apply, or could not be read.
    #[serde(rename = "N/A")]
    NA,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Status::Pass => "PASS",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
            Status::NA => "N/A",
        })
    }
}

/// One finding.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// `kernel`, `device <name>`, `qdisc <name>`, `sysctl` or `udp`.
    pub section: String,
    /// What was checked.
    pub name: String,
    /// The verdict.
    pub status: Status,
    /// One line saying why.
    pub detail: String,
    /// The exact command that fixes a WARN or FAIL.
    pub fix: Option<String>,
    /// The numbers the check read, by name (such as `mtu`, `value` and
    /// `minimum`, `count`); empty where it read none.
    pub values: BTreeMap<&'static str, u64>,
}

impl Check {
    /// The check, with the number `v` it read, named `name`.
    pub fn with(mut self, name: &'static str, v: u64) -> Check {
        self.values.insert(name, v);
        self
    }
}

/// A finding.
pub fn check(
    section: &str,
    name: &str,
    status: Status,
    detail: impl Into<String>,
    fix: Option<String>,
) -> Check {
    Check {
        section: section.into(),
        name: name.into(),
        status,
        detail: detail.into(),
        fix,
        values: BTreeMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names() {
        assert_eq!(Status::NA.to_string(), "N/A");
        assert_eq!(serde_json::to_string(&Status::Warn).unwrap(), "\"WARN\"");
        assert_eq!(serde_json::to_string(&Status::NA).unwrap(), "\"N/A\"");
    }
}
