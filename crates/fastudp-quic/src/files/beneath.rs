//! Opening a file beneath a directory, with the kernel as the judge.
//!
//! A server that maps request paths to files must never open anything
//! outside its directory. String checks on the path (`..`, `%2e%2e`,
//! absolute paths, symbolic links that lead out) can be fooled; Linux's
//! `openat2(2)` (5.6+) resolves the path inside a directory file
//! descriptor and refuses every escape itself. [`open_beneath`] is that
//! call (rustix's safe wrapper) with the flags a file server wants.

use std::fs::File;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;

/// Opens `path`, relative to the directory `dir`, for reading, refusing
/// anything that does not resolve inside `dir` without a symbolic link.
///
/// This is `openat2(2)` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
/// RESOLVE_NO_MAGICLINKS` and `O_RDONLY | O_CLOEXEC | O_NOCTTY |
/// O_NONBLOCK`. The kernel checks every component of the path:
///
/// - `..` above `dir` or an absolute path fails with `EXDEV`;
/// - a symbolic link anywhere in the path fails with `ELOOP`, even one
///   whose target stays inside `dir` (stricter than "nothing outside",
///   and immune to a link changed between a check and the open);
/// - `/proc` magic links fail with `ELOOP` as well.
///
/// `O_NONBLOCK` lets a FIFO with no writer open at once instead of
/// blocking the caller; the file's type is the caller's to check
/// (`File::metadata`) before it reads. A NUL byte in `path` is an
/// `InvalidInput` error.
///
/// There is no fallback to checking the path as a string. Where
/// `openat2(2)` is missing (Linux before 5.6, or a seccomp filter that
/// refuses it with `ENOSYS` or `EPERM`), the error says so, with kind
/// `Unsupported` (`ENOSYS`) or `PermissionDenied` (`EPERM`). On other
/// systems every call fails with `Unsupported`.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) fn open_beneath(dir: BorrowedFd<'_>, path: &Path) -> io::Result<File> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    rustix::fs::openat2(
        dir,
        path,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map(File::from)
    .map_err(|e| explain(e.into()))
}

/// `openat2(2)` is Linux-only: without it no path can be opened safely
/// beneath a directory, so this refuses.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(crate) fn open_beneath(_dir: BorrowedFd<'_>, _path: &Path) -> io::Result<File> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "opening a file beneath a directory needs openat2(2), which is Linux-only",
    ))
}

/// The errors that mean "openat2(2) itself is unavailable", turned into
/// one that says so; every other error is returned as the kernel gave it.
#[cfg_attr(not(any(target_os = "linux", target_os = "android")), allow(dead_code))]
fn explain(e: io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(libc::ENOSYS) => io::Error::new(
            io::ErrorKind::Unsupported,
            "openat2(2) is not available (ENOSYS): it needs Linux 5.6 or later and no \
             seccomp filter refusing it; files are never opened without it",
        ),
        Some(libc::EPERM) => io::Error::new(
            io::ErrorKind::PermissionDenied,
            "openat2(2) was refused with EPERM (a seccomp filter or a security module); \
             files are never opened without it",
        ),
        _ => e,
    }
}

#[cfg(all(test, any(target_os = "linux", target_os = "android")))]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileTypeExt;
    use std::path::PathBuf;

    /// A fresh directory under the system's temporary directory, removed
    /// when dropped.
    struct TempDir(PathBuf);
    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let p = std::env::temp_dir().join(format!(
                "fastudp-quic-beneath-{tag}-{}-{:?}",
                std::process::id(),
                std::time::SystemTime::now()
            ));
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// `root/` holds `www/` (the served directory) and `secret` beside it.
    fn tree(tag: &str) -> (TempDir, File) {
        let t = TempDir::new(tag);
        let www = t.0.join("www");
        std::fs::create_dir_all(www.join("sub")).unwrap();
        std::fs::write(www.join("a.txt"), b"inside").unwrap();
        std::fs::write(www.join("sub/b.txt"), b"deeper").unwrap();
        std::fs::write(t.0.join("secret"), b"outside").unwrap();
        std::os::unix::fs::symlink("a.txt", www.join("link-in")).unwrap();
        std::os::unix::fs::symlink("../secret", www.join("link-out")).unwrap();
        std::os::unix::fs::symlink("sub", www.join("dirlink")).unwrap();
        let dir = File::open(&www).unwrap();
        (t, dir)
    }

    fn read(dir: &File, p: &str) -> io::Result<Vec<u8>> {
        use std::io::Read;
        let mut f = open_beneath(dir.as_fd(), Path::new(p))?;
        let mut v = Vec::new();
        f.read_to_end(&mut v)?;
        Ok(v)
    }

    fn errno(r: io::Result<Vec<u8>>) -> i32 {
        match r {
            Ok(v) => panic!("opened, read {:?}", String::from_utf8_lossy(&v)),
            Err(e) => e
                .raw_os_error()
                .unwrap_or_else(|| panic!("not an OS error: {e}")),
        }
    }

    #[test]
    fn opens_files_inside() {
        let (_t, dir) = tree("inside");
        assert_eq!(read(&dir, "a.txt").unwrap(), b"inside");
        assert_eq!(read(&dir, "sub/b.txt").unwrap(), b"deeper");
        assert_eq!(read(&dir, "./sub/../a.txt").unwrap(), b"inside");
        assert_eq!(errno(read(&dir, "missing")), libc::ENOENT);
        assert_eq!(errno(read(&dir, "a.txt/x")), libc::ENOTDIR);
    }

    #[test]
    fn refuses_escapes_with_exdev() {
        let (_t, dir) = tree("escape");
        for p in [
            "../secret",
            "sub/../../secret",
            "/etc/passwd",
            "..",
            "sub/../..",
        ] {
            assert_eq!(errno(read(&dir, p)), libc::EXDEV, "{p}");
        }
    }

    #[test]
    fn refuses_every_symlink_with_eloop() {
        let (_t, dir) = tree("symlink");
        // Out, in (stricter than asked), and as a directory component.
        for p in ["link-out", "link-in", "dirlink/b.txt"] {
            assert_eq!(errno(read(&dir, p)), libc::ELOOP, "{p}");
        }
    }

    #[test]
    fn refuses_magic_links() {
        // /proc/self/cwd and /proc/self/root are magic links.
        let Ok(proc) = File::open("/proc/self") else {
            fastudp_test_support::note(&fastudp_test_support::current_test(), "no /proc");
            return;
        };
        for p in ["cwd", "root/etc/passwd"] {
            let r = open_beneath(proc.as_fd(), Path::new(p)).map(drop);
            assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::ELOOP), "{p}");
        }
    }

    #[test]
    fn a_fifo_opens_without_blocking() {
        let (t, dir) = tree("fifo");
        // mkfifo is not in std: mkfifo(1) makes it.
        let made = std::process::Command::new("mkfifo")
            .arg(t.0.join("www/fifo"))
            .status()
            .is_ok_and(|s| s.success());
        if !made {
            fastudp_test_support::note(&fastudp_test_support::current_test(), "mkfifo(1) failed");
            return;
        }
        // Without O_NONBLOCK this would wait for a writer forever.
        let f = open_beneath(dir.as_fd(), Path::new("fifo")).unwrap();
        assert!(f.metadata().unwrap().file_type().is_fifo());
    }

    #[test]
    fn a_nul_in_the_path_is_invalid_input() {
        let (_t, dir) = tree("nul");
        let e = open_beneath(dir.as_fd(), Path::new("a.txt\0")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn enosys_and_eperm_say_openat2_is_unavailable() {
        let e = explain(io::Error::from_raw_os_error(libc::ENOSYS));
        assert_eq!(e.kind(), io::ErrorKind::Unsupported);
        assert!(e.to_string().contains("openat2(2) is not available"), "{e}");
        let e = explain(io::Error::from_raw_os_error(libc::EPERM));
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("EPERM"), "{e}");
        let e = explain(io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    }
}
