//! `thaw activator` and `thaw autoscaler` as real processes against the in-process API server
//! (through a cuttable relay, with a kubeconfig), with a test kubelet that runs real
//! `thaw sample-app` pods. Real clock; every wait polls a condition with a deadline.

mod kube_e2e_support;
mod kube_support;

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube_e2e_support::*;
use tokio::time::Instant;

const LONG: Duration = Duration::from_secs(40);

async fn leader(c: &Cluster) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), SYSTEM);
    leases
        .get_opt("thaw-autoscaler")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty())
}

fn admin_addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The status of `path` on `addr` and its body (0 when nothing answers).
async fn status_of(addr: SocketAddr, path: &str) -> (u16, String) {
    let req = http::Request::get(format!("http://{addr}{path}"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    match http().request(req).await {
        Ok(r) => {
            let code = r.status().as_u16();
            let body = http_body_util::BodyExt::collect(r.into_body())
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            (code, String::from_utf8_lossy(&body).into_owned())
        }
        Err(_) => (0, String::new()),
    }
}

/// The status of an empty stats push to `addr` presenting `token`.
async fn push_with(addr: SocketAddr, token: &str) -> u16 {
    let req = http::Request::post(format!("http://{addr}/stats"))
        .header("authorization", format!("Bearer {token}"))
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            br#"{"source":"x","stats":[]}"#,
        )))
        .unwrap();
    http().request(req).await.map_or(0, |r| r.status().as_u16())
}

/// An install with no stats token: the activator's /healthz answers at once and its /readyz
/// says it waits for the token; the autoscaler leader creates the Secret and both turn ready.
/// A rotated token is taken live by the autoscaler, and the one it replaced is still accepted
/// (the grace period), so no push is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stats_token_is_made_waited_for_and_rotated_live() {
    let c = Cluster::start_without_token(serde_json::json!({})).await;
    let data: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let act_admin = free_port();
    c.activator_service(&[data]).await;
    // The activator alone first: healthy at once, not ready, and saying why.
    let act = activator(&c, "act-1", data, act_admin).await;
    let (code, body) = until(LONG, "the activator's /readyz", || async {
        let (code, body) = status_of(admin_addr(act_admin), "/readyz").await;
        (code != 0 && body.contains("stats token")).then_some((code, body))
    })
    .await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(
        status_of(admin_addr(act_admin), "/healthz").await,
        (200, "ok\n".to_string()),
        "{}",
        act.logs()
    );
    assert_eq!(c.token().await, None);

    // The autoscaler leader makes the Secret; both roles turn ready.
    let (stats, as_admin) = (free_port(), free_port());
    let scaler = autoscaler(&c, "as-1", stats, as_admin);
    let made = until(LONG, "the Secret made by the leader", || c.token()).await;
    assert_eq!(made.len(), 64, "a 32-byte random token in hex");
    until(LONG, "both ready", || async {
        (ready(act_admin).await && ready(as_admin).await).then_some(())
    })
    .await;
    let stats_addr = admin_addr(stats);
    assert_eq!(push_with(stats_addr, &made).await, 202, "{}", scaler.logs());

    // Rotation: the new token is in force without a restart, the old one still accepted.
    let rotated = "rotated-token-0123456789abcdefghij";
    c.set_token(rotated).await;
    until(LONG, "the rotated token accepted", || async {
        (push_with(stats_addr, rotated).await == 202).then_some(())
    })
    .await;
    assert_eq!(
        push_with(stats_addr, &made).await,
        202,
        "within the grace period"
    );
    assert_eq!(push_with(stats_addr, "not-the-token-at-all-000").await, 401);
    assert!(ready(act_admin).await, "{}", act.logs());
}

/// Cold start through two activators, their capacity split, the serving-mode swap and its
/// order back to zero, the stats token, and a live ConfigMap edit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_start_split_swap_and_scale_to_zero() {
    let c = Cluster::start(serde_json::json!({
        "stable-window": "6s",
        "scale-to-zero-grace-period": "2s",
        "allow-zero-initial-scale": "true",
    }))
    .await;
    let acts: Vec<SocketAddr> = (0..2)
        .map(|_| SocketAddr::from(([127, 0, 0, 1], free_port())))
        .collect();
    c.activator_service(&acts).await;
    c.revision(
        "hello-00001",
        1,
        // max-scale 2: the pod set stays steady under the burst below (while pods come and
        // go, a pod can change activator with a request still in flight; docs/decisions.md).
        serde_json::json!({"autoscaling.knative.dev/target-burst-capacity": "0",
            "autoscaling.knative.dev/initial-scale": "0",
            "autoscaling.knative.dev/max-scale": "2"}),
    )
    .await;
    let kubelet = Kubelet::start(
        c.client.clone(),
        vec![(
            "hello-00001".into(),
            PodKind {
                stats: true,
                crash: false,
                sidecar: None,
                strict_mtls: false,
            },
        )],
    );
    let (s1, s2, a1, a2, aa1, aa2) = (
        free_port(),
        free_port(),
        free_port(),
        free_port(),
        free_port(),
        free_port(),
    );
    let _as1 = autoscaler(&c, "autoscaler-1", s1, a1);
    let _as2 = autoscaler(&c, "autoscaler-2", s2, a2);
    let act1 = activator(&c, "activator-1", acts[0], aa1).await;
    let act2 = activator(&c, "activator-2", acts[1], aa2).await;
    until(LONG, "activators ready", || async {
        (ready(aa1).await && ready(aa2).await).then_some(())
    })
    .await;
    let lead = until(LONG, "a leader", || leader(&c)).await;
    let lead_addr: SocketAddr = lead.parse().unwrap();

    // The stats port refuses a sender without the token, and one with a wrong token.
    let client = http();
    for auth in [None, Some("Bearer not-the-token-at-all-000")] {
        let mut req = http::Request::post(format!("http://{lead_addr}/stats"));
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let body = r#"{"source":"x","stats":[{"namespace":"default","name":"hello-00001","concurrency":50,"requests":1,"poke":true}]}"#;
        let resp = client
            .request(
                req.body(http_body_util::Full::new(bytes::Bytes::from(body)))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), 401, "{auth:?}");
    }

    // The replica that does not lead answers 503 even with the token: the sender moves on.
    // (Its answer counts only while the Lease names the same leader before and after it: on a
    // starved machine a 3 s Lease can change hands between the two reads.)
    let code = until(
        LONG,
        "an answer from the replica that does not lead",
        || async {
            let before: SocketAddr = leader(&c).await?.parse().ok()?;
            let other = if before.port() == s1 { s2 } else { s1 };
            let resp = client
                .request(
                    http::Request::post(format!("http://127.0.0.1:{other}/stats"))
                        .header("authorization", format!("Bearer {TOKEN}"))
                        .body(http_body_util::Full::new(bytes::Bytes::from_static(
                            br#"{"source":"x","stats":[]}"#,
                        )))
                        .unwrap(),
                )
                .await
                .ok()?;
            let after: SocketAddr = leader(&c).await?.parse().ok()?;
            (before == after).then_some(resp.status())
        },
    )
    .await;
    assert_eq!(code, 503);

    // A request at zero is held, the leader scales up, the kubelet publishes pods, 200.
    assert_eq!(c.replicas("hello-00001").await, 0);
    let (status, timing, body) = get(&client, acts[0], "hello-00001", "/").await;
    assert_eq!(status, 200, "{body}\n{}", act1.logs());
    assert!(
        timing.is_some_and(|t| t.contains("cold")),
        "Server-Timing names the cold start"
    );
    assert!(c.replicas("hello-00001").await >= 1);
    // The activators follow the leader's decisions (the feed).
    for admin in [aa1, aa2] {
        until(LONG, "the decision reached the activator", || async {
            let v: serde_json::Value =
                serde_json::from_str(&get_text(admin_addr(admin), "/revisions").await).ok()?;
            let desired = v["revisions"]
                .as_array()?
                .iter()
                .find(|r| r["name"] == "hello-00001")?["desired"]
                .as_i64()?;
            (desired >= 1).then_some(())
        })
        .await;
    }

    // Two activators, containerConcurrency 1, two pods (max-scale): the activators deal the
    // pods out, so a pod never gets two requests at once, though 16 arrive together.
    let private: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        Api::namespaced(c.client.clone(), NS);
    until(LONG, "both pods in the private slices", || async {
        let lp = kube::api::ListParams::default()
            .labels("serving.knative.dev/revision=hello-00001,networking.internal.knative.dev/serviceType=Private");
        (private.list(&lp).await.ok()?.items.len() == 2).then_some(())
    })
    .await;
    // Each activator has seen both pods and taken its own (until then one that sees a single
    // pod shares it, and the two could both use it).
    until(LONG, "each activator on its own pod", || async {
        let mut seen = Vec::new();
        for admin in [aa1, aa2] {
            let v: serde_json::Value =
                serde_json::from_str(&get_text(admin_addr(admin), "/revisions").await).ok()?;
            let rev = v["revisions"]
                .as_array()?
                .iter()
                .find(|r| r["name"] == "hello-00001")?
                .clone();
            seen.push(rev["ready"]["addresses"].as_array()?.clone());
        }
        let all: std::collections::BTreeSet<String> =
            seen.iter().flatten().map(ToString::to_string).collect();
        (seen.iter().all(|s| s.len() == 1) && all.len() == 2).then_some(())
    })
    .await;
    let mut all = Vec::new();
    for i in 0..16 {
        let client = client.clone();
        let a = acts[i % 2];
        all.push(tokio::spawn(async move {
            get(&client, a, "hello-00001", "/").await.0
        }));
    }
    for h in all {
        assert_eq!(h.await.unwrap(), 200);
    }
    assert_eq!(
        kubelet.peak.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "a pod had more than containerConcurrency requests at once"
    );

    // With burst capacity to spare and pod stats flowing, the public endpoints go to the pods.
    let on_pods = |eps: &[SocketAddr]| !eps.is_empty() && eps.iter().all(|e| !acts.contains(e));
    until(LONG, "public endpoints on the pods", || async {
        on_pods(&c.public_endpoints("hello-00001").await).then_some(())
    })
    .await;

    // Idle: back to the activators first, then zero a grace period later.
    until(LONG, "scale to zero", || async {
        (c.replicas("hello-00001").await == 0).then_some(())
    })
    .await;
    // The kubelet's next round records it.
    until(
        LONG,
        "the kubelet's record of the scale to zero",
        || async {
            kubelet
                .timeline()
                .iter()
                .any(|(_, s)| *s == Seen::Scale("hello-00001".into(), 0))
                .then_some(())
        },
    )
    .await;
    let timeline = kubelet.timeline();
    let zero_at = timeline
        .iter()
        .rposition(|(_, s)| *s == Seen::Scale("hello-00001".into(), 0))
        .unwrap();
    let back = timeline[..zero_at]
        .iter()
        .rposition(|(_, s)| matches!(s, Seen::Public(_, eps) if !eps.is_empty() && eps.iter().all(|e| acts.contains(e))))
        .expect("the public endpoints went back to the activators before the scale to zero");
    let served_by_pods = timeline[..back]
        .iter()
        .any(|(_, s)| matches!(s, Seen::Public(_, eps) if on_pods(eps)));
    assert!(served_by_pods, "{timeline:?}");
    if std::env::var("E2E_DEBUG").is_ok() {
        for (t, s) in &timeline {
            eprintln!("{:?} {s:?}", t.elapsed());
        }
        eprintln!(
            "{}",
            std::fs::read_to_string(c.dir.path().join("autoscaler-1.log")).unwrap()
        );
    }
    let gap = timeline[zero_at].0 - timeline[back].0;
    assert!(
        gap >= Duration::from_millis(1700),
        "zero came {gap:?} after the swap back; the grace period is 2 s"
    );

    // A live ConfigMap edit applies; an invalid one is rejected, the last good one kept.
    let metrics = |port| async move { get_text(admin_addr(port), "/metrics").await };
    let applied = |t: &str| metric(t, "thaw_config_reloads_total", &["config-autoscaler"]);
    let rejected = |t: &str| {
        metric(
            t,
            "thaw_config_reload_rejected_total",
            &["config-autoscaler"],
        )
    };
    let before = applied(&metrics(a1).await);
    c.config_map(
        "config-autoscaler",
        serde_json::json!({"stable-window": "8s", "scale-to-zero-grace-period": "2s",
            "allow-zero-initial-scale": "true"}),
    )
    .await;
    until(LONG, "the edit applied", || async {
        (applied(&metrics(a1).await) > before).then_some(())
    })
    .await;
    // The revision's effective stable window follows, on the activators too.
    let stable_window = |admin: u16| async move {
        let v: serde_json::Value =
            serde_json::from_str(&get_text(admin_addr(admin), "/revisions").await).ok()?;
        v["revisions"]
            .as_array()?
            .iter()
            .find(|r| r["name"] == "hello-00001")?["autoscaling"]["stable-window"]
            .as_str()
            .map(String::from)
    };
    until(LONG, "the new stable window on the activator", || async {
        (stable_window(aa1).await.as_deref() == Some("8s")).then_some(())
    })
    .await;
    c.config_map(
        "config-autoscaler",
        serde_json::json!({"stable-window": "banana"}),
    )
    .await;
    until(LONG, "the invalid edit rejected", || async {
        (rejected(&metrics(a1).await) >= 1.0).then_some(())
    })
    .await;
    let logs = std::fs::read_to_string(c.dir.path().join("autoscaler-1.log")).unwrap();
    assert!(
        logs.contains("stable-window"),
        "the rejection names the key"
    );
    until(LONG, "the activator's rejection too", || async {
        let t = get_text(admin_addr(aa1), "/metrics").await;
        (rejected(&t) >= 1.0).then_some(())
    })
    .await;
    assert_eq!(
        stable_window(aa1).await.as_deref(),
        Some("8s"),
        "the last good value stays"
    );
    drop(act2);
}

/// A crash-looping revision answers held requests 503 at once; the leader is killed and the
/// other replica takes over and keeps scaling; the API server is cut off for 10 s while warm
/// traffic flows, and every watch resumes without re-listing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_loop_failover_and_api_server_cut() {
    let c = Cluster::start(serde_json::json!({
        "stable-window": "6s",
        "allow-zero-initial-scale": "true",
    }))
    .await;
    let act = SocketAddr::from(([127, 0, 0, 1], free_port()));
    c.activator_service(&[act]).await;
    c.revision(
        "warm-00001",
        0,
        serde_json::json!({"autoscaling.knative.dev/min-scale": "1"}),
    )
    .await;
    c.revision(
        "crashy-00001",
        0,
        serde_json::json!({"autoscaling.knative.dev/initial-scale": "0"}),
    )
    .await;
    c.revision(
        "late-00001",
        0,
        serde_json::json!({"autoscaling.knative.dev/initial-scale": "0"}),
    )
    .await;
    let _kubelet = Kubelet::start(
        c.client.clone(),
        vec![
            (
                "warm-00001".into(),
                PodKind {
                    stats: false,
                    crash: false,
                    sidecar: None,
                    strict_mtls: false,
                },
            ),
            (
                "crashy-00001".into(),
                PodKind {
                    stats: false,
                    crash: true,
                    sidecar: None,
                    strict_mtls: false,
                },
            ),
            (
                "late-00001".into(),
                PodKind {
                    stats: false,
                    crash: false,
                    sidecar: None,
                    strict_mtls: false,
                },
            ),
        ],
    );
    let (s1, s2, a1, a2, aa) = (
        free_port(),
        free_port(),
        free_port(),
        free_port(),
        free_port(),
    );
    let mut as1 = autoscaler(&c, "autoscaler-1", s1, a1);
    let mut as2 = autoscaler(&c, "autoscaler-2", s2, a2);
    let activator = activator(&c, "activator-1", act, aa).await;
    until(LONG, "activator ready", || async {
        ready(aa).await.then_some(())
    })
    .await;
    let client = http();
    until(LONG, "warm revision serving", || async {
        (get(&client, act, "warm-00001", "/").await.0 == 200).then_some(())
    })
    .await;

    // A crash-looping revision: its held request is answered 503 at once, not 504 at the end
    // of its 30 s wait.
    let (status, _, body) = get(&client, act, "crashy-00001", "/").await;
    assert_eq!(status, 503, "{body}");
    assert!(!body.contains("crashy-00001-pod"), "no internals: {body}");

    // The leader dies: the other replica takes over within lease duration + 2 x retry period
    // (3 s + 1 s; the deadline adds a second for the API round trips) and keeps scaling.
    let old = until(LONG, "a leader", || leader(&c)).await;
    let (dead, alive_admin) = if old.ends_with(&format!(":{s1}")) {
        (&mut as1, a2)
    } else {
        (&mut as2, a1)
    };
    dead.kill();
    let killed_at = Instant::now();
    let new = until(Duration::from_secs(5), "a new leader", || async {
        leader(&c).await.filter(|l| *l != old)
    })
    .await;
    assert!(killed_at.elapsed() <= Duration::from_secs(5));
    assert_eq!(c.replicas("late-00001").await, 0);
    let (status, _, body) = get(&client, act, "late-00001", "/").await;
    assert_eq!(status, 200, "the new leader ({new}) scales: {body}");
    assert_eq!(c.replicas("late-00001").await, 1);
    // Stats reach the new leader, and none go to the dead one any more.
    let act_metrics = || async { get_text(admin_addr(aa), "/metrics").await };
    let failed = |t: &str| {
        metric(t, "thaw_activator_stats_push_total", &["error"])
            + metric(t, "thaw_activator_stats_push_total", &["timeout"])
    };
    until(LONG, "stats accepted by the new leader", || async {
        let t = get_text(admin_addr(alive_admin), "/metrics").await;
        (metric(
            &t,
            "thaw_autoscaler_stats_requests_total",
            &["path=\"stats\"", "code=\"202\""],
        ) > 0.0)
            .then_some(())
    })
    .await;
    let f1 = failed(&act_metrics().await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        failed(&act_metrics().await),
        f1,
        "stats still sent to the dead leader"
    );

    // The API server is away for 10 s: warm traffic keeps flowing; then each watch resumes
    // from its resourceVersion, with no new LIST.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let resources = [
        "/apis/serving.knative.dev/v1/revisions?",
        "/apis/discovery.k8s.io/v1/endpointslices?",
        "/api/v1/pods?",
        "/apis/apps/v1/deployments?",
        "/configmaps?",
        "/api/v1/services?",
    ];
    let lists_before: Vec<usize> = resources.iter().map(|r| c.relay.lists(r).len()).collect();
    let watches_before: Vec<usize> = resources.iter().map(|r| c.relay.watches(r).len()).collect();
    c.relay.cut();
    let cut_at = Instant::now();
    let mut ok = 0;
    while cut_at.elapsed() < Duration::from_secs(10) {
        let (status, _, body) = get(&client, act, "warm-00001", "/").await;
        assert_eq!(status, 200, "warm traffic during the cut: {body}");
        ok += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(ok >= 20);
    c.relay.restore();
    until(LONG, "every watch resumed", || async {
        resources
            .iter()
            .zip(&watches_before)
            .all(|(r, before)| c.relay.watches(r).len() > *before)
            .then_some(())
    })
    .await;
    let lists_after: Vec<usize> = resources.iter().map(|r| c.relay.lists(r).len()).collect();
    assert_eq!(
        lists_before, lists_after,
        "a watch re-listed after the cut: {resources:?}"
    );
    assert_eq!(get(&client, act, "warm-00001", "/").await.0, 200);
    drop(activator);
}

/// With real `thaw queue` sidecars in the pods: their stats flow, so the public endpoints swap
/// to the pods; a burst sent straight to the pods (the activator out of the path) keeps the
/// revision scaled up; idle, it goes back through the activator to zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_take_the_activator_out_of_the_path_and_back() {
    let c = Cluster::start(serde_json::json!({
        "stable-window": "6s",
        "scale-to-zero-grace-period": "2s",
        "allow-zero-initial-scale": "true",
    }))
    .await;
    let act = SocketAddr::from(([127, 0, 0, 1], free_port()));
    c.activator_service(&[act]).await;
    c.revision(
        "side-00001",
        2,
        serde_json::json!({"autoscaling.knative.dev/target-burst-capacity": "0",
            "autoscaling.knative.dev/initial-scale": "0"}),
    )
    .await;
    let kubelet = Kubelet::start(
        c.client.clone(),
        vec![(
            "side-00001".into(),
            PodKind {
                stats: false,
                crash: false,
                sidecar: Some(2),
                strict_mtls: false,
            },
        )],
    );
    let (s1, a1, aa) = (free_port(), free_port(), free_port());
    let _as1 = autoscaler(&c, "autoscaler-1", s1, a1);
    let _act = activator(&c, "activator-1", act, aa).await;
    until(LONG, "activator ready", || async {
        ready(aa).await.then_some(())
    })
    .await;
    let client = http();
    let (status, _, body) = get(&client, act, "side-00001", "/").await;
    assert_eq!(status, 200, "{body}");

    // The sidecars' stats flow: the public endpoints go to the pods (their sidecars).
    let pods = until(LONG, "public endpoints on the pods", || async {
        let eps = c.public_endpoints("side-00001").await;
        (!eps.is_empty() && !eps.contains(&act)).then_some(eps)
    })
    .await;

    // A burst straight to the pods, as the public Service now sends it: 6 at a time for 8 s
    // (longer than the stable window). Only the sidecars see it; the revision stays up.
    let burst_end = Instant::now() + Duration::from_secs(8);
    let mut workers = Vec::new();
    for i in 0..6 {
        let (client, pod) = (client.clone(), pods[i % pods.len()]);
        workers.push(tokio::spawn(async move {
            let mut ok = 0u32;
            while Instant::now() < burst_end {
                let req = http::Request::get(format!("http://{pod}/"))
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap();
                if let Ok(r) = client.request(req).await
                    && r.status() == 200
                {
                    ok += 1;
                }
            }
            ok
        }));
    }
    let mut lowest = i32::MAX;
    while Instant::now() < burst_end {
        lowest = lowest.min(c.replicas("side-00001").await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut served = 0;
    for w in workers {
        served += w.await.unwrap();
    }
    assert!(served > 20, "the burst was served by the pods: {served}");
    assert!(
        lowest >= 1,
        "the revision went to zero while its pods served a burst"
    );
    assert!(
        c.replicas("side-00001").await >= 2,
        "6 at a time at containerConcurrency 2 wants more than one pod"
    );
    assert!(
        kubelet.peak.load(std::sync::atomic::Ordering::SeqCst) <= 2,
        "a user container saw more than containerConcurrency"
    );

    // Idle: back to the activator, then zero.
    until(LONG, "scale to zero", || async {
        (c.replicas("side-00001").await == 0).then_some(())
    })
    .await;
    // The kubelet's next round records it.
    until(
        LONG,
        "the kubelet's record of the scale to zero",
        || async {
            kubelet
                .timeline()
                .iter()
                .any(|(_, s)| *s == Seen::Scale("side-00001".into(), 0))
                .then_some(())
        },
    )
    .await;
    let timeline = kubelet.timeline();
    let zero_at = timeline
        .iter()
        .rposition(|(_, s)| *s == Seen::Scale("side-00001".into(), 0))
        .unwrap();
    assert!(
        timeline[..zero_at]
            .iter()
            .any(|(_, s)| *s == Seen::Public("side-00001".into(), vec![act])),
        "the public endpoints went back to the activator before zero: {timeline:?}"
    );
}

/// The route check and the gateways' trust (SECURITY.md, "Tenancy"): a request reaches a
/// revision only through a host of a Route of its namespace that routes it (cluster-local
/// short names included), a revision no Route routes is 404, a just-unrouted one is served
/// for `routing-grace` and refused after it (the last good grace kept through a bad edit), and
/// Knative's routing headers are believed from config-istio's gateway endpoints alone, a new
/// one trusted without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_reach_only_what_their_hosts_route_and_gateways_are_trusted_live() {
    let c = Cluster::start(serde_json::json!({})).await;
    c.config_map(
        "config-activator",
        serde_json::json!({"routing-grace": "5s"}),
    )
    .await;
    let act = SocketAddr::from(([127, 0, 0, 1], free_port()));
    c.activator_service(&[act]).await;
    let warm = serde_json::json!({"autoscaling.knative.dev/min-scale": "1"});
    c.revision("hello-00001", 0, warm.clone()).await;
    c.revision("other-00001", 0, warm).await;
    c.unrouted_revision(
        "reserve-00001",
        0,
        serde_json::json!({"autoscaling.knative.dev/initial-scale": "0"}),
    )
    .await;
    // team-a's Route, naming a revision called as team-b's (this rig's namespace) is.
    c.route("team-a", "web", &["hello-00001"]).await;
    let pod = PodKind::default();
    let _kubelet = Kubelet::start(
        c.client.clone(),
        vec![("hello-00001".into(), pod), ("other-00001".into(), pod)],
    );
    let (s1, a1, aa) = (free_port(), free_port(), free_port());
    let _as1 = autoscaler(&c, "autoscaler-1", s1, a1);
    let activator = activator(&c, "activator-1", act, aa).await;
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
    let hello = format!("hello-00001.{NS}.svc.cluster.local");
    let named = |rev| Some((NS, rev));

    // Cluster-local short names are the Route's hosts too.
    for host in [format!("hello-00001.{NS}"), format!("hello-00001.{NS}.svc")] {
        let (status, _, body) = get_as(&client, act, &host, named("hello-00001"), "/").await;
        assert_eq!(status, 200, "{host}: {body}");
    }
    // team-a's host with team-b's revision named: 404 from a trusted peer, without detail.
    let (status, _, body) = get_as(
        &client,
        act,
        "web.team-a.svc.cluster.local",
        named("hello-00001"),
        "/",
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert!(!body.contains("hello") && !body.contains(NS), "{body}");
    // A revision no Route routes: neither named through another route's host nor by its own.
    let (status, _, body) = get_as(&client, act, &hello, named("reserve-00001"), "/").await;
    assert_eq!(status, 404, "{body}");
    let reserve = format!("reserve-00001.{NS}.svc.cluster.local");
    assert_eq!(get_as(&client, act, &reserve, None, "/").await.0, 404);
    // hello's host naming other: refused from the gateway (127.0.0.1) ...
    assert_eq!(
        get_as(&client, act, &hello, named("other-00001"), "/")
            .await
            .0,
        404
    );
    // ... and from a peer that is no gateway the headers are ignored: the host routes.
    let stranger = http_from([127, 0, 0, 2].into());
    let (status, _, body) = get_as(&stranger, act, &hello, named("other-00001"), "/").await;
    assert_eq!(status, 200, "{body}");
    // Published as a gateway endpoint, the same peer is believed without a restart.
    c.gateways_at(&[[127, 0, 0, 1].into(), [127, 0, 0, 2].into()])
        .await;
    until(LONG, "the new gateway endpoint trusted", || async {
        (get_as(&stranger, act, &hello, named("other-00001"), "/")
            .await
            .0
            == 404)
            .then_some(())
    })
    .await;
    let refused = metric(
        &get_text(admin_addr(aa), "/metrics").await,
        "thaw_activator_route_refused_total",
        &[],
    );
    assert!(refused >= 4.0, "refusals counted: {refused}");

    // A bad routing-grace is rejected naming the key; the last good one (5 s) stays.
    c.config_map(
        "config-activator",
        serde_json::json!({"routing-grace": "soon"}),
    )
    .await;
    until(LONG, "the bad routing-grace rejected", || async {
        let text = get_text(admin_addr(aa), "/metrics").await;
        let rejected = metric(
            &text,
            "thaw_config_reload_rejected_total",
            &["config-activator"],
        );
        (rejected >= 1.0).then_some(())
    })
    .await;
    let logs = activator.logs();
    assert!(
        logs.lines()
            .any(|l| l.contains("rejected") && l.contains("routing-grace") && l.contains("soon")),
        "the rejection names the key and the value:\n{logs}"
    );
    // hello's Route moves to other: once the activator sees it (other is served through
    // hello's host), hello is still served within the grace, and refused after it.
    c.route(NS, "hello-00001", &["other-00001"]).await;
    until(LONG, "the route change seen", || async {
        (get_as(&client, act, &hello, named("other-00001"), "/")
            .await
            .0
            == 200)
            .then_some(())
    })
    .await;
    let moved = Instant::now();
    let (status, _, body) = get_as(&client, act, &hello, named("hello-00001"), "/").await;
    assert_eq!(status, 200, "within the grace: {body}");
    until(LONG, "hello refused after the grace", || async {
        (get_as(&client, act, &hello, named("hello-00001"), "/")
            .await
            .0
            == 404)
            .then_some(())
    })
    .await;
    assert!(
        moved.elapsed() < Duration::from_secs(30),
        "the 5 s grace, not the 60 s default"
    );
}
