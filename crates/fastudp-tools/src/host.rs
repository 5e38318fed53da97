//! Host and device facts for diagnostics: ethtool features, channels and
//! driver through the `SIOCETHTOOL` ioctl (no ethtool program), in the
//! network namespace of the calling thread.
//!
//! Not part of the library's API: it exists for the `fastudp` command
//! and may change at any time.

use crate::ethtool::{self as et, Channels};
use crate::sys;
use std::io;

/// One netdev feature, as `ethtool -k` shows it (by its kernel name, such
/// as `rx-gro` for "generic-receive-offload").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicFeature {
    /// The kernel's name (`tx-udp-segmentation`, `rx-gro`, ...).
    pub name: String,
    /// In effect now.
    pub active: bool,
    /// Asked for (may differ from `active` when a dependency is off).
    pub requested: bool,
    /// Can be changed on this device (not "fixed").
    pub changeable: bool,
}

/// Every feature of device `ifname`, in the kernel's order.
pub fn features(ifname: &str) -> io::Result<Vec<NicFeature>> {
    let mut info = et::sset_info_request();
    sys::ethtool_ioctl(ifname, &mut info)?;
    let count = et::sset_info_count(&info).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::Unsupported,
            "the kernel has no feature-name string set",
        )
    })?;
    // The length must be exactly the count: kernels since 6.19 (and stable
    // trees) answer a different non-zero length with no strings at all, and
    // older ones write `count` strings whatever the length says.
    let mut names = et::gstrings_request(count);
    sys::ethtool_ioctl(ifname, &mut names)?;
    let names = et::gstrings_names(&names);

    let mut bits = et::gfeatures_request(names.len().max(count));
    sys::ethtool_ioctl(ifname, &mut bits)?;
    Ok(names
        .into_iter()
        .enumerate()
        .filter_map(|(i, name)| {
            et::gfeatures_bit(&bits, i).map(|b| NicFeature {
                name,
                active: b.active,
                requested: b.requested,
                changeable: b.available && !b.never_changed,
            })
        })
        .collect())
}

/// Turns features of `ifname` on or off, by kernel name. Every name must
/// exist and be changeable, or nothing is changed and the error says which.
pub fn set_features(ifname: &str, changes: &[(&str, bool)]) -> io::Result<()> {
    let all = features(ifname)?;
    let mut idx = Vec::new();
    for (name, on) in changes {
        match all.iter().position(|f| f.name == *name) {
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{ifname} has no feature {name}"),
                ))
            }
            Some(i) if !all[i].changeable && all[i].active != *on => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("{ifname} cannot change {name} (fixed by its driver)"),
                ))
            }
            Some(i) => idx.push((i, *on)),
        }
    }
    let mut req = et::sfeatures_request(all.len(), &idx);
    sys::ethtool_ioctl(ifname, &mut req)
}

/// The channel (queue) counts of `ifname` (`ethtool -l`).
pub fn channels(ifname: &str) -> io::Result<Channels> {
    let mut b = Channels::get_request();
    sys::ethtool_ioctl(ifname, &mut b)?;
    Channels::decode(&b).ok_or_else(|| io::Error::other("short GCHANNELS reply"))
}

/// Sets the channel counts of `ifname` (`ethtool -L`).
pub fn set_channels(ifname: &str, c: &Channels) -> io::Result<()> {
    let mut b = c.set_request();
    sys::ethtool_ioctl(ifname, &mut b)
}

/// The driver of `ifname` (`ethtool -i`), such as `veth`.
pub fn driver(ifname: &str) -> io::Result<String> {
    let mut b = et::drvinfo_request();
    sys::ethtool_ioctl(ifname, &mut b)?;
    Ok(et::drvinfo_driver(&b))
}
