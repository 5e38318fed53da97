//! The state file of `tune --apply`: the original value of everything tune
//! changed, so that `tune --revert` can put it back.
//!
//! tune runs as root, so the file is handled as an attacker would like it
//! not to be:
//! - it is written atomically (a new temporary file with mode 0600 in the
//!   same directory, then a rename), and a symbolic link at its path is
//!   refused, never followed;
//! - a directory that another user can write is refused, unless it has the
//!   sticky bit and the file is new (so nobody else can replace it);
//! - it is read without following a symbolic link, only if it is a
//!   regular file of at most [`MAX_STATE_BYTES`], owned by this user and
//!   writable by nobody else;
//! - every change in it is checked ([`Change::checked`]) before anything is
//!   written.

use super::change::Change;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The largest state file tune reads.
pub const MAX_STATE_BYTES: u64 = 1 << 20;
/// The state file format version written.
pub const STATE_VERSION: u32 = 2;

/// What a state file holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    /// The format version ([`STATE_VERSION`]).
    pub version: u32,
    /// The devices tune was run on, in order.
    pub devices: Vec<String>,
    /// The changes, in the order they were first made; each `old` is the
    /// value before the first `--apply` that changed it.
    pub changes: Vec<Change>,
}

/// Either form of the file: today's, or the bare list of older versions.
#[derive(Deserialize)]
#[serde(untagged)]
enum AnyState {
    Current(State),
    List(Vec<Change>),
}

impl State {
    /// Parses and checks a state file's text: every change must be one
    /// tune could have made ([`Change::checked`]).
    pub fn parse(text: &str) -> Result<State, String> {
        let st = match serde_json::from_str::<AnyState>(text) {
            Ok(AnyState::Current(s)) => s,
            Ok(AnyState::List(changes)) => State {
                version: 1,
                devices: Vec::new(),
                changes,
            },
            Err(_) => {
                return Err("not a tune state file (expected what tune --apply writes)".to_string())
            }
        };
        if st.version == 0 || st.version > STATE_VERSION {
            return Err(format!(
                "state file version {} is not one this fastudp reads (1 to {STATE_VERSION})",
                st.version
            ));
        }
        let mut devices = st.devices;
        for d in &devices {
            if !super::change::valid_dev_name(d) {
                return Err(format!("{d:?} is not a network interface name"));
            }
        }
        let mut changes: Vec<Change> = Vec::with_capacity(st.changes.len());
        for (i, c) in st.changes.into_iter().enumerate() {
            let c = c.checked().map_err(|e| format!("change {}: {e}", i + 1))?;
            if changes.iter().any(|o| o.key() == c.key()) {
                return Err(format!("change {}: \"{c}\" appears twice", i + 1));
            }
            if let Some(d) = c.device() {
                if !devices.iter().any(|x| x == d) {
                    devices.push(d.to_string());
                }
            }
            changes.push(c);
        }
        Ok(State {
            version: STATE_VERSION,
            devices,
            changes,
        })
    }

    /// Adds `later` changes made on `devices`: a setting already here keeps
    /// its first-saved original and takes the later `new`; others are
    /// appended.
    pub fn merge(&mut self, devices: &[String], later: &[Change]) {
        for d in devices {
            if !self.devices.contains(d) {
                self.devices.push(d.clone());
            }
        }
        for c in later {
            match self.changes.iter_mut().find(|o| o.key() == c.key()) {
                Some(o) => o.merge(c),
                None => self.changes.push(c.clone()),
            }
        }
    }
}

/// This process's effective user id (the owner of `/proc/self`).
fn euid() -> u32 {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(0)
}

/// True when a user other than this one may write in a directory or file
/// with these permissions.
fn others_can_write(m: &std::fs::Metadata) -> bool {
    let mode = m.permissions().mode();
    mode & 0o002 != 0
        || (mode & 0o020 != 0 && m.gid() != 0)
        || (m.uid() != euid() && mode & 0o200 != 0)
}

/// `path`'s directory (`.` for a bare file name).
fn dir_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Opens a state file for reading: no symbolic link, a regular file owned
/// by this user, writable by nobody else. `Ok(None)` when it is absent.
fn open_existing(path: &Path) -> Result<Option<std::fs::File>, String> {
    let shown = path.display();
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(format!(
                "{shown} is a symbolic link: tune never follows one (give the real path)"
            ))
        }
        Err(e) => return Err(format!("cannot open {shown}: {e}")),
    };
    let m = f
        .metadata()
        .map_err(|e| format!("cannot stat {shown}: {e}"))?;
    if !m.is_file() {
        return Err(format!("{shown} is not a regular file"));
    }
    if m.uid() != euid() {
        return Err(format!(
            "{shown} belongs to user {}, not to this user: tune did not write it",
            m.uid()
        ));
    }
    if others_can_write(&m) {
        return Err(format!(
            "{shown} can be written by other users (mode {:o}): refusing to trust it",
            m.permissions().mode() & 0o7777
        ));
    }
    if m.len() > MAX_STATE_BYTES {
        return Err(format!(
            "{shown} is {} bytes, more than a tune state file ({MAX_STATE_BYTES})",
            m.len()
        ));
    }
    Ok(Some(f))
}

/// Reads and checks the state file at `path`; `Ok(None)` when there is
/// none.
pub fn load(path: &Path) -> Result<Option<State>, String> {
    let Some(f) = open_existing(path)? else {
        return Ok(None);
    };
    let mut text = String::new();
    f.take(MAX_STATE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    State::parse(&text)
        .map(Some)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Checks that `dir` is a place to keep a state file: a directory that
/// no other user can write, or a sticky one when the file is new.
fn check_dir(dir: &Path, file_exists: bool) -> Result<(), String> {
    let m = std::fs::metadata(dir).map_err(|e| format!("cannot use {}: {e}", dir.display()))?;
    if !m.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if others_can_write(&m) {
        let sticky = m.permissions().mode() & 0o1000 != 0;
        if !sticky || file_exists {
            return Err(format!(
                "other users can write in {} (mode {:o}){}: keep the state file in a directory only you can write (--state)",
                dir.display(),
                m.permissions().mode() & 0o7777,
                if sticky { ", and the file is already there" } else { "" }
            ));
        }
    }
    Ok(())
}

/// Checks, before anything is changed, that a state file can be written
/// at `path`, creating its directory (mode 0700) if needed. Returns the
/// state already saved there, if any.
pub fn prepare(path: &Path) -> Result<Option<State>, String> {
    let dir = dir_of(path);
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let existing = load(path)?;
    check_dir(&dir, existing.is_some())?;
    Ok(existing)
}

/// Writes `state` to `path` atomically with mode 0600: a new temporary file
/// in the same directory, synced, then renamed over `path` (a rename never
/// follows a symbolic link). [`prepare`] must have passed.
pub fn save(path: &Path, state: &State) -> Result<(), String> {
    let dir = dir_of(path);
    let name = path
        .file_name()
        .ok_or_else(|| format!("{} names no file", path.display()))?;
    let json = serde_json::to_string_pretty(state).map_err(|e| e.to_string())?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(json.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write the state file {}: {e}", path.display())
    })
}

/// Puts back what was at `path` before [`save`]: `previous`, or no file.
pub fn restore(path: &Path, previous: Option<&State>) {
    let r = match previous {
        Some(p) => save(path, p),
        None => std::fs::remove_file(path).map_err(|e| e.to_string()),
    };
    if let Err(e) = r {
        eprintln!(
            "fastudp: warning: could not restore the state file {}: {e}",
            path.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn private_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fastudp-state-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
        d
    }

    fn sample() -> State {
        State {
            version: STATE_VERSION,
            devices: vec!["vb".into()],
            changes: vec![Change::GroFlushTimeout {
                dev: "vb".into(),
                old: 0,
                new: 50_000,
            }],
        }
    }

    #[test]
    fn saved_state_is_private_and_reads_back() {
        let d = private_dir("rt");
        let p = d.join("s.json");
        assert_eq!(prepare(&p).unwrap(), None);
        save(&p, &sample()).unwrap();
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        assert_eq!(load(&p).unwrap(), Some(sample()));
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_symlink_at_the_state_path_is_refused_and_its_target_untouched() {
        let d = private_dir("link");
        let target = d.join("important");
        std::fs::write(&target, "keep me\n").unwrap();
        let p = d.join("state.json");
        std::os::unix::fs::symlink(&target, &p).unwrap();
        let e = prepare(&p).unwrap_err();
        assert!(e.contains("symbolic link"), "{e}");
        assert!(load(&p).unwrap_err().contains("symbolic link"));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me\n");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_directory_others_can_write_is_refused_unless_sticky_and_new() {
        let d = private_dir("perm");
        let open = d.join("open");
        std::fs::DirBuilder::new()
            .mode(0o777)
            .create(&open)
            .unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = prepare(&open.join("s.json")).unwrap_err();
        assert!(e.contains("other users can write"), "{e}");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let p = open.join("s.json");
        assert_eq!(prepare(&p).unwrap(), None, "sticky and new: allowed");
        save(&p, &sample()).unwrap();
        let e = prepare(&p).unwrap_err();
        assert!(e.contains("already there"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_state_file_others_can_write_is_not_trusted() {
        let d = private_dir("ww");
        let p = d.join("s.json");
        save(&p, &sample()).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(load(&p).unwrap_err().contains("other users"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_older_list_form_is_read_and_checked() {
        let old = r#"[{"kind":"sysctl","name":"net.core.rmem_max","old":212992,"new":7500000},
                      {"kind":"sysfs","path":"/sys/class/net/vb/gro_flush_timeout","old":"0","new":"50000"}]"#;
        let s = State::parse(old).unwrap();
        assert_eq!(s.devices, vec!["vb".to_string()]);
        assert_eq!(s.changes.len(), 2);
        let evil = r#"[{"kind":"sysctl","name":"net.core.rmem_max","old":212992,"new":7500000},
                       {"kind":"sysfs","path":"/etc/shadow","old":"","new":"x"}]"#;
        let e = State::parse(evil).unwrap_err();
        assert!(e.contains("change 2"), "{e}");
        assert!(State::parse(r#"{"version":9,"devices":[],"changes":[]}"#).is_err());
        assert!(State::parse("{\"not\": \"a list\"}").is_err());
    }

    #[test]
    fn merging_keeps_originals_adds_new_settings_and_devices() {
        let mut s = sample();
        s.merge(
            &["va".into()],
            &[
                Change::GroFlushTimeout {
                    dev: "vb".into(),
                    old: 50_000,
                    new: 60_000,
                },
                Change::Feature {
                    dev: "va".into(),
                    name: "rx-gro".into(),
                    old: false,
                    new: true,
                },
            ],
        );
        assert_eq!(s.devices, vec!["vb".to_string(), "va".to_string()]);
        assert_eq!(
            s.changes[0],
            Change::GroFlushTimeout {
                dev: "vb".into(),
                old: 0,
                new: 60_000
            }
        );
        assert_eq!(s.changes.len(), 2);
    }
}
