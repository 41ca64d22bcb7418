//! Knative Serving v1.15 itself (knative.dev/serving v0.42.2, built by `tests/cluster/build.sh`)
//! installed on the plane as its release says: `serving-crds.yaml` (serving's
//! `config/core/300-resources`, knative.dev/networking's CRDs and knative.dev/caching's Image
//! CRD), waited for, then `serving-core.yaml` (the rest of `config/core`, with networking's
//! `config-network`), in the release's order, through `kubectl apply --server-side` as
//! [`super::install`] applies thaw's deploy/. Then the ingress: net-istio's part, played by
//! [`super::net_istio`] (config-istio naming the plane's gateway Services, its two Gateways,
//! its KIngress reconciler).
//!
//! The one change to the release's objects is what `ko` does when it builds a release: every
//! `ko://knative.dev/serving/cmd/<name>` value (the four Deployments' images, config-deployment's
//! `queue-sidecar-image`, the queue-proxy Image) becomes an image the kubelet stand-in runs,
//! `thaw.test/knative/<name>` ([`images`]: the binary built from that package). The rest is
//! applied as released: resources, probes, security contexts and affinities the stand-in does
//! not enforce are kept (it reports what it cannot honour instead of being told to ignore it).
//! The post-install jobs (`config/post-install`: storage version migration, the default-domain
//! job's magic DNS) are not run: there is nothing to migrate and no DNS; the docs' "No DNS"
//! step is taken instead (config-domain's `example.com`, [`DOMAIN`]).
//!
//! What the plane lacks and how Knative gets it: the API server calls the webhook at its
//! Service's endpoints (`--enable-aggregator-routing`, as for thaw's); the activator's
//! websocket to `autoscaler.knative-serving.svc.cluster.local:8080` and the autoscaler's probe
//! of a revision's public Service (`{revision}.{namespace}.svc.cluster.local:80`, which must
//! lead to the activator before it scales to zero) need cluster DNS and kube-proxy: the kubelet
//! stand-in resolves Service names for knative-serving's pods and proxies cluster IPs
//! ([`super::kubelet::Kubelet::resolve_services`], turned on before the Deployments are
//! applied). The autoscaler scrapes and the activator probes pods at their own addresses.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::Plane;
use super::kubelet::ImageRun;
use super::net_istio::{self, NetIstio};

/// Where Knative lives.
pub const NAMESPACE: &str = "knative-serving";
/// The images the kubelet stand-in maps to Knative's binaries: `thaw.test/knative/<name>`.
pub const IMAGE_REPO: &str = "thaw.test/knative";
/// The domain of Knative's routes: config-domain's key, as Knative's "No DNS" install step
/// sets it (requests name the route's host in `Host`).
pub const DOMAIN: &str = "example.com";
/// What `ko` resolves: `ko://knative.dev/serving/cmd/<name>`.
const KO_PREFIX: &str = "ko://knative.dev/serving/cmd/";
/// Knative's commands built by `tests/cluster/build.sh` into `knative/bin`.
const COMMANDS: [&str; 5] = ["activator", "autoscaler", "controller", "queue", "webhook"];
/// How long the install waits for the webhook to answer admission requests.
const WEBHOOK_WAIT: Duration = Duration::from_secs(120);
/// How long [`Knative::stop`] waits for a component's pods to be gone.
const STOP_WAIT: Duration = Duration::from_secs(700);

/// A component of Knative Serving's control and data plane: a Deployment of knative-serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Component {
    Controller,
    Webhook,
    Autoscaler,
    Activator,
}

impl Component {
    pub const ALL: [Component; 4] = [
        Component::Controller,
        Component::Webhook,
        Component::Autoscaler,
        Component::Activator,
    ];

    /// Its Deployment's name (also its pods' `app` label).
    pub fn deployment(self) -> &'static str {
        match self {
            Component::Controller => "controller",
            Component::Webhook => "webhook",
            Component::Autoscaler => "autoscaler",
            Component::Activator => "activator",
        }
    }
}

/// The images of Knative's commands, for the kubelet stand-in: `thaw.test/knative/<name>`
/// runs the binary `tests/cluster/build.sh` built from `knative.dev/serving/cmd/<name>`.
pub fn images() -> Vec<(String, ImageRun)> {
    let bin = super::bin_dir().join("knative/bin");
    COMMANDS
        .iter()
        .map(|c| {
            (
                format!("{IMAGE_REPO}/{c}"),
                ImageRun {
                    program: bin.join(c),
                    args: vec![],
                    env: vec![],
                },
            )
        })
        .collect()
}

/// The release YAML `tests/cluster/build.sh` copied from the modules.
fn config_dir() -> PathBuf {
    super::bin_dir().join("knative/config")
}

/// The YAML files under `dir`, recursively, in the order `ko resolve -R -f` reads them
/// (lexical paths).
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            out.extend(yaml_files(&p));
        } else if p.extension().is_some_and(|e| e == "yaml") {
            out.push(p);
        }
    }
    out
}

/// `serving-crds.yaml`'s files: serving's resources, networking's, caching's Image.
fn crd_files() -> Vec<PathBuf> {
    let c = config_dir();
    let mut files = yaml_files(&c.join("serving/core/300-resources"));
    for f in [
        "certificate.yaml",
        "domain-claim.yaml",
        "ingress.yaml",
        "serverlessservice.yaml",
    ] {
        files.push(c.join("networking").join(f));
    }
    files.push(c.join("caching/image.yaml"));
    files
}

/// `serving-core.yaml`'s files but the CRDs: the rest of `config/core`, with networking's
/// config-network (a link into networking's config in serving's repository).
fn core_files() -> Vec<PathBuf> {
    let c = config_dir();
    let core = c.join("serving/core");
    let mut files: Vec<PathBuf> = yaml_files(&core)
        .into_iter()
        .filter(|p| !p.starts_with(core.join("300-resources")))
        .collect();
    let at = files
        .iter()
        .position(|p| p.starts_with(core.join("deployments")))
        .unwrap_or(files.len());
    files.insert(at, c.join("networking/config-network.yaml"));
    files
}

/// Every object of `files`, in order, with `ko://` images resolved ([`resolve_images`]).
fn objects(files: &[PathBuf]) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f)
            .map_err(|e| format!("{}: {e} (run tests/cluster/build.sh)", f.display()))?;
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .map_err(|e| format!("{}: not YAML: {e}", f.display()))?;
        for mut d in docs.into_iter().filter(|d| d.is_object()) {
            resolve_images(&mut d);
            out.push(d);
        }
    }
    Ok(out)
}

/// What `ko` does to the release: every string `ko://knative.dev/serving/cmd/<name>` becomes
/// the image `thaw.test/knative/<name>`.
fn resolve_images(v: &mut Value) {
    match v {
        Value::String(s) => {
            if let Some(name) = s.strip_prefix(KO_PREFIX) {
                *s = format!("{IMAGE_REPO}/{name}");
            }
        }
        Value::Array(items) => items.iter_mut().for_each(resolve_images),
        Value::Object(m) => m.values_mut().for_each(resolve_images),
        _ => {}
    }
}

/// `kubectl apply --server-side` of `objects` as one List, written into the plane's directory.
async fn apply(plane: &Plane, name: &str, objects: &[Value]) -> Result<String, String> {
    let path = plane.dir.path().join(format!("knative-{name}.json"));
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    std::fs::write(&path, serde_json::to_vec_pretty(&list).unwrap())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    plane
        .kubectl(&[
            "apply",
            "--server-side",
            "--field-manager=knative-release",
            "-f",
            &path.display().to_string(),
        ])
        .await
}

fn name_of(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or_default()
}

/// Knative installed on the plane: what the release made (to list and undo it) and the
/// ingress's stand-in (its reconciler runs until this is dropped).
pub struct Knative {
    /// The resources of Knative's CRDs, `plural.group`: Knative's objects are theirs.
    pub resources: Vec<String>,
    /// The webhook configurations the release made, as applied.
    pub webhooks: Vec<Value>,
    pub net_istio: NetIstio,
}

/// Installs Knative Serving as its release says (this module's doc) and the ingress's
/// stand-in; returns once every Deployment of knative-serving is Available and the API server
/// admits Knative's writes ([`Knative::until_admitted`]), or `Err` naming the step that
/// failed.
pub async fn install(plane: &Plane) -> Result<Knative, String> {
    let crds = objects(&crd_files())?;
    apply(plane, "crds", &crds).await?;
    let mut wait = vec![
        "wait".to_string(),
        "--for=condition=Established".into(),
        "--timeout=60s".into(),
    ];
    wait.extend(crds.iter().map(|c| format!("crd/{}", name_of(c))));
    plane
        .kubectl(&wait.iter().map(String::as_str).collect::<Vec<_>>())
        .await?;
    let resources = crds
        .iter()
        .map(|c| {
            format!(
                "{}.{}",
                c["spec"]["names"]["plural"].as_str().unwrap_or_default(),
                c["spec"]["group"].as_str().unwrap_or_default()
            )
        })
        .collect();

    // Before any of Knative's pods: the activator dials the autoscaler by name.
    plane.kubelet.resolve_services(NAMESPACE);
    let core = objects(&core_files())?;
    let webhooks = core
        .iter()
        .filter(|o| {
            o["kind"]
                .as_str()
                .is_some_and(|k| k.ends_with("WebhookConfiguration"))
        })
        .cloned()
        .collect();
    apply(plane, "core", &core).await?;
    let net_istio = net_istio::install(plane).await?;
    super::install::wait_available(plane, NAMESPACE).await?;
    let knative = Knative {
        resources,
        webhooks,
        net_istio,
    };
    knative.until_admitted(plane).await?;
    // Knative's "No DNS" step: routes are `{route}.{namespace}.example.com`, reached by Host.
    // After the webhook answers: it validates config-domain.
    plane
        .kubectl(&[
            "-n",
            NAMESPACE,
            "patch",
            "configmap/config-domain",
            "--type=merge",
            &format!(r#"--patch={{"data":{{"{DOMAIN}":""}}}}"#),
        ])
        .await?;
    Ok(knative)
}

impl Knative {
    /// Waits (up to [`WEBHOOK_WAIT`]) until the API server admits Knative's controller's
    /// writes: a server-side dry run, as the controller's ServiceAccount, of a Configuration in
    /// `default` owned by a Service (as the controller makes them, `blockOwnerDeletion` set)
    /// passes Knative's webhook, which has its certificate, has written its configurations' CA
    /// bundles and rules, and defaults it; and `OwnerReferencesPermissionEnforcement`, which
    /// refuses (but to a user who may finalize anything, such as the admin) an owner whose kind
    /// the API server's discovery does not know yet (it learns new CRDs' kinds within seconds).
    pub async fn until_admitted(&self, plane: &Plane) -> Result<(), String> {
        let path = plane.dir.path().join("knative-admission-probe.yaml");
        std::fs::write(
            &path,
            "apiVersion: serving.knative.dev/v1\nkind: Configuration\nmetadata:\n  name: admission-probe\n  namespace: default\n  ownerReferences:\n    - apiVersion: serving.knative.dev/v1\n      kind: Service\n      name: admission-probe\n      uid: 6d1f3c52-0c1e-4a4e-9d55-2f0b7a0f3c11\n      controller: true\n      blockOwnerDeletion: true\nspec:\n  template:\n    spec:\n      containers:\n        - image: ghcr.io/knative/helloworld-go\n",
        )
        .unwrap();
        let deadline = Instant::now() + WEBHOOK_WAIT;
        loop {
            let out = plane
                .kubectl(&[
                    &format!("--as=system:serviceaccount:{NAMESPACE}:controller"),
                    "create",
                    "--dry-run=server",
                    "-o",
                    "json",
                    "-f",
                    &path.display().to_string(),
                ])
                .await;
            match out {
                // Defaulted by the webhook: the container got its default name.
                Ok(o) if o.contains("\"user-container\"") => return Ok(()),
                Ok(o) if Instant::now() >= deadline => {
                    return Err(format!(
                        "Knative's webhook did not default a Configuration: {o}"
                    ));
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!(
                        "the API server does not admit Knative's writes after {WEBHOOK_WAIT:?}: {e}"
                    ));
                }
                _ => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }

    /// Stops `c` as an operator would: its Deployment scaled to 0; returns once its pods are
    /// gone, or `Err` after [`STOP_WAIT`] (their grace periods are the release's: the
    /// activator's is 600 s, though it drains and exits well before).
    pub async fn stop(&self, plane: &Plane, c: Component) -> Result<(), String> {
        self.scale(plane, c, 0).await?;
        pods_gone(plane, c).await
    }

    /// Deletes `c`'s Deployment, as the cut-over does (docs/migrating-from-knative.md);
    /// returns once its pods are gone, or `Err` after [`STOP_WAIT`].
    pub async fn delete(&self, plane: &Plane, c: Component) -> Result<(), String> {
        plane
            .kubectl(&[
                "-n",
                NAMESPACE,
                "delete",
                &format!("deployment/{}", c.deployment()),
                "--wait=false",
            ])
            .await?;
        pods_gone(plane, c).await
    }

    /// Starts `c` again (its Deployment scaled to 1); returns once it is Available.
    pub async fn start(&self, plane: &Plane, c: Component) -> Result<(), String> {
        self.scale(plane, c, 1).await?;
        plane
            .kubectl(&[
                "-n",
                NAMESPACE,
                "rollout",
                "status",
                &format!("deployment/{}", c.deployment()),
                &format!("--timeout={}", super::install::WAIT),
            ])
            .await
            .map(drop)
    }

    async fn scale(&self, plane: &Plane, c: Component, replicas: u32) -> Result<(), String> {
        plane
            .kubectl(&[
                "-n",
                NAMESPACE,
                "scale",
                &format!("deployment/{}", c.deployment()),
                &format!("--replicas={replicas}"),
            ])
            .await
            .map(drop)
    }

    /// Deletes the webhook configurations the release made (the webhook stops being called;
    /// Knative's objects are admitted without its defaulting and validation). Knative's
    /// webhook only updates its configurations: it does not make them again
    /// ([`Knative::restore_webhooks`] does).
    pub async fn remove_webhooks(&self, plane: &Plane) -> Result<(), String> {
        for o in &self.webhooks {
            let what = format!(
                "{}/{}",
                o["kind"].as_str().unwrap_or_default().to_lowercase(),
                name_of(o)
            );
            plane
                .kubectl(&["delete", &what, "--ignore-not-found"])
                .await?;
        }
        Ok(())
    }

    /// Applies the release's webhook configurations again (after
    /// [`Knative::remove_webhooks`]); a running webhook fills in their CA bundle and rules,
    /// [`Knative::until_admitted`] waits for it.
    pub async fn restore_webhooks(&self, plane: &Plane) -> Result<(), String> {
        apply(plane, "webhooks", &self.webhooks).await.map(drop)
    }

    /// Every object of Knative's resources in the cluster (Services, Configurations,
    /// Revisions, Routes, KIngresses, ServerlessServices, PodAutoscalers, Metrics,
    /// Certificates, Images, ...), sorted.
    pub async fn objects(&self, plane: &Plane) -> Result<Vec<KnativeObject>, String> {
        let out = plane
            .kubectl(&["get", &self.resources.join(","), "-A", "-o", "json"])
            .await?;
        let list: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
        let mut objects: BTreeSet<KnativeObject> = BTreeSet::new();
        for o in list["items"].as_array().into_iter().flatten() {
            let ready = o["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "Ready")
                .and_then(|c| c["status"].as_str())
                .map(str::to_string);
            objects.insert(KnativeObject {
                kind: o["kind"].as_str().unwrap_or_default().into(),
                namespace: o["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .into(),
                name: name_of(o).into(),
                ready,
            });
        }
        Ok(objects.into_iter().collect())
    }
}

/// Waits until `c` has no pod left; `Err` after [`STOP_WAIT`].
async fn pods_gone(plane: &Plane, c: Component) -> Result<(), String> {
    let pods: Api<Pod> = Api::namespaced(plane.admin.clone(), NAMESPACE);
    let lp = ListParams::default().labels(&format!("app={}", c.deployment()));
    let deadline = Instant::now() + STOP_WAIT;
    loop {
        match pods.list(&lp).await {
            Ok(l) if l.items.is_empty() => return Ok(()),
            Ok(l) if Instant::now() >= deadline => {
                return Err(format!(
                    "{} still has {} pod(s) after {STOP_WAIT:?}",
                    c.deployment(),
                    l.items.len()
                ));
            }
            Err(e) if Instant::now() >= deadline => return Err(e.to_string()),
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// One of Knative's objects as [`Knative::objects`] lists it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct KnativeObject {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// Its Ready condition's status, if it has one.
    pub ready: Option<String>,
}

impl std::fmt::Display for KnativeObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}/{} Ready={}",
            self.kind,
            self.namespace,
            self.name,
            self.ready.as_deref().unwrap_or("-")
        )
    }
}
