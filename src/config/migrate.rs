//! `thaw migrate config`: Knative Serving's ConfigMaps carried over to thaw's.
//!
//! Reads Knative's ConfigMaps from manifest files (a ConfigMap per document, a `kind: List` as
//! `kubectl get configmaps -o yaml` prints it, or a whole release YAML whose other kinds are
//! passed over; `-` is stdin) or from a live cluster (`--from-cluster`: the namespace's
//! ConfigMaps named `config-*`, `knative-serving` by default, through the client the roles use:
//! in-cluster or `KUBECONFIG`). Writes thaw's to stdout as a YAML stream, each ConfigMap in the
//! target namespace (`thaw-system` by default) with every key and value Knative had but
//! `_example` (Knative's commented documentation). Nothing is written to the cluster: the
//! operator reads the stream and applies it (`| kubectl apply --server-side
//! --field-manager=thaw-migrate -f -`), so the step can be reviewed and undone like any other
//! manifest.
//!
//! On stderr, per ConfigMap (`{config-map}: {key}: {what}`), every key that does not simply
//! carry over, under [`super::keys`]'s rule (the one `thaw config check` and the live reload
//! apply):
//! - a key read under a newer name: `config-istio: gateway.knative-serving.knative-ingress-gateway:
//!   read as external-gateways` (net-istio's older gateway keys, config-network's `ingress.class`
//!   and `auto-tls`, config-leader-election's camel-case timings);
//! - a key with no effect in thaw (unknown, a Knative key thaw does not implement, a value
//!   Knative would ignore): carried over, and named with why;
//! - `config-deployment`'s `queue-sidecar-image`: *not* carried over. It names Knative's
//!   queue-proxy image, which is not thaw's sidecar; without the key thaw's controller injects
//!   its own image (`thaw queue`).
//! - A ConfigMap thaw does not read at all (`config-observability`, `config-logging`,
//!   `config-tracing`, or any other): named whole, not written.
//!
//! An invalid value of a key thaw implements is an error (`{config-map}: {key}: {value}:
//! {reason}`), exactly what `thaw config check` would say of the written ConfigMap: the
//! stream is still written (every ConfigMap, so the operator can fix the value in it) and the
//! exit code is 1. `--output json` prints one object instead of the stream:
//!
//! ```json
//! {"ok": true, "errors": [{"configMap": "config-gc", "key": "...", "value": "...", "reason": "..."}],
//!  "notes": [{"configMap": "config-istio", "key": "gateway.ns.gw", "message": "read as external-gateways"},
//!            {"configMap": "config-logging", "key": null, "message": "a ConfigMap thaw does not read; not carried over"}],
//!  "configMaps": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {...}, "data": {...}}]}
//! ```

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{Value, json};

use super::load::check_named;
use super::parse::Problem;

/// Knative Serving's system namespace, where `--from-cluster` reads by default.
pub const KNATIVE_NAMESPACE: &str = "knative-serving";

/// The annotation naming where a migrated ConfigMap came from (`knative-serving/config-gc` or
/// the file).
pub const MIGRATED_FROM: &str = "thaw.dev/migrated-from";

/// The ConfigMaps thaw reads, by name (Knative's, and thaw's own `config-activator`).
pub const READ_BY_THAW: &[&str] = &[
    super::autoscaler::NAME,
    super::defaults::NAME,
    super::activator::NAME,
    super::gc::NAME,
    super::network::DOMAIN_NAME,
    super::network::NETWORK_NAME,
    super::network::ISTIO_NAME,
    super::network::GATEWAY_NAME,
    super::network::CERTMANAGER_NAME,
    super::deployment::NAME,
    super::features::NAME,
    super::leader_election::NAME,
];

/// Output format of `thaw migrate config`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// thaw's ConfigMaps as a YAML stream (notes and errors on stderr).
    Yaml,
    /// One JSON object `{ok, errors, notes, configMaps}`.
    Json,
}

/// Arguments of `thaw migrate config`.
#[derive(Debug, clap::Args)]
pub struct MigrateConfigArgs {
    /// Manifests holding Knative's ConfigMaps (`-`: stdin). Other kinds are passed over.
    #[arg(
        required_unless_present = "from_cluster",
        conflicts_with = "from_cluster"
    )]
    pub files: Vec<PathBuf>,
    /// Read the ConfigMaps of a live cluster instead (in-cluster config or KUBECONFIG).
    #[arg(long)]
    pub from_cluster: bool,
    /// Knative's namespace, for --from-cluster.
    #[arg(long, default_value = KNATIVE_NAMESPACE)]
    pub knative_namespace: String,
    /// The namespace written into thaw's ConfigMaps.
    #[arg(long, default_value = super::live::SYSTEM_NAMESPACE)]
    pub namespace: String,
    #[arg(long, value_enum, default_value_t = Output::Yaml)]
    pub output: Output,
}

/// One of Knative's ConfigMaps as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// Where it came from: a file, or `namespace/name` in the cluster.
    pub origin: String,
    pub name: String,
    pub data: BTreeMap<String, String>,
}

/// A note on one ConfigMap: a key that does not simply carry over (`key` set), or the whole
/// ConfigMap (`key` `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub config_map: String,
    pub key: Option<String>,
    pub message: String,
}

impl std::fmt::Display for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.key {
            Some(k) => write!(f, "{}: {k}: {}", self.config_map, self.message),
            None => write!(f, "{}: {}", self.config_map, self.message),
        }
    }
}

/// What migrating found: thaw's ConfigMaps, the notes, and the invalid values.
#[derive(Debug, Clone, Default)]
pub struct Migration {
    /// thaw's ConfigMaps (whole manifests), in the order read.
    pub config_maps: Vec<Value>,
    pub notes: Vec<Note>,
    /// Invalid values of keys thaw implements, each naming its ConfigMap (as `file`).
    pub errors: Vec<Problem>,
}

/// The keys read under a newer name: (ConfigMap, key) → the name thaw reads it as.
fn read_as(config_map: &str, key: &str) -> Option<&'static str> {
    match (config_map, key) {
        (super::network::ISTIO_NAME, k) => super::network::istio_legacy::read_as(k),
        (super::network::NETWORK_NAME, "ingress.class") => Some("ingress-class"),
        (super::network::NETWORK_NAME, "auto-tls") => Some("external-domain-tls"),
        (super::leader_election::NAME, "leaseDuration") => Some("lease-duration"),
        (super::leader_election::NAME, "renewDeadline") => Some("renew-deadline"),
        (super::leader_election::NAME, "retryPeriod") => Some("retry-period"),
        _ => None,
    }
}

/// Keys not carried over, with why: Knative values that would break thaw if kept.
fn dropped(config_map: &str, key: &str) -> Option<&'static str> {
    match (config_map, key) {
        (super::deployment::NAME, "queue-sidecar-image") => Some(
            "Knative's queue-proxy image, not carried over: it is not thaw's sidecar; without \
             the key thaw's controller injects its own (thaw queue)",
        ),
        _ => None,
    }
}

/// Migrates `sources` into ConfigMaps of `namespace` (pure: no I/O). A name given twice is an
/// error on the second.
pub fn migrate(sources: &[Source], namespace: &str) -> Migration {
    let mut m = Migration::default();
    let mut seen = BTreeMap::new();
    for s in sources {
        if let Some(first) = seen.insert(s.name.clone(), s.origin.clone()) {
            m.errors.push(
                Problem::new(
                    "metadata.name",
                    &s.name,
                    format!("given twice (first in {first}): keep one"),
                )
                .in_file(&s.name),
            );
            continue;
        }
        let note = |key: Option<&str>, message: String| Note {
            config_map: s.name.clone(),
            key: key.map(str::to_string),
            message,
        };
        if !READ_BY_THAW.contains(&s.name.as_str()) {
            m.notes.push(note(
                None,
                format!(
                    "a ConfigMap thaw does not read; not carried over ({} key(s))",
                    s.data.keys().filter(|k| *k != "_example").count()
                ),
            ));
            continue;
        }
        let mut data = BTreeMap::new();
        for (k, v) in &s.data {
            if k == "_example" {
                continue;
            }
            if let Some(why) = dropped(&s.name, k) {
                m.notes.push(note(Some(k), why.to_string()));
                continue;
            }
            if let Some(target) = read_as(&s.name, k) {
                m.notes.push(note(Some(k), format!("read as {target}")));
            }
            data.insert(k.clone(), v.clone());
        }
        let written = super::load::ConfigMapData {
            name: s.name.clone(),
            namespace: Some(namespace.to_string()),
            data: data.clone(),
        };
        let (result, warnings) = check_named(&written);
        for w in warnings {
            let key = super::keys::warning_key(&w).to_string();
            let why = w
                .split_once(':')
                .map_or(w.as_str(), |(_, why)| why)
                .trim()
                .to_string();
            m.notes.push(note(Some(&key), why));
        }
        if let Err(problems) = result {
            m.errors
                .extend(problems.0.into_iter().map(|p| p.in_file(&s.name)));
        }
        m.config_maps.push(json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": s.name,
                "namespace": namespace,
                "annotations": {MIGRATED_FROM: s.origin},
            },
            "data": data,
        }));
    }
    m
}

/// Knative's ConfigMaps in the YAML documents of one input: ConfigMaps, and the ConfigMaps of
/// `kind: List` documents; other kinds are passed over.
pub fn sources_in(docs: &[Value], origin: &str) -> Result<Vec<Source>, Problem> {
    let mut out = Vec::new();
    let mut push = |doc: &Value| -> Result<(), Problem> {
        if doc.get("kind").and_then(Value::as_str) != Some("ConfigMap") {
            return Ok(());
        }
        let name = doc
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .ok_or_else(|| Problem::new(origin, "metadata.name", "a ConfigMap without a name"))?;
        let mut data = BTreeMap::new();
        if let Some(map) = doc.get("data").and_then(Value::as_object) {
            for (k, v) in map {
                let text = match v {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                };
                data.insert(k.clone(), text);
            }
        }
        out.push(Source {
            origin: origin.to_string(),
            name: name.to_string(),
            data,
        });
        Ok(())
    };
    for doc in docs {
        if doc.get("kind").and_then(Value::as_str) == Some("List") {
            for item in doc
                .get("items")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                push(item)?;
            }
        } else {
            push(doc)?;
        }
    }
    Ok(out)
}

/// Reads Knative's ConfigMaps from files (`-`: stdin).
pub fn read_files(files: &[PathBuf]) -> Result<Vec<Source>, Problem> {
    let mut out = Vec::new();
    for path in files {
        let origin = path.display().to_string();
        let mut text = String::new();
        if path.as_os_str() == "-" {
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| Problem::new(&origin, "", format!("cannot read: {e}")))?;
        } else {
            text = std::fs::read_to_string(path)
                .map_err(|e| Problem::new(&origin, "", format!("cannot read: {e}")))?;
        }
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).map_err(|e| {
            let first = e.to_string();
            let first = first.lines().next().unwrap_or("invalid YAML").to_string();
            Problem::new(&origin, "", format!("invalid YAML: {first}"))
        })?;
        out.extend(sources_in(&docs, &origin)?);
    }
    Ok(out)
}

/// The namespace's ConfigMaps named `config-*` (Knative's naming), in name order, through
/// `client`; the others (`kube-root-ca.crt`, an operator's own) are not Knative's
/// configuration and are passed over.
pub async fn read_cluster(client: kube::Client, namespace: &str) -> Result<Vec<Source>, String> {
    use k8s_openapi::api::core::v1::ConfigMap as KubeConfigMap;
    let api: kube::Api<KubeConfigMap> = kube::Api::namespaced(client, namespace);
    let list = api
        .list(&kube::api::ListParams::default())
        .await
        .map_err(|e| format!("cannot list the ConfigMaps of {namespace}: {e}"))?;
    let mut out: Vec<Source> = list
        .items
        .into_iter()
        .filter_map(|cm| {
            let name = cm.metadata.name?;
            name.starts_with("config-").then(|| Source {
                origin: format!("{namespace}/{name}"),
                name,
                data: cm.data.unwrap_or_default().into_iter().collect(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// A manifest's fields in the order kubectl prints them (a JSON map would sort them).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Ordered<'a> {
    api_version: &'a Value,
    kind: &'a Value,
    metadata: OrderedMeta<'a>,
    data: &'a Value,
}

#[derive(serde::Serialize)]
struct OrderedMeta<'a> {
    name: &'a Value,
    namespace: &'a Value,
    annotations: &'a Value,
}

/// thaw's ConfigMaps as a YAML stream.
pub fn render_yaml(m: &Migration) -> String {
    let mut out = String::new();
    for cm in &m.config_maps {
        let ordered = Ordered {
            api_version: &cm["apiVersion"],
            kind: &cm["kind"],
            metadata: OrderedMeta {
                name: &cm["metadata"]["name"],
                namespace: &cm["metadata"]["namespace"],
                annotations: &cm["metadata"]["annotations"],
            },
            data: &cm["data"],
        };
        out.push_str("---\n");
        // Serialising strings and maps cannot fail.
        out.push_str(&serde_saphyr::to_string(&ordered).expect("a ConfigMap serialises to YAML"));
    }
    out
}

/// The JSON report (the module's documentation shows its shape).
pub fn render_json(m: &Migration) -> Value {
    json!({
        "ok": m.errors.is_empty(),
        "errors": m.errors.iter().map(|p| json!({
            "configMap": p.file, "key": p.key, "value": p.value, "reason": p.reason,
        })).collect::<Vec<_>>(),
        "notes": m.notes.iter().map(|n| json!({
            "configMap": n.config_map, "key": n.key, "message": n.message,
        })).collect::<Vec<_>>(),
        "configMaps": m.config_maps,
    })
}

/// Runs the command: the stream (or JSON) on stdout, notes and errors on stderr; exit 1 when
/// an input cannot be read or a value is invalid for thaw.
pub fn run(args: &MigrateConfigArgs) -> ExitCode {
    let sources = if args.from_cluster {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                crate::cli::say(format!("thaw migrate config: cannot start a runtime: {e}"));
                return crate::cli::invalid();
            }
        };
        let read = rt.block_on(async {
            let client = kube::Client::try_default()
                .await
                .map_err(|e| format!("no Kubernetes client configuration: {e}"))?;
            read_cluster(client, &args.knative_namespace).await
        });
        match read {
            Ok(s) => s,
            Err(e) => {
                crate::cli::say(format!("thaw migrate config: {e}"));
                return crate::cli::invalid();
            }
        }
    } else {
        match read_files(&args.files) {
            Ok(s) => s,
            Err(p) => {
                crate::cli::say(p);
                return crate::cli::invalid();
            }
        }
    };
    let m = migrate(&sources, &args.namespace);
    {
        let mut err = std::io::stderr().lock();
        for n in &m.notes {
            let _ = writeln!(err, "{n}");
        }
        for p in &m.errors {
            let _ = writeln!(err, "error: {p}");
        }
    }
    match args.output {
        Output::Yaml => crate::cli::out(&render_yaml(&m)),
        Output::Json => crate::cli::out(&format!("{:#}\n", render_json(&m))),
    }
    if m.errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        crate::cli::invalid()
    }
}

#[cfg(test)]
mod tests;
