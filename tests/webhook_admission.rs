//! `thaw webhook` as a real process against the in-process API server. That server does not
//! call admission webhooks, so these tests play its part: they send real `AdmissionReview`s
//! over TLS to the webhook's port, trusting only the `caBundle` they read from the webhook
//! configuration at each call (as an API server does), with the server name of the webhook's
//! Service. The configurations are the ones in deploy/webhook/. Waits poll with deadlines;
//! nothing asserts a duration.

mod kube_e2e_support;
mod kube_support;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
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

/// A TLS client trusting exactly `bundle`, offering `alpn` (none when empty).
fn connector(bundle: &[u8], alpn: &[&[u8]]) -> Result<tokio_rustls::TlsConnector, String> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(bundle) {
        roots
            .add(c.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(cfg)))
}

/// A TCP connection to the webhook's `port` from the loopback address `from`.
async fn connect_from(from: IpAddr, port: u16) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind((from, 0).into())?;
    socket.connect((LOCAL, port).into()).await
}

/// The loopback address the webhook listens on, and the tests' "attacker" connects from.
const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
/// Another loopback address: the API server's connections in the tests on connection seats.
const API_SERVER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// POSTs `body` to `path` over a new TLS connection to `port`, trusting exactly `bundle`.
async fn post(port: u16, bundle: &[u8], path: &str, body: Vec<u8>) -> Result<Answer, String> {
    post_from(LOCAL, port, bundle, path, body).await
}

/// [`post`] from the loopback address `from`, offering ALPN `h2` and `http/1.1` as an API
/// server does.
async fn post_from(
    from: IpAddr,
    port: u16,
    bundle: &[u8],
    path: &str,
    body: Vec<u8>,
) -> Result<Answer, String> {
    let connector = connector(bundle, &[b"h2", b"http/1.1"])?;
    let tcp = connect_from(from, port)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = rustls::pki_types::ServerName::try_from(SERVER_NAME).unwrap();
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    if let Some(p) = tls
        .get_ref()
        .1
        .alpn_protocol()
        .filter(|p| *p != b"http/1.1")
    {
        return Err(format!("ALPN chose {}", String::from_utf8_lossy(p)));
    }
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
        m.contains(
            "invalid name \"localhost\": name: Invalid value: \"localhost\": should be a domain"
        ) && m.contains("mismatched namespaces: spec.ref.namespace"),
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

/// Connection seats (tests below): a TLS connection to the webhook from 127.0.0.1 asking for h2
/// (it gets HTTP/1.1), held without a request. Its task ends when the webhook closes it.
async fn idle_connection(
    connector: &tokio_rustls::TlsConnector,
    port: u16,
) -> Result<tokio::task::JoinHandle<()>, String> {
    use tokio::io::AsyncReadExt;
    let tcp = connect_from(LOCAL, port)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = rustls::pki_types::ServerName::try_from(SERVER_NAME).unwrap();
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    assert_eq!(
        tls.get_ref().1.alpn_protocol(),
        Some(&b"http/1.1"[..]),
        "the webhook speaks HTTP/1.1 only"
    );
    Ok(tokio::spawn(async move {
        let mut buf = [0u8; 512];
        while matches!(tls.read(&mut buf).await, Ok(n) if n > 0) {}
    }))
}

/// 300 idle connections from one address (each asking for h2) fill the seats many times over;
/// a fresh AdmissionReview from another address (the API server) is answered all the same:
/// each new connection took the seat of the oldest idle one, which was closed. Without the
/// eviction the 65th connection on would be refused, the API server's included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_from_one_address_never_keep_the_api_server_out() {
    const SEATS: usize = 64;
    const ATTACK: usize = 300;
    let c = Cluster::start(json!({})).await;
    apply_configurations(&c).await;
    let (port, admin) = (free_port(), free_port());
    // A handshake timeout far beyond the test: no idle connection closes by itself.
    let _w = webhook(
        &c,
        "wh-a",
        port,
        admin,
        &[
            "--max-connections",
            &SEATS.to_string(),
            "--handshake-timeout",
            "10m",
        ],
    );
    started(&c, admin).await;
    let bundle = ca_bundle(&c, "/defaulting").await.unwrap();

    let asks_h2 = connector(&bundle, &[b"h2", b"http/1.1"]).unwrap();
    let mut attempts = Vec::with_capacity(ATTACK);
    for _ in 0..ATTACK {
        attempts.push(idle_connection(&asks_h2, port).await);
    }

    // The API server's review, from another address, on a new connection.
    let r = admit_from(&c, port, &review("Service", "CREATE", helloworld(), None)).await;
    assert_eq!(r["allowed"], true, "{r}");
    // Each of the 300 was let in too, a seat taken from an older one.
    let held: Vec<_> = attempts
        .into_iter()
        .enumerate()
        .map(|(i, a)| a.unwrap_or_else(|e| panic!("idle connection {i} refused: {e}")))
        .collect();

    // Every seat given away was the oldest idle one's: the first 300 - 64 + 1 connections are
    // closed, the newest 63 still open.
    let evicted = ATTACK - SEATS + 1;
    until(
        Duration::from_secs(30),
        "the evicted connections closed",
        || async { (held.iter().filter(|h| h.is_finished()).count() >= evicted).then_some(()) },
    )
    .await;
    assert!(held[..evicted].iter().all(|h| h.is_finished()));
    assert!(
        held[evicted..].iter().all(|h| !h.is_finished()),
        "a newer connection was closed before an older idle one"
    );
    let metrics = get_text(format!("127.0.0.1:{admin}").parse().unwrap(), "/metrics").await;
    assert_eq!(
        metric(
            &metrics,
            "thaw_webhook_connections_closed_total",
            &["reason=\"evicted\""]
        ),
        evicted as f64,
        "{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            "thaw_webhook_refused_total",
            &["reason=\"connections\""]
        ),
        0.0,
        "{metrics}"
    );
    assert!(metric(&metrics, "thaw_webhook_connections ", &[]) <= SEATS as f64);
    for h in held {
        h.abort();
    }
}

/// Sends `review` to the validating webhook from [`API_SERVER`]'s address; the response part.
async fn admit_from(c: &Cluster, port: u16, review: &Value) -> Value {
    let bundle = ca_bundle(c, "/resource-validation")
        .await
        .expect("a caBundle");
    let a = post_from(
        API_SERVER,
        port,
        &bundle,
        "/resource-validation",
        serde_json::to_vec(review).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["response"]["uid"], review["request"]["uid"]);
    a.body["response"].clone()
}

/// What became of one request whose body trickled.
struct Trickled {
    /// When its head was sent (before the webhook could start its body timeout).
    head_sent: tokio::time::Instant,
    /// When the webhook closed the connection.
    closed: tokio::time::Instant,
    /// The status answered before the close, if it was read.
    status: Option<u16>,
    /// Body bytes sent before the close.
    sent: usize,
}

/// A request on a new connection from 127.0.0.1 whose `body` is sent a byte every 100 ms, once
/// the webhook asked for it (`Expect: 100-continue`: hyper answers 100 when the handler reads
/// the body, so the request is in flight). The task ends when the webhook closes the
/// connection.
async fn trickling_request(
    connector: &tokio_rustls::TlsConnector,
    port: u16,
    body: Vec<u8>,
) -> Result<tokio::task::JoinHandle<Trickled>, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = connect_from(LOCAL, port)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = rustls::pki_types::ServerName::try_from(SERVER_NAME).unwrap();
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let head = format!(
        "POST /resource-validation HTTP/1.1\r\nhost: {SERVER_NAME}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\
         expect: 100-continue\r\n\r\n",
        body.len()
    );
    let head_sent = tokio::time::Instant::now();
    tls.write_all(head.as_bytes())
        .await
        .map_err(|e| format!("head: {e}"))?;
    let mut interim = Vec::new();
    let mut buf = [0u8; 512];
    while !interim.windows(4).any(|w| w == b"\r\n\r\n") {
        match tls.read(&mut buf).await {
            Ok(n) if n > 0 => interim.extend_from_slice(&buf[..n]),
            r => return Err(format!("no 100 Continue: {r:?}")),
        }
    }
    assert!(
        interim.starts_with(b"HTTP/1.1 100"),
        "{}",
        String::from_utf8_lossy(&interim)
    );
    let (mut rd, mut wr) = tokio::io::split(tls);
    Ok(tokio::spawn(async move {
        let sent = std::sync::atomic::AtomicUsize::new(0);
        let mut answer = Vec::new();
        let read = async {
            let mut buf = [0u8; 512];
            while let Ok(n) = rd.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                answer.extend_from_slice(&buf[..n]);
            }
        };
        let write = async {
            for b in &body {
                if wr.write_all(std::slice::from_ref(b)).await.is_err() || wr.flush().await.is_err()
                {
                    break;
                }
                sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            std::future::pending::<()>().await
        };
        tokio::select! {
            _ = read => {}
            _ = write => {}
        }
        let status = std::str::from_utf8(&answer)
            .ok()
            .and_then(|a| a.strip_prefix("HTTP/1.1 "))
            .and_then(|a| a.get(..3))
            .and_then(|c| c.parse().ok());
        Trickled {
            head_sent,
            closed: tokio::time::Instant::now(),
            status,
            sent: sent.load(std::sync::atomic::Ordering::Relaxed),
        }
    }))
}

/// 300 connections each holding one request whose body trickles (a byte every 100 ms, far
/// slower than the body timeout allows) are answered 408 and closed at the body timeout, never
/// before it, while fresh reviews from the API server's address are answered throughout.
/// Asking for h2 gets HTTP/1.1, so the answered request frees its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_whose_bodies_trickle_are_freed_at_the_body_timeout() {
    const TRICKLING: usize = 300;
    let body_timeout = Duration::from_secs(2);
    let c = Cluster::start(json!({})).await;
    apply_configurations(&c).await;
    let (port, admin) = (free_port(), free_port());
    // Seats for every trickling request and the fresh reviews: this test is about the body
    // timeout, the one above about a full room.
    let _w = webhook(
        &c,
        "wh-a",
        port,
        admin,
        &[
            "--max-connections",
            "400",
            "--request-timeout",
            "2s",
            "--handshake-timeout",
            "10m",
        ],
    );
    started(&c, admin).await;
    let bundle = ca_bundle(&c, "/resource-validation").await.unwrap();
    let fresh = review("Service", "CREATE", helloworld(), None);
    // A review padded with whitespace: a minute and more at a byte every 100 ms.
    let mut slow = serde_json::to_vec(&fresh).unwrap();
    slow.resize(slow.len() + 1000, b' ');

    let asks_h2 = connector(&bundle, &[b"h2", b"http/1.1"]).unwrap();
    let mut trickling = Vec::with_capacity(TRICKLING);
    for i in 0..TRICKLING {
        trickling.push(
            trickling_request(&asks_h2, port, slow.clone())
                .await
                .unwrap_or_else(|e| panic!("trickling request {i}: {e}")),
        );
    }
    let seated = tokio::time::Instant::now();

    // Fresh reviews, one after another, until every trickling connection is closed.
    let mut answered = 0u32;
    let mut first_answered = None;
    while !trickling.iter().all(|h| h.is_finished()) {
        assert!(
            seated.elapsed() < Duration::from_secs(60),
            "trickling connections still open after a minute"
        );
        let r = admit_from(&c, port, &fresh).await;
        assert_eq!(r["allowed"], true, "{r}");
        answered += 1;
        first_answered.get_or_insert_with(tokio::time::Instant::now);
    }
    let mut ends = Vec::with_capacity(TRICKLING);
    let mut timed_out = 0;
    for h in trickling {
        let t = h.await.unwrap();
        assert!(
            t.closed >= t.head_sent + body_timeout,
            "a trickling request was cut before the body timeout"
        );
        assert!(t.sent < slow.len(), "a trickling body was sent whole");
        if t.status == Some(408) {
            timed_out += 1;
        }
        ends.push(t.closed);
    }
    let last_closed = ends.iter().max().copied().unwrap();
    assert!(
        first_answered.is_some_and(|f| f < last_closed),
        "no fresh review answered while trickling requests were in flight"
    );
    println!(
        "{TRICKLING} trickling requests cut ({timed_out} read their 408), {answered} fresh reviews answered meanwhile"
    );
    let metrics = get_text(format!("127.0.0.1:{admin}").parse().unwrap(), "/metrics").await;
    assert!(
        metric(
            &metrics,
            "thaw_webhook_refused_total",
            &["reason=\"timeout\""]
        ) >= TRICKLING as f64,
        "{metrics}"
    );
    // Every seat is free again.
    until(
        Duration::from_secs(10),
        "no connection open on the webhook",
        || async {
            let m = get_text(format!("127.0.0.1:{admin}").parse().unwrap(), "/metrics").await;
            (metric(&m, "thaw_webhook_connections ", &[]) == 0.0).then_some(())
        },
    )
    .await;
}

/// The webhook speaks HTTP/1.1 only (a client offering only h2 fails the handshake), and an
/// idle connection is closed after the handshake timeout, a new one that sends no request as
/// well as one that carried a review (HTTP/1.1 keep-alive), and counted; never before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_after_the_handshake_timeout() {
    let handshake_timeout = Duration::from_secs(1);
    let c = Cluster::start(json!({})).await;
    apply_configurations(&c).await;
    let (port, admin) = (free_port(), free_port());
    let _w = webhook(&c, "wh-a", port, admin, &["--handshake-timeout", "1s"]);
    started(&c, admin).await;
    let bundle = ca_bundle(&c, "/resource-validation").await.unwrap();
    // A client offering only h2 gets no connection at all.
    let h2_only = connector(&bundle, &[b"h2"]).unwrap();
    assert!(
        idle_connection(&h2_only, port).await.is_err(),
        "the webhook does not speak HTTP/2"
    );
    let asks_h2 = connector(&bundle, &[b"h2", b"http/1.1"]).unwrap();

    // No request at all.
    let opened = tokio::time::Instant::now();
    let silent = idle_connection(&asks_h2, port).await.unwrap();

    // One review, then nothing.
    let tcp = connect_from(API_SERVER, port).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from(SERVER_NAME).unwrap();
    let tls = asks_h2.connect(name, tcp).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    let kept = tokio::spawn(conn);
    let asked = tokio::time::Instant::now();
    let body = serde_json::to_vec(&review("Service", "CREATE", helloworld(), None)).unwrap();
    let resp = send
        .send_request(
            http::Request::post("/resource-validation")
                .header("host", SERVER_NAME)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();

    let silent_closed = tokio::time::timeout(Duration::from_secs(30), silent)
        .await
        .map(|_| tokio::time::Instant::now())
        .expect("the silent connection closed");
    assert!(silent_closed >= opened + handshake_timeout);
    let kept_closed = tokio::time::timeout(Duration::from_secs(30), kept)
        .await
        .map(|_| tokio::time::Instant::now())
        .expect("the kept-alive connection closed");
    assert!(kept_closed >= asked + handshake_timeout);
    let metrics = get_text(format!("127.0.0.1:{admin}").parse().unwrap(), "/metrics").await;
    assert_eq!(
        metric(
            &metrics,
            "thaw_webhook_connections_closed_total",
            &["reason=\"idle\""]
        ),
        2.0,
        "{metrics}"
    );
}
