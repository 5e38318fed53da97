//! Prints the ethtool features, driver and channels of a device:
//! `cargo run -p fastudp-io --example features -- lo`.
fn main() {
    let dev = std::env::args().nth(1).unwrap_or_else(|| "lo".into());
    match fastudp_tools::host::features(&dev) {
        Ok(fs) => {
            println!("{} features", fs.len());
            for f in fs {
                let fixed = if f.changeable { "" } else { " [fixed]" };
                println!("{}: {}{fixed}", f.name, if f.active { "on" } else { "off" });
            }
        }
        Err(e) => eprintln!("{dev}: {e}"),
    }
    println!("driver: {:?}", fastudp_tools::host::driver(&dev));
    println!("channels: {:?}", fastudp_tools::host::channels(&dev));
}
