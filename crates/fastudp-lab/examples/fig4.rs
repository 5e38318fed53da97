//! Turns the runs of `scripts/fig4.sh` (one CSV line per stream run) into
//! the Figure 4 table of docs/BENCHMARKS.md and a chart: the median of
//! every configuration's runs, with the spread of its loss.
//!
//! `cargo run -p fastudp-lab --example fig4 -- docs/fig4-runs.csv docs/fig4.svg`
//!
//! It prints the table (Markdown) on stdout and writes the SVG: loss and
//! server CPU per byte against the pacing interval (full GSO trains), and
//! loss against the burst size at 8 ms, paced and unpaced.

use plotters::prelude::*;
use std::collections::BTreeMap;

/// One configuration: interval (ms), max burst, pacing.
type Key = (u32, u32, String);

/// The runs of one configuration, a vector per column.
#[derive(Default)]
struct Runs {
    gbps: Vec<f64>,
    cpu: Vec<f64>,
    calls: Vec<f64>,
    loss: Vec<f64>,
    within: Vec<f64>,
    b2b: Vec<f64>,
    steal: Vec<f64>,
    /// Datagrams the sender's own full qdisc dropped (`ENOBUFS`), % of
    /// those it sent.
    dropped: Vec<f64>,
    /// 1 - bytes received / bytes sent, %, over every flow (the
    /// receiver's loss covers only the flows it saw).
    all_loss: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        })
}

fn read(input: &str) -> Result<BTreeMap<Key, Runs>, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(input)?;
    let mut map: BTreeMap<Key, Runs> = BTreeMap::new();
    for l in text.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = l.split(',').collect();
        if f.len() < 9 {
            return Err(format!("{input}: short line {l:?}").into());
        }
        let num = |i: usize| -> Result<f64, Box<dyn std::error::Error>> {
            f[i].parse::<f64>()
                .map_err(|e| format!("{input}: field {} of {l:?}: {e}", i + 1).into())
        };
        let r = map
            .entry((f[0].parse()?, f[1].parse()?, f[2].to_string()))
            .or_default();
        r.gbps.push(num(3)?);
        r.cpu.push(num(4)?);
        r.calls.push(num(5)?);
        r.loss.push(num(6)? * 100.0);
        r.within.push(num(7)? * 100.0);
        r.b2b.push(num(8)?);
        if f.len() > 9 && !f[9].is_empty() {
            r.steal.push(num(9)? * 100.0);
        }
        // Runs since the sender counts its local drops (columns 12 to 15).
        if f.len() > 14 && !f[11].is_empty() {
            let sent = num(11)?;
            if sent > 0.0 {
                r.dropped.push(num(12)? / sent * 100.0);
            }
            let tx_bytes = num(13)?;
            if tx_bytes > 0.0 {
                r.all_loss.push((1.0 - num(14)? / tx_bytes) * 100.0);
            }
        }
    }
    Ok(map)
}

/// The median of `v` as a percentage, or n/a for runs without it.
fn pct(v: &[f64]) -> String {
    if v.is_empty() {
        "n/a".to_string()
    } else {
        format!("{:.2}%", median(v))
    }
}

fn table(map: &BTreeMap<Key, Runs>) {
    println!("| interval | max burst | pacing | runs | sent Gbit/s | server CPU ns/B | send calls/s | loss | loss, min to max | dropped by the sender's qdisc | loss over all flows | flows within 5% | longest back-to-back | host steal |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for ((i, b, p), r) in map {
        let (lo, hi) = min_max(&r.loss);
        println!(
            "| {i} ms | {b} | {p} | {} | {:.3} | {:.2} | {:.0} | {:.2}% | {:.2}% to {:.2}% | {} | {} | {:.0}% | {:.0} | {} |",
            r.loss.len(),
            median(&r.gbps),
            median(&r.cpu),
            median(&r.calls),
            median(&r.loss),
            lo,
            hi,
            pct(&r.dropped),
            pct(&r.all_loss),
            median(&r.within),
            median(&r.b2b),
            if r.steal.is_empty() {
                "n/a".to_string()
            } else {
                format!("{:.0}%", median(&r.steal))
            }
        );
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (input, output) = match (args.get(1), args.get(2)) {
        (Some(i), Some(o)) => (i.clone(), o.clone()),
        _ => return Err("usage: fig4 RUNS.csv OUTPUT.svg".into()),
    };
    let map = read(&input)?;
    table(&map);
    let full = map.keys().map(|k| k.1).max().unwrap_or(0);
    let get = |i: u32, b: u32, p: &str| map.get(&(i, b, p.to_string()));
    let root = SVGBackend::new(&output, (1500, 460)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "25 flows x 2 MB/s into a 500 Mbit/s, 32 KiB tbf: paced (blue) and unpaced (red); medians, loss bars show min to max",
        ("sans-serif", 18),
    )?;
    let panels = root.split_evenly((1, 3));
    // Okabe-Ito blue and vermillion: told apart with any common
    // colour-vision deficiency.
    let modes = [
        ("user", RGBColor(0, 114, 178)),
        ("none", RGBColor(213, 94, 0)),
    ];
    // Panels 1 and 2: against the interval, full trains.
    let intervals = [1u32, 2, 4, 8];
    type Pick = fn(&Runs) -> (f64, f64, f64);
    let loss: Pick = |r| {
        let (lo, hi) = min_max(&r.loss);
        (median(&r.loss), lo, hi)
    };
    let cpu: Pick = |r| {
        let m = median(&r.cpu);
        (m, m, m)
    };
    for (area, title, pick, max) in [
        (&panels[0], "loss (%) by interval", loss, 100.0),
        (&panels[1], "server CPU ns per byte by interval", cpu, 25.0),
    ] {
        let mut c = ChartBuilder::on(area)
            .margin(15)
            .caption(title, ("sans-serif", 16))
            .x_label_area_size(35)
            .y_label_area_size(45)
            .build_cartesian_2d(0.0..4.0, 0.0..max)?;
        c.configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .x_desc("pacing interval: 1, 2, 4 and 8 ms, left to right")
            .draw()?;
        for (k, (mode, color)) in modes.iter().enumerate() {
            let bars: Vec<(f64, (f64, f64, f64))> = intervals
                .iter()
                .enumerate()
                .filter_map(|(x, &i)| Some((x as f64, pick(get(i, full, mode)?))))
                .collect();
            draw_bars(&mut c, &bars, k, *color, max)?;
        }
        if let Some(b) = get(1, 1, "user") {
            let y = pick(b).0.min(max);
            c.draw_series(LineSeries::new(
                vec![(0.0, y), (4.0, y)],
                BLACK.stroke_width(2),
            ))?
            .label("one datagram every 1 ms (paced)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], BLACK.stroke_width(2)));
            c.configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()?;
        }
    }
    // Panel 3: loss against the burst at 8 ms.
    let bursts: Vec<u32> = map
        .keys()
        .filter(|k| k.0 == 8)
        .map(|k| k.1)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut c = ChartBuilder::on(&panels[2])
        .margin(15)
        .caption("loss (%) by max burst at 8 ms", ("sans-serif", 16))
        .x_label_area_size(35)
        .y_label_area_size(45)
        .build_cartesian_2d(0.0..bursts.len().max(1) as f64, 0.0..100.0)?;
    c.configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .x_desc(format!(
            "max burst (segments): {}, left to right",
            bursts
                .iter()
                .map(|b| b.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .draw()?;
    for (k, (mode, color)) in modes.iter().enumerate() {
        let bars: Vec<(f64, (f64, f64, f64))> = bursts
            .iter()
            .enumerate()
            .filter_map(|(x, &b)| Some((x as f64, loss(get(8, b, mode)?))))
            .collect();
        draw_bars(&mut c, &bars, k, *color, 100.0)?;
    }
    root.present()?;
    Ok(())
}

/// Draws one mode's bars (median) with a min-to-max whisker, side `k` of
/// each slot.
fn draw_bars<DB: DrawingBackend>(
    c: &mut ChartContext<
        '_,
        DB,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    bars: &[(f64, (f64, f64, f64))],
    k: usize,
    color: RGBColor,
    max: f64,
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    c.draw_series(bars.iter().map(|&(x, (m, _, _))| {
        let x0 = x + 0.1 + 0.4 * k as f64;
        Rectangle::new(
            [(x0, 0.0), (x0 + 0.38, m.min(max))],
            color.mix(0.7).filled(),
        )
    }))?;
    c.draw_series(
        bars.iter()
            .filter(|(_, (_, lo, hi))| hi > lo)
            .map(|&(x, (_, lo, hi))| {
                let xm = x + 0.29 + 0.4 * k as f64;
                PathElement::new(vec![(xm, lo.min(max)), (xm, hi.min(max))], BLACK)
            }),
    )?;
    Ok(())
}
