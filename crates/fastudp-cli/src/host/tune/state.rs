//! The state file of `tune --apply`: the original value of everything tune
//! changed, so that `tune --revert` can put it back.
//!
//! tune runs as root, so the file is handled as an attacker would like it
//! not to be:
//! - its path is walked from `/` one directory at a time with `openat2`
//!   (`RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH`): a symbolic link anywhere in
//!   it is refused, never followed, and so is a directory that belongs to
//!   another user (who could swap what lies below it) or that other users
//!   can write without the sticky bit;
//! - it is written atomically (a new temporary file with mode 0600 in the
//!   same directory, then a rename), relative to the directory's
//!   descriptor;
//! - its own directory, when other users can write it, is taken only with
//!   the sticky bit and when the file is new (so nobody else can replace
//!   it);
//! - it is read without following a symbolic link, only if it is a
//!   regular file of at most [`MAX_STATE_BYTES`], owned by this user and
//!   writable by nobody else;
//! - every change in it is checked ([`Change::checked`]) before anything is
//!   written.

use super::change::Change;
use anyhow::{anyhow, Context};
use fastudp_tools::os;
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

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
    /// tune could have made ([`Change::checked`]). A refusal is a usage
    /// error: the file is input.
    pub fn parse(text: &str) -> anyhow::Result<State> {
        let st = match serde_json::from_str::<AnyState>(text) {
            Ok(AnyState::Current(s)) => s,
            Ok(AnyState::List(changes)) => State {
                version: 1,
                devices: Vec::new(),
                changes,
            },
            Err(_) => bail_usage!("not a tune state file (expected what tune --apply writes)"),
        };
        if st.version == 0 || st.version > STATE_VERSION {
            bail_usage!(
                "state file version {} is not one this fastudp reads (1 to {STATE_VERSION})",
                st.version
            );
        }
        let mut devices = st.devices;
        for d in &devices {
            if !super::change::valid_dev_name(d) {
                bail_usage!("{d:?} is not a network interface name");
            }
        }
        let mut changes: Vec<Change> = Vec::with_capacity(st.changes.len());
        for (i, c) in st.changes.into_iter().enumerate() {
            let c = c.checked().with_context(|| format!("change {}", i + 1))?;
            if changes.iter().any(|o| o.key() == c.key()) {
                bail_usage!("change {}: \"{c}\" appears twice", i + 1);
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

/// Flags for resolving one name inside a directory descriptor: no
/// symbolic link (of any kind, at any depth), nothing outside it.
const RESOLVE: u64 =
    libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS | libc::RESOLVE_BENEATH;

/// The directory of a state file, opened by walking its path from `/` one
/// component at a time without following a symbolic link. Every directory
/// on the way belongs to root or this user, and none that other users can
/// write lacks the sticky bit: nobody else can swap what lies below. The
/// file is then opened, created and renamed relative to the descriptor, so
/// the directory cannot be exchanged under tune either.
struct StateDir {
    fd: OwnedFd,
    /// The directory's path, to show.
    shown: PathBuf,
    /// Other users may write in it (it is then sticky).
    open: bool,
    /// The state file's name in it.
    name: OsString,
}

impl StateDir {
    /// Resolves `path`'s directory (a relative path from the current
    /// directory's real path), creating missing directories (mode 0700)
    /// when `create`. `Ok(None)` when it does not exist and not `create`.
    /// A path refused (a link, a directory of another user, one others can
    /// write) is a usage error; a failed system call is not.
    fn open(path: &Path, create: bool) -> anyhow::Result<Option<StateDir>> {
        let shown = path.display();
        let abs = if path.is_absolute() {
            path.to_path_buf()
        } else {
            std::env::current_dir()
                .with_context(|| format!("{shown}: the current directory"))?
                .join(path)
        };
        let name = abs
            .file_name()
            .filter(|_| !path.as_os_str().as_encoded_bytes().ends_with(b"/"))
            .ok_or_else(|| usage!("{shown} names no file"))?
            .to_os_string();
        let root = std::fs::File::open("/").context("cannot open /")?;
        let mut fd = OwnedFd::from(root);
        let mut at = PathBuf::from("/");
        check_walked(&fd, &at)?;
        for c in abs.parent().unwrap_or(Path::new("/")).components() {
            let c = match c {
                Component::RootDir | Component::CurDir => continue,
                Component::ParentDir => {
                    bail_usage!(
                        "{shown}: a path with '..' is not taken: give the directory's real path"
                    )
                }
                Component::Normal(c) => c,
                Component::Prefix(_) => bail_usage!("{shown}: not a Unix path"),
            };
            at.push(c);
            let flags = libc::O_PATH | libc::O_DIRECTORY;
            let next = match os::openat2(fd.as_fd(), Path::new(c), flags, 0, RESOLVE) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) && create => {
                    os::mkdirat(fd.as_fd(), Path::new(c), 0o700)
                        .with_context(|| format!("cannot create {}", at.display()))?;
                    os::openat2(fd.as_fd(), Path::new(c), flags, 0, RESOLVE)
                }
                r => r,
            };
            fd = match next {
                Ok(f) => f,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
                Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                    bail_usage!(
                        "{} is a symbolic link: tune never follows one in the state path (give the real path)",
                        at.display()
                    )
                }
                // Not a directory, say: the path given cannot be used.
                Err(e) => bail_usage!("cannot use {}: {e}", at.display()),
            };
            check_walked(&fd, &at)?;
        }
        let m = stat(&fd).with_context(|| format!("cannot stat {}", at.display()))?;
        Ok(Some(StateDir {
            fd,
            shown: at,
            open: others_can_write(&m),
            name,
        }))
    }

    /// The state file's path, to show.
    fn file(&self) -> PathBuf {
        self.shown.join(&self.name)
    }

    /// Checks that the state file may be kept here: a directory nobody
    /// else can write, or a sticky one when the file is new.
    fn check(&self, file_exists: bool) -> anyhow::Result<()> {
        if self.open && file_exists {
            bail_usage!(
                "other users can write in {}, and the file is already there: keep the state file in a directory only you can write (--state)",
                self.shown.display()
            );
        }
        Ok(())
    }
}

/// The metadata of a descriptor (an `O_PATH` one too).
fn stat(fd: &OwnedFd) -> std::io::Result<std::fs::Metadata> {
    let f = std::fs::File::from(fd.try_clone()?);
    f.metadata()
}

/// Checks one directory of a state path: owned by root or this user, and
/// writable by others only if sticky.
fn check_walked(fd: &OwnedFd, at: &Path) -> anyhow::Result<()> {
    let m = stat(fd).with_context(|| format!("cannot stat {}", at.display()))?;
    if m.uid() != 0 && m.uid() != euid() {
        bail_usage!(
            "{} belongs to user {}, neither root nor this user: its owner could swap what lies below it; keep the state file elsewhere (--state)",
            at.display(),
            m.uid()
        );
    }
    if others_can_write(&m) && m.permissions().mode() & 0o1000 == 0 {
        bail_usage!(
            "other users can write in {} (mode {:o}): keep the state file in a directory only you can write (--state)",
            at.display(),
            m.permissions().mode() & 0o7777
        );
    }
    Ok(())
}

/// Opens a state file for reading: no symbolic link, a regular file owned
/// by this user, writable by nobody else. `Ok(None)` when it is absent.
fn open_existing(dir: &StateDir) -> anyhow::Result<Option<std::fs::File>> {
    let path = dir.file();
    let shown = path.display();
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK;
    let f = match os::openat2(dir.fd.as_fd(), Path::new(&dir.name), flags, 0, RESOLVE) {
        Ok(f) => std::fs::File::from(f),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            bail_usage!("{shown} is a symbolic link: tune never follows one (give the real path)")
        }
        Err(e) => return Err(anyhow!(e).context(format!("cannot open {shown}"))),
    };
    let m = f
        .metadata()
        .with_context(|| format!("cannot stat {shown}"))?;
    if !m.is_file() {
        bail_usage!("{shown} is not a regular file");
    }
    if m.uid() != euid() {
        bail_usage!(
            "{shown} belongs to user {}, not to this user: tune did not write it",
            m.uid()
        );
    }
    if others_can_write(&m) {
        bail_usage!(
            "{shown} can be written by other users (mode {:o}): refusing to trust it",
            m.permissions().mode() & 0o7777
        );
    }
    if m.len() > MAX_STATE_BYTES {
        bail_usage!(
            "{shown} is {} bytes, more than a tune state file ({MAX_STATE_BYTES})",
            m.len()
        );
    }
    Ok(Some(f))
}

/// Reads and checks the state file in `dir`.
fn load_in(dir: &StateDir) -> anyhow::Result<Option<State>> {
    let Some(f) = open_existing(dir)? else {
        return Ok(None);
    };
    let mut text = String::new();
    f.take(MAX_STATE_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read {}", dir.file().display()))?;
    State::parse(&text)
        .map(Some)
        .with_context(|| dir.file().display().to_string())
}

/// Reads and checks the state file at `path`; `Ok(None)` when there is
/// none.
pub fn load(path: &Path) -> anyhow::Result<Option<State>> {
    match StateDir::open(path, false)? {
        Some(dir) => load_in(&dir),
        None => Ok(None),
    }
}

/// Checks, before anything is changed, that a state file can be written
/// at `path`, creating its directory (mode 0700) if needed. Returns the
/// state already saved there, if any.
pub fn prepare(path: &Path) -> anyhow::Result<Option<State>> {
    let dir = StateDir::open(path, true)?
        .ok_or_else(|| anyhow!("cannot create the directory of {}", path.display()))?;
    let existing = load_in(&dir)?;
    dir.check(existing.is_some())?;
    Ok(existing)
}

/// Writes `state` to `path` atomically with mode 0600: a new temporary file
/// in the same directory, synced, then renamed over the file (a rename
/// never follows a symbolic link), all relative to the directory's
/// descriptor. [`prepare`] must have passed.
pub fn save(path: &Path, state: &State) -> anyhow::Result<()> {
    let dir = StateDir::open(path, false)?
        .ok_or_else(|| anyhow!("the directory of {} is gone", path.display()))?;
    let json = serde_json::to_string_pretty(state).context("the state as JSON")?;
    let mut tmp = OsString::from(".");
    tmp.push(&dir.name);
    tmp.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let write = || -> std::io::Result<()> {
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        let mut f = std::fs::File::from(os::openat2(dir.fd.as_fd(), &tmp, flags, 0o600, RESOLVE)?);
        f.write_all(json.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        os::renameat(dir.fd.as_fd(), &tmp, Path::new(&dir.name))
    };
    write().map_err(|e| {
        let _ = os::unlinkat(dir.fd.as_fd(), &tmp);
        anyhow!(e).context(format!("cannot write the state file {}", path.display()))
    })
}

/// Puts back what was at `path` before [`save`]: `previous`, or no file.
pub fn restore(path: &Path, previous: Option<&State>) {
    let r = match previous {
        Some(p) => save(path, p),
        None => StateDir::open(path, false).and_then(|d| match d {
            Some(d) => Ok(os::unlinkat(d.fd.as_fd(), Path::new(&d.name))?),
            None => Ok(()),
        }),
    };
    if let Err(e) = r {
        eprintln!(
            "fastudp: warning: could not restore the state file {}: {e:#}",
            path.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::DirBuilderExt;

    /// An error's line, as `main` prints it; a refusal must be a usage
    /// error (exit status 2).
    fn msg(e: anyhow::Error) -> String {
        assert_eq!(crate::failure::exit_status(&e), 2, "{e:#}");
        format!("{e:#}")
    }

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
        let e = msg(prepare(&p).unwrap_err());
        assert!(e.contains("symbolic link"), "{e}");
        assert!(msg(load(&p).unwrap_err()).contains("symbolic link"));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me\n");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// No directory of the state path may be a symbolic link, nor belong
    /// to another user: its owner could point the path anywhere (here at a
    /// directory of root's), and tune would write there as root.
    #[test]
    fn no_directory_of_the_state_path_is_a_link_or_another_users() {
        let d = private_dir("walk");
        let real = d.join("real");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&real)
            .unwrap();
        // A link in the middle of the path (here root's own): refused.
        std::os::unix::fs::symlink(&real, d.join("link")).unwrap();
        let p = d.join("link").join("state.json");
        let e = msg(prepare(&p).unwrap_err());
        assert!(e.contains("symbolic link"), "{e}");
        assert!(save(&p, &sample()).is_err());
        assert!(msg(load(&p).unwrap_err()).contains("symbolic link"));
        // A directory of another user, with a link in it to root's.
        let other = d.join("other");
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&other)
            .unwrap();
        if std::os::unix::fs::chown(&other, Some(65534), Some(65534)).is_ok() {
            std::os::unix::fs::symlink(&real, other.join("link")).unwrap();
            for p in [other.join("link/state.json"), other.join("state.json")] {
                let e = msg(prepare(&p).unwrap_err());
                assert!(e.contains("belongs to user 65534"), "{e}");
            }
        } else {
            eprintln!("not root: the other user's directory is not tested");
        }
        assert_eq!(
            std::fs::read_dir(&real).unwrap().count(),
            0,
            "nothing was written through a link"
        );
        // '..' is not taken either.
        let e = msg(prepare(&real.join("../real/s.json")).unwrap_err());
        assert!(e.contains(".."), "{e}");
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
        let e = msg(prepare(&open.join("s.json")).unwrap_err());
        assert!(e.contains("other users can write"), "{e}");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let p = open.join("s.json");
        assert_eq!(prepare(&p).unwrap(), None, "sticky and new: allowed");
        save(&p, &sample()).unwrap();
        let e = msg(prepare(&p).unwrap_err());
        assert!(e.contains("already there"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_state_file_others_can_write_is_not_trusted() {
        let d = private_dir("ww");
        let p = d.join("s.json");
        save(&p, &sample()).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(msg(load(&p).unwrap_err()).contains("other users"));
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
        let e = msg(State::parse(evil).unwrap_err());
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
