//! Knative's `mesh-compatibility-mode` with `thaw activator` and `thaw autoscaler` as real
//! processes against the in-process API server: pods behind a mesh enforcing mutual TLS (their
//! slice addresses refuse plain text; only the private Service's cluster IP reaches them, as
//! in an Istio `STRICT` namespace) and pods outside it, side by side.

mod kube_e2e_support;
mod kube_support;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use kube_e2e_support::mesh::KubeProxy;
use kube_e2e_support::*;

const LONG: Duration = Duration::from_secs(40);

/// The activator's `/revisions` entry of `revision`: its endpoints' addresses and limits.
async fn activator_endpoints(admin: u16, revision: &str) -> Vec<(String, Option<u64>)> {
    let text = get_text(SocketAddr::from(([127, 0, 0, 1], admin)), "/revisions").await;
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    v["revisions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["name"] == revision)
        .flat_map(|r| r["endpoints"].as_array().cloned().unwrap_or_default())
        .map(|e| {
            (
                e["address"].as_str().unwrap_or_default().to_string(),
                e["limit"].as_u64(),
            )
        })
        .collect()
}

/// The `http` address of each pod of `revision` the kubelet has published (each pod its own
/// private slice).
async fn pod_addrs(c: &Cluster, revision: &str) -> Vec<SocketAddr> {
    let slices: kube::Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        kube::Api::namespaced(c.client.clone(), NS);
    let lp = kube::api::ListParams::default()
        .labels(&format!("kubernetes.io/service-name={revision}-private"));
    let items = slices.list(&lp).await.map(|l| l.items).unwrap_or_default();
    items
        .into_iter()
        .filter_map(|s| {
            let port = s
                .ports?
                .into_iter()
                .find(|p| p.name.as_deref() == Some("http"))?
                .port?;
            Some(SocketAddr::from(([127, 0, 0, 1], port as u16)))
        })
        .collect()
}

async fn pod_slices(c: &Cluster, revision: &str) -> usize {
    pod_addrs(c, revision).await.len()
}

/// Whether the autoscaler leader's `/revisions` says `revision`'s pod stats flow.
async fn stats_flowing(admin: u16, revision: &str) -> bool {
    let text = get_text(SocketAddr::from(([127, 0, 0, 1], admin)), "/revisions").await;
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    v["revisions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|r| r["name"] == revision && r["podStatsFlowing"] == true)
}

fn kind(strict_mtls: bool) -> PodKind {
    PodKind {
        sidecar: Some(1),
        strict_mtls,
        ..PodKind::default()
    }
}

/// `auto` (the default): the activator probes each revision's first ready pod. The strict
/// revision's pod refuses as a mesh does, its private Service answers: that revision goes
/// through the Service (one endpoint at `max(1, cc × ready / activators)`); the other's pod
/// answers: it is reached directly. The autoscaler's pod-stats pulls follow the same split,
/// so both revisions' stats flow. Then `enabled` takes even the plain revision through its Service,
/// and the route check still refuses another namespace's host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_pods_are_reached_through_the_private_service() {
    let c = Cluster::start(serde_json::json!({})).await;
    let act = SocketAddr::from(([127, 0, 0, 1], free_port()));
    c.activator_service(&[act]).await;
    for rev in ["strict-00001", "plain-00001"] {
        c.revision(rev, 1, serde_json::json!({})).await;
    }
    let strict_proxy =
        KubeProxy::start(&c.client, "strict-00001", Ipv4Addr::new(127, 0, 99, 1)).await;
    let plain_proxy =
        KubeProxy::start(&c.client, "plain-00001", Ipv4Addr::new(127, 0, 99, 2)).await;
    let kubelet = Kubelet::start(
        c.client.clone(),
        vec![
            ("strict-00001".into(), kind(true)),
            ("plain-00001".into(), kind(false)),
        ],
    );
    let (s1, a1, aa) = (free_port(), free_port(), free_port());
    let mut asc = autoscaler(&c, "autoscaler-1", s1, a1);
    let mut acti = activator(&c, "activator-1", act, aa).await;
    until(LONG, "activator ready", || async {
        ready(aa).await.then_some(())
    })
    .await;
    let client = http();
    for rev in ["strict-00001", "plain-00001"] {
        let (status, _, body) = get(&client, act, rev, "/").await;
        assert_eq!(status, 200, "{rev}: {body}");
    }
    // The strict pod's own address refuses plain text: only the Service reached it.
    let strict_pod = pod_addrs(&c, "strict-00001").await[0];
    let (status, _, _) = get(&client, strict_pod, "strict-00001", "/").await;
    assert_ne!(status, 200, "the strict pod answered plain text directly");
    assert!(
        strict_proxy.forwarded().0 >= 2,
        "the probe and the request went through the Service"
    );

    // The activator's endpoints: the Service for the strict revision, its limit cc 1 × the
    // ready pods / 1 activator; the pod for the plain one.
    let strict_svc = format!("127.0.99.1:{}", strict_proxy.http);
    until(LONG, "the Service at cc × ready pods", || async {
        let pods = pod_slices(&c, "strict-00001").await as u64;
        let eps = activator_endpoints(aa, "strict-00001").await;
        (eps == vec![(strict_svc.clone(), Some(pods))]).then_some(())
    })
    .await;
    let plain = activator_endpoints(aa, "plain-00001").await;
    assert!(!plain.is_empty(), "{plain:?}");
    assert!(
        plain
            .iter()
            .all(|(a, limit)| a.starts_with("127.0.0.1:") && *limit == Some(1)),
        "{plain:?}"
    );
    assert_eq!(
        plain_proxy.forwarded().0,
        0,
        "the plain revision went through its Service"
    );

    // The autoscaler pulls the strict revision's stats through the Service (after its direct
    // pulls were refused), the plain one's from the pod: both flow (what lets the swap serve a
    // revision from its pods).
    until(
        LONG,
        "stats pulled through the strict revision's Service",
        || async { (strict_proxy.forwarded().1 > 0).then_some(()) },
    )
    .await;
    for rev in ["strict-00001", "plain-00001"] {
        until(LONG, "pod stats flowing", || async {
            stats_flowing(a1, rev).await.then_some(())
        })
        .await;
    }
    assert_eq!(
        plain_proxy.forwarded().1,
        0,
        "the plain revision's stats went through its Service"
    );
    assert!(kubelet.peak.load(std::sync::atomic::Ordering::SeqCst) <= 1);

    // `enabled`: every revision through its Service, read when the roles start.
    c.config_map(
        "config-network",
        serde_json::json!({"mesh-compatibility-mode": "enabled"}),
    )
    .await;
    asc.kill();
    acti.kill();
    let (s2, a2, aa2) = (free_port(), free_port(), free_port());
    let _asc = autoscaler(&c, "autoscaler-2", s2, a2);
    let _acti = activator(&c, "activator-2", act, aa2).await;
    until(LONG, "activator ready", || async {
        ready(aa2).await.then_some(())
    })
    .await;
    let (status, _, body) = get(&client, act, "plain-00001", "/").await;
    assert_eq!(status, 200, "{body}");
    // The route check holds whichever way pods are reached: another namespace's host naming
    // this namespace's revision is 404, with no detail.
    c.route("team-a", "web", &["strict-00001"]).await;
    let (status, _, body) = get_as(
        &client,
        act,
        "web.team-a.svc.cluster.local",
        Some((NS, "strict-00001")),
        "/",
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert!(!body.contains("strict"), "{body}");
    let plain_svc = format!("127.0.99.2:{}", plain_proxy.http);
    until(
        LONG,
        "the plain revision's Service at cc × ready pods",
        || async {
            let pods = pod_slices(&c, "plain-00001").await as u64;
            let eps = activator_endpoints(aa2, "plain-00001").await;
            (eps == vec![(plain_svc.clone(), Some(pods))]).then_some(())
        },
    )
    .await;
    assert!(plain_proxy.forwarded().0 >= 1);
    until(
        LONG,
        "stats pulled through the plain revision's Service",
        || async {
            (plain_proxy.forwarded().1 > 0 && stats_flowing(a2, "plain-00001").await).then_some(())
        },
    )
    .await;
}

/// The element Istio's sidecar appends to `X-Forwarded-Client-Cert` for a peer whose SPIFFE id
/// is `ns/{ns}/sa/{sa}` (Envoy's `APPEND_FORWARD` with Subject, URI and DNS).
fn sidecar_xfcc(ns: &str, sa: &str) -> String {
    format!(
        "By=spiffe://cluster.local/ns/thaw-system/sa/activator;\
         Hash=00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff;Subject=\"\";\
         URI=spiffe://cluster.local/ns/{ns}/sa/{sa}"
    )
}

/// How many requests the activator has answered 200 for `revision`.
async fn served(admin: u16, revision: &str) -> f64 {
    let text = get_text(SocketAddr::from(([127, 0, 0, 1], admin)), "/metrics").await;
    let rev = format!("revision=\"{revision}\"");
    metric(
        &text,
        "thaw_activator_requests_total",
        &[&rev, "code=\"200\""],
    )
}

/// GET `/` on `act` from `source` with `Host: host` and `headers`; which of `revisions` the
/// activator served it to (by its per-revision counters), or the status.
async fn reached(
    act: SocketAddr,
    admin: u16,
    source: [u8; 4],
    host: &str,
    headers: &[(&str, &str)],
    revisions: &[&str],
) -> String {
    let mut before = Vec::new();
    for r in revisions {
        before.push(served(admin, r).await);
    }
    let mut req = http::Request::get(format!("http://{act}/")).header("host", host);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let status = match http_from(source.into()).request(req).await {
        Ok(r) => r.status().as_u16(),
        Err(e) => return format!("failed: {e}"),
    };
    for (r, b) in revisions.iter().zip(before) {
        if served(admin, r).await > b {
            return r.to_string();
        }
    }
    format!("status {status}")
}

/// Issue 47, point 8, with `thaw activator` as a real process: behind its Istio sidecar
/// (every peer 127.0.0.6) the gateways are told by the identity the sidecar vouches for in
/// `X-Forwarded-Client-Cert`, and the activator learns that identity from the pods behind
/// config-istio's gateway Services (their service account). A gateway keeps the revision its
/// headers chose; a pod is routed by its host's Route; a pod's own copy of the gateway's
/// identity, sent without the sidecar, is ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_its_sidecar_the_activator_believes_gateways_by_mesh_identity() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    let c = Cluster::start(serde_json::json!({})).await;
    let act = SocketAddr::from(([127, 0, 0, 1], free_port()));
    c.activator_service(&[act]).await;
    let warm = serde_json::json!({"autoscaling.knative.dev/min-scale": "1"});
    for rev in ["hello-00001", "other-00001"] {
        c.revision(rev, 0, warm.clone()).await;
    }
    // A Route over both: hello at 100 %, other routed at 0 % (a gateway may still name it).
    c.route(NS, "web", &["hello-00001", "other-00001"]).await;
    // The ingress gateway's pod, at 127.0.0.3, running as Istio's gateway service account.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "istio-system");
    pods.create(
        &PostParams::default(),
        &obj(serde_json::json!({
            "metadata": {"name": "istio-ingressgateway-1", "namespace": "istio-system"},
            "spec": {"serviceAccountName": "istio-ingressgateway-service-account",
                "containers": [{"name": "istio-proxy", "image": "proxyv2"}]},
        })),
    )
    .await
    .unwrap();
    pods.patch_status(
        "istio-ingressgateway-1",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"phase": "Running",
            "podIP": "127.0.0.3", "podIPs": [{"ip": "127.0.0.3"}]}})),
    )
    .await
    .unwrap();
    let _kubelet = Kubelet::start(
        c.client.clone(),
        vec![
            ("hello-00001".into(), PodKind::default()),
            ("other-00001".into(), PodKind::default()),
        ],
    );
    let (s1, a1, aa) = (free_port(), free_port(), free_port());
    let _asc = autoscaler(&c, "autoscaler-1", s1, a1);
    let _acti = activator(&c, "activator-1", act, aa).await;
    c.gateways_at(&[[127, 0, 0, 1].into(), [127, 0, 0, 3].into()])
        .await;
    until(LONG, "activator ready", || async {
        ready(aa).await.then_some(())
    })
    .await;
    let client = http();
    for rev in ["hello-00001", "other-00001"] {
        until(LONG, "warm revisions serving", || async {
            (get(&client, act, rev, "/").await.0 == 200).then_some(())
        })
        .await;
    }
    let revs = ["hello-00001", "other-00001"];
    let host = format!("web.{NS}.svc.cluster.local");
    let choice = [
        ("knative-serving-namespace", NS),
        ("knative-serving-revision", "other-00001"),
    ];
    let gw = sidecar_xfcc("istio-system", "istio-ingressgateway-service-account");
    let mut from_gateway = choice.to_vec();
    from_gateway.push(("x-forwarded-client-cert", &gw));
    // The gateway through the sidecar: its choice, once its pod's identity is followed.
    until(LONG, "the gateway's identity believed", || async {
        (reached(act, aa, [127, 0, 0, 6], &host, &from_gateway, &revs).await == "other-00001")
            .then_some(())
    })
    .await;
    // A pod through the sidecar: its host's Route (hello at 100 %), whatever it named.
    let pod = sidecar_xfcc(NS, "default");
    let mut from_pod = choice.to_vec();
    from_pod.push(("x-forwarded-client-cert", &pod));
    for _ in 0..3 {
        assert_eq!(
            reached(act, aa, [127, 0, 0, 6], &host, &from_pod, &revs).await,
            "hello-00001"
        );
        // A pod sending the gateway's identity itself, without the sidecar: ignored.
        assert_eq!(
            reached(act, aa, [127, 0, 0, 2], &host, &from_gateway, &revs).await,
            "hello-00001"
        );
        // Without a sidecar, a pod calling the Route's cluster-local host.
        assert_eq!(
            reached(act, aa, [127, 0, 0, 2], &format!("web.{NS}"), &[], &revs).await,
            "hello-00001"
        );
    }
}
