//! Loading ConfigMaps: from a manifest file (YAML, its `data:` map) or from a plain key/value map
//! (what a live ConfigMap watch hands over).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::keys::{ConfigMap, Parsed, Shown};
use super::parse::{Problem, Problems};
use super::{ActivatorConfig, AutoscalerConfig, DefaultsConfig, DeploymentConfig, GcConfig};

/// A ConfigMap as read from a manifest: its name and its `data:` map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigMapData {
    pub name: String,
    pub namespace: Option<String>,
    pub data: BTreeMap<String, String>,
}

/// A `data:` value. Kubernetes requires strings; numbers and booleans written without quotes
/// are accepted and read as their text, so nothing an operator wrote is lost.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Scalar {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl Scalar {
    fn into_text(self) -> String {
        match self {
            Scalar::Str(s) => s,
            Scalar::Int(i) => i.to_string(),
            Scalar::Float(f) => f.to_string(),
            Scalar::Bool(b) => b.to_string(),
        }
    }
}

#[derive(Debug, Deserialize)]
struct Meta {
    name: Option<String>,
    namespace: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Manifest {
    kind: Option<String>,
    metadata: Option<Meta>,
    data: Option<BTreeMap<String, Scalar>>,
}

/// Parses a ConfigMap manifest. A YAML error names the line and column; a manifest that is not
/// a ConfigMap, or has no `metadata.name`, is a problem too. `origin` names the input in errors.
pub fn parse_manifest(text: &str, origin: &str) -> Result<ConfigMapData, Problems> {
    let m: Manifest = serde_saphyr::from_str(text).map_err(|e| {
        let at = e
            .location()
            .map(|l| format!("line {} column {}", l.line(), l.column()))
            .unwrap_or_else(|| "(no position)".into());
        let msg = e.to_string();
        let first = msg.lines().next().unwrap_or("invalid YAML").to_string();
        Problems(vec![Problem::new(
            origin,
            at,
            format!("invalid YAML: {first}"),
        )])
    })?;
    if let Some(kind) = &m.kind
        && kind != "ConfigMap"
    {
        return Err(Problems(vec![Problem::new(
            origin,
            kind,
            "kind must be ConfigMap",
        )]));
    }
    let Some(name) = m.metadata.as_ref().and_then(|md| md.name.clone()) else {
        return Err(Problems(vec![Problem::new(
            origin,
            "metadata.name",
            "missing: the ConfigMap's name says which configuration it holds",
        )]));
    };
    Ok(ConfigMapData {
        name,
        namespace: m.metadata.and_then(|md| md.namespace),
        data: m
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into_text()))
            .collect(),
    })
}

/// Reads and parses a ConfigMap manifest file.
pub fn read_manifest(path: &Path) -> Result<ConfigMapData, Problems> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| Problems(vec![Problem::new(&origin, "", format!("cannot read: {e}"))]))?;
    parse_manifest(&text, &origin)
}

/// Reads the ConfigMaps of a manifest file: one, or each document of a `---` stream (and each
/// item of a `kind: List`), in order. A single document keeps [`read_manifest`]'s errors (with
/// the line); in a stream, every document must be a ConfigMap.
pub fn read_manifests(path: &Path) -> Result<Vec<ConfigMapData>, Problems> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| Problems(vec![Problem::new(&origin, "", format!("cannot read: {e}"))]))?;
    let docs = match serde_saphyr::from_multiple::<serde_json::Value>(&text) {
        Ok(docs) => docs,
        Err(_) => return parse_manifest(&text, &origin).map(|cm| vec![cm]),
    };
    let is_list = |d: &serde_json::Value| d.get("kind").and_then(|k| k.as_str()) == Some("List");
    if docs.len() <= 1 && !docs.iter().any(is_list) {
        return parse_manifest(&text, &origin).map(|cm| vec![cm]);
    }
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for doc in &docs {
        let items: Vec<&serde_json::Value> = if is_list(doc) {
            doc.get("items")
                .and_then(|i| i.as_array())
                .map(|a| a.iter().collect())
                .unwrap_or_default()
        } else {
            vec![doc]
        };
        for item in items {
            // Re-read through the one manifest parser, so values are read as in a single file.
            let yaml = serde_saphyr::to_string(item).unwrap_or_default();
            match parse_manifest(&yaml, &origin) {
                Ok(cm) => out.push(cm),
                Err(p) => problems.extend(p.0),
            }
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(Problems(problems))
    }
}

/// Reads `path` as the ConfigMap `T` (its `metadata.name` must be `T::NAME`).
pub fn from_manifest<T: ConfigMap>(path: &Path) -> Result<T, Problems> {
    parsed_from_manifest(path).map(|p| p.config)
}

/// [`from_manifest`] with the keys that have no effect in thaw ([`Parsed::warnings`]).
pub fn parsed_from_manifest<T: ConfigMap>(path: &Path) -> Result<Parsed<T>, Problems> {
    let cm = read_manifest(path)?;
    if cm.name != T::NAME {
        return Err(Problems(vec![Problem::new(
            path.display().to_string(),
            format!("metadata.name: {}", cm.name),
            format!("expected the {} ConfigMap", T::NAME),
        )]));
    }
    T::parse(&cm.data)
}

/// A ConfigMap recognised by its name and checked: every key shown, or every problem; plus
/// its unknown-key warnings either way.
pub fn check_named(cm: &ConfigMapData) -> (Result<Vec<Shown>, Problems>, Vec<String>) {
    fn check<T: ConfigMap>(cm: &ConfigMapData) -> (Result<Vec<Shown>, Problems>, Vec<String>) {
        (
            T::parse(&cm.data).map(|p| p.config.show()),
            T::warnings(&cm.data),
        )
    }
    match cm.name.as_str() {
        super::autoscaler::NAME => check::<AutoscalerConfig>(cm),
        super::defaults::NAME => check::<DefaultsConfig>(cm),
        super::activator::NAME => check::<ActivatorConfig>(cm),
        super::gc::NAME => check::<GcConfig>(cm),
        super::network::DOMAIN_NAME => check::<super::network::DomainConfig>(cm),
        super::network::NETWORK_NAME => check::<super::network::TemplateConfig>(cm),
        super::network::ISTIO_NAME => check::<super::network::IstioConfig>(cm),
        super::network::GATEWAY_NAME => check::<super::network::GatewayConfig>(cm),
        super::network::CERTMANAGER_NAME => check::<super::network::CertManagerConfig>(cm),
        super::deployment::NAME => check::<DeploymentConfig>(cm),
        super::features::NAME => check::<super::FeaturesConfig>(cm),
        super::leader_election::NAME => {
            match super::leader_election::LeaderElectionConfig::parse_map(&cm.data) {
                Ok(p) => (Ok(p.config.show()), p.warnings),
                Err(e) => (Err(e), Vec::new()),
            }
        }
        other => (
            Err(Problems(vec![Problem::new(
                "metadata.name",
                other,
                "not a ConfigMap thaw reads (config-autoscaler, config-defaults, config-activator, \
                 config-gc, config-domain, config-network, config-istio, config-gateway, \
                 config-certmanager, config-deployment, config-features, \
                 config-leader-election)",
            )])),
            Vec::new(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_data_scalars_as_text() {
        let cm = parse_manifest(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: config-autoscaler\n  namespace: knative-serving\ndata:\n  stable-window: 60s\n  max-scale-up-rate: 1000\n  enable-scale-to-zero: true\n  container-concurrency-target-percentage: 0.7\n  _example: |\n    anything\n",
            "t",
        )
        .unwrap();
        assert_eq!(cm.name, "config-autoscaler");
        assert_eq!(cm.data["stable-window"], "60s");
        assert_eq!(cm.data["max-scale-up-rate"], "1000");
        assert_eq!(cm.data["enable-scale-to-zero"], "true");
        assert_eq!(cm.data["container-concurrency-target-percentage"], "0.7");
    }

    #[test]
    fn malformed_yaml_names_the_line() {
        let err = parse_manifest(
            "kind: ConfigMap\nmetadata:\n  name: config-autoscaler\ndata:\n  a: b\n   c: d\n",
            "f.yaml",
        )
        .unwrap_err();
        assert_eq!(err.0.len(), 1);
        assert!(err.0[0].value.starts_with("line "), "{err}");
        assert!(
            err.0[0].value.contains("line 6") || err.0[0].value.contains("line 5"),
            "{err}"
        );
    }

    #[test]
    fn a_stream_or_a_list_gives_each_config_map() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.yaml");
        std::fs::write(
            &p,
            "---\nkind: ConfigMap\nmetadata: {name: config-gc}\ndata: {min-non-active-revisions: 5}\n\
             ---\nkind: List\nitems:\n- kind: ConfigMap\n  metadata: {name: config-domain}\n",
        )
        .unwrap();
        let cms = read_manifests(&p).unwrap();
        let names: Vec<&str> = cms.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["config-gc", "config-domain"]);
        assert_eq!(cms[0].data["min-non-active-revisions"], "5");
        std::fs::write(
            &p,
            "kind: ConfigMap\nmetadata: {name: config-gc}\n---\nkind: Secret\nmetadata: {name: x}\n",
        )
        .unwrap();
        let e = read_manifests(&p).unwrap_err();
        assert_eq!(e.0[0].reason, "kind must be ConfigMap");
        // One document keeps the single-file errors, with the line.
        std::fs::write(
            &p,
            "kind: ConfigMap\nmetadata:\n  name: config-gc\n data: x\n",
        )
        .unwrap();
        let e = read_manifests(&p).unwrap_err();
        assert!(e.0[0].value.starts_with("line "), "{e}");
    }

    #[test]
    fn wrong_kind_and_missing_name_are_problems() {
        assert!(parse_manifest("kind: Secret\nmetadata: {name: x}\n", "f").is_err());
        let e = parse_manifest("kind: ConfigMap\ndata: {a: b}\n", "f").unwrap_err();
        assert_eq!(e.0[0].value, "metadata.name");
    }
}
