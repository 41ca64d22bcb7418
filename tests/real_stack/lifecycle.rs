//! The lifecycle cases of the whole stack on the real control plane: what the webhook writes
//! and refuses (Knative's defaults in a Service, a Revision's spec kept immutable, its own
//! certificate rotated under a stream of applies), what goes away (config-gc's old revisions,
//! a deleted Service's objects, a deleted namespace, each through Kubernetes' own garbage
//! collector and namespace controller), and Pod Security `restricted` (a Service's pods with
//! and without `secure-pod-defaults`, thaw's own pods). The real-plane equivalents of
//! tests/webhook_admission.rs, tests/controller_e2e.rs's config-gc case and the stack tests'
//! Service lifecycle.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Pod, Secret};
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use thaw::webhook::certs::{self, Stored};
use tokio::time::Instant;

use crate::plane_support::Plane;
use crate::plane_support::harness::{Case, SYSTEM_CONFIG, apply, show};
use crate::{case, exclusive_case};

/// This module's cases.
pub fn cases() -> Vec<Case> {
    vec![
        case!(the_webhook_writes_knatives_defaults_into_a_service),
        case!(a_revision_spec_change_is_refused_as_immutable),
        exclusive_case!(the_webhook_certificate_rotates_under_applies_none_refused),
        case!(config_gc_collects_the_oldest_non_routed_revisions),
        case!(a_deleted_service_leaves_nothing_behind),
        case!(a_deleted_namespace_with_services_goes_away),
        case!(restricted_pods_need_a_security_context_not_the_sidecar),
        exclusive_case!(secure_pod_defaults_admit_helloworld_under_restricted),
        case!(thaw_system_enforces_restricted_on_every_pod),
    ]
}

// === helpers ===

const SYSTEM: &str = "thaw-system";
/// The webhook's certificate Secret (`thaw webhook --secret`, deploy/webhook/).
const CERTS_SECRET: &str = "thaw-webhook-certs";
/// The two webhook configurations (deploy/webhook/configurations.yaml).
const WEBHOOK_CONFIGURATIONS: &str = "thaw-webhook";
/// The name the API server checks the webhook's certificate against (its Service's).
const WEBHOOK_SERVER_NAME: &str = "thaw-webhook.thaw-system.svc";
/// The admission port of a webhook replica (`--listen`).
const WEBHOOK_PORT: u16 = 8443;
/// Pod Security `restricted`, as the README tells to label a namespace.
const RESTRICTED: [&str; 2] = [
    "pod-security.kubernetes.io/enforce=restricted",
    "pod-security.kubernetes.io/enforce-version=v1.33",
];

/// Knative's helloworld-go Service, as Knative's documentation writes it (`TARGET` varied).
fn helloworld(name: &str, target: &str) -> String {
    format!(
        r#"apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: {name}
spec:
  template:
    spec:
      containers:
        - image: ghcr.io/knative/helloworld-go:latest
          ports:
            - containerPort: 8080
          env:
            - name: TARGET
              value: "{target}"
"#
    )
}

/// Evaluates `body` (an async block's body returning `Result<T, String>`) every 250 ms until
/// it is `Ok`, and is its value; panics with its last error after `within`.
macro_rules! until {
    ($what:expr, $within:expr, $body:block $(,)?) => {{
        let (what, within) = ($what, $within);
        let deadline = Instant::now() + within;
        loop {
            match checked(async { $body }).await {
                Ok(v) => break v,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "{what}: not so after {within:?}: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }};
}

/// Gives [`until!`]'s body its type.
async fn checked<T>(body: impl Future<Output = Result<T, String>>) -> Result<T, String> {
    body.await
}

/// `kubectl ... -o json`, parsed.
async fn kubectl_json(plane: &Plane, args: &[&str]) -> Result<Value, String> {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let out = plane.kubectl(&all).await?;
    serde_json::from_str(&out).map_err(|e| format!("kubectl {}: {e}", args.join(" ")))
}

use crate::plane_support::checks::condition;

fn condition_text(obj: &Value, type_: &str) -> String {
    condition(obj, type_).map_or_else(
        || format!("no {type_} condition"),
        |c| format!("{type_}={} {}: {}", c["status"], c["reason"], c["message"]),
    )
}

/// Waits until Service `name` is Ready with `revision` its latest ready revision; returns it.
async fn until_ready(plane: &Plane, ns: &str, name: &str, revision: &str) -> Value {
    until!(
        &format!("ksvc {ns}/{name} Ready on {revision}"),
        Duration::from_secs(180),
        {
            let ksvc = kubectl_json(plane, &["-n", ns, "get", "ksvc", name]).await?;
            let ready = condition(&ksvc, "Ready").is_some_and(|c| c["status"] == "True");
            let latest = &ksvc["status"]["latestReadyRevisionName"];
            let generation = &ksvc["metadata"]["generation"];
            if ready && latest == revision && ksvc["status"]["observedGeneration"] == *generation {
                Ok(ksvc)
            } else {
                Err(format!(
                    "{}; latestReady {latest}",
                    condition_text(&ksvc, "Ready")
                ))
            }
        },
    )
}

/// Runs `body` with `data` merged into the thaw-system ConfigMap `name` (by `kubectl patch`,
/// as an operator would), then puts back the data it had, also when `body` panics (the panic
/// is resumed once restored). The caller holds [`SYSTEM_CONFIG`].
async fn with_system_config(
    plane: &Arc<Plane>,
    name: &str,
    data: Value,
    body: impl Future<Output = ()> + Send + 'static,
) {
    let cms: Api<ConfigMap> = Api::namespaced(plane.admin.clone(), SYSTEM);
    let before = cms.get(name).await.unwrap().data.unwrap_or_default();
    let patch = json!({ "data": data }).to_string();
    plane
        .kubectl(&[
            "-n",
            SYSTEM,
            "patch",
            "configmap",
            name,
            "--type=merge",
            "-p",
            &patch,
        ])
        .await
        .unwrap();
    let outcome = tokio::spawn(body).await;
    let restore = json!([{ "op": "replace", "path": "/data", "value": before }]).to_string();
    plane
        .kubectl(&[
            "-n",
            SYSTEM,
            "patch",
            "configmap",
            name,
            "--type=json",
            "-p",
            &restore,
        ])
        .await
        .unwrap_or_else(|e| panic!("restoring {name}: {e}"));
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// The names of the objects of `kinds` in `ns` (`kind/name`, as `kubectl get -o name`).
async fn objects(plane: &Plane, ns: &str, kinds: &[&str]) -> Result<Vec<String>, String> {
    let out = plane
        .kubectl(&["-n", ns, "get", &kinds.join(","), "-o", "name"])
        .await?;
    Ok(out.lines().map(str::to_string).collect())
}

/// What a Service makes, directly or through its children: every kind its deletion must
/// take away.
const OWNED_KINDS: &[&str] = &[
    "configurations.serving.knative.dev",
    "routes.serving.knative.dev",
    "revisions.serving.knative.dev",
    "deployments.apps",
    "replicasets.apps",
    "pods",
    "services",
    "endpoints",
    "endpointslices.discovery.k8s.io",
    "virtualservices.networking.istio.io",
];

/// `kind` of a `kubectl get -o name` line (`deployment.apps/x` -> `deployment.apps`).
fn kind_of(line: &str) -> &str {
    line.split('/').next().unwrap_or(line)
}

fn count_by_kind(names: &[String]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for n in names {
        *m.entry(kind_of(n).to_string()).or_insert(0) += 1;
    }
    m
}

// === 3. what the webhook writes and refuses ===

/// A Service that sets none of them gets Knative's defaults from the mutating webhook
/// (`webhook.serving.knative.dev`, `thaw webhook` behind it), in the object the API server
/// stores and returns to the apply itself: `containerConcurrency: 0`, `timeoutSeconds: 300`,
/// the container named `user-container` with the TCP readiness probe, `enableServiceLinks:
/// false`, all traffic to the latest revision, and the creator. The CRD's schema defaults none
/// of these, and no controller writes a Service's spec: the webhook did.
async fn the_webhook_writes_knatives_defaults_into_a_service(plane: Arc<Plane>, ns: String) {
    let yaml = helloworld("hello", "World");
    let path = plane.dir.path().join(format!("{ns}-hello.yaml"));
    std::fs::write(&path, &yaml).unwrap();
    // What the apply itself got back: the object as admitted, before any controller ran.
    let applied = plane
        .kubectl(&[
            "-n",
            &ns,
            "apply",
            "-f",
            &path.display().to_string(),
            "-o",
            "yaml",
        ])
        .await
        .unwrap();
    let stored = plane
        .kubectl(&["-n", &ns, "get", "ksvc", "hello", "-o", "yaml"])
        .await
        .unwrap();
    show("kubectl get ksvc hello -o yaml", &stored);
    for (what, text) in [
        ("kubectl apply -o yaml", &applied),
        ("kubectl get", &stored),
    ] {
        let ksvc: Value = serde_saphyr::from_str(text)
            .unwrap_or_else(|e| panic!("{what}: not YAML: {e}\n{text}"));
        let spec = &ksvc["spec"]["template"]["spec"];
        let c = &spec["containers"][0];
        let checks = [
            (
                "containerConcurrency",
                &spec["containerConcurrency"],
                json!(0),
            ),
            ("timeoutSeconds", &spec["timeoutSeconds"], json!(300)),
            ("containers[0].name", &c["name"], json!("user-container")),
            (
                "containers[0].readinessProbe",
                &c["readinessProbe"],
                json!({"successThreshold": 1, "tcpSocket": {"port": 0}}),
            ),
            (
                "enableServiceLinks",
                &spec["enableServiceLinks"],
                json!(false),
            ),
            (
                "spec.traffic",
                &ksvc["spec"]["traffic"],
                json!([{"latestRevision": true, "percent": 100}]),
            ),
            (
                "serving.knative.dev/creator",
                &ksvc["metadata"]["annotations"]["serving.knative.dev/creator"],
                json!("kubernetes-admin"),
            ),
        ];
        for (field, got, want) in checks {
            assert_eq!(*got, want, "{what}: {field}\n{text}");
        }
    }
    // The sent YAML had none of them.
    let sent: Value = serde_saphyr::from_str(&yaml).unwrap();
    let spec = &sent["spec"]["template"]["spec"];
    for (field, v) in [
        ("containerConcurrency", &spec["containerConcurrency"]),
        ("timeoutSeconds", &spec["timeoutSeconds"]),
        ("enableServiceLinks", &spec["enableServiceLinks"]),
        ("containers[0].name", &spec["containers"][0]["name"]),
        (
            "containers[0].readinessProbe",
            &spec["containers"][0]["readinessProbe"],
        ),
        ("spec.traffic", &sent["spec"]["traffic"]),
        ("metadata.annotations", &sent["metadata"]["annotations"]),
    ] {
        assert!(v.is_null(), "{field} in the sent YAML");
    }
    // The Revision stamped from it carries them too, and goes Ready.
    until_ready(&plane, &ns, "hello", "hello-00001").await;
    let rev = kubectl_json(&plane, &["-n", &ns, "get", "revision", "hello-00001"])
        .await
        .unwrap();
    assert_eq!(rev["spec"]["containerConcurrency"], 0, "{rev:#}");
    assert_eq!(rev["spec"]["timeoutSeconds"], 300, "{rev:#}");
    assert_eq!(rev["spec"]["containers"][0]["name"], "user-container");
    println!(
        "defaults written at admission: containerConcurrency 0, timeoutSeconds 300, \
         user-container, tcpSocket readiness probe, enableServiceLinks false, traffic 100% latest"
    );
}

/// A Revision's spec cannot change once created: `kubectl patch` and `kubectl apply` of a
/// changed spec are refused by the validating webhook with Knative's message ("Immutable
/// fields changed (-old +new)"), and the Revision stays as it was. Its metadata (a label) may
/// change.
async fn a_revision_spec_change_is_refused_as_immutable(plane: Arc<Plane>, ns: String) {
    apply(&plane, &ns, "hello", &helloworld("hello", "World"))
        .await
        .unwrap();
    let rev = until!("hello-00001 created", Duration::from_secs(60), {
        kubectl_json(&plane, &["-n", &ns, "get", "revision", "hello-00001"]).await
    });
    let denied = r#"admission webhook "validation.webhook.serving.knative.dev" denied the request"#;
    let immutable = "Immutable fields changed (-old +new)";

    let patched = plane
        .kubectl(&[
            "-n",
            &ns,
            "patch",
            "revision",
            "hello-00001",
            "--type=merge",
            "-p",
            r#"{"spec":{"containerConcurrency":5}}"#,
        ])
        .await
        .expect_err("a patch of the spec is refused");
    show("kubectl patch revision (spec)", &patched);
    assert!(patched.contains(denied), "{patched}");
    assert!(patched.contains(immutable), "{patched}");
    assert!(patched.contains("containerConcurrency"), "{patched}");

    // kubectl apply of the Revision as read back, its container's env changed.
    let mut changed = rev.clone();
    for k in [
        "managedFields",
        "resourceVersion",
        "uid",
        "creationTimestamp",
        "generation",
    ] {
        changed["metadata"].as_object_mut().unwrap().remove(k);
    }
    changed.as_object_mut().unwrap().remove("status");
    changed["spec"]["containers"][0]["env"] = json!([{"name": "TARGET", "value": "Changed"}]);
    let applied = apply(&plane, &ns, "revision", &changed.to_string())
        .await
        .expect_err("an apply of a changed spec is refused");
    show("kubectl apply of a changed Revision", &applied);
    assert!(applied.contains(denied), "{applied}");
    assert!(applied.contains(immutable), "{applied}");

    let after = kubectl_json(&plane, &["-n", &ns, "get", "revision", "hello-00001"])
        .await
        .unwrap();
    assert_eq!(after["spec"], rev["spec"], "the spec changed");
    // Metadata is not the spec: a label is accepted.
    plane
        .kubectl(&[
            "-n",
            &ns,
            "label",
            "revision",
            "hello-00001",
            "lifecycle.thaw.test/checked=yes",
        ])
        .await
        .unwrap();
    println!("revision spec: patch and apply refused ({immutable}); a label accepted");
}

/// The webhook's certificate rotated while `kubectl apply` of a changing Service runs in a
/// loop: none refused. An operator forces the rotation by deleting the Secret
/// `thaw-system/thaw-webhook-certs` (thaw re-creates it). What must hold, as for a rotation
/// near expiry (src/webhook/certs.rs): the new CA is published in both configurations'
/// `caBundle` before any replica serves its certificate, and the old CA stays trusted while a
/// replica may still serve the old one; so every new connection, at any moment, to any
/// replica, with the `caBundle` as stored then, is trusted (probed beside the applies), and
/// the new pair is served only after it was staged. At the end every replica serves the new
/// certificate and both `caBundle`s changed.
async fn the_webhook_certificate_rotates_under_applies_none_refused(plane: Arc<Plane>, ns: String) {
    let secrets: Api<Secret> = Api::namespaced(plane.admin.clone(), SYSTEM);
    let old = stored(&secrets.get(CERTS_SECRET).await.unwrap());
    let old_pair = old.current.clone().expect("a served pair");
    let old_bundles = ca_bundles(&plane).await.unwrap();
    assert!(
        old_bundles
            .iter()
            .all(|b| certs::bundle_contains(b, &old_pair.ca_cert)),
        "the configurations do not trust the served CA"
    );
    let replicas = webhook_replicas(&plane).await;
    assert_eq!(replicas.len(), 2, "deploy/webhook runs two replicas");
    for r in &replicas {
        let served = served_certificate(*r, &old_bundles[0]).await.unwrap();
        assert_eq!(served, der(&old_pair.server_cert), "{r} serves another");
    }

    apply(&plane, &ns, "svc", &with_annotation(0))
        .await
        .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    // kubectl apply in a loop, each a change of the Service's metadata (both webhooks run).
    let results: Arc<std::sync::Mutex<Vec<Applied>>> = Arc::default();
    let applies = {
        let (plane, ns, stop, results) = (plane.clone(), ns.clone(), stop.clone(), results.clone());
        tokio::spawn(async move {
            let mut i = 1;
            while !stop.is_cancelled() {
                let r = apply(&plane, &ns, "svc", &with_annotation(i)).await;
                results
                    .lock()
                    .unwrap()
                    .push((Instant::now(), r.map(|_| ())));
                i += 1;
            }
        })
    };
    let applied = || results.lock().unwrap().len();
    // New connections as an API server makes them: the caBundles as stored now, each replica.
    let probes = {
        let (plane, stop, replicas) = (plane.clone(), stop.clone(), replicas.clone());
        tokio::spawn(async move {
            let (mut n, mut failed) = (0u32, Vec::new());
            let mut served: BTreeSet<Vec<u8>> = BTreeSet::new();
            while !stop.is_cancelled() {
                match ca_bundles(&plane).await {
                    Err(e) => failed.push(format!("reading the caBundles: {e}")),
                    Ok(bundles) => {
                        for r in &replicas {
                            for (which, b) in ["validating", "mutating"].iter().zip(&bundles) {
                                n += 1;
                                match served_certificate(*r, b).await {
                                    Ok(c) => {
                                        served.insert(c);
                                    }
                                    Err(e) => {
                                        failed.push(format!("{r} with the {which} caBundle: {e}"))
                                    }
                                }
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (n, failed, served)
        })
    };
    // Every state of the Secret, in order (a staged pair lasts the publish delay, a minute).
    let states = {
        let (secrets, stop) = (secrets.clone(), stop.clone());
        tokio::spawn(async move {
            let mut seen: Vec<(Instant, Option<Stored>)> = Vec::new();
            while !stop.is_cancelled() {
                if let Ok(s) = secrets.get_opt(CERTS_SECRET).await {
                    let s = s.as_ref().map(stored);
                    if seen.last().is_none_or(|(_, last)| *last != s) {
                        seen.push((Instant::now(), s));
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            seen
        })
    };

    // Applies go through before the rotation starts...
    until!("three applies", Duration::from_secs(60), {
        (applied() >= 3)
            .then_some(())
            .ok_or_else(|| format!("{} applies", applied()))
    });
    let started = Instant::now();
    plane
        .kubectl(&["-n", SYSTEM, "delete", "secret", CERTS_SECRET])
        .await
        .unwrap();
    let new_pair = until!(
        "a new certificate served by every replica and trusted by both caBundles",
        Duration::from_secs(240),
        {
            let s = secrets
                .get_opt(CERTS_SECRET)
                .await
                .map_err(|e| e.to_string())?
                .ok_or("no Secret")?;
            let pair = stored(&s)
                .current
                .filter(|p| p.ca_cert != old_pair.ca_cert)
                .ok_or("no new pair served yet")?;
            let bundles = ca_bundles(&plane).await?;
            if !bundles
                .iter()
                .all(|b| certs::bundle_contains(b, &pair.ca_cert))
            {
                return Err("the new CA is not in both caBundles".into());
            }
            for r in &replicas {
                let c = served_certificate(*r, &bundles[0]).await?;
                if c != der(&pair.server_cert) {
                    return Err(format!("{r} serves another certificate"));
                }
            }
            Ok(pair)
        },
    );
    let rotated = started.elapsed();
    // ... and after the change-over.
    let at_change = applied();
    until!(
        "three applies after the rotation",
        Duration::from_secs(60),
        {
            (applied() >= at_change + 3)
                .then_some(())
                .ok_or_else(|| format!("{} applies", applied() - at_change))
        },
    );
    stop.cancel();
    applies.await.unwrap();
    let applies = std::mem::take(&mut *results.lock().unwrap());
    let (probed, probe_failures, served) = probes.await.unwrap();
    let states = states.await.unwrap();

    let refused: Vec<&String> = applies
        .iter()
        .filter_map(|(_, r)| r.as_ref().err())
        .collect();
    let during = applies
        .iter()
        .filter(|(t, _)| *t >= started && *t <= started + rotated)
        .count();
    let history: Vec<String> = states
        .iter()
        .map(|(t, s)| {
            let at = t.saturating_duration_since(started).as_secs_f64();
            match s {
                None => format!("+{at:.1}s: no Secret"),
                Some(s) => format!(
                    "+{at:.1}s: current {} next {} bundle of {}",
                    s.current
                        .as_ref()
                        .map_or("-".into(), |p| fingerprint(&p.ca_cert)),
                    s.next
                        .as_ref()
                        .map_or("-".into(), |p| fingerprint(&p.ca_cert)),
                    certs::split_bundle(&s.bundle).len()
                ),
            }
        })
        .collect();
    println!(
        "rotation: the new certificate served by both replicas {:.1}s after the Secret was \
         deleted; {} applies ({} during the rotation), {} refused; {probed} new TLS connections \
         probed, {} failed; {} certificates served\nthe Secret: {}",
        rotated.as_secs_f64(),
        applies.len(),
        during,
        refused.len(),
        probe_failures.len(),
        served.len(),
        history.join("; ")
    );
    assert!(
        refused.is_empty(),
        "{} of {} applies refused:\n{}",
        refused.len(),
        applies.len(),
        refused
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(during > 0, "no apply ran during the rotation");
    assert!(
        probe_failures.is_empty(),
        "new connections failed:\n{}",
        probe_failures.join("\n")
    );
    // The mechanism: the new pair was staged (its CA published) before it was served.
    let staged = states.iter().any(|(_, s)| {
        s.as_ref()
            .and_then(|s| s.next.as_ref())
            .is_some_and(|n| n.ca_cert == new_pair.ca_cert)
    });
    assert!(
        staged,
        "the new pair was served without being staged first:\n{}",
        history.join("\n")
    );
    let new_bundles = ca_bundles(&plane).await.unwrap();
    assert_ne!(new_bundles, old_bundles, "the caBundles did not change");
    assert_ne!(new_pair.server_cert, old_pair.server_cert);
}

/// When an apply of the loop ended, and how.
type Applied = (Instant, Result<(), String>);

fn with_annotation(i: u32) -> String {
    helloworld("rotation", "World").replacen(
        "  name: rotation\n",
        &format!("  name: rotation\n  annotations:\n    lifecycle.thaw.test/apply: \"{i}\"\n"),
        1,
    )
}

fn stored(s: &Secret) -> Stored {
    let data: BTreeMap<String, String> = s
        .data
        .iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), String::from_utf8(v.0.clone()).ok()?)))
        .collect();
    let staged = s
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(certs::STAGED_AT_ANNOTATION));
    Stored::from_data(&data, staged.map(String::as_str))
}

/// A short, stable name of a PEM certificate for the log.
fn fingerprint(pem: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    pem.trim().hash(&mut h);
    format!("{:08x}", h.finish() as u32)
}

fn der(pem: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .as_ref()
        .to_vec()
}

/// The `caBundle` of the validating then the mutating webhook configuration, as stored.
async fn ca_bundles(plane: &Plane) -> Result<Vec<Vec<u8>>, String> {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    let v: Api<ValidatingWebhookConfiguration> = Api::all(plane.admin.clone());
    let m: Api<MutatingWebhookConfiguration> = Api::all(plane.admin.clone());
    let v = v
        .get(WEBHOOK_CONFIGURATIONS)
        .await
        .map_err(|e| e.to_string())?;
    let m = m
        .get(WEBHOOK_CONFIGURATIONS)
        .await
        .map_err(|e| e.to_string())?;
    let first = |b: Option<&k8s_openapi::ByteString>| b.map(|b| b.0.clone()).unwrap_or_default();
    Ok(vec![
        first(
            v.webhooks
                .iter()
                .flatten()
                .next()
                .and_then(|w| w.client_config.ca_bundle.as_ref()),
        ),
        first(
            m.webhooks
                .iter()
                .flatten()
                .next()
                .and_then(|w| w.client_config.ca_bundle.as_ref()),
        ),
    ])
}

/// Every webhook replica's admission address (its pod's IP).
async fn webhook_replicas(plane: &Plane) -> Vec<SocketAddr> {
    let pods: Api<Pod> = Api::namespaced(plane.admin.clone(), SYSTEM);
    pods.list(&ListParams::default().labels("app.kubernetes.io/name=webhook"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.status?.pod_ip)
        .map(|ip| SocketAddr::new(ip.parse().unwrap(), WEBHOOK_PORT))
        .collect()
}

/// The certificate `addr` serves on a new TLS connection that trusts exactly `bundle` and
/// checks the Service's name, as the API server's connection does (DER).
async fn served_certificate(addr: SocketAddr, bundle: &[u8]) -> Result<Vec<u8>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certs::bundle_ders(bundle) {
        roots.add(c).map_err(|e| e.to_string())?;
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let name = rustls::pki_types::ServerName::try_from(WEBHOOK_SERVER_NAME).unwrap();
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        connector
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))
    };
    let tls = tokio::time::timeout(Duration::from_secs(10), handshake)
        .await
        .map_err(|_| "no TLS handshake in 10 s".to_string())??;
    Ok(tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec())
        .unwrap_or_default())
}

// === 5. what goes away ===

/// config-gc collects old revisions, as Knative's collector does. Knative's defaults
/// (deploy/config/config-gc.yaml, `GcConfig::default` in src/config/gc.rs): retain-since-
/// create-time 48h, retain-since-last-active-time 15h, min-non-active-revisions 20,
/// max-non-active-revisions 1000, under which five revisions all stay. Then, for the case:
/// both retention times 1s and min-non-active-revisions 1. Of hello-00001 (pinned by the tag
/// `old`, so routed), 00002, 00003, 00004 (no longer routed) and 00005 (the latest), the two
/// oldest non-routed are collected and the most recently routed one kept, as Knative's
/// collector (oldest first, `min-non-active-revisions` most recent kept); their Deployments,
/// ReplicaSets, pods and Services go through the real garbage collector.
async fn config_gc_collects_the_oldest_non_routed_revisions(plane: Arc<Plane>, ns: String) {
    let _config = SYSTEM_CONFIG.lock().await;
    let cms: Api<ConfigMap> = Api::namespaced(plane.admin.clone(), SYSTEM);
    let gc = cms.get("config-gc").await.unwrap().data.unwrap_or_default();
    for (k, v) in [
        ("retain-since-create-time", "48h"),
        ("retain-since-last-active-time", "15h"),
        ("min-non-active-revisions", "20"),
        ("max-non-active-revisions", "1000"),
    ] {
        assert_eq!(gc.get(k).map(String::as_str), Some(v), "config-gc {k}");
    }
    let service = |target: &str| {
        helloworld("hello", target)
            + "  traffic:\n    - latestRevision: true\n      percent: 100\n    \
               - tag: old\n      revisionName: hello-00001\n      percent: 0\n"
    };
    apply(&plane, &ns, "hello", &helloworld("hello", "v1"))
        .await
        .unwrap();
    until_ready(&plane, &ns, "hello", "hello-00001").await;
    for g in 2..=5 {
        apply(&plane, &ns, "hello", &service(&format!("v{g}")))
            .await
            .unwrap();
        until_ready(&plane, &ns, "hello", &format!("hello-{g:05}")).await;
    }
    let revs: Api<kube::api::DynamicObject> = knative(&plane, &ns, "revisions");
    let want: BTreeMap<&str, &str> = [
        ("hello-00001", "active"),
        ("hello-00002", "reserve"),
        ("hello-00003", "reserve"),
        ("hello-00004", "reserve"),
        ("hello-00005", "active"),
    ]
    .into();
    // Under Knative's defaults all five stay, the labeler having marked them.
    let marked = until!("the routing states", Duration::from_secs(60), {
        let s = routing_states(&revs).await?;
        let got: BTreeMap<&str, &str> = s
            .iter()
            .map(|(k, (r, _))| (k.as_str(), r.as_str()))
            .collect();
        if got == want {
            Ok(s)
        } else {
            Err(format!("{got:?}"))
        }
    });
    // Every non-routed revision stale by the case's 1s: the last one stopped being routed
    // more than a second ago.
    let last = marked
        .values()
        .filter_map(|(_, m)| m.as_deref()?.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .max()
        .expect("routingStateModified");
    until!(
        "a second past the last routing change",
        Duration::from_secs(30),
        {
            let age = k8s_openapi::jiff::Timestamp::now().duration_since(last);
            if age.as_secs_f64() >= 2.0 {
                Ok(())
            } else {
                Err(format!("{age:?}"))
            }
        },
    );
    assert_eq!(
        routing_states(&revs).await.unwrap().len(),
        5,
        "collected under the defaults"
    );

    let body = {
        let (plane, ns) = (plane.clone(), ns.clone());
        async move {
            let revs: Api<kube::api::DynamicObject> = knative(&plane, &ns, "revisions");
            let collected = until!(
                "hello-00002 and hello-00003 collected",
                Duration::from_secs(60),
                {
                    let names: BTreeSet<String> = revs
                        .list(&ListParams::default())
                        .await
                        .map_err(|e| e.to_string())?
                        .items
                        .into_iter()
                        .filter_map(|r| r.metadata.name)
                        .collect();
                    for keep in ["hello-00001", "hello-00004", "hello-00005"] {
                        assert!(
                            names.contains(keep),
                            "{keep} collected (left: {names:?}); Knative keeps the routed \
                             revision, the latest, and the min-non-active-revisions most \
                             recently routed ones, deleting the oldest first"
                        );
                    }
                    if names.contains("hello-00002") || names.contains("hello-00003") {
                        return Err(format!("left: {names:?}"));
                    }
                    Ok(names)
                },
            );
            let kept: BTreeSet<String> = ["hello-00001", "hello-00004", "hello-00005"]
                .map(String::from)
                .into();
            assert_eq!(
                collected, kept,
                "the routed, the most recently routed and the latest stay"
            );
            // What they owned goes through Kubernetes' garbage collector.
            let gone = Instant::now();
            for rev in ["hello-00002", "hello-00003"] {
                let selector = format!("serving.knative.dev/revision={rev}");
                until!(
                    &format!("{rev}'s Deployment, ReplicaSet, pods and Services gone"),
                    Duration::from_secs(180),
                    {
                        let left = plane
                            .kubectl(&[
                                "-n",
                                &ns,
                                "get",
                                "deployments,replicasets,pods,services",
                                "-l",
                                &selector,
                                "-o",
                                "name",
                            ])
                            .await?;
                        if left.trim().is_empty() {
                            Ok(())
                        } else {
                            Err(left)
                        }
                    },
                );
            }
            let events = plane
                .kubectl(&[
                    "-n",
                    &ns,
                    "get",
                    "events",
                    "--field-selector",
                    "reason=Deleted",
                    "-o",
                    "custom-columns=MESSAGE:.message",
                    "--no-headers",
                ])
                .await
                .unwrap();
            assert!(
                events.contains("hello-00002") && events.contains("hello-00003"),
                "{events}"
            );
            println!(
                "config-gc: 2 of 5 revisions collected (hello-00002, hello-00003), kept \
                 {kept:?}; their Deployments, ReplicaSets, pods and Services gone {:.1}s later",
                gone.elapsed().as_secs_f64()
            );
        }
    };
    with_system_config(
        &plane,
        "config-gc",
        json!({
            "retain-since-create-time": "1s",
            "retain-since-last-active-time": "1s",
            "min-non-active-revisions": "1",
            "max-non-active-revisions": "1000",
        }),
        body,
    )
    .await;
}

/// Each revision's `routingState` label and `routingStateModified` annotation.
async fn routing_states(
    revs: &Api<kube::api::DynamicObject>,
) -> Result<BTreeMap<String, (String, Option<String>)>, String> {
    Ok(revs
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items
        .into_iter()
        .map(|r| {
            let name = r.metadata.name.clone().unwrap_or_default();
            let labels = r.metadata.labels.unwrap_or_default();
            let modified = r
                .metadata
                .annotations
                .unwrap_or_default()
                .get("serving.knative.dev/routingStateModified")
                .cloned();
            let routing = labels
                .get("serving.knative.dev/routingState")
                .cloned()
                .unwrap_or_default();
            (name, (routing, modified))
        })
        .collect())
}

fn knative(plane: &Plane, ns: &str, plural: &str) -> Api<kube::api::DynamicObject> {
    let ar = kube::api::ApiResource {
        group: "serving.knative.dev".into(),
        version: "v1".into(),
        api_version: "serving.knative.dev/v1".into(),
        kind: plural.into(),
        plural: plural.into(),
    };
    Api::namespaced_with(plane.admin.clone(), ns, &ar)
}

/// `kubectl delete ksvc`: everything the Service made (its Configuration and Route, the
/// Revision, its Deployment, ReplicaSet, pod, Services, Endpoints and EndpointSlices, the
/// Route's VirtualServices) goes, through the owner references and Kubernetes' garbage
/// collector.
async fn a_deleted_service_leaves_nothing_behind(plane: Arc<Plane>, ns: String) {
    apply(&plane, &ns, "hello", &helloworld("hello", "World"))
        .await
        .unwrap();
    until_ready(&plane, &ns, "hello", "hello-00001").await;
    let before = objects(&plane, &ns, OWNED_KINDS).await.unwrap();
    show("what hello made", &before.join("\n"));
    let counts = count_by_kind(&before);
    for kind in OWNED_KINDS {
        let singular = kind_of_kind(kind);
        assert!(
            counts.keys().any(|k| k == &singular),
            "no {kind} made by the Service: {before:?}"
        );
    }
    let started = Instant::now();
    plane
        .kubectl(&["-n", &ns, "delete", "ksvc", "hello"])
        .await
        .unwrap();
    until!("everything hello made gone", Duration::from_secs(180), {
        let left = objects(&plane, &ns, OWNED_KINDS).await?;
        if left.is_empty() {
            Ok(())
        } else {
            Err(left.join(", "))
        }
    },);
    println!(
        "kubectl delete ksvc: {} objects ({counts:?}) gone in {:.1}s",
        before.len(),
        started.elapsed().as_secs_f64()
    );
}

/// `kubectl get -o name`'s kind for a resource name of [`OWNED_KINDS`].
fn kind_of_kind(resource: &str) -> String {
    let (plural, group) = resource.split_once('.').unwrap_or((resource, ""));
    let singular = match plural {
        "endpoints" => plural,
        p => p.strip_suffix('s').unwrap_or(p),
    };
    if group.is_empty() {
        singular.to_string()
    } else {
        format!("{singular}.{group}")
    }
}

/// A namespace with two Services in it is deleted and disappears: the namespace controller
/// deletes every object in it and nothing of thaw's (a finalizer, an object it re-creates)
/// holds it back.
async fn a_deleted_namespace_with_services_goes_away(plane: Arc<Plane>, ns: String) {
    let doomed = format!("{ns}-doomed");
    plane
        .kubectl(&["create", "namespace", &doomed])
        .await
        .unwrap();
    until!("the default ServiceAccount", Duration::from_secs(30), {
        plane
            .kubectl(&["-n", &doomed, "get", "serviceaccount", "default"])
            .await
            .map(|_| ())
    },);
    for (name, target) in [("hello", "one"), ("hello-two", "two")] {
        apply(&plane, &doomed, name, &helloworld(name, target))
            .await
            .unwrap();
    }
    until_ready(&plane, &doomed, "hello", "hello-00001").await;
    until_ready(&plane, &doomed, "hello-two", "hello-two-00001").await;
    let before = objects(&plane, &doomed, OWNED_KINDS).await.unwrap();
    let finalizers: Vec<String> = {
        let all = kubectl_json(
            &plane,
            &["-n", &doomed, "get", "ksvc,configurations,routes,revisions"],
        )
        .await
        .unwrap();
        all["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| {
                let f = o["metadata"]["finalizers"].as_array()?;
                Some(format!("{}/{}: {f:?}", o["kind"], o["metadata"]["name"]))
            })
            .collect()
    };
    show("finalizers on thaw's objects", &finalizers.join("\n"));
    let started = Instant::now();
    plane
        .kubectl(&["delete", "namespace", &doomed, "--wait=false"])
        .await
        .unwrap();
    let namespaces: Api<Namespace> = Api::all(plane.admin.clone());
    // The namespace controller, finding pods still terminating, looks again after half their
    // grace period (`ResourcesRemainingError`'s estimate / 2 + 1 s): a revision pod's is the
    // drain, the revision's timeout (Knative's default 300 s) and a margin, 340 s, so the
    // namespace goes about 3 minutes after its deletion however soon the pods end.
    until!(
        &format!("namespace {doomed} gone"),
        Duration::from_secs(420),
        {
            match namespaces.get_opt(&doomed).await {
                Ok(None) => Ok(()),
                Ok(Some(n)) => {
                    let conds = n
                        .status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|c| c.status == "True")
                        .map(|c| format!("{} {:?}", c.type_, c.message))
                        .collect::<Vec<_>>();
                    let left = objects(&plane, &doomed, OWNED_KINDS)
                        .await
                        .unwrap_or_default();
                    Err(format!("{conds:?}; left: {left:?}"))
                }
                Err(e) => Err(e.to_string()),
            }
        }
    );
    println!(
        "namespace with 2 Services ({} objects) deleted and gone in {:.1}s; finalizers on \
         thaw's objects: {finalizers:?}",
        before.len(),
        started.elapsed().as_secs_f64()
    );
}

// === 6. Pod Security `restricted` ===

/// The container security context Pod Security `restricted` asks of every container.
const RESTRICTED_CONTEXT: &str = "          securityContext:
            runAsNonRoot: true
            allowPrivilegeEscalation: false
            capabilities:
              drop: [ALL]
            seccompProfile:
              type: RuntimeDefault
";

/// In a namespace enforcing Pod Security `restricted`, under Knative's defaults
/// (`secure-pod-defaults: disabled`): Knative's helloworld-go, which sets no security
/// context, has its pods refused by the real PodSecurity admission, and the Revision says so
/// (`Ready=False`, the refusal naming `user-container` only: the `queue-proxy` sidecar thaw
/// adds meets `restricted`). What the user does: set the container's security context as
/// `restricted` asks; that revision's pod (user container and sidecar) is admitted, goes
/// Ready and answers through the ingress.
async fn restricted_pods_need_a_security_context_not_the_sidecar(plane: Arc<Plane>, ns: String) {
    let mut label = vec!["label", "namespace", ns.as_str()];
    label.extend(RESTRICTED);
    plane.kubectl(&label).await.unwrap();
    apply(&plane, &ns, "hello", &helloworld("hello", "World"))
        .await
        .unwrap();
    let refused = until!(
        "hello-00001 Ready=False by PodSecurity",
        Duration::from_secs(120),
        {
            let rev = kubectl_json(&plane, &["-n", &ns, "get", "revision", "hello-00001"]).await?;
            let ready = condition(&rev, "Ready").cloned().unwrap_or_default();
            let msg = ready["message"].as_str().unwrap_or_default();
            if ready["status"] == "False" && msg.contains("violates PodSecurity") {
                Ok(ready)
            } else {
                Err(condition_text(&rev, "Ready"))
            }
        },
    );
    let msg = refused["message"].as_str().unwrap().to_string();
    show("hello-00001's Ready condition", &format!("{refused:#}"));
    assert!(
        msg.contains(r#"violates PodSecurity "restricted:v1.33""#),
        "{msg}"
    );
    assert!(msg.contains(r#"container "user-container""#), "{msg}");
    assert!(
        !msg.contains("queue-proxy"),
        "the sidecar is refused: {msg}"
    );
    // The ReplicaSet controller's own record of it.
    let events: Api<Event> = Api::namespaced(plane.admin.clone(), &ns);
    let failed: Vec<String> = events
        .list(&ListParams::default().fields("reason=FailedCreate"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.message)
        .collect();
    assert!(!failed.is_empty(), "no FailedCreate event");
    for m in &failed {
        assert!(m.contains("violates PodSecurity"), "{m}");
        assert!(!m.contains("queue-proxy"), "the sidecar is refused: {m}");
    }
    let pods: Api<Pod> = Api::namespaced(plane.admin.clone(), &ns);
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "a pod was admitted"
    );

    // What the user must do.
    let fixed = helloworld("hello", "World").replace(
        "          env:\n",
        &format!("{RESTRICTED_CONTEXT}          env:\n"),
    );
    apply(&plane, &ns, "hello", &fixed).await.unwrap();
    until_ready(&plane, &ns, "hello", "hello-00002").await;
    let pod = pods
        .list(&ListParams::default().labels("serving.knative.dev/revision=hello-00002"))
        .await
        .unwrap()
        .items
        .into_iter()
        .next()
        .expect("hello-00002's pod");
    let names: Vec<String> = pod
        .spec
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .map(|c| c.name.clone())
        .collect();
    assert_eq!(names, ["user-container", "queue-proxy"]);
    let host = format!("hello.{ns}.example.com");
    let gateway = crate::plane_support::checks::service_endpoint(
        &plane,
        "istio-system",
        "istio-ingressgateway",
    )
    .await
    .unwrap();
    let (status, body) = crate::plane_support::checks::get(gateway, &host, "/")
        .await
        .unwrap();
    assert_eq!((status, body.trim()), (200, "Hello from World!"));
    println!(
        "restricted: helloworld's pods refused ({} FailedCreate events, none naming \
         queue-proxy); with the container's securityContext set, admitted, Ready, 200",
        failed.len()
    );
}

/// `secure-pod-defaults: enabled` in config-features (the operator's choice; Knative's
/// default is `disabled`): Knative's helloworld-go, unchanged, goes Ready in a namespace
/// enforcing `restricted`, thaw having filled its container's security context. Exclusive:
/// the setting changes every revision's pods.
async fn secure_pod_defaults_admit_helloworld_under_restricted(plane: Arc<Plane>, ns: String) {
    let _config = SYSTEM_CONFIG.lock().await;
    let mut label = vec!["label", "namespace", ns.as_str()];
    label.extend(RESTRICTED);
    plane.kubectl(&label).await.unwrap();
    let body = {
        let (plane, ns) = (plane.clone(), ns.clone());
        async move {
            apply(&plane, &ns, "hello", &helloworld("hello", "World"))
                .await
                .unwrap();
            until_ready(&plane, &ns, "hello", "hello-00001").await;
            let pods: Api<Pod> = Api::namespaced(plane.admin.clone(), &ns);
            let pod = pods
                .list(&ListParams::default().labels("serving.knative.dev/revision=hello-00001"))
                .await
                .unwrap()
                .items
                .into_iter()
                .next()
                .expect("hello-00001's pod");
            let spec = pod.spec.unwrap();
            for c in &spec.containers {
                let sc = serde_json::to_value(&c.security_context).unwrap();
                show(&format!("{}'s securityContext", c.name), &format!("{sc:#}"));
                assert_eq!(sc["allowPrivilegeEscalation"], false, "{}: {sc}", c.name);
                assert_eq!(sc["runAsNonRoot"], true, "{}: {sc}", c.name);
                assert_eq!(
                    sc["capabilities"]["drop"],
                    json!(["ALL"]),
                    "{}: {sc}",
                    c.name
                );
                assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{}", c.name);
            }
            println!("secure-pod-defaults enabled: helloworld admitted under restricted, Ready");
        }
    };
    with_system_config(
        &plane,
        "config-features",
        json!({"secure-pod-defaults": "enabled"}),
        body,
    )
    .await;
}

/// thaw-system enforces `restricted` (deploy/namespace.yaml) on the real namespace, and every
/// pod of every thaw Deployment was admitted: each Deployment and its ReplicaSet at full
/// replicas, no ReplicaFailure, no FailedCreate event in the namespace.
async fn thaw_system_enforces_restricted_on_every_pod(plane: Arc<Plane>, _ns: String) {
    let namespaces: Api<Namespace> = Api::all(plane.admin.clone());
    let system = namespaces.get(SYSTEM).await.unwrap();
    let labels = system.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("restricted"),
        "{labels:?}"
    );
    let deployments: Api<Deployment> = Api::namespaced(plane.admin.clone(), SYSTEM);
    let replica_sets: Api<ReplicaSet> = Api::namespaced(plane.admin.clone(), SYSTEM);
    let pods: Api<Pod> = Api::namespaced(plane.admin.clone(), SYSTEM);
    let all = deployments
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let names: Vec<String> = all.iter().filter_map(|d| d.metadata.name.clone()).collect();
    for want in ["activator", "autoscaler", "controller", "webhook"] {
        assert!(names.iter().any(|n| n == want), "no {want}: {names:?}");
    }
    let mut admitted = 0;
    for d in &all {
        let name = d.metadata.name.clone().unwrap();
        let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let st = d.status.clone().unwrap_or_default();
        assert_eq!(st.ready_replicas.unwrap_or(0), want, "{name}: {st:?}");
        for c in st.conditions.iter().flatten() {
            assert!(
                !(c.type_ == "ReplicaFailure" && c.status == "True"),
                "{name}: {c:?}"
            );
        }
        let selector = d
            .spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        for rs in replica_sets
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items
        {
            let want = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
            let st = rs.status.unwrap_or_default();
            assert_eq!(st.replicas, want, "{name}'s ReplicaSet");
            assert!(
                st.conditions
                    .iter()
                    .flatten()
                    .all(|c| c.type_ != "ReplicaFailure"),
                "{name}'s ReplicaSet: {:?}",
                st.conditions
            );
        }
        admitted += pods
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items
            .len();
    }
    let events: Api<Event> = Api::namespaced(plane.admin.clone(), SYSTEM);
    let failed: Vec<String> = events
        .list(&ListParams::default().fields("reason=FailedCreate"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.message)
        .collect();
    assert!(failed.is_empty(), "FailedCreate in thaw-system: {failed:?}");
    println!(
        "thaw-system enforces restricted; {} Deployments at full replicas, {admitted} pods \
         admitted, no FailedCreate",
        all.len()
    );
}
