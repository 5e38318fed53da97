//! `--plot FILE.svg`: a bar chart of throughput and CPU cost per byte.

use super::Measurement;
use plotters::prelude::*;

fn label(r: &Measurement) -> String {
    format!("{} -> {}", super::name(r.tx), r.rx)
}

/// Draws one bar per run: Gbit/s on the left, sender and receiver CPU ns
/// per byte on the right.
pub fn svg(path: &str, title: &str, rs: &[Measurement]) -> Result<(), String> {
    if rs.is_empty() {
        return Err("nothing to plot".into());
    }
    let n = rs.len();
    let height = 110 + 34 * n as u32;
    let root = SVGBackend::new(path, (1280, height)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("cannot draw {path}: {e}");
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root
        .titled(title, ("sans-serif", 20))
        .map_err(|e| err(&e))?;
    let (left, right) = root.split_horizontally(700);
    let names: Vec<String> = rs.iter().map(label).collect();
    let y_fmt = |y: &f64| {
        let i = y.floor() as usize;
        if (*y - y.floor() - 0.5).abs() < 1e-6 && i < names.len() {
            names[n - 1 - i].clone()
        } else {
            String::new()
        }
    };

    let gmax = rs.iter().map(|r| r.gbps).fold(0.0, f64::max).max(1e-3) * 1.1;
    let mut c = ChartBuilder::on(&left)
        .margin(10)
        .caption("throughput (Gbit/s)", ("sans-serif", 16))
        .x_label_area_size(30)
        .y_label_area_size(260)
        .build_cartesian_2d(0.0..gmax, 0.0..n as f64)
        .map_err(|e| err(&e))?;
    c.configure_mesh()
        .disable_y_mesh()
        .y_labels(2 * n + 1)
        .y_label_formatter(&y_fmt)
        .draw()
        .map_err(|e| err(&e))?;
    c.draw_series(rs.iter().enumerate().map(|(i, r)| {
        let y = (n - 1 - i) as f64;
        Rectangle::new(
            [(0.0, y + 0.15), (r.gbps, y + 0.85)],
            BLUE.mix(0.7).filled(),
        )
    }))
    .map_err(|e| err(&e))?;

    let cmax = rs
        .iter()
        .map(|r| r.tx_cpu_ns_per_byte + r.rx_cpu_ns_per_byte)
        .fold(0.0, f64::max)
        .max(1e-3)
        * 1.1;
    let mut c = ChartBuilder::on(&right)
        .margin(10)
        .caption("CPU ns per byte (sender + receiver)", ("sans-serif", 16))
        .x_label_area_size(30)
        .y_label_area_size(10)
        .build_cartesian_2d(0.0..cmax, 0.0..n as f64)
        .map_err(|e| err(&e))?;
    c.configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .draw()
        .map_err(|e| err(&e))?;
    c.draw_series(rs.iter().enumerate().map(|(i, r)| {
        let y = (n - 1 - i) as f64;
        Rectangle::new(
            [(0.0, y + 0.15), (r.tx_cpu_ns_per_byte, y + 0.85)],
            RED.mix(0.7).filled(),
        )
    }))
    .map_err(|e| err(&e))?
    .label("sender")
    .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], RED.mix(0.7).filled()));
    c.draw_series(rs.iter().enumerate().map(|(i, r)| {
        let y = (n - 1 - i) as f64;
        let a = r.tx_cpu_ns_per_byte;
        Rectangle::new(
            [(a, y + 0.15), (a + r.rx_cpu_ns_per_byte, y + 0.85)],
            GREEN.mix(0.7).filled(),
        )
    }))
    .map_err(|e| err(&e))?
    .label("receiver")
    .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], GREEN.mix(0.7).filled()));
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
