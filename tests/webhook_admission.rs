//! `thaw webhook` as a real process against the in-process API server. That server does not
//! call admission webhooks, so these tests play its part: they send real `AdmissionReview`s
//! over TLS to the webhook's port, trusting only the `caBundle` they read from the webhook
//! configuration at each call (as an API server does), with the server name of the webhook's
//! Service. The configurations are the ones in deploy/webhook/. Waits poll with deadlines;
//! nothing asserts a duration.

mod kube_e2e_support;
mod kube_support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, PostParams};
use kube_e2e_support::*;
use serde_json::{Value, json};
use thaw::controller::configuration::defaulted_spec;
use thaw::knative::Service;

const SERVER_NAME: &str = "thaw-webhook.thaw-system.svc";
const VALIDATING: &str = "validation.webhook.serving.knative.dev";

/// The webhook configurations of deploy/webhook/, created as `kubectl apply` would.
async fn apply_configurations(c: &Cluster) {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/webhook/configurations.yaml"),
    )
    .unwrap();
    for doc in text.split("\n---\n") {
        let v: Value = serde_saphyr::from_str(doc).unwrap();
        match v["kind"].as_str().unwrap() {
            "MutatingWebhookConfiguration" => {
                let api: Api<MutatingWebhookConfiguration> = Api::all(c.client.clone());
                api.create(&PostParams::default(), &obj(v)).await.unwrap();
            }
            "ValidatingWebhookConfiguration" => {
                let api: Api<ValidatingWebhookConfiguration> = Api::all(c.client.clone());
                api.create(&PostParams::default(), &obj(v)).await.unwrap();
            }
            k => panic!("unexpected {k}"),
        }
    }
}

fn webhook(c: &Cluster, name: &str, port: u16, admin: u16, extra: &[&str]) -> Proc {
    let mut args: Vec<String> = [
        "webhook",
        "--system-namespace",
        SYSTEM,
        "--name",
        name,
        "--lease-duration",
        "3s",
        "--renew-deadline",
        "2s",
        "--retry-period",
        "500ms",
        "--cert-check-interval",
        "200ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(format!("--listen=127.0.0.1:{port}"));
    args.push(format!("--admin-listen=127.0.0.1:{admin}"));
    args.extend(extra.iter().map(|s| s.to_string()));
    c.spawn(name, &args)
}

/// The caBundle the API server would use for `path`'s webhook, read now.
async fn ca_bundle(c: &Cluster, path: &str) -> Option<Vec<u8>> {
    let b = if path == "/defaulting" {
        let api: Api<MutatingWebhookConfiguration> = Api::all(c.client.clone());
        api.get("thaw-webhook").await.ok()?.webhooks?[0]
            .client_config
            .ca_bundle
            .clone()
    } else {
        let api: Api<ValidatingWebhookConfiguration> = Api::all(c.client.clone());
        api.get("thaw-webhook").await.ok()?.webhooks?[0]
            .client_config
            .ca_bundle
            .clone()
    };
    b.map(|b| b.0).filter(|b| !b.is_empty())
}

/// What one call returned: the HTTP status, the body, and the served certificate (DER).
struct Answer {
    status: u16,
    body: Value,
    cert: Vec<u8>,
}

/// POSTs `body` to `path` over a new TLS connection to `port`, trusting exactly `bundle`.
async fn post(port: u16, bundle: &[u8], path: &str, body: Vec<u8>) -> Result<Answer, String> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(bundle) {
        roots
            .add(c.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = rustls::pki_types::ServerName::try_from(SERVER_NAME).unwrap();
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let cert = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec())
        .unwrap_or_default();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    let req = http::Request::post(path)
        .header("host", SERVER_NAME)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = send
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    Ok(Answer { status, body, cert })
}

fn review(kind: &str, op: &str, object: Value, old: Option<Value>) -> Value {
    let plural = format!("{}s", kind.to_lowercase());
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": format!("uid-{kind}-{op}"),
            "kind": {"group": "serving.knative.dev", "version": "v1", "kind": kind},
            "resource": {"group": "serving.knative.dev", "version": "v1", "resource": plural},
            "name": object["metadata"]["name"], "namespace": NS, "operation": op,
            "userInfo": {"username": "alice@example.com", "groups": ["system:authenticated"]},
            "object": object, "oldObject": old, "dryRun": false,
        }
    })
}

/// Sends `review` as the API server would (the caBundle read now); the response part.
async fn admit(c: &Cluster, port: u16, path: &str, review: &Value) -> Value {
    let bundle = ca_bundle(c, path).await.expect("a caBundle");
    let a = post(port, &bundle, path, serde_json::to_vec(review).unwrap())
        .await
        .unwrap();
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["kind"], "AdmissionReview");
    assert_eq!(a.body["response"]["uid"], review["request"]["uid"]);
    a.body["response"].clone()
}

/// The helloworld Service of Knative's samples.
fn helloworld() -> Value {
    json!({
        "apiVersion": "serving.knative.dev/v1", "kind": "Service",
        "metadata": {"name": "helloworld-go", "namespace": NS},
        "spec": {"template": {"spec": {"containers": [{
            "image": "ghcr.io/knative/helloworld-go:latest",
            "env": [{"name": "TARGET", "value": "Go Sample v1"}],
        }]}}},
    })
}

fn with_patch(object: &Value, response: &Value) -> Value {
    // The patch is base64 in the JSON, as ByteString reads it.
    let raw: k8s_openapi::ByteString =
        serde_json::from_value(response["patch"].clone()).expect("a patch");
    let raw = raw.0;
    assert_eq!(response["patchType"], "JSONPatch");
    let p: json_patch::Patch = serde_json::from_slice(&raw).unwrap();
    let mut out = object.clone();
    json_patch::patch(&mut out, &p).unwrap();
    out
}

/// kubectl's line for a refusal (`Error from server (BadRequest): admission webhook "..."
/// denied the request: ...`), from the AdmissionResponse.
fn kubectl_line(response: &Value) -> String {
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 400);
    assert_eq!(response["status"]["reason"], "BadRequest");
    format!(
        "Error from server (BadRequest): error when creating \"service.yaml\": admission webhook \"{VALIDATING}\" denied the request: {}",
        response["status"]["message"].as_str().unwrap()
    )
}

async fn started(c: &Cluster, admin: u16) {
    let addr = format!("127.0.0.1:{admin}").parse().unwrap();
    until(
        Duration::from_secs(30),
        "the webhook ready with a caBundle published",
        || async {
            let ready = get_text(addr, "/readyz").await == "ok\n";
            (ready
                && ca_bundle(c, "/defaulting").await.is_some()
                && ca_bundle(c, "/resource-validation").await.is_some())
            .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_over_tls_defaults_and_refuses_as_knative() {
    let c = Cluster::start(json!({})).await;
    c.config_map("config-defaults", json!({"container-concurrency": "7"}))
        .await;
    apply_configurations(&c).await;
    let (port, admin) = (free_port(), free_port());
    let _w = webhook(&c, "wh-a", port, admin, &["--max-body", "65536"]);
    started(&c, admin).await;

    // Defaulting: the patched object's template is what the controller's defaulted_spec makes
    // of the same input, with Knative's traffic default and the creator.
    let hello = helloworld();
    let r = admit(
        &c,
        port,
        "/defaulting",
        &review("Service", "CREATE", hello.clone(), None),
    )
    .await;
    assert_eq!(r["allowed"], true);
    let patched = with_patch(&hello, &r);
    let svc: Service = serde_json::from_value(patched.clone()).unwrap();
    let sent: Service = serde_json::from_value(hello.clone()).unwrap();
    let defaults = thaw::config::DefaultsConfig {
        container_concurrency: 7,
        ..Default::default()
    };
    assert_eq!(
        svc.spec.configuration.template.spec,
        defaulted_spec(&sent.spec.configuration.template.spec, &defaults)
    );
    let spec = &svc.spec.configuration.template.spec;
    assert_eq!(
        spec.container_concurrency,
        Some(7),
        "config-defaults is followed"
    );
    assert_eq!(spec.timeout_seconds, Some(300));
    let container = &spec.pod_spec.containers[0];
    assert_eq!(container.name, "user-container");
    assert!(
        container
            .readiness_probe
            .as_ref()
            .unwrap()
            .tcp_socket
            .is_some()
    );
    assert_eq!(svc.spec.route.traffic.len(), 1);
    assert_eq!(svc.spec.route.traffic[0].latest_revision, Some(true));
    assert_eq!(svc.spec.route.traffic[0].percent, Some(100));
    let ann = svc.metadata.annotations.clone().unwrap();
    assert_eq!(ann["serving.knative.dev/creator"], "alice@example.com");
    assert_eq!(ann["serving.knative.dev/lastModifier"], "alice@example.com");
    // The patched object is valid, and the API server stores it as patched.
    let r = admit(
        &c,
        port,
        "/resource-validation",
        &review("Service", "CREATE", patched.clone(), None),
    )
    .await;
    assert_eq!(r["allowed"], true, "{r}");
    let svcs: Api<Service> = Api::namespaced(c.client.clone(), NS);
    svcs.create(&PostParams::default(), &svc).await.unwrap();
    let stored = svcs.get("helloworld-go").await.unwrap();
    assert_eq!(stored.spec, svc.spec);
    let mut shown = serde_json::to_value(&stored).unwrap();
    for k in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "generation",
        "managedFields",
    ] {
        shown["metadata"].as_object_mut().unwrap().remove(k);
    }
    let yaml = serde_saphyr::to_string(&shown).unwrap();
    println!("--- helloworld after the defaulting webhook, read back:\n{yaml}");
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md"),
    )
    .unwrap();
    assert!(
        docs.contains(&yaml),
        "docs/architecture.md shows another stored helloworld:\n{yaml}"
    );

    // Validation refuses with Knative's message, as kubectl prints it (the README shows it).
    let mut bad = patched.clone();
    bad["spec"]["traffic"][0]["percent"] = json!(150);
    let r = admit(
        &c,
        port,
        "/resource-validation",
        &review("Service", "CREATE", bad, None),
    )
    .await;
    let line = kubectl_line(&r);
    println!("--- kubectl:\n{line}");
    assert_eq!(
        line,
        "Error from server (BadRequest): error when creating \"service.yaml\": admission webhook \
         \"validation.webhook.serving.knative.dev\" denied the request: validation failed: \
         expected 0 <= 150 <= 100: spec.traffic[0].percent\nTraffic targets sum to 150, want 100: \
         spec.traffic"
    );
    let readme =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
            .unwrap();
    assert!(
        readme.contains(&line),
        "README.md shows another refusal: {line}"
    );
    // A field config-features keeps closed is refused naming the key that opens it.
    let mut masked = patched.clone();
    masked["spec"]["template"]["spec"]["hostNetwork"] = json!(true);
    let r = admit(
        &c,
        port,
        "/resource-validation",
        &review("Service", "CREATE", masked, None),
    )
    .await;
    assert_eq!(r["allowed"], false);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("hostNetwork"),
        "{r}"
    );

    // A template change under the same explicit revision name is refused.
    let mut v1 = patched.clone();
    v1["spec"]["template"]["metadata"] = json!({"name": "helloworld-go-v1"});
    let mut v1b = v1.clone();
    v1b["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = json!("Go Sample v2");
    let r = admit(
        &c,
        port,
        "/resource-validation",
        &review("Service", "UPDATE", v1b.clone(), Some(v1.clone())),
    )
    .await;
    let m = r["status"]["message"].as_str().unwrap();
    assert!(
        m.starts_with("validation failed: Saw the following changes without a name change (-old +new): spec.template.metadata.name\n"),
        "{m}"
    );
    assert!(m.contains("Go Sample v2"), "{m}");
    let mut v2 = v1b.clone();
    v2["spec"]["template"]["metadata"]["name"] = json!("helloworld-go-v2");
    let r = admit(
        &c,
        port,
        "/resource-validation",
        &review("Service", "UPDATE", v2, Some(v1)),
    )
    .await;
    assert_eq!(r["allowed"], true, "{r}");

    // A Revision's spec is immutable; its labels are not.
    let rev = json!({
        "apiVersion": "serving.knative.dev/v1", "kind": "Revision",
        "metadata": {"name": "helloworld-go-00001", "namespace": NS},
        "spec": patched["spec"]["template"]["spec"].clone(),
    });
    let mut edited = rev.clone();
    edited["spec"]["containerConcurrency"] = json!(1);
    let r = admit(
        &c,
        port,
        "/resource-validation",
        &review("Revision", "UPDATE", edited, Some(rev.clone())),
    )
    .await;
    let m = r["status"]["message"].as_str().unwrap();
    assert!(
        m.starts_with("validation failed: Immutable fields changed (-old +new): spec\n"),
        "{m}"
    );
    let mut relabelled = rev.clone();
    relabelled["metadata"]["labels"] = json!({"team": "a"});
    let r = admit(
        &c,
        port,
        "/resource-validation",
        &review("Revision", "UPDATE", relabelled, Some(rev)),
    )
    .await;
    assert_eq!(r["allowed"], true, "{r}");

    // A DomainMapping (v1beta1): a single-label name and a ref in another namespace are
    // refused with Knative's messages; a valid one is admitted.
    let dm = |name: &str, ref_ns: &str| {
        json!({
            "apiVersion": "serving.knative.dev/v1beta1", "kind": "DomainMapping",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"ref": {"apiVersion": "serving.knative.dev/v1", "kind": "Service",
                "name": "helloworld-go", "namespace": ref_ns}},
        })
    };
    let mut bad = review(
        "DomainMapping",
        "CREATE",
        dm("localhost", "elsewhere"),
        None,
    );
    bad["request"]["kind"]["version"] = json!("v1beta1");
    let r = admit(&c, port, "/resource-validation", &bad).await;
    assert_eq!(r["allowed"], false, "{r}");
    let m = r["status"]["message"].as_str().unwrap();
    assert!(
        m.contains("invalid name \"localhost\": should be a domain with at least two segments")
            && m.contains("mismatched namespaces: spec.ref.namespace"),
        "{m}"
    );
    let mut good = review("DomainMapping", "CREATE", dm("hello.example.org", NS), None);
    good["request"]["kind"]["version"] = json!("v1beta1");
    let r = admit(&c, port, "/resource-validation", &good).await;
    assert_eq!(r["allowed"], true, "{r}");

    // Bounded and clear on bad input: no details of thaw's in the answers.
    let bundle = ca_bundle(&c, "/resource-validation").await.unwrap();
    let a = post(port, &bundle, "/resource-validation", vec![b' '; 70_000])
        .await
        .unwrap();
    assert_eq!(a.status, 413, "{}", a.body);
    let a = post(
        port,
        &bundle,
        "/resource-validation",
        b"{\"kind\":".to_vec(),
    )
    .await
    .unwrap();
    assert_eq!(a.status, 400);
    assert!(
        a.body["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("the body is not an AdmissionReview")
    );
    let a = post(port, &bundle, "/elsewhere", b"{}".to_vec())
        .await
        .unwrap();
    assert_eq!(a.status, 404);

    // The admin port counts admissions by webhook, kind, operation and outcome.
    let metrics = get_text(format!("127.0.0.1:{admin}").parse().unwrap(), "/metrics").await;
    assert!(
        metric(
            &metrics,
            "thaw_webhook_requests_total",
            &[
                "webhook=\"validation\"",
                "kind=\"Service\"",
                "allowed=\"false\""
            ]
        ) >= 3.0,
        "{metrics}"
    );
    assert!(
        metric(
            &metrics,
            "thaw_webhook_refused_total",
            &["reason=\"body_too_large\""]
        ) >= 1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_rotate_under_a_stream_of_calls_to_two_replicas_with_none_failed() {
    let c = Cluster::start(json!({})).await;
    apply_configurations(&c).await;
    // Certificates of 20 s, rotated with 15 s left: a rotation every ~5 s. A new CA is in the
    // caBundle 3 s before its certificate is served: the client below reads the bundle right
    // before each call (an API server's informer is the slower reader the default minute
    // covers).
    let life = [
        "--cert-validity",
        "20s",
        "--cert-rotate-before",
        "15s",
        "--cert-publish-delay",
        "3s",
    ];
    let (pa, aa, pb, ab) = (free_port(), free_port(), free_port(), free_port());
    let _a = webhook(&c, "wh-a", pa, aa, &life);
    let _b = webhook(&c, "wh-b", pb, ab, &life);
    started(&c, aa).await;
    started(&c, ab).await;
    let hello = helloworld();
    let body = serde_json::to_vec(&review("Service", "CREATE", hello, None)).unwrap();
    let mut served: BTreeSet<Vec<u8>> = BTreeSet::new();
    let mut calls = 0u32;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    // Until each replica has served three different certificates (two rotations), every
    // call, alternating between the replicas, on a new connection, must succeed.
    let mut per_replica: [BTreeSet<Vec<u8>>; 2] = Default::default();
    while per_replica.iter().any(|s| s.len() < 3) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no two rotations: {served:?}"
        );
        let i = (calls % 2) as usize;
        let port = [pa, pb][i];
        let path = if calls.is_multiple_of(3) {
            "/defaulting"
        } else {
            "/resource-validation"
        };
        let bundle = ca_bundle(&c, path).await.expect("a caBundle");
        let a = post(port, &bundle, path, body.clone())
            .await
            .unwrap_or_else(|e| panic!("call {calls} to replica {i} failed: {e}"));
        assert_eq!(a.status, 200, "call {calls}: {}", a.body);
        assert_eq!(
            a.body["response"]["allowed"], true,
            "call {calls}: {}",
            a.body
        );
        served.insert(a.cert.clone());
        per_replica[i].insert(a.cert);
        calls += 1;
    }
    println!(
        "{calls} calls, {} certificates served, none failed",
        served.len()
    );
    // One writer: the Lease holder made every certificate.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(c.client.clone(), SYSTEM);
    let holder = leases
        .get("thaw-webhook")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity
        .unwrap();
    assert!(holder == "wh-a" || holder == "wh-b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_refuses_to_start_beside_knative_serving() {
    let c = Cluster::start(json!({})).await;
    let deps: Api<Deployment> = Api::namespaced(c.client.clone(), "knative-serving");
    deps.create(
        &PostParams::default(),
        &obj(json!({
            "metadata": {"name": "controller", "namespace": "knative-serving"},
            "spec": {"selector": {"matchLabels": {"app": "controller"}},
                "template": {"metadata": {"labels": {"app": "controller"}},
                    "spec": {"containers": [{"name": "controller", "image": "knative"}]}}},
        })),
    )
    .await
    .unwrap();
    let mut w = webhook(&c, "wh-a", free_port(), free_port(), &[]);
    let code = w.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(code, Some(1), "{}", w.logs());
    assert!(
        w.logs()
            .contains("Knative Serving is installed (Deployment knative-serving/controller)"),
        "{}",
        w.logs()
    );
}
