//! `thaw config check FILE...`: validate ConfigMap manifests and print the effective
//! configuration, every key with its value and whether it is the default.
//!
//! Exit code 0 when every file is valid; 1 otherwise, with one `FILE: KEY: VALUE: REASON` line
//! per problem on stderr (all problems of all files, not only the first); with `--output json`
//! the problems are also printed on stdout as `{"errors": [{file, key, value, reason}],
//! "warnings": [...]}`. Warnings (unknown keys)
//! go to stderr as `warning: ...` and do not fail the check.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{Map, Value};

use super::keys::Shown;
use super::load::{check_named, read_manifest};
use super::parse::Problem;

/// Output format of `thaw config check`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// One line per key: name, value, unit, and `default` or `set`.
    Text,
    /// One JSON object keyed by Knative's key names (durations in seconds, percentages as
    /// Knative writes them), plus `_non_default`: the keys whose value is not the default.
    Json,
}

/// Arguments of `thaw config check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// ConfigMap manifests (config-autoscaler, config-defaults, config-activator), recognised by
    /// their `metadata.name`, or a `thaw local` services file (local.yaml).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// One checked file: its ConfigMap name and every key shown.
#[derive(Debug, Clone)]
pub struct Checked {
    pub name: String,
    pub path: PathBuf,
    pub keys: Vec<Shown>,
}

/// Checks `files`; returns the effective configurations, or every problem found (in any file),
/// plus warnings either way.
pub fn check(files: &[PathBuf]) -> (Result<Vec<Checked>, Vec<Problem>>, Vec<String>) {
    let mut ok = Vec::new();
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    for path in files {
        let file = path.display().to_string();
        if is_local_yaml(path) {
            match crate::local::model::load(&crate::local::model::Source::File(path.clone())) {
                Ok(model) => {
                    warnings.extend(
                        model
                            .warnings
                            .iter()
                            .map(|w| format!("{}: {w}", path.display())),
                    );
                    ok.push(Checked {
                        name: "local".into(),
                        path: path.clone(),
                        keys: show_local(&model),
                    });
                }
                Err(p) => problems.extend(p.0.into_iter().map(|p| p.in_file(&file))),
            }
            continue;
        }
        let cm = match read_manifest(path) {
            Ok(cm) => cm,
            Err(p) => {
                problems.extend(p.0.into_iter().map(|p| p.in_file(&file)));
                continue;
            }
        };
        let (result, w) = check_named(&cm);
        warnings.extend(w.into_iter().map(|w| format!("{}: {w}", path.display())));
        match result {
            Ok(keys) => ok.push(Checked {
                name: cm.name,
                path: path.clone(),
                keys,
            }),
            Err(p) => problems.extend(p.0.into_iter().map(|p| p.in_file(&file))),
        }
    }
    if problems.is_empty() {
        (Ok(ok), warnings)
    } else {
        (Err(problems), warnings)
    }
}

/// A local.yaml is recognised by its top level: a Kubernetes manifest has `kind` or
/// `metadata`, local.yaml has neither. Unreadable or invalid YAML goes the manifest way, whose
/// errors name the file and the line.
fn is_local_yaml(path: &std::path::Path) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    match serde_saphyr::from_str::<serde_json::Value>(&text) {
        Ok(Value::Object(top)) => !top.contains_key("kind") && !top.contains_key("metadata"),
        _ => false,
    }
}

/// local.yaml's effective content: the domain, and per service its route, first revision and
/// the settings that decide its scaling.
fn show_local(m: &crate::local::model::LocalModel) -> Vec<Shown> {
    let mut out = vec![Shown {
        key: "domain",
        text: m.domain.clone(),
        json: Value::from(m.domain.clone()),
        unit: "route hosts are {service}.{namespace}.{domain}",
        is_default: m.domain == "example.com",
    }];
    for s in &m.services {
        // Validated by `load`, so resolving again cannot fail; skip defensively if it does.
        let Ok(spec) = s.revision_spec(1, &m.domain, &m.configs) else {
            continue;
        };
        let a = &spec.autoscaling;
        let text = format!(
            "{}/{} host={} revision={} containerConcurrency={} target={} stable-window={}s \
             min-scale={} max-scale={} initial-scale={}",
            s.namespace,
            s.name,
            s.route_host(&m.domain),
            spec.key.name,
            spec.container_concurrency,
            a.target_value,
            a.stable_window.as_secs(),
            a.min_scale,
            a.max_scale,
            a.initial_scale
        );
        out.push(Shown {
            key: "service",
            json: serde_json::json!({
                "namespace": s.namespace, "name": s.name, "host": s.route_host(&m.domain),
                "revision": &*spec.key.name, "container-concurrency": spec.container_concurrency,
                "target": a.target_value, "stable-window": a.stable_window.as_secs(),
                "min-scale": a.min_scale, "max-scale": a.max_scale, "initial-scale": a.initial_scale,
            }),
            text,
            unit: "",
            is_default: false,
        });
    }
    out
}

/// The text report.
pub fn render_text(checked: &[Checked]) -> String {
    let mut out = String::new();
    for c in checked {
        out.push_str(&format!("# {} ({})\n", c.name, c.path.display()));
        let width = c.keys.iter().map(|k| k.key.len()).max().unwrap_or(0);
        if c.name == "local" {
            for k in &c.keys {
                out.push_str(&format!("{:8} {}\n", k.key, k.text));
            }
            continue;
        }
        for k in &c.keys {
            let src = if k.is_default { "default" } else { "set" };
            out.push_str(&format!(
                "{:width$}  {:<28}  {:<7}  {}\n",
                k.key, k.text, src, k.unit
            ));
        }
    }
    out
}

/// The JSON report: one object keyed by Knative's key names.
pub fn render_json(checked: &[Checked]) -> Value {
    let mut obj = Map::new();
    let mut non_default = Vec::new();
    for c in checked {
        if c.name == "local" {
            let services: Vec<Value> = c
                .keys
                .iter()
                .filter(|k| k.key == "service")
                .map(|k| k.json.clone())
                .collect();
            let domain = c
                .keys
                .iter()
                .find(|k| k.key == "domain")
                .map(|k| k.json.clone());
            obj.insert(
                "local".into(),
                serde_json::json!({"domain": domain, "services": services}),
            );
            continue;
        }
        for k in &c.keys {
            obj.insert(k.key.to_string(), k.json.clone());
            if !k.is_default {
                non_default.push(Value::from(k.key));
            }
        }
    }
    obj.insert("_non_default".into(), Value::Array(non_default));
    Value::Object(obj)
}

/// Runs the command: prints the report to stdout, problems and warnings to stderr.
pub fn run(args: &CheckArgs) -> ExitCode {
    let (result, warnings) = check(&args.files);
    let mut err = std::io::stderr().lock();
    for w in &warnings {
        let _ = writeln!(err, "warning: {w}");
    }
    match result {
        Ok(checked) => {
            let text = match args.output {
                Output::Text => render_text(&checked),
                Output::Json => format!("{:#}\n", render_json(&checked)),
            };
            crate::cli::out(&text);
            ExitCode::SUCCESS
        }
        Err(problems) => {
            for p in &problems {
                let _ = writeln!(err, "{p}");
            }
            if args.output == Output::Json {
                let v = serde_json::json!({
                    "errors": problems.iter().map(Problem::to_json).collect::<Vec<_>>(),
                    "warnings": warnings,
                });
                crate::cli::out(&format!("{v:#}\n"));
            }
            crate::cli::invalid()
        }
    }
}
