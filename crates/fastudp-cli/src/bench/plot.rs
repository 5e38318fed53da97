//! `--plot FILE.svg`: a bar chart of throughput and CPU cost per byte.
//!
//! The colours are from the Okabe-Ito palette, which readers with any
//! common colour-vision deficiency can tell apart; a run that lost
//! datagrams is also marked by a pattern and a label, not colour alone.

use super::Measurement;
use plotters::prelude::*;

/// Okabe-Ito blue: throughput.
pub const BLUE_OI: RGBColor = RGBColor(0, 114, 178);
/// Okabe-Ito orange: the sender's CPU.
pub const ORANGE_OI: RGBColor = RGBColor(230, 159, 0);
/// Okabe-Ito sky blue: the receiver's CPU.
pub const SKY_BLUE_OI: RGBColor = RGBColor(86, 180, 233);
/// Okabe-Ito vermillion: datagrams lost.
pub const VERMILLION_OI: RGBColor = RGBColor(213, 94, 0);

/// The share of the run's datagrams that were lost, if any were.
fn loss(r: &Measurement) -> Option<(u64, f64)> {
    let lost = r.lost.filter(|&l| l > 0)?;
    Some((lost, lost as f64 / r.sent.max(1) as f64))
}

fn label(r: &Measurement) -> String {
    format!("{} -> {}", super::name(r.tx), r.rx)
}

/// Draws one bar per run: Gbit/s on the left, sender and receiver CPU ns
/// per byte on the right.
pub fn svg(path: &str, title: &str, rs: &[Measurement]) -> Result<(), String> {
    let names: Vec<String> = rs.iter().map(label).collect();
    svg_labeled(path, title, rs, &names)
}

/// The same, each bar named by `names` (one per run).
pub fn svg_labeled(
    path: &str,
    title: &str,
    rs: &[Measurement],
    names: &[String],
) -> Result<(), String> {
    if rs.is_empty() || names.len() != rs.len() {
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
    let y_fmt = |y: &f64| {
        let i = y.floor() as usize;
        if (*y - y.floor() - 0.5).abs() < 1e-6 && i < names.len() {
            names[n - 1 - i].clone()
        } else {
            String::new()
        }
    };

    // Room on the right for the loss labels.
    let gmax = rs.iter().map(|r| r.gbps).fold(0.0, f64::max).max(1e-3) * 1.3;
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
            BLUE_OI.mix(0.8).filled(),
        )
    }))
    .map_err(|e| err(&e))?
    .label("throughput")
    .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], BLUE_OI.mix(0.8).filled()));
    // A lossy run: its bar outlined and hatched in vermillion, and the
    // loss written beside it.
    let lossy: Vec<(usize, &Measurement, u64, f64)> = rs
        .iter()
        .enumerate()
        .filter_map(|(i, r)| loss(r).map(|(l, f)| (i, r, l, f)))
        .collect();
    if !lossy.is_empty() {
        c.draw_series(lossy.iter().map(|&(i, r, _, _)| {
            let y = (n - 1 - i) as f64;
            Rectangle::new(
                [(0.0, y + 0.15), (r.gbps, y + 0.85)],
                VERMILLION_OI.stroke_width(3),
            )
        }))
        .map_err(|e| err(&e))?
        .label("lost datagrams")
        .legend(|(x, y)| {
            Rectangle::new([(x, y - 5), (x + 12, y + 5)], VERMILLION_OI.stroke_width(3))
        });
        for &(i, r, _, _) in &lossy {
            let y = (n - 1 - i) as f64;
            let steps = 12;
            c.draw_series((1..steps).map(|k| {
                let x = r.gbps * k as f64 / steps as f64;
                PathElement::new(
                    vec![
                        (x, y + 0.15),
                        ((x + r.gbps / steps as f64).min(r.gbps), y + 0.85),
                    ],
                    VERMILLION_OI.stroke_width(2),
                )
            }))
            .map_err(|e| err(&e))?;
        }
        c.draw_series(lossy.iter().map(|&(i, r, lost, frac)| {
            let y = (n - 1 - i) as f64;
            Text::new(
                format!("lost {lost} ({:.2}%)", frac * 100.0),
                (r.gbps + gmax * 0.01, y + 0.65),
                ("sans-serif", 13).into_font().color(&BLACK),
            )
        }))
        .map_err(|e| err(&e))?;
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
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
            ORANGE_OI.mix(0.85).filled(),
        )
    }))
    .map_err(|e| err(&e))?
    .label("sender")
    .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], ORANGE_OI.mix(0.85).filled()));
    c.draw_series(rs.iter().enumerate().map(|(i, r)| {
        let y = (n - 1 - i) as f64;
        let a = r.tx_cpu_ns_per_byte;
        Rectangle::new(
            [(a, y + 0.15), (a + r.rx_cpu_ns_per_byte, y + 0.85)],
            SKY_BLUE_OI.mix(0.85).filled(),
        )
    }))
    .map_err(|e| err(&e))?
    .label("receiver")
    .legend(|(x, y)| {
        Rectangle::new(
            [(x, y - 5), (x + 12, y + 5)],
            SKY_BLUE_OI.mix(0.85).filled(),
        )
    });
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::TxStrategy;

    fn run(tx: TxStrategy, lost: Option<u64>) -> Measurement {
        Measurement {
            tx,
            rx: "gro-recvmmsg".into(),
            bytes: 1_000_000_000,
            datagrams: 1_000_000,
            seconds: 1.0,
            mbytes_per_sec: 1000.0,
            gbps: 8.0,
            datagrams_per_sec: 1e6,
            tx_calls_per_sec: 1e5,
            bytes_per_call: 1e4,
            rx_calls_per_sec: 1e5,
            tx_cpu_ns_per_byte: 0.5,
            rx_cpu_ns_per_byte: 0.7,
            softirq_ns_per_byte: 0.2,
            all_cpu_ns_per_byte: 1.5,
            sent: 1_477_000,
            lost,
            kernel_drops: 0,
            speedup_vs_sendto: None,
            speedup_vs_recvfrom: None,
            zerocopy_completions: None,
            zerocopy_copied: None,
            host_steal: None,
        }
    }

    fn draw(rs: &[Measurement]) -> String {
        let path = std::env::temp_dir().join(format!(
            "fastudp-plot-test-{}-{}.svg",
            std::process::id(),
            rs.len()
        ));
        let p = path.to_str().unwrap();
        svg(p, "test", rs).unwrap();
        let text = std::fs::read_to_string(p).unwrap();
        let _ = std::fs::remove_file(p);
        text.to_uppercase()
    }

    #[test]
    fn a_lossy_run_is_marked_and_a_clean_one_is_not() {
        let lossy = draw(&[
            run(TxStrategy::Sendto, Some(0)),
            run(TxStrategy::Sendmmsg, Some(477_000)),
        ]);
        assert!(lossy.contains("LOST 477000 (32.30%)"), "no loss label");
        assert!(lossy.contains("#D55E00"), "no vermillion mark");
        let clean = draw(&[run(TxStrategy::Sendto, Some(0)), run(TxStrategy::Tcp, None)]);
        assert!(!clean.contains("LOST 0") && !clean.contains("#D55E00"));
    }

    #[test]
    fn colours_are_okabe_ito_not_pure_red_and_green() {
        let svg = draw(&[run(TxStrategy::Sendto, Some(10))]);
        for pure in ["#FF0000", "#00FF00", "#0000FF"] {
            assert!(!svg.contains(pure), "{pure} in the plot");
        }
        for oi in ["#0072B2", "#E69F00", "#56B4E9"] {
            assert!(svg.contains(oi), "{oi} missing");
        }
    }
}
