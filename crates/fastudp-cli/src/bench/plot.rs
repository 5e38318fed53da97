//! `--plot FILE.svg`: a bar chart of throughput and CPU cost per byte.
//!
//! The colours are from the Okabe-Ito palette, which readers with any
//! common colour-vision deficiency can tell apart; a run that lost
//! datagrams is also marked by a pattern and a label, not colour alone.

use super::Measurement;
use anyhow::{anyhow, bail};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
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
/// per byte on the right. A chart that cannot be drawn (or written) is a
/// runtime failure.
pub fn svg(path: &str, title: &str, rs: &[Measurement]) -> anyhow::Result<()> {
    let names: Vec<String> = rs.iter().map(label).collect();
    svg_labeled(path, title, rs, &names)
}

/// The same, each bar named by `names` (one per run).
pub fn svg_labeled(
    path: &str,
    title: &str,
    rs: &[Measurement],
    names: &[String],
) -> anyhow::Result<()> {
    if rs.is_empty() || names.len() != rs.len() {
        bail!("nothing to plot");
    }
    draw(path, title, rs, names).map_err(|e| anyhow!("cannot draw {path}: {e}"))
}

/// What drawing on the SVG backend gives.
type Drawn<T = ()> = Result<T, DrawingAreaErrorKind<std::io::Error>>;

/// A chart of one bar per run, run 0 at the top.
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

fn draw(path: &str, title: &str, rs: &[Measurement], names: &[String]) -> Drawn {
    let n = rs.len();
    let height = 110 + 34 * n as u32;
    let root = SVGBackend::new(path, (1280, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 20))?;
    let (left, right) = root.split_horizontally(700);
    throughput_chart(&left, rs, names)?;
    cpu_chart(&right, rs)?;
    root.present()?;
    Ok(())
}

/// The bar of run `i` of `n`, from `x0` to `x1`.
fn bar(i: usize, n: usize, x0: f64, x1: f64) -> [(f64, f64); 2] {
    let y = (n - 1 - i) as f64;
    [(x0, y + 0.15), (x1, y + 0.85)]
}

/// Throughput, Gbit/s: the left chart, with the runs' names.
fn throughput_chart(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    rs: &[Measurement],
    names: &[String],
) -> Drawn {
    let n = rs.len();
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
    let mut c = ChartBuilder::on(area)
        .margin(10)
        .caption("throughput (Gbit/s)", ("sans-serif", 16))
        .x_label_area_size(30)
        .y_label_area_size(260)
        .build_cartesian_2d(0.0..gmax, 0.0..n as f64)?;
    c.configure_mesh()
        .disable_y_mesh()
        .y_labels(2 * n + 1)
        .y_label_formatter(&y_fmt)
        .draw()?;
    c.draw_series(
        rs.iter()
            .enumerate()
            .map(|(i, r)| Rectangle::new(bar(i, n, 0.0, r.gbps), BLUE_OI.mix(0.8).filled())),
    )?
    .label("throughput")
    .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], BLUE_OI.mix(0.8).filled()));
    mark_losses(&mut c, rs, gmax)?;
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
}

/// A lossy run: its bar outlined and hatched in vermillion, and the loss
/// written beside it.
fn mark_losses(c: &mut Chart<'_, '_>, rs: &[Measurement], gmax: f64) -> Drawn {
    let n = rs.len();
    let lossy: Vec<(usize, &Measurement, u64, f64)> = rs
        .iter()
        .enumerate()
        .filter_map(|(i, r)| loss(r).map(|(l, f)| (i, r, l, f)))
        .collect();
    if lossy.is_empty() {
        return Ok(());
    }
    c.draw_series(lossy.iter().map(|&(i, r, _, _)| {
        Rectangle::new(bar(i, n, 0.0, r.gbps), VERMILLION_OI.stroke_width(3))
    }))?
    .label("lost datagrams")
    .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], VERMILLION_OI.stroke_width(3)));
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
        }))?;
    }
    c.draw_series(lossy.iter().map(|&(i, r, lost, frac)| {
        let y = (n - 1 - i) as f64;
        Text::new(
            format!("lost {lost} ({:.2}%)", frac * 100.0),
            (r.gbps + gmax * 0.01, y + 0.65),
            ("sans-serif", 13).into_font().color(&BLACK),
        )
    }))?;
    Ok(())
}

/// CPU ns per byte, sender and receiver stacked: the right chart.
fn cpu_chart(area: &DrawingArea<SVGBackend<'_>, Shift>, rs: &[Measurement]) -> Drawn {
    let n = rs.len();
    let cmax = rs
        .iter()
        .map(|r| r.tx_cpu_ns_per_byte + r.rx_cpu_ns_per_byte)
        .fold(0.0, f64::max)
        .max(1e-3)
        * 1.1;
    let mut c = ChartBuilder::on(area)
        .margin(10)
        .caption("CPU ns per byte (sender + receiver)", ("sans-serif", 16))
        .x_label_area_size(30)
        .y_label_area_size(10)
        .build_cartesian_2d(0.0..cmax, 0.0..n as f64)?;
    c.configure_mesh().disable_y_mesh().y_labels(0).draw()?;
    c.draw_series(rs.iter().enumerate().map(|(i, r)| {
        Rectangle::new(
            bar(i, n, 0.0, r.tx_cpu_ns_per_byte),
            ORANGE_OI.mix(0.85).filled(),
        )
    }))?
    .label("sender")
    .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], ORANGE_OI.mix(0.85).filled()));
    c.draw_series(rs.iter().enumerate().map(|(i, r)| {
        let a = r.tx_cpu_ns_per_byte;
        Rectangle::new(
            bar(i, n, a, a + r.rx_cpu_ns_per_byte),
            SKY_BLUE_OI.mix(0.85).filled(),
        )
    }))?
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
