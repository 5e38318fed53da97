//! tune's state-file parser (`fastudp-cli/src/host/tune/state.rs`,
//! `State::parse`) and the check of each change (`change.rs`,
//! `Change::checked`), on any text. tune runs as root and the file is
//! input like any other.
//!
//! Input: the file's text (not UTF-8: nothing to do).
//!
//! Checks: no panic; a state that parses holds only devices with valid
//! names and checked changes, each setting once, each change's device
//! listed; it is written back (as `tune --apply` saves it) and read again
//! unchanged. A single change that `checked` accepts is in today's form,
//! within tune's ranges, passes the check again unchanged, and so does its
//! inverse.

#![no_main]

use fastudp_fuzz::host::sysctl::SYSCTLS;
use fastudp_fuzz::host::tune::change::{valid_dev_name, Change, TUNE_FEATURES};
use fastudp_fuzz::host::tune::state::{State, STATE_VERSION};
use libfuzzer_sys::fuzz_target;

/// True when `c` is a change `tune --apply` could have made: a listed
/// sysctl with a C `int` value above 0, a feature tune turns on, 1 to 4096
/// channels, a `gro_flush_timeout` that fits the kernel's `u32`, a
/// `napi_defer_hard_irqs` that fits its `s32`.
fn in_range(c: &Change) -> bool {
    match c {
        Change::Sysctl { name, old, new } => {
            SYSCTLS.iter().any(|s| s.0 == name)
                && [old, new].iter().all(|&&v| v >= 1 && v <= i32::MAX as u64)
        }
        Change::Feature { name, .. } => TUNE_FEATURES.contains(&name.as_str()),
        Change::Channels { old, new, .. } => [old.0, old.1, new.0, new.1]
            .iter()
            .all(|v| (1..=4096).contains(v)),
        Change::GroFlushTimeout { old, new, .. } => {
            [old, new].iter().all(|&&v| v <= u64::from(u32::MAX))
        }
        Change::NapiDeferHardIrqs { old, new, .. } => {
            [old, new].iter().all(|&&v| v <= i32::MAX as u64)
        }
        Change::Sysfs { .. } => false,
    }
}

fn check_change(c: &Change) {
    assert!(in_range(c), "{c:?}");
    let again = c.clone().checked();
    assert!(
        again.as_ref().is_ok_and(|a| a == c),
        "checked twice: {again:?}"
    );
    assert!(c.device().is_none_or(valid_dev_name));
    let inv = c.inverse();
    assert_eq!(inv.key(), c.key());
    let checked = inv.clone().checked();
    assert!(
        checked.as_ref().is_ok_and(|x| *x == inv),
        "the inverse is refused: {checked:?}"
    );
    assert!(!c.to_string().is_empty());
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(st) = State::parse(text) {
        assert_eq!(st.version, STATE_VERSION);
        assert!(st.devices.iter().all(|d| valid_dev_name(d)));
        for (i, c) in st.changes.iter().enumerate() {
            check_change(c);
            assert!(
                st.changes[..i].iter().all(|o| o.key() != c.key()),
                "a setting twice"
            );
            if let Some(d) = c.device() {
                assert!(st.devices.iter().any(|x| x == d), "{d} not listed");
            }
        }
        let saved = serde_json::to_string_pretty(&st).expect("a state serializes");
        let read = State::parse(&saved);
        assert!(
            read.as_ref().is_ok_and(|r| *r == st),
            "saved and read again: {read:?}"
        );
    }
    if let Ok(c) = serde_json::from_str::<Change>(text) {
        if let Ok(c) = c.checked() {
            check_change(&c);
        }
    }
});
