//! Turns the runs of `scripts/quic-bench.sh` (one CSV line per run) into
//! the table of docs/BENCHMARKS.md section 14 and a chart: the median of
//! every configuration's runs (with the range of the server's CPU per
//! Gbit), and the ratios the issue sets targets for.
//!
//! `cargo run -p fastudp-lab --example quic_chart -- docs/quic-runs.csv docs/quic.svg`
//!
//! It prints the tables (Markdown) on stdout and writes the SVG: server CPU
//! seconds per Gbit (left) and goodput (right) per profile, workload and
//! server. Colours are from the Okabe-Ito palette, one per server, and
//! every bar is labelled, so colour is never the only cue.

use plotters::prelude::*;
use std::collections::BTreeMap;

/// Profile, workload, config.
type Key = (String, String, String);

#[derive(Default)]
struct Runs {
    cpu: Vec<f64>,
    goodput: Vec<f64>,
    dg_send: Vec<f64>,
    retrans: Vec<f64>,
    completed: Vec<f64>,
    connections: Vec<f64>,
    on_rate: Vec<f64>,
    stalled: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

fn range(v: &[f64]) -> (f64, f64) {
    v.iter()
        .filter(|x| x.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        })
}

fn name(config: &str) -> &'static str {
    match config {
        "a" => "(a) quic serve",
        "b" => "(b) no offloads",
        "c" => "(c) plain quinn",
        "d" => "(d) TLS/TCP",
        "g" => "(g) quic-go",
        _ => "?",
    }
}

const COLOURS: [RGBColor; 4] = [
    RGBColor(0, 114, 178),   // blue
    RGBColor(230, 159, 0),   // orange
    RGBColor(0, 158, 115),   // bluish green
    RGBColor(204, 121, 167), // reddish purple
];

fn read(input: &str) -> Result<BTreeMap<Key, Runs>, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(input)?;
    let mut map: BTreeMap<Key, Runs> = BTreeMap::new();
    for l in text.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = l.split(',').collect();
        if f.len() < 20 {
            return Err(format!("{input}: short line {l:?}").into());
        }
        // An empty field (no figure for that stack) reads as NaN.
        let num = |i: usize| f[i].parse::<f64>().unwrap_or(f64::NAN);
        let r = map
            .entry((f[0].to_string(), f[1].to_string(), f[2].to_string()))
            .or_default();
        r.cpu.push(num(4));
        r.goodput.push(num(5));
        r.dg_send.push(num(9));
        r.retrans.push(num(11));
        r.connections.push(num(12));
        r.completed.push(num(13));
        r.on_rate.push(num(14));
        r.stalled.push(num(16));
    }
    Ok(map)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        return Err("usage: quic_chart RUNS.csv OUT.svg".into());
    }
    let map = read(&args[1])?;
    // Profiles and workloads in the order the script runs them.
    let mut groups: Vec<(String, String)> = Vec::new();
    for (p, w, _) in map.keys() {
        let g = (p.clone(), w.clone());
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    groups.sort_by_key(|(p, w)| (p != "offload", w != "video"));

    println!("| profile | workload | server | CPU s/Gbit (range) | goodput Gbit/s | datagrams/send call | retransmitted packets | completed | on rate | stalled conns | runs |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (p, w) in &groups {
        for c in ["a", "b", "c", "d", "g"] {
            let Some(r) = map.get(&(p.clone(), w.clone(), c.to_string())) else {
                continue;
            };
            let (lo, hi) = range(&r.cpu);
            let on = median(&r.on_rate);
            println!(
                "| `{p}` | {w} | {} | {:.3} ({lo:.3}-{hi:.3}) | {:.2} | {} | {:.0} | {:.0}/{:.0} | {} | {} | {} |",
                name(c),
                median(&r.cpu),
                median(&r.goodput),
                if median(&r.dg_send).is_finite() {
                    format!("{:.1}", median(&r.dg_send))
                } else {
                    "-".into()
                },
                median(&r.retrans),
                median(&r.completed),
                median(&r.connections),
                if on.is_finite() {
                    format!("{:.1}%", on * 100.0)
                } else {
                    "-".into()
                },
                if w == "video" {
                    format!("{:.0}", median(&r.stalled))
                } else {
                    "-".into()
                },
                r.cpu.len()
            );
        }
    }
    println!();
    println!(
        "| profile | workload | a/b (target <= 0.5) | a/c (target < 1) | a/d (target <= 1.5) |"
    );
    println!("|---|---|---|---|---|");
    for (p, w) in &groups {
        let m = |c: &str| {
            map.get(&(p.clone(), w.clone(), c.to_string()))
                .map(|r| median(&r.cpu))
                .unwrap_or(f64::NAN)
        };
        let (a, b, c, d) = (m("a"), m("b"), m("c"), m("d"));
        let v = |x: f64, ok: bool| format!("{x:.2} {}", if ok { "met" } else { "**missed**" });
        println!(
            "| `{p}` | {w} | {} | {} | {} |",
            v(a / b, a / b <= 0.5),
            v(a / c, a / c < 1.0),
            v(a / d, a / d <= 1.5)
        );
    }

    // The chart: one row per (profile, workload, config).
    let map = &map;
    let rows: Vec<(String, usize, f64, f64)> = groups
        .iter()
        .flat_map(move |(p, w)| {
            ["a", "b", "c", "d"]
                .iter()
                .enumerate()
                .filter_map(move |(i, c)| {
                    map.get(&(p.clone(), w.clone(), c.to_string())).map(|r| {
                        (
                            format!("{p} {w} {}", name(c)),
                            i,
                            median(&r.cpu),
                            median(&r.goodput),
                        )
                    })
                })
        })
        .collect();
    let n = rows.len();
    let root = SVGBackend::new(&args[2], (1280, 110 + 30 * n as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "fastudp quic serve against its baselines (testbed; medians)",
        ("sans-serif", 20),
    )?;
    let (left, right) = root.split_horizontally(720);
    let labels: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    let y_fmt = |y: &f64| {
        let i = y.floor() as usize;
        if (*y - y.floor() - 0.5).abs() < 1e-6 && i < n {
            labels[n - 1 - i].clone()
        } else {
            String::new()
        }
    };
    for (area, title, col, fmt) in [
        (
            &left,
            "server CPU seconds per Gbit (less is better)",
            2usize,
            3usize,
        ),
        (&right, "goodput (Gbit/s)", 3, 2),
    ] {
        let val = |r: &(String, usize, f64, f64)| if col == 2 { r.2 } else { r.3 };
        let max = rows
            .iter()
            .map(val)
            .filter(|x| x.is_finite())
            .fold(0.0, f64::max)
            .max(1e-3)
            * 1.25;
        let mut c = ChartBuilder::on(area)
            .margin(10)
            .caption(title, ("sans-serif", 16))
            .x_label_area_size(30)
            .y_label_area_size(if col == 2 { 300 } else { 10 })
            .build_cartesian_2d(0.0..max, 0.0..n as f64)?;
        if col == 2 {
            c.configure_mesh()
                .disable_y_mesh()
                .y_labels(2 * n + 1)
                .y_label_formatter(&y_fmt)
                .draw()?;
        } else {
            c.configure_mesh().disable_y_mesh().y_labels(0).draw()?;
        }
        for (i, r) in rows.iter().enumerate() {
            let y = (n - 1 - i) as f64;
            let v = val(r);
            if !v.is_finite() {
                continue;
            }
            c.draw_series(std::iter::once(Rectangle::new(
                [(0.0, y + 0.15), (v, y + 0.85)],
                COLOURS[r.1].mix(0.85).filled(),
            )))?;
            c.draw_series(std::iter::once(Text::new(
                format!("{v:.fmt$}"),
                (v + max * 0.01, y + 0.65),
                ("sans-serif", 13).into_font().color(&BLACK),
            )))?;
        }
    }
    root.present()?;
    eprintln!("wrote {}", args[2]);
    Ok(())
}
