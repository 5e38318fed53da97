//! Gives the shared library the name it is installed under: the soname
//! `libfastudp.so.MAJOR.MINOR` while the major version is 0 (a minor
//! release may change the ABI), `libfastudp.so.MAJOR` after, as cargo-c
//! names libraries. `scripts/capi.sh install` installs the file under that
//! name with the `libfastudp.so` link.

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_default();
    let minor = std::env::var("CARGO_PKG_VERSION_MINOR").unwrap_or_default();
    let soname = if major == "0" {
        format!("libfastudp.so.{major}.{minor}")
    } else {
        format!("libfastudp.so.{major}")
    };
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
