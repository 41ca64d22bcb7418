//! `/metrics` content negotiation: OpenMetrics text for a scraper that asks for it, the classic
//! Prometheus text format (`text/plain; version=0.0.4`) otherwise.
//!
//! prometheus-client encodes only OpenMetrics; [`to_classic`] rewrites its output line by line
//! into the classic format: no `# EOF` and no `# UNIT`; a counter's HELP and TYPE carry the
//! `_total` name of its sample (`# TYPE x counter` + `x_total` becomes `# TYPE x_total
//! counter`); an info metric becomes a gauge named `x_info`; HELP text loses OpenMetrics' `\"`
//! escape; exemplars are dropped.

/// OpenMetrics' content type.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The classic Prometheus text format's content type.
pub const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Which exposition format to answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    OpenMetrics,
    Classic,
}

impl Format {
    /// The format an `Accept` header prefers: OpenMetrics when it ranks
    /// `application/openmetrics-text` above `text/plain` (by q-value, then order), the classic
    /// format otherwise (no header, `*/*`, `text/plain`), as Prometheus's own clients do.
    pub fn negotiate(accept: Option<&str>) -> Self {
        let Some(accept) = accept else {
            return Format::Classic;
        };
        let mut best: Option<(f32, Format)> = None;
        for item in accept.split(',') {
            let mut parts = item.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.strip_prefix("q="))
                .find_map(|q| q.parse::<f32>().ok())
                .unwrap_or(1.0);
            let format = match media.as_str() {
                "application/openmetrics-text" => Format::OpenMetrics,
                "text/plain" | "text/*" | "*/*" => Format::Classic,
                _ => continue,
            };
            if q > 0.0 && best.is_none_or(|(bq, _)| q > bq) {
                best = Some((q, format));
            }
        }
        best.map_or(Format::Classic, |(_, f)| f)
    }

    /// The `Content-Type` of this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => OPENMETRICS,
            Format::Classic => CLASSIC,
        }
    }
}

/// OpenMetrics text (as prometheus-client writes it) to the classic Prometheus text format.
pub fn to_classic(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let lines: Vec<&str> = openmetrics.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            // A family: HELP, TYPE (and maybe UNIT) come together before its samples.
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let kind = lines[i..]
                .iter()
                .take(2)
                .find_map(|l| l.strip_prefix("# TYPE "))
                .and_then(|t| t.split_once(' '))
                .map(|(_, k)| k)
                .unwrap_or("unknown");
            let (classic_name, classic_kind) = classic_family(name, kind);
            out.push_str(&format!(
                "# HELP {classic_name} {}\n",
                help.replace("\\\"", "\"")
            ));
            out.push_str(&format!("# TYPE {classic_name} {classic_kind}\n"));
            // Skip the TYPE (and UNIT) lines just rewritten.
            while i < lines.len()
                && (lines[i].starts_with("# TYPE ") || lines[i].starts_with("# UNIT "))
            {
                i += 1;
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            // A TYPE without HELP.
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let (classic_name, classic_kind) = classic_family(name, kind);
            out.push_str(&format!("# TYPE {classic_name} {classic_kind}\n"));
            continue;
        }
        // A sample; drop an exemplar (` # {labels} value`), which only follows the value.
        let sample = match line.find(" # {") {
            Some(at) => &line[..at],
            None => line,
        };
        out.push_str(sample);
        out.push('\n');
    }
    out
}

/// A family's classic name and type from its OpenMetrics name and type.
fn classic_family(name: &str, kind: &str) -> (String, &'static str) {
    match kind {
        "counter" => (format!("{name}_total"), "counter"),
        "gauge" => (name.to_string(), "gauge"),
        "histogram" => (name.to_string(), "histogram"),
        "summary" => (name.to_string(), "summary"),
        "info" => (format!("{name}_info"), "gauge"),
        _ => (name.to_string(), "untyped"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_follows_accept_and_q_values() {
        use Format::*;
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                          version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        let cases = [
            (None, Classic),
            (Some("*/*"), Classic),
            (Some("text/plain;version=0.0.4"), Classic),
            (Some(prometheus), OpenMetrics),
            (Some("application/openmetrics-text"), OpenMetrics),
            (
                Some("text/plain;version=0.0.4;q=0.9,application/openmetrics-text;q=0.5"),
                Classic,
            ),
            (Some("application/json"), Classic),
            (Some("application/openmetrics-text;q=0"), Classic),
        ];
        for (accept, want) in cases {
            assert_eq!(Format::negotiate(accept), want, "{accept:?}");
        }
    }

    #[test]
    fn openmetrics_becomes_the_classic_format() {
        let om = "# HELP thaw_requests Requests answered.\n# TYPE thaw_requests counter\n\
                  thaw_requests_total{code=\"200\"} 3\n\
                  # HELP thaw_hold_seconds Time held.\n# TYPE thaw_hold_seconds histogram\n\
                  # UNIT thaw_hold_seconds seconds\nthaw_hold_seconds_sum 0.5\n\
                  thaw_hold_seconds_count 1\nthaw_hold_seconds_bucket{le=\"+Inf\"} 1\n\
                  # HELP thaw_build The build \\\"info\\\".\n# TYPE thaw_build info\n\
                  thaw_build_info{version=\"0.1.0\"} 1\n\
                  # HELP process_open_fds Fds.\n# TYPE process_open_fds gauge\n\
                  process_open_fds 7 # {trace_id=\"x\"} 1\n# EOF\n";
        let classic = to_classic(om);
        assert_eq!(
            classic,
            "# HELP thaw_requests_total Requests answered.\n# TYPE thaw_requests_total counter\n\
             thaw_requests_total{code=\"200\"} 3\n\
             # HELP thaw_hold_seconds Time held.\n# TYPE thaw_hold_seconds histogram\n\
             thaw_hold_seconds_sum 0.5\nthaw_hold_seconds_count 1\n\
             thaw_hold_seconds_bucket{le=\"+Inf\"} 1\n\
             # HELP thaw_build_info The build \"info\".\n# TYPE thaw_build_info gauge\n\
             thaw_build_info{version=\"0.1.0\"} 1\n\
             # HELP process_open_fds Fds.\n# TYPE process_open_fds gauge\nprocess_open_fds 7\n"
        );
    }
}
