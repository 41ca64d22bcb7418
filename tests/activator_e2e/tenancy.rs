//! Issue 47, points 6 and 8 (SECURITY.md, "Tenancy"): an activator guarded by Routes as on
//! Kubernetes, on real sockets. Callers come from distinct loopback addresses: 127.0.0.3 is a
//! gateway endpoint, 127.0.0.6 is the activator's own Istio sidecar (every peer behind it,
//! gateways included), 127.0.0.2 and 127.0.0.1 are pods that are not gateways. Each revision
//! is its own upstream, so what answers tells which revision a request reached.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

use thaw::activator::route_check::{
    CATCH_UP, GatewayIdentities, GatewayPeers, GroupInput, RouteBook, RouteGuard, RouteInput,
};
use thaw::config::ActivatorConfig;
use thaw::revision::{RevisionKey, RevisionSpec};

use crate::harness::*;

const GATEWAY: [u8; 4] = [127, 0, 0, 3];
const SIDECAR: [u8; 4] = [127, 0, 0, 6];
const POD: [u8; 4] = [127, 0, 0, 2];

/// The element Istio's sidecar appends for a peer with the SPIFFE id `ns/{ns}/sa/{sa}`
/// (Envoy's `APPEND_FORWARD` with Subject, URI and DNS; an Istio workload certificate).
fn xfcc(ns: &str, sa: &str) -> String {
    format!(
        "By=spiffe://cluster.local/ns/thaw-system/sa/activator;\
         Hash=9a0f6e4b7d1c2e3f4a5b6c7d8e9f00112233445566778899aabbccddeeff0011;Subject=\"\";\
         URI=spiffe://cluster.local/ns/{ns}/sa/{sa}"
    )
}

/// The default Istio ingress gateway's identity.
fn gateway_xfcc() -> String {
    xfcc("istio-system", "istio-ingressgateway-service-account")
}

/// A Route with its default group over `hosts` drawing from `split`, and tag groups
/// `(tag, hosts, revision)`.
fn route(
    ns: &str,
    name: &str,
    hosts: &[&str],
    split: &[(&str, u32)],
    tags: &[(&str, &[&str], &str)],
) -> RouteInput {
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut groups = vec![GroupInput {
        tag: None,
        hosts: strings(hosts),
        split: split.iter().map(|(r, p)| (r.to_string(), *p)).collect(),
    }];
    let mut revisions: Vec<String> = split.iter().map(|(r, _)| r.to_string()).collect();
    for (tag, hosts, rev) in tags {
        groups.push(GroupInput {
            tag: Some(tag.to_string()),
            hosts: strings(hosts),
            split: vec![(rev.to_string(), 100)],
        });
        revisions.push(rev.to_string());
    }
    RouteInput {
        namespace: ns.into(),
        name: name.into(),
        groups,
        revisions,
    }
}

/// The cluster-local names of route `name` in `ns` (as the Route reconciler builds them).
fn local(name: &str, ns: &str) -> [String; 3] {
    [
        format!("{name}.{ns}"),
        format!("{name}.{ns}.svc"),
        format!("{name}.{ns}.svc.cluster.local"),
    ]
}

/// An activator guarded by Routes, with an upstream per revision.
struct Tenancy {
    h: Harness,
    /// Upstream address -> `namespace/name` of the revision it serves.
    by_addr: HashMap<SocketAddr, String>,
    _ups: Vec<Upstream>,
    routes: Arc<RouteBook>,
}

/// Revisions in the catalog: team-a's web-1, web-2, shop-1, shop-2, reserve-1 (no Route routes
/// it) and team-b's db-1. Routes: team-a/web (web-1 100 %, tag `next` on web-2), team-a/shop
/// (shop-1 and shop-2 at 50 % each), team-b/db (db-1), team-a/lost (names lost-1, which the
/// catalog does not hold).
async fn start(seats: u32) -> Tenancy {
    let _ = thaw::activator::raise_nofile_limit();
    let names = [
        ("team-a", "web-1"),
        ("team-a", "web-2"),
        ("team-a", "shop-1"),
        ("team-a", "shop-2"),
        ("team-a", "reserve-1"),
        ("team-b", "db-1"),
    ];
    let specs: Vec<RevisionSpec> = names
        .iter()
        .map(|(ns, n)| {
            let mut s = RevisionSpec::test(ns, n);
            // Each revision's own names, as on Kubernetes: not a Route's hosts.
            s.hosts = local(n, ns).to_vec();
            s
        })
        .collect();
    let h = Harness::start(specs, ActivatorConfig::default()).await;
    let mut ups = Vec::new();
    let mut by_addr = HashMap::new();
    for (ns, n) in names {
        let up = Upstream::start().await;
        h.endpoints
            .set_ready(&RevisionKey::new(ns, n), vec![up.addr]);
        by_addr.insert(up.addr, format!("{ns}/{n}"));
        ups.push(up);
    }
    let guard = RouteGuard {
        routes: RouteBook::new(),
        gateways: GatewayPeers::new(),
        identities: GatewayIdentities::new(),
        catch_up_seats: seats,
    };
    guard.gateways.set([IpAddr::from(GATEWAY)]);
    guard.identities.set([(
        "istio-system".to_string(),
        "istio-ingressgateway-service-account".to_string(),
    )]);
    let now = Instant::now();
    let grace = Duration::from_secs(60);
    let web_hosts = local("web", "team-a");
    let mut web: Vec<&str> = web_hosts.iter().map(String::as_str).collect();
    web.push("web.team-a.example.com");
    let next = local("next-web", "team-a");
    let next: Vec<&str> = next.iter().map(String::as_str).collect();
    let shop = local("shop", "team-a");
    let shop: Vec<&str> = shop.iter().map(String::as_str).collect();
    let db = local("db", "team-b");
    let db: Vec<&str> = db.iter().map(String::as_str).collect();
    let routes = guard.routes.clone();
    routes.replace_all(
        vec![
            route(
                "team-a",
                "web",
                &web,
                &[("web-1", 100)],
                &[("next", &next, "web-2")],
            ),
            route(
                "team-a",
                "shop",
                &shop,
                &[("shop-1", 50), ("shop-2", 50)],
                &[],
            ),
            route("team-b", "db", &db, &[("db-1", 100)], &[]),
            route("team-a", "lost", &["lost.team-a"], &[("lost-1", 100)], &[]),
        ],
        now,
        grace,
    );
    h.activator.guard_routes(guard);
    Tenancy {
        h,
        by_addr,
        _ups: ups,
        routes,
    }
}

/// A client whose connections come from `source`.
fn client_from(source: [u8; 4]) -> Client<HttpConnector, TestBody> {
    let mut c = HttpConnector::new();
    c.set_local_address(Some(IpAddr::from(source)));
    Client::builder(TokioExecutor::new()).build(c)
}

impl Tenancy {
    /// GET `path` with `Host: host` and `headers`, from `source`: status and body.
    async fn get(
        &self,
        source: [u8; 4],
        host: &str,
        headers: &[(&str, &str)],
        path: &str,
    ) -> (u16, String) {
        let mut req = Request::get(format!("http://{}{path}", self.h.data)).header("host", host);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let (status, _, body) = send(&client_from(source), req.body(full("")).unwrap()).await;
        (status.as_u16(), body)
    }

    /// Which revision answered `GET /` (`namespace/name`), or the status and body when none
    /// did.
    async fn reached(&self, source: [u8; 4], host: &str, headers: &[(&str, &str)]) -> String {
        let (status, body) = self.get(source, host, headers, "/").await;
        body.strip_prefix("hello from ")
            .and_then(|a| a.parse::<SocketAddr>().ok())
            .and_then(|a| self.by_addr.get(&a).cloned())
            .unwrap_or_else(|| format!("{status}: {body}"))
    }
}

/// Knative's routing headers naming `namespace/name`.
fn named<'a>(namespace: &'a str, name: &'a str) -> [(&'a str, &'a str); 2] {
    [
        ("knative-serving-namespace", namespace),
        ("knative-serving-revision", name),
    ]
}

/// A 404's body without its request id: what a client can compare.
fn without_id(body: &str) -> String {
    body.split(" (request id ")
        .next()
        .unwrap_or(body)
        .to_string()
}

/// Point 8: behind the activator's sidecar, a gateway (its identity in the sidecar's
/// `X-Forwarded-Client-Cert`) keeps the revision its headers chose, even one the host's split
/// would not draw; the split is not drawn again. Its choice still passes the route check, and
/// the sidecar's header goes on to the revision.
#[tokio::test]
async fn a_gateway_through_the_sidecar_keeps_its_choice() {
    let t = start(100).await;
    let gw = gateway_xfcc();
    let mut with_gw = named("team-a", "web-2").to_vec();
    with_gw.push(("x-forwarded-client-cert", &gw));
    for _ in 0..5 {
        assert_eq!(
            t.reached(SIDECAR, "web.team-a.example.com", &with_gw).await,
            "team-a/web-2"
        );
    }
    // The same headers without the identity: the host's Route routes (web-1 at 100 %).
    assert_eq!(
        t.reached(SIDECAR, "web.team-a.example.com", &named("team-a", "web-2"))
            .await,
        "team-a/web-1"
    );
    // A gateway endpoint's address, without a sidecar: believed as before.
    assert_eq!(
        t.reached(GATEWAY, "web.team-a", &named("team-a", "web-2"))
            .await,
        "team-a/web-2"
    );
    // The sidecar's identity goes on to the revision, as the sidecar wrote it.
    let (status, body) = t
        .get(SIDECAR, "web.team-a.example.com", &with_gw, "/headers")
        .await;
    assert_eq!(status, 200, "{body}");
    let seen: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(seen["x-forwarded-client-cert"], gw.as_str());
    // A gateway's choice still passes the route check: team-a's host cannot name team-b's.
    let mut cross = named("team-b", "db-1").to_vec();
    cross.push(("x-forwarded-client-cert", &gw));
    let (status, _) = t.get(SIDECAR, "web.team-a.example.com", &cross, "/").await;
    assert_eq!(status, 404);
}

/// Point 8: behind the sidecar, a pod that is no gateway (its own identity in the header) is
/// routed by its host: the Route's split, a tag's host its tag's revision, another
/// namespace's Route's host that Route's revision; the headers it sent are ignored.
#[tokio::test]
async fn a_pod_through_the_sidecar_is_routed_by_host() {
    let t = start(100).await;
    let pod = xfcc("team-c", "default");
    let mut headers = named("team-a", "web-2").to_vec();
    headers.push(("x-forwarded-client-cert", &pod));
    assert_eq!(
        t.reached(SIDECAR, "web.team-a.svc.cluster.local", &headers)
            .await,
        "team-a/web-1"
    );
    assert_eq!(
        t.reached(SIDECAR, "next-web.team-a.svc:80", &headers).await,
        "team-a/web-2",
        "a tag's host"
    );
    assert_eq!(
        t.reached(SIDECAR, "db.team-b", &headers).await,
        "team-b/db-1",
        "each host reaches its own Route's revisions"
    );
    let mut drawn: HashMap<String, u32> = HashMap::new();
    for _ in 0..200 {
        let rev = t
            .reached(
                SIDECAR,
                "shop.team-a.svc.cluster.local",
                &[("x-forwarded-client-cert", &pod)],
            )
            .await;
        *drawn.entry(rev).or_default() += 1;
    }
    // 50/50 over 200 draws: each side well above 40 unless the split is not drawn.
    assert_eq!(drawn.len(), 2, "{drawn:?}");
    assert!(drawn.values().all(|n| *n > 40), "{drawn:?}");
}

/// Point 8: `X-Forwarded-Client-Cert` is believed only from the activator's own sidecar, as
/// its last element, sent once. A pod sending the gateway's identity itself is routed by host
/// and its header removed; behind the sidecar, a prefix shaped to swallow the sidecar's
/// element, or a second field, makes nobody a gateway.
#[tokio::test]
async fn a_client_sent_client_cert_is_ignored() {
    let t = start(100).await;
    let gw = gateway_xfcc();
    let mut forged = named("team-a", "web-2").to_vec();
    forged.push(("x-forwarded-client-cert", &gw));
    assert_eq!(
        t.reached(POD, "web.team-a", &forged).await,
        "team-a/web-1",
        "the gateway's identity from a pod's own address"
    );
    let (status, body) = t.get(POD, "web.team-a", &forged, "/headers").await;
    assert_eq!(status, 200, "{body}");
    let seen: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(seen.get("x-forwarded-client-cert").is_none(), "{body}");
    // Behind the sidecar: what the client sent comes first, the sidecar's element last.
    let pod = xfcc("team-c", "default");
    let claim =
        "URI=spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account";
    for value in [
        format!("{gw},{pod}"),
        format!("{claim};x=\",{pod}"),
        format!("{claim};x=\"\\,{pod}"),
    ] {
        let mut h = named("team-a", "web-2").to_vec();
        h.push(("x-forwarded-client-cert", &value));
        assert_eq!(
            t.reached(SIDECAR, "web.team-a", &h).await,
            "team-a/web-1",
            "{value}"
        );
    }
    let mut twice = named("team-a", "web-2").to_vec();
    twice.push(("x-forwarded-client-cert", &gw));
    twice.push(("x-forwarded-client-cert", &gw));
    assert_eq!(
        t.reached(SIDECAR, "web.team-a", &twice).await,
        "team-a/web-1"
    );
}

/// Point 8: without a sidecar, a pod calling a Route's cluster-local host (as `{route}-mesh`
/// or a plain `curl` does) is routed by that host's Route, with its split; its routing
/// headers are ignored.
#[tokio::test]
async fn without_a_sidecar_a_pod_calling_a_cluster_local_host_is_routed_by_host() {
    let t = start(100).await;
    for host in local("web", "team-a") {
        assert_eq!(t.reached(POD, &host, &[]).await, "team-a/web-1", "{host}");
    }
    assert_eq!(
        t.reached(POD, "WEB.team-a.svc:8080", &named("team-a", "web-2"))
            .await,
        "team-a/web-1"
    );
    assert_eq!(
        t.reached(POD, "next-web.team-a.svc.cluster.local", &[])
            .await,
        "team-a/web-2"
    );
    let mut drawn: HashMap<String, u32> = HashMap::new();
    for _ in 0..200 {
        *drawn
            .entry(t.reached(POD, "shop.team-a", &[]).await)
            .or_default() += 1;
    }
    assert_eq!(drawn.len(), 2, "{drawn:?}");
    assert!(drawn.values().all(|n| *n > 40), "{drawn:?}");
}

/// Point 6: a host no Route has (a revision's own name, whether or not the revision exists),
/// a Route of another namespace, a revision that does not exist, one no Route routes, and a
/// Route naming a revision the catalog lacks all give the same body, and none is answered
/// before the catch-up period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_404_tells_nothing_and_comes_no_sooner_than_the_catch_up() {
    let t = Arc::new(start(100).await);
    type Case = ([u8; 4], &'static str, Option<(&'static str, &'static str)>);
    let cases: [Case; 8] = [
        (POD, "nobody.example.com", None),
        (POD, "web-1.team-a.svc.cluster.local", None),
        (POD, "ghost-1.team-a.svc.cluster.local", None),
        (POD, "lost.team-a", None),
        (GATEWAY, "web.team-a", Some(("team-b", "db-1"))),
        (GATEWAY, "web.team-a", Some(("team-a", "ghost-1"))),
        (GATEWAY, "web.team-a", Some(("team-a", "reserve-1"))),
        (GATEWAY, "nobody.example.com", Some(("team-a", "web-1"))),
    ];
    let tasks: Vec<_> = cases
        .into_iter()
        .map(|(source, host, names)| {
            let t = t.clone();
            tokio::spawn(async move {
                let headers = names.map(|(ns, n)| named(ns, n)).unwrap_or_default();
                let headers: &[(&str, &str)] = if names.is_some() { &headers } else { &[] };
                let started = Instant::now();
                let (status, body) = t.get(source, host, headers, "/").await;
                (host, names, status, body, started.elapsed())
            })
        })
        .collect();
    let mut bodies = Vec::new();
    for task in tasks {
        let (host, names, status, body, took) = task.await.unwrap();
        assert_eq!(status, 404, "{host} {names:?}: {body}");
        assert!(took >= CATCH_UP, "{host} {names:?} answered after {took:?}");
        assert!(body.contains("(request id "), "{body}");
        bodies.push(without_id(&body));
    }
    bodies.dedup();
    assert_eq!(bodies, ["not found"]);
    let m = t.h.metrics().await;
    assert!(
        m.contains("thaw_activator_route_refused_total 8"),
        "each counted: {m}"
    );
    assert!(m.contains("thaw_activator_route_catch_up_waiting 0"), "{m}");
}

/// Point 6: the catch-up holds at most its seats' worth of requests; past them a request is
/// answered the same 404 at once (counted), and requests the Routes place are still served.
/// (A round whose two waiters ended before the third request came, on a stalled machine, is
/// tried again: the test shows the rule, not a speed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catch_up_is_capped() {
    let t = Arc::new(start(2).await);
    let full = |m: &str| {
        m.lines()
            .find_map(|l| l.strip_prefix("thaw_activator_route_catch_up_full_total "))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let mut turned_away = false;
    for _round in 0..5 {
        let waiting: Vec<_> = (0..2)
            .map(|_| {
                let t = t.clone();
                tokio::spawn(async move { t.get(POD, "nobody.example.com", &[], "/").await })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !t
            .h
            .metrics()
            .await
            .contains("thaw_activator_route_catch_up_waiting 2")
        {
            assert!(Instant::now() < deadline, "two requests never waited");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let before = full(&t.h.metrics().await);
        let (status, body) = t.get(POD, "elsewhere.example.com", &[], "/").await;
        assert_eq!(status, 404);
        turned_away = full(&t.h.metrics().await) == before + 1;
        if turned_away {
            // While the seats are full, what the Routes place is served.
            assert_eq!(t.reached(POD, "web.team-a", &[]).await, "team-a/web-1");
        }
        for w in waiting {
            let (s, b) = w.await.unwrap();
            assert_eq!(s, 404);
            assert_eq!(without_id(&b), without_id(&body), "the same body");
        }
        if turned_away {
            break;
        }
    }
    assert!(
        turned_away,
        "a request past the seats was never turned away at once"
    );
    let m = t.h.metrics().await;
    assert!(m.contains("thaw_activator_route_catch_up_waiting 0"), "{m}");
}

/// The catch-up serves what shows up within it: a Route written while the request waits (as
/// the reconciler writes a Route's status just after its VirtualServices), and a revision the
/// catalog learns while a request for the Route naming it waits. (A round whose requests
/// ended before the writes, on a stalled machine, is tried again with new names.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catch_up_serves_a_route_or_revision_seen_a_moment_later() {
    let t = Arc::new(start(100).await);
    let grace = Duration::from_secs(60);
    let mut served = false;
    for round in 0..5 {
        let late = format!("late{round}.team-a");
        let (lost, lost_rev) = (format!("lost{round}.team-a"), format!("lost{round}-1"));
        t.routes.set(
            route(
                "team-a",
                &format!("lost{round}"),
                &[&lost],
                &[(&lost_rev, 100)],
                &[],
            ),
            Instant::now(),
            grace,
        );
        let asks = [late.clone(), lost.clone()].map(|host| {
            let t = t.clone();
            tokio::spawn(async move { t.reached(POD, &host, &[]).await })
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while !t
            .h
            .metrics()
            .await
            .contains("thaw_activator_route_catch_up_waiting 2")
        {
            assert!(Instant::now() < deadline, "the requests never waited");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // While they wait: the Route of the first host, the revision the second's names.
        t.routes.set(
            route(
                "team-a",
                &format!("late{round}"),
                &[&late],
                &[("web-2", 100)],
                &[],
            ),
            Instant::now(),
            grace,
        );
        let up = Upstream::start().await;
        let key = RevisionKey::new("team-a", &lost_rev);
        t.h.endpoints.set_ready(&key, vec![up.addr]);
        t.h.catalog.upsert(RevisionSpec::test("team-a", &lost_rev));
        let [a, b] = asks;
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        if a.starts_with("404") || b.starts_with("404") {
            continue;
        }
        assert_eq!(a, "team-a/web-2");
        assert!(b.starts_with("200: hello from "), "{b}");
        served = true;
        break;
    }
    assert!(
        served,
        "nothing written during the catch-up was ever served"
    );
}
