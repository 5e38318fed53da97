//! Draws the Figure 4 table of docs/BENCHMARKS.md (a CSV written by the
//! stream runs) as an SVG: loss and server CPU per byte against the pacing
//! interval, paced and unpaced.
//!
//! `cargo run -p fastudp-cli --example fig4 -- docs/fig4.csv docs/fig4.svg`

use plotters::prelude::*;

struct Row {
    interval: u32,
    burst: u32,
    pacing: String,
    cpu: f64,
    loss: f64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (input, output) = match (args.get(1), args.get(2)) {
        (Some(i), Some(o)) => (i.clone(), o.clone()),
        _ => return Err("usage: fig4 INPUT.csv OUTPUT.svg".into()),
    };
    let text = std::fs::read_to_string(&input)?;
    let mut rows = Vec::new();
    for l in text.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = l.split(',').collect();
        if f.len() < 7 {
            return Err(format!("{input}: short line {l:?}").into());
        }
        rows.push(Row {
            interval: f[0].parse()?,
            burst: f[1].parse()?,
            pacing: f[2].to_string(),
            cpu: f[4].parse()?,
            loss: f[6].parse::<f64>()? * 100.0,
        });
    }
    let grid: Vec<&Row> = rows.iter().filter(|r| r.burst > 1).collect();
    let baseline = rows.iter().find(|r| r.burst == 1);
    let root = SVGBackend::new(&output, (1100, 460)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "25 flows x 2 MB/s into a 500 Mbit/s, 32 KiB tbf: paced (blue) and unpaced (red)",
        ("sans-serif", 18),
    )?;
    let (left, right) = root.split_horizontally(550);
    let intervals = [1u32, 2, 4, 8];
    for (area, title, pick, max) in [
        (
            &left,
            "loss (%)",
            (|r: &Row| r.loss) as fn(&Row) -> f64,
            100.0,
        ),
        (&right, "server CPU ns per byte", |r: &Row| r.cpu, 25.0),
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
        for (k, (mode, color)) in [("user", BLUE), ("none", RED)].into_iter().enumerate() {
            c.draw_series(grid.iter().filter(|r| r.pacing == mode).filter_map(|r| {
                let i = intervals.iter().position(|&v| v == r.interval)? as f64;
                let x0 = i + 0.1 + 0.4 * k as f64;
                Some(Rectangle::new(
                    [(x0, 0.0), (x0 + 0.38, pick(r).min(max))],
                    color.mix(0.7).filled(),
                ))
            }))?;
        }
        if let Some(b) = baseline {
            let y = pick(b).min(max);
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
    root.present()?;
    Ok(())
}
