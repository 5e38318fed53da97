//! The static-file server's request-path parser
//! (`fastudp_quic::files::request_path`), on any request target. A client
//! chooses these bytes, and the path it yields is what the server opens.
//!
//! Input: the request target's bytes.
//!
//! Checks: no panic; an accepted path is relative (no leading `/`), has
//! no `..` component and no NUL, is UTF-8, not empty, not longer than
//! `MAX_PATH` plus `index.html`, and ends in `index.html` when it named a
//! directory. Every byte of it percent-encoded again parses back to the
//! same path (one decoding, nothing else changed). A plain target (a
//! leading `/`, no `%`, `?`, `#` or NUL, UTF-8, short enough) is judged
//! by a second, independent rule: refused as absolute or `..` exactly
//! when that rule says so, otherwise accepted unchanged. A refusal counts
//! as an escape only for `Absolute` and `DotDot`.

#![no_main]

use fastudp_quic::files::{request_path, PathError, INDEX, MAX_PATH};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match request_path(data) {
        Ok(p) => {
            let s = p.as_str();
            assert!(!s.is_empty());
            assert!(!s.starts_with('/'), "{s:?} is absolute");
            assert!(!s.split('/').any(|c| c == ".."), "{s:?} has ..");
            assert!(!s.contains('\0'));
            assert!(s.len() <= MAX_PATH + INDEX.len());
            assert!(!s.ends_with('/'));
            // Re-encoded, every byte as %XX: the same path.
            if s.len() <= MAX_PATH {
                let mut enc = b"/".to_vec();
                for b in s.bytes() {
                    enc.extend_from_slice(format!("%{b:02X}").as_bytes());
                }
                assert_eq!(request_path(&enc).as_ref(), Ok(&p), "{s:?} re-encoded");
            }
        }
        Err(e) => {
            assert_eq!(
                e.is_escape(),
                matches!(e, PathError::Absolute | PathError::DotDot)
            );
        }
    }
    // The independent rule, for targets with nothing to decode.
    let plain = data.first() == Some(&b'/')
        && !data.iter().any(|&b| matches!(b, b'%' | b'?' | b'#' | 0))
        && data.len() <= MAX_PATH + 1;
    if let (true, Ok(text)) = (plain, std::str::from_utf8(data)) {
        let rest = &text[1..];
        let got = request_path(data);
        if rest.starts_with('/') {
            assert_eq!(got, Err(PathError::Absolute));
        } else if rest.split('/').any(|c| c == "..") {
            assert_eq!(got, Err(PathError::DotDot));
        } else {
            let want = if rest.is_empty() || rest.ends_with('/') {
                format!("{rest}{INDEX}")
            } else {
                rest.to_string()
            };
            assert_eq!(got.map(|p| p.as_str().to_string()), Ok(want));
        }
    }
});
