//! Sets `cfg(fastudp_tools)`: the library's `sys` and `wire` sources,
//! compiled here too, then include the items only the tools use.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(fastudp_tools)");
    println!("cargo::rustc-cfg=fastudp_tools");
}
