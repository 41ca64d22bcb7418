//! A small hand-written SVG of a simulation: offered concurrency (left axis), desired and
//! ready pods (right axis) over time, panic seconds shaded, with axes and a legend.

use std::fmt::Write as _;

use super::Row;

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 64.0;
const TOP: f64 = 44.0;
const BOTTOM: f64 = 48.0;
/// At most this many points per series; longer traces keep the maximum of each chunk.
const MAX_POINTS: usize = 1800;

const OFFERED: &str = "#1f77b4";
const DESIRED: &str = "#ff7f0e";
const READY: &str = "#2ca02c";
const PANIC: &str = "#d62728";

/// The plot as a standalone SVG document. `rows[i]` and `offered[i]` describe second `i`.
pub fn svg(title: &str, offered: &[f64], rows: &[Row]) -> String {
    let n = rows.len().min(offered.len()).max(1);
    let chunk = n.div_ceil(MAX_POINTS);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |i: usize| LEFT + plot_w * i as f64 / (n.saturating_sub(1).max(1)) as f64;

    let load: Vec<f64> = maxima(offered.iter().copied().take(n), chunk);
    let desired: Vec<f64> = maxima(rows.iter().map(|r| f64::from(r.desired)), chunk);
    let ready: Vec<f64> = maxima(rows.iter().map(|r| f64::from(r.ready)), chunk);
    let load_max = nice_ceiling(load.iter().copied().fold(0.0, f64::max));
    let pods_max = nice_ceiling(desired.iter().chain(&ready).copied().fold(0.0, f64::max));
    let y_load = |v: f64| TOP + plot_h * (1.0 - v / load_max);
    let y_pods = |v: f64| TOP + plot_h * (1.0 - v / pods_max);

    let mut s = String::with_capacity(64 * 1024);
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="14">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );

    // Panic seconds, shaded.
    let mut i = 0;
    while i < n {
        if rows[i].panic {
            let start = i;
            while i < n && rows[i].panic {
                i += 1;
            }
            let (x0, x1) = (x(start), x(i.min(n - 1)).max(x(start) + 1.0));
            let _ = writeln!(
                s,
                r#"<rect class="panic" x="{x0:.1}" y="{TOP}" width="{:.1}" height="{plot_h}" fill="{PANIC}" fill-opacity="0.12"/>"#,
                x1 - x0
            );
        }
        i += 1;
    }

    // Axes and ticks.
    let bottom = TOP + plot_h;
    let right = LEFT + plot_w;
    let _ = writeln!(
        s,
        r#"<path d="M{LEFT},{TOP} V{bottom} H{right} V{TOP}" fill="none" stroke="black"/>"#
    );
    for t in 0..=5 {
        let f = f64::from(t) / 5.0;
        let y = TOP + plot_h * (1.0 - f);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{right}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text><text x="{}" y="{:.1}">{}</text>"##,
            LEFT - 6.0,
            y + 4.0,
            tick(load_max * f),
            right + 6.0,
            y + 4.0,
            tick(pods_max * f),
        );
        let label = (n as f64 * f).round() as usize;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{label}</text>"#,
            x(label.min(n - 1)),
            bottom + 16.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">second</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 10.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(16,{0}) rotate(-90)" text-anchor="middle" fill="{OFFERED}">offered concurrency</text><text transform="translate({1},{0}) rotate(-90)" text-anchor="middle">pods</text>"#,
        TOP + plot_h / 2.0,
        WIDTH - 10.0,
    );

    // Series. Ready is drawn under desired, which is dashed so both stay visible where they
    // agree.
    let dashed = r#" stroke-dasharray="6 4""#;
    let series: [Series<'_>; 3] = [
        ("offered", OFFERED, &load, false, "", &y_load),
        ("ready", READY, &ready, true, "", &y_pods),
        ("desired", DESIRED, &desired, true, dashed, &y_pods),
    ];
    for (name, colour, values, step, dash, y) in series {
        let mut points = String::with_capacity(values.len() * 16);
        for (j, &v) in values.iter().enumerate() {
            let xi = x((j * chunk).min(n - 1));
            if step && j > 0 {
                let _ = write!(points, "{xi:.1},{:.1} ", y(values[j - 1]));
            }
            let _ = write!(points, "{xi:.1},{:.1} ", y(v));
        }
        let _ = writeln!(
            s,
            r#"<polyline class="{name}" points="{}" fill="none" stroke="{colour}" stroke-width="1.5"{dash}/>"#,
            points.trim_end()
        );
    }

    // Legend.
    let entries = [
        ("offered concurrency", OFFERED),
        ("desired pods", DESIRED),
        ("ready pods", READY),
        ("panic", PANIC),
    ];
    for (k, (label, colour)) in entries.iter().enumerate() {
        let lx = LEFT + 10.0 + 150.0 * k as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{lx}" y="{}" width="14" height="4" fill="{colour}"/><text x="{}" y="{}">{label}</text>"#,
            TOP - 12.0,
            lx + 18.0,
            TOP - 8.0
        );
    }
    s.push_str("</svg>\n");
    s
}

/// (class, colour, values, drawn as steps, extra attributes, y scale).
type Series<'a> = (
    &'a str,
    &'a str,
    &'a [f64],
    bool,
    &'a str,
    &'a dyn Fn(f64) -> f64,
);

/// The maximum of each `chunk` consecutive values.
fn maxima(values: impl Iterator<Item = f64>, chunk: usize) -> Vec<f64> {
    let mut out = Vec::new();
    for (i, v) in values.enumerate() {
        if i % chunk == 0 {
            out.push(v);
        } else if let Some(last) = out.last_mut() {
            *last = last.max(v);
        }
    }
    out
}

/// The smallest of 1, 2, 5 × 10^k at or above `v` (1 for nothing).
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|&c| c >= v)
        .unwrap_or(10.0 * mag)
}

fn tick(v: f64) -> String {
    super::trace::number(v)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
