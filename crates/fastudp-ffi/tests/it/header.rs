//! The header drift check: `include/fastudp.h` (checked in) must be what
//! cbindgen generates from this crate now. After a deliberate change to
//! the C API, regenerate it with
//!
//!     FASTUDP_BLESS=1 cargo test -p fastudp-ffi --test it -- header::

use std::path::PathBuf;

#[test]
fn checked_in_header_matches_the_code() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let header = crate_dir.join("../../include/fastudp.h");
    let mut config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("crates/fastudp-ffi/cbindgen.toml");
    // cbindgen exports no string constants: the version string comes from
    // the package version here, so that it cannot drift from it.
    config.after_includes = Some(format!(
        "\n/**\n * The version of this header as a string; fastudp_version() returns the\n \
         * library's.\n */\n#define FASTUDP_VERSION_STRING \"{}\"",
        env!("CARGO_PKG_VERSION")
    ));
    let bindings = cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let generated = String::from_utf8(generated).expect("the header is UTF-8");
    if std::env::var_os("FASTUDP_BLESS").is_some() {
        std::fs::write(&header, &generated).expect("write include/fastudp.h");
        eprintln!("wrote {}", header.display());
        return;
    }
    let checked_in = std::fs::read_to_string(&header).unwrap_or_default();
    if checked_in != generated {
        let first = checked_in
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| checked_in.lines().count().min(generated.lines().count()));
        panic!(
            "include/fastudp.h differs from what the code generates (first at line {}):\n  \
             checked in: {:?}\n  generated:  {:?}\n\
             After a deliberate C API change, regenerate it:\n    \
             FASTUDP_BLESS=1 cargo test -p fastudp-ffi --test it -- header::",
            first + 1,
            checked_in.lines().nth(first).unwrap_or("(end of file)"),
            generated.lines().nth(first).unwrap_or("(end of file)"),
        );
    }
    // The header declares every exported function the library has.
    let src = std::fs::read_to_string(crate_dir.join("src/abi.rs")).unwrap();
    for line in src.lines() {
        let line = line.trim_start();
        let Some(rest) = line
            .strip_prefix("pub unsafe extern \"C\" fn ")
            .or_else(|| line.strip_prefix("pub extern \"C\" fn "))
        else {
            continue;
        };
        let name = rest.split('(').next().unwrap();
        assert!(
            generated.contains(&format!("{name}(")),
            "{name} is exported but not in the header"
        );
    }
}
