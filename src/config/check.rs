//! `thaw config check FILE...`: validate ConfigMap manifests (one per file, or a `---` stream
//! of them as `thaw migrate config` writes, each then named `FILE (CONFIG-MAP)`) and `thaw
//! local`'s services file, and print the effective configuration, every key with its value and
//! whether it is the default.
//!
//! The rule is [`super::keys`]'s, the same as the live reload's: only an invalid value of a key
//! thaw implements fails the check. Exit code 0 when every file is valid; 1 otherwise, with one
//! `FILE: KEY: VALUE: REASON` line per problem on stderr (all problems of all files, not only
//! the first). Keys with no effect in thaw (unknown keys, Knative keys thaw does not implement,
//! flag values Knative would ignore; local.yaml fields that mean nothing locally) go to stderr
//! as `warning: FILE: KEY: WHY` and fail the check only with `--strict`. `--output json`
//! prints one object of one shape whatever happened (`ok` is the exit code's verdict):
//!
//! ```json
//! {"ok": false,
//!  "errors": [{"file": "as.yaml", "key": "stable-window", "value": "1s", "reason": "must be in [6s, 1h]"}],
//!  "warnings": [{"file": "as.yaml", "message": "unknown-thing: unknown key, ignored"}],
//!  "settings": [{"configMap": "config-gc", "file": "gc.yaml",
//!                "values": {"min-non-active-revisions": 20, ...}, "nonDefault": []}]}
//! ```
//!
//! `settings` holds every file that is valid (also when another is not); `values` is keyed by
//! Knative's key names (durations in seconds, percentages as Knative writes them).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{Map, Value, json};

use super::keys::Shown;
use super::load::{check_named, read_manifests};
use super::parse::Problem;

/// Output format of `thaw config check`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// One line per key: name, value, unit, and `default` or `set`.
    Text,
    /// One JSON object `{ok, errors, warnings, settings}`, the same shape whether the check
    /// passed or not; values keyed by Knative's key names (durations in seconds, percentages
    /// as Knative writes them).
    Json,
}

/// Arguments of `thaw config check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// ConfigMap manifests (config-autoscaler, config-defaults, config-activator, ...; one per
    /// file, or a `---` stream of them as `thaw migrate config` writes), recognised by their
    /// `metadata.name`, or a `thaw local` services file (local.yaml).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Fail (exit 1) also when a key has no effect in thaw, not only on invalid values.
    #[arg(long)]
    pub strict: bool,
}

/// One checked file: its ConfigMap name and every key shown.
#[derive(Debug, Clone)]
pub struct Checked {
    pub name: String,
    pub path: PathBuf,
    pub keys: Vec<Shown>,
}

/// A warning about one file: it does not fail the check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub file: String,
    pub message: String,
}

/// What checking files found: the valid files' effective configurations, every problem of
/// the others, and warnings.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub checked: Vec<Checked>,
    pub problems: Vec<Problem>,
    pub warnings: Vec<Warning>,
}

/// Checks every file of `files`; one invalid file does not stop the others being checked.
pub fn check(files: &[PathBuf]) -> Report {
    let mut r = Report::default();
    for path in files {
        let file = path.display().to_string();
        let warn = |w: Vec<String>| {
            w.into_iter().map(|message| Warning {
                file: file.clone(),
                message,
            })
        };
        if is_local_yaml(path) {
            match crate::local::model::load(&crate::local::model::Source::File(path.clone())) {
                Ok(model) => {
                    r.warnings.extend(warn(model.warnings.clone()));
                    r.checked.push(Checked {
                        name: "local".into(),
                        path: path.clone(),
                        keys: show_local(&model),
                    });
                }
                Err(p) => r.problems.extend(p.0.into_iter().map(|p| p.in_file(&file))),
            }
            continue;
        }
        let cms = match read_manifests(path) {
            Ok(cms) => cms,
            Err(p) => {
                r.problems.extend(p.0.into_iter().map(|p| p.in_file(&file)));
                continue;
            }
        };
        // A stream of several ConfigMaps (`thaw migrate config`'s output) names each one
        // beside the file.
        let many = cms.len() > 1;
        for cm in cms {
            let at = if many {
                format!("{file} ({})", cm.name)
            } else {
                file.clone()
            };
            let (result, w) = check_named(&cm);
            r.warnings.extend(w.into_iter().map(|message| Warning {
                file: at.clone(),
                message,
            }));
            match result {
                Ok(keys) => r.checked.push(Checked {
                    name: cm.name,
                    path: path.clone(),
                    keys,
                }),
                Err(p) => r.problems.extend(p.0.into_iter().map(|p| p.in_file(&at))),
            }
        }
    }
    r
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

impl Report {
    /// Whether the check passes: no problem, and under `strict` no key without effect either.
    pub fn passes(&self, strict: bool) -> bool {
        self.problems.is_empty() && (!strict || self.warnings.is_empty())
    }
}

/// The JSON report (the module's documentation shows its shape); `ok` is
/// [`Report::passes`].
pub fn render_json(report: &Report, strict: bool) -> Value {
    let settings: Vec<Value> = report
        .checked
        .iter()
        .map(|c| {
            let mut values = Map::new();
            let mut services = Vec::new();
            let mut non_default = Vec::new();
            for k in &c.keys {
                if c.name == "local" && k.key == "service" {
                    services.push(k.json.clone());
                    continue;
                }
                values.insert(k.key.to_string(), k.json.clone());
                if !k.is_default {
                    non_default.push(Value::from(k.key));
                }
            }
            if c.name == "local" {
                values.insert("services".into(), Value::Array(services));
            }
            json!({
                "configMap": c.name,
                "file": c.path.display().to_string(),
                "values": values,
                "nonDefault": non_default,
            })
        })
        .collect();
    json!({
        "ok": report.passes(strict),
        "errors": report.problems.iter().map(Problem::to_json).collect::<Vec<_>>(),
        "warnings": report
            .warnings
            .iter()
            .map(|w| json!({"file": w.file, "message": w.message}))
            .collect::<Vec<_>>(),
        "settings": settings,
    })
}

/// Runs the command: prints the report to stdout (text: only when every file is valid; JSON:
/// always), problems and warnings to stderr.
pub fn run(args: &CheckArgs) -> ExitCode {
    let report = check(&args.files);
    let mut err = std::io::stderr().lock();
    for w in &report.warnings {
        let _ = writeln!(err, "warning: {}: {}", w.file, w.message);
    }
    for p in &report.problems {
        let _ = writeln!(err, "{p}");
    }
    match args.output {
        Output::Text if report.problems.is_empty() => {
            crate::cli::out(&render_text(&report.checked))
        }
        Output::Text => {}
        Output::Json => crate::cli::out(&format!("{:#}\n", render_json(&report, args.strict))),
    }
    if args.strict && report.problems.is_empty() && !report.warnings.is_empty() {
        let _ = writeln!(
            err,
            "--strict: {} key(s) with no effect in thaw",
            report.warnings.len()
        );
    }
    if report.passes(args.strict) {
        ExitCode::SUCCESS
    } else {
        crate::cli::invalid()
    }
}
