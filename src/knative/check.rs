//! `thaw validate`: Knative's validation of stored or written objects, off-cluster. Reads
//! YAML or JSON documents (files, or `-` for stdin: what `kubectl get ... -o yaml` prints,
//! `List`s included) and checks every Service, Configuration, Revision and Route with the
//! rules the controller applies ([`super::validate`]), under the `config-features`,
//! `config-defaults` and `config-autoscaler` files given (Knative's defaults otherwise).
//!
//! Before an upgrade that brings new rules (the field masks), it lists what the new version
//! will refuse:
//! `kubectl get ksvc,configurations,revisions,routes -A -o yaml | thaw validate --features config-features.yaml -`.
//!
//! Output: one block per invalid object, `Kind namespace/name:` then the problems as the
//! object's condition would say them, indented. Exit 0 when every object is valid, 1 when one
//! is not or an input cannot be read (named), 2 for usage errors.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::Value;

use super::validate::{self, FieldError};
use super::{Configuration, Revision, Route, Service};
use crate::cli::{out, say};
use crate::config::keys::ConfigMap;
use crate::config::load::from_manifest;
use crate::config::{AutoscalerConfig, DefaultsConfig, FeaturesConfig};

/// Arguments of `thaw validate`.
#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    /// Files of Knative objects (YAML or JSON, several documents and `List`s allowed); `-`
    /// reads stdin.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// The `config-features` ConfigMap to check against (default: Knative's defaults).
    #[arg(long, value_name = "FILE")]
    pub features: Option<PathBuf>,
    /// The `config-defaults` ConfigMap (timeouts, container concurrency limits).
    #[arg(long, value_name = "FILE")]
    pub defaults: Option<PathBuf>,
    /// The `config-autoscaler` ConfigMap (bounds of the autoscaling annotations).
    #[arg(long, value_name = "FILE")]
    pub autoscaler: Option<PathBuf>,
}

/// The ConfigMaps the objects are checked under.
pub struct Under {
    pub features: FeaturesConfig,
    pub defaults: DefaultsConfig,
    pub autoscaler: AutoscalerConfig,
}

/// One invalid object: `Kind namespace/name` and its problems.
#[derive(Debug, PartialEq)]
pub struct Refused {
    pub object: String,
    pub errors: Vec<FieldError>,
}

/// The objects of one document: a `List`'s items, or the document itself.
fn objects(doc: Value) -> Vec<Value> {
    match doc {
        Value::Object(mut m) if m.get("kind").and_then(Value::as_str) == Some("List") => {
            match m.remove("items") {
                Some(Value::Array(items)) => items,
                _ => Vec::new(),
            }
        }
        Value::Null => Vec::new(),
        other => vec![other],
    }
}

/// Checks every Knative object of `docs`; other kinds are skipped. An object that does not
/// parse as its kind is refused with the parse error.
pub fn check(docs: Vec<Value>, under: &Under) -> Vec<Refused> {
    let mut out = Vec::new();
    for o in docs.into_iter().flat_map(objects) {
        let kind = o
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let api = o.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        if !api.starts_with("serving.knative.dev/") {
            continue;
        }
        let meta = &o["metadata"];
        let name = format!(
            "{kind} {}/{}",
            meta["namespace"].as_str().unwrap_or("default"),
            meta["name"].as_str().unwrap_or("")
        );
        fn typed<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, Vec<FieldError>> {
            serde_json::from_value(v).map_err(|e| {
                vec![FieldError::new(
                    "(the whole object)",
                    format!("does not parse: {e}"),
                )]
            })
        }
        let (d, a, f) = (&under.defaults, &under.autoscaler, &under.features);
        let errors = match kind.as_str() {
            "Service" => typed::<Service>(o).map(|s| validate::service(&s, d, a, f)),
            "Configuration" => {
                typed::<Configuration>(o).map(|c| validate::configuration(&c, d, a, f))
            }
            "Revision" => typed::<Revision>(o).map(|r| validate::revision(&r, d, a, f)),
            "Route" => typed::<Route>(o).map(|r| validate::route(&r)),
            _ => continue,
        }
        .unwrap_or_else(|e| e);
        if !errors.is_empty() {
            out.push(Refused {
                object: name,
                errors,
            });
        }
    }
    out
}

fn read(path: &Path) -> Result<Vec<Value>, String> {
    let mut text = String::new();
    let shown = path.display();
    if path.as_os_str() == "-" {
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| format!("stdin: {e}"))?;
    } else {
        text = std::fs::read_to_string(path).map_err(|e| format!("{shown}: {e}"))?;
    }
    serde_saphyr::from_multiple::<Value>(&text).map_err(|e| format!("{shown}: {e}"))
}

fn load<T: ConfigMap>(path: &Option<PathBuf>) -> Result<T, String> {
    match path {
        None => Ok(T::default()),
        Some(p) => from_manifest::<T>(p).map_err(|e| format!("{}: {e}", p.display())),
    }
}

/// Runs `thaw validate` (see the module docs for the output and exit codes).
pub fn run(args: &ValidateArgs) -> ExitCode {
    let under = match (|| -> Result<Under, String> {
        Ok(Under {
            features: load(&args.features)?,
            defaults: load(&args.defaults)?,
            autoscaler: load(&args.autoscaler)?,
        })
    })() {
        Ok(u) => u,
        Err(e) => {
            say(format!("error: {e}"));
            return ExitCode::from(1);
        }
    };
    let mut docs = Vec::new();
    for f in &args.files {
        match read(f) {
            Ok(d) => docs.extend(d),
            Err(e) => {
                say(format!("error: {e}"));
                return ExitCode::from(1);
            }
        }
    }
    let refused = check(docs, &under);
    let mut text = String::new();
    for r in &refused {
        text.push_str(&format!("{}:\n", r.object));
        for line in validate::render(&r.errors).lines() {
            text.push_str(&format!("  {line}\n"));
        }
    }
    out(&text);
    if refused.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
