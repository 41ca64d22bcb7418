//! A small hand-written SVG of a simulation: offered concurrency and the requests waiting
//! while no pod is ready (left axis), desired and ready pods (right axis) over time, panic
//! seconds shaded; under the plot, per configuration, the settings used and the summary. A
//! second configuration (`--compare`) is overlaid in its own colours on the same trace.

use std::fmt::Write as _;

use super::{Row, Summary};

const WIDTH: f64 = 960.0;
const PLOT_H: f64 = 330.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 64.0;
const TOP: f64 = 62.0;
/// Under the plot: the x-axis labels.
const AXIS: f64 = 44.0;
/// Height of one line of the settings-and-summary panel.
const LINE: f64 = 16.0;
/// Characters per panel line before it wraps (12 px sans-serif across the plot's width).
const WRAP: usize = 140;
/// At most this many points per series; longer traces keep the maximum of each chunk.
const MAX_POINTS: usize = 1800;

const OFFERED: &str = "#1f77b4";
const PANIC: &str = "#d62728";
/// Per configuration: desired (dashed line), ready (line over a light area), waiting (area).
const COLOURS: [(&str, &str, &str); 2] = [
    ("#ff7f0e", "#2ca02c", "#d62728"),
    ("#9467bd", "#8c564b", "#e377c2"),
];

/// One configuration's run over the trace.
#[derive(Debug, Clone, Copy)]
pub struct Run<'a> {
    /// What the legend and panel call it (e.g. the config file).
    pub label: &'a str,
    /// The settings used, as one line of text (wrapped in the picture).
    pub settings: &'a str,
    pub rows: &'a [Row],
    pub summary: &'a Summary,
}

/// The plot as a standalone SVG document. `offered[i]` and each run's `rows[i]` describe
/// second `i`; at most two runs are drawn.
pub fn svg(title: &str, offered: &[f64], runs: &[Run<'_>]) -> String {
    let runs = &runs[..runs.len().min(COLOURS.len())];
    let n = runs
        .iter()
        .map(|r| r.rows.len())
        .chain([offered.len()])
        .min()
        .unwrap_or(0)
        .max(1);
    let chunk = n.div_ceil(MAX_POINTS);
    let plot_w = WIDTH - LEFT - RIGHT;
    let x = |i: usize| LEFT + plot_w * i as f64 / (n.saturating_sub(1).max(1)) as f64;

    let load: Vec<f64> = maxima(offered.iter().copied().take(n), chunk);
    let per_run: Vec<[Vec<f64>; 3]> = runs
        .iter()
        .map(|r| {
            [
                maxima(r.rows.iter().take(n).map(|r| f64::from(r.desired)), chunk),
                maxima(r.rows.iter().take(n).map(|r| f64::from(r.ready)), chunk),
                maxima(r.rows.iter().take(n).map(|r| r.waiting), chunk),
            ]
        })
        .collect();
    let load_max = nice_ceiling(load.iter().copied().fold(0.0, f64::max));
    let pods_max = nice_ceiling(
        per_run
            .iter()
            .flat_map(|[d, r, _]| d.iter().chain(r))
            .copied()
            .fold(0.0, f64::max),
    );
    let y_load = |v: f64| TOP + PLOT_H * (1.0 - v / load_max);
    let y_pods = |v: f64| TOP + PLOT_H * (1.0 - v / pods_max);

    let panel: Vec<(usize, Vec<String>)> = runs
        .iter()
        .enumerate()
        .map(|(k, r)| {
            let mut lines = vec![format!("{} settings:", r.label)];
            lines.extend(wrap(r.settings, WRAP).into_iter().map(|l| format!("  {l}")));
            lines.push(format!("  summary: {}", summary_line(r.summary)));
            (k, lines)
        })
        .collect();
    let panel_lines: usize = panel.iter().map(|(_, l)| l.len()).sum();
    let height = TOP + PLOT_H + AXIS + LINE * panel_lines as f64 + 12.0;

    let mut s = String::with_capacity(64 * 1024);
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="{WIDTH}" height="{height}" fill="white"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="14">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );

    // Panic seconds of the first configuration, shaded.
    if let Some(first) = runs.first() {
        let rows = first.rows;
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
                    r#"<rect class="panic" x="{x0:.1}" y="{TOP}" width="{:.1}" height="{PLOT_H}" fill="{PANIC}" fill-opacity="0.08"/>"#,
                    x1 - x0
                );
            }
            i += 1;
        }
    }

    // Axes and ticks.
    let bottom = TOP + PLOT_H;
    let right = LEFT + plot_w;
    let _ = writeln!(
        s,
        r#"<path d="M{LEFT},{TOP} V{bottom} H{right} V{TOP}" fill="none" stroke="black"/>"#
    );
    for t in 0..=5 {
        let f = f64::from(t) / 5.0;
        let y = TOP + PLOT_H * (1.0 - f);
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
        bottom + 34.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(16,{0}) rotate(-90)" text-anchor="middle" fill="{OFFERED}">concurrency (offered, waiting)</text><text transform="translate({1},{0}) rotate(-90)" text-anchor="middle">pods</text>"#,
        TOP + PLOT_H / 2.0,
        WIDTH - 10.0,
    );

    // Areas first (requests waiting, ready pods), then lines on top: offered, then each
    // configuration's ready (solid) and desired (dashed, thicker) so they stay apart where
    // they agree.
    let points = |values: &[f64], y: &dyn Fn(f64) -> f64| {
        let mut p = String::with_capacity(values.len() * 24);
        for (j, &v) in values.iter().enumerate() {
            let xi = x((j * chunk).min(n - 1));
            if j > 0 {
                let _ = write!(p, "{xi:.1},{:.1} ", y(values[j - 1]));
            }
            let _ = write!(p, "{xi:.1},{:.1} ", y(v));
        }
        p
    };
    let area = |values: &[f64], y: &dyn Fn(f64) -> f64| {
        let last = x(((values.len().max(1) - 1) * chunk).min(n - 1));
        format!(
            "{LEFT:.1},{bottom:.1} {}{last:.1},{bottom:.1}",
            points(values, y)
        )
    };
    for (k, [_, ready, waiting]) in per_run.iter().enumerate() {
        let (_, ready_c, waiting_c) = COLOURS[k];
        let _ = writeln!(
            s,
            r#"<polygon class="ready-area-{k}" points="{}" fill="{ready_c}" fill-opacity="0.10" stroke="none"/>"#,
            area(ready, &y_pods)
        );
        let (opacity, dash) = if k == 0 {
            ("0.45", "")
        } else {
            ("0.0", r#" stroke-dasharray="2 2""#)
        };
        let _ = writeln!(
            s,
            r#"<polygon class="waiting-{k}" points="{}" fill="{waiting_c}" fill-opacity="{opacity}" stroke="{waiting_c}" stroke-width="1"{dash}/>"#,
            area(waiting, &y_load)
        );
    }
    let _ = writeln!(
        s,
        r#"<polyline class="offered" points="{}" fill="none" stroke="{OFFERED}" stroke-width="1.5"/>"#,
        points(&load, &y_load).trim_end()
    );
    for (k, [desired, ready, _]) in per_run.iter().enumerate() {
        let (desired_c, ready_c, _) = COLOURS[k];
        let _ = writeln!(
            s,
            r#"<polyline class="ready-{k}" points="{}" fill="none" stroke="{ready_c}" stroke-width="1.5"/>"#,
            points(ready, &y_pods).trim_end()
        );
        let _ = writeln!(
            s,
            r#"<polyline class="desired-{k}" points="{}" fill="none" stroke="{desired_c}" stroke-width="2.5" stroke-dasharray="7 4"/>"#,
            points(desired, &y_pods).trim_end()
        );
    }

    // Legend: one row per configuration, above the plot.
    for (k, r) in runs.iter().enumerate() {
        let (desired_c, ready_c, waiting_c) = COLOURS[k];
        let y = 34.0 + 14.0 * k as f64;
        // The file name only: the panel below gives the whole path.
        let short = r.label.rsplit('/').next().unwrap_or(r.label);
        let mut entries = vec![
            (format!("desired pods ({short})"), desired_c, "7 4"),
            ("ready pods".to_string(), ready_c, ""),
            ("requests waiting (no pod ready)".to_string(), waiting_c, ""),
        ];
        if k == 0 {
            entries.push(("offered concurrency".into(), OFFERED, ""));
            entries.push(("panic".into(), PANIC, ""));
        }
        let mut lx = LEFT;
        for (label, colour, dash) in entries {
            let _ = writeln!(
                s,
                r#"<line x1="{lx}" y1="{}" x2="{}" y2="{}" stroke="{colour}" stroke-width="3" stroke-dasharray="{dash}"/><text x="{}" y="{}">{}</text>"#,
                y - 4.0,
                lx + 16.0,
                y - 4.0,
                lx + 20.0,
                y,
                escape(&label)
            );
            lx += 28.0 + 6.5 * label.len() as f64;
        }
    }

    // Settings and summary per configuration.
    let mut y = bottom + AXIS + 12.0;
    for (k, lines) in &panel {
        let (desired_c, _, _) = COLOURS[*k];
        for (j, line) in lines.iter().enumerate() {
            let colour = if j == 0 { desired_c } else { "black" };
            let _ = writeln!(
                s,
                r#"<text class="panel-{k}" x="{LEFT}" y="{y:.1}" fill="{colour}" xml:space="preserve">{}</text>"#,
                escape(line)
            );
            y += LINE;
        }
    }
    s.push_str("</svg>\n");
    s
}

/// The summary as one line.
pub fn summary_line(s: &Summary) -> String {
    format!(
        "pod-seconds {} · scale-from-zero events {} · seconds with requests waiting {} · peak \
         pods {} (over {} s)",
        s.pod_seconds, s.scale_from_zero, s.waiting_seconds, s.peak_pods, s.seconds
    )
}

/// `text` cut into lines of at most `width` characters at ", " boundaries.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for part in text.split(", ") {
        if !line.is_empty() && line.len() + 2 + part.len() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push_str(", ");
        }
        line.push_str(part);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

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
