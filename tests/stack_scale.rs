//! Not a check but a measurement (docs/benchmarks.md, "The whole stack: 10,000 Services in 500
//! namespaces"): two `thaw controller` replicas, a `thaw autoscaler` and a `thaw activator`,
//! each a real process reaching the in-process API server through its own counting proxy
//! (`scale_support::CountingProxy`), at Knative's default settings (Lease timings 60/40/10 s,
//! stable window 60 s, scale-to-zero grace 30 s, initial scale 1); the test plays the
//! Deployment controller, the kubelet and the endpoints controller (pods are API objects at
//! their own loopback address, one shared server answering their stats pulls and probes:
//! `scale_support::Kubelet`, `scale_support::PodServer`) and the ingress gateway (answering
//! the controller's probes).
//!
//! It creates `THAW_SCALE_SERVICES` Knative Services (default 10,000) spread over
//! `THAW_SCALE_NAMESPACES` namespaces (default 500), then prints:
//! - the time from the first create to every Service `Ready`, and each role's CPU time, peak
//!   RSS (`VmHWM`) and API calls by verb over that time;
//! - the time until the cluster settles (every revision scaled to zero by the autoscaler, no
//!   role writing for 30 s: Lease renewals apart, as everywhere below), then over `THAW_SCALE_STEADY_SECS` (default 120) of steady
//!   state each role's API calls per minute by verb (writes counted separately), CPU share
//!   and RSS (`VmRSS`);
//! - a leader change of the controller: the leader is sent SIGTERM (it releases the Lease);
//!   the time until the standby leads and until its `/metrics` count a reconcile of every
//!   Service, Configuration, Route and Revision, and the API calls it made meanwhile.
//!
//! It fails (after printing everything) when a Service is not Ready within
//! `THAW_SCALE_READY_MAX_SECS` (default 3600), when a role writes in steady state, when the
//! new leader writes while it resumes, or when it does not resume within the same bound.
//!
//! `cargo test --release --test stack_scale -- --ignored --nocapture`
//! (`THAW_SCALE_SERVICES=200 THAW_SCALE_NAMESPACES=10` for a quick run).

mod kube_support;
mod scale_support;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use scale_support::{
    CallCounts, Kubelet, PodServer, ProcStats, RoleProc, by_verb, diff, lease_writes, metric,
    render, writes,
};
use thaw::knative::Service;
use tokio::time::Instant;

const SYSTEM: &str = "thaw-system";
/// The kinds the controller reconciles once each per Service (one revision each).
const KINDS: [&str; 4] = ["Service", "Configuration", "Route", "Revision"];
/// No role may write for this long before the steady window starts.
const QUIET: Duration = Duration::from_secs(30);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.trim()
                .replace(['_', ','], "")
                .parse()
                .unwrap_or_else(|_| panic!("{name}={v:?}: expected a whole number"))
        })
        .unwrap_or(default)
}

fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Knative's helloworld-go Service, as `tests/controller_scale.rs` creates them.
fn service(ns: &str, name: &str) -> Service {
    obj(serde_json::json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"template": {
            "metadata": {"annotations": {"autoscaling.knative.dev/target": "10"}},
            "spec": {"containerConcurrency": 10, "containers": [{
                "image": "ghcr.io/knative/helloworld-go:latest",
                "ports": [{"containerPort": 8080}],
                "env": [{"name": "TARGET", "value": name}]
            }]}
        }}
    }))
}

/// Waits (each 200 ms, at most `within`) for `f` to hold; panics naming `what`.
async fn until<F, Fut>(within: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn leading(role: &RoleProc) -> bool {
    role.get("/leader").await.contains("\"leading\":true")
}

/// Services Ready now, followed through a watch (straight to the server, not counted).
fn follow_ready(client: kube::Client) -> (Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let ready = Arc::new(AtomicUsize::new(0));
    let r = ready.clone();
    let task = tokio::spawn(async move {
        let api: Api<Service> = Api::all(client);
        let mut seen: HashMap<String, bool> = HashMap::new();
        let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
        let is_ready = |s: &Service| s.status.as_ref().is_some_and(|s| s.status.is_true("Ready"));
        while let Some(ev) = stream.next().await {
            let Ok(ev) = ev else { continue };
            match ev {
                watcher::Event::Apply(s) | watcher::Event::InitApply(s) => {
                    let key = format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any());
                    seen.insert(key, is_ready(&s));
                }
                watcher::Event::Delete(s) => {
                    let key = format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any());
                    seen.remove(&key);
                }
                watcher::Event::Init => seen.clear(),
                watcher::Event::InitDone => {}
            }
            r.store(seen.values().filter(|v| **v).count(), Ordering::Relaxed);
        }
    });
    (ready, task)
}

/// The roles, in the order of the report.
struct Roles {
    all: Vec<Arc<RoleProc>>,
}

impl Roles {
    fn counts(&self) -> BTreeMap<String, CallCounts> {
        self.all
            .iter()
            .map(|r| (r.name.clone(), r.proxy.counts()))
            .collect()
    }

    fn stats(&self) -> BTreeMap<String, ProcStats> {
        self.all
            .iter()
            .map(|r| (r.name.clone(), r.stats()))
            .collect()
    }

    fn total_writes(&self) -> u64 {
        self.all.iter().map(|r| writes(&r.proxy.counts())).sum()
    }

    /// One progress line: each role's RSS and CPU.
    fn line(&self) -> String {
        self.all
            .iter()
            .map(|r| {
                let s = r.stats();
                format!("{} {:.0} MiB {:.0} s", r.name, s.rss_mib, s.cpu)
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn tails(&self) -> String {
        self.all
            .iter()
            .map(|r| format!("--- {} (last 30 lines)\n{}", r.name, r.tail(30)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `counts` summed by verb: `get 12, list 3`.
fn totals(counts: &CallCounts) -> String {
    let v = by_verb(counts);
    if v.is_empty() {
        return "none".into();
    }
    v.iter()
        .map(|(verb, n)| format!("{verb} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn per_minute(counts: &CallCounts, over: Duration) -> String {
    let mins = over.as_secs_f64() / 60.0;
    let v = by_verb(counts);
    if v.is_empty() {
        return "none".into();
    }
    v.iter()
        .map(|(verb, n)| format!("{verb} {:.1}", *n as f64 / mins))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reconciles of each of [`KINDS`] counted on a controller's `/metrics`.
async fn reconciles(role: &RoleProc) -> BTreeMap<&'static str, f64> {
    let text = role.get("/metrics").await;
    KINDS
        .iter()
        .map(|k| {
            (
                *k,
                metric(
                    &text,
                    "thaw_controller_reconcile_total",
                    &[&format!("kind=\"{k}\"")],
                ),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --release --ignored --nocapture"]
async fn services_in_namespaces_whole_stack() {
    let n_services = env_u64("THAW_SCALE_SERVICES", 10_000) as usize;
    let n_namespaces = (env_u64("THAW_SCALE_NAMESPACES", 500) as usize).max(1);
    let steady_for = Duration::from_secs(env_u64("THAW_SCALE_STEADY_SECS", 120));
    let bound = Duration::from_secs(env_u64("THAW_SCALE_READY_MAX_SECS", 3600));
    let mut failures: Vec<String> = Vec::new();

    let api = kube_support::TestApi::start().await;
    let client = api.client();
    let dir = tempfile::tempdir().unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), SYSTEM);
    let ns_api: Api<Namespace> = Api::all(client.clone());
    ns_api
        .create(
            &PostParams::default(),
            &obj(serde_json::json!({"metadata": {"name": SYSTEM}})),
        )
        .await
        .unwrap();
    // Knative's defaults everywhere; the sidecar's image named so the controller need not read
    // its own Pod.
    cms.create(
        &PostParams::default(),
        &obj(
            serde_json::json!({"metadata": {"name": "config-deployment"},
            "data": {"queue-sidecar-image": "ghcr.io/thaw-dev/thaw:scale"}}),
        ),
    )
    .await
    .unwrap();
    // config-istio's default gateways, answering the controller's probes.
    let gateway = kube_support::gateway::default_gateways(&client).await;
    let pods = PodServer::start().await;
    let net = 100 + (std::process::id() % 150) as u8;
    let kubelet = Kubelet::start(client.clone(), net, &pods, 16);
    let (ready, ready_task) = follow_ready(client.clone());

    // The roles, each on its own ports.
    let activator_data = free_addr();
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), SYSTEM);
    slices
        .create(
            &PostParams::default(),
            &obj(serde_json::json!({
                "metadata": {"name": "activator-service-1",
                    "labels": {"kubernetes.io/service-name": "activator-service"}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": activator_data.port(), "protocol": "TCP"}],
                "endpoints": [{"addresses": [activator_data.ip().to_string()],
                    "conditions": {"ready": true}}],
            })),
        )
        .await
        .unwrap();
    let start_role = |name: &'static str, args: Vec<String>, admin: SocketAddr| {
        let (api_addr, dir) = (api.addr(), dir.path().to_path_buf());
        async move { Arc::new(RoleProc::start(api_addr, &dir, name, admin, &args, SYSTEM).await) }
    };
    let controller_args = |name: &str, admin: SocketAddr| {
        vec![
            "controller".to_string(),
            format!("--system-namespace={SYSTEM}"),
            format!("--admin-listen={admin}"),
            format!("--name={name}"),
        ]
    };
    let a = free_addr();
    let ctl1 = start_role("controller-1", controller_args("controller-1", a), a).await;
    until(Duration::from_secs(60), "controller-1 leading", || {
        leading(&ctl1)
    })
    .await;
    let a = free_addr();
    let ctl2 = start_role("controller-2", controller_args("controller-2", a), a).await;
    until(Duration::from_secs(60), "controller-2 ready", || async {
        ctl2.get("/readyz").await.starts_with("ok")
    })
    .await;
    let (a, stats) = (free_addr(), free_addr());
    let autoscaler = start_role(
        "autoscaler",
        vec![
            "autoscaler".into(),
            format!("--system-namespace={SYSTEM}"),
            format!("--stats-listen={stats}"),
            format!("--stats-advertise={stats}"),
            format!("--admin-listen={a}"),
        ],
        a,
    )
    .await;
    until(Duration::from_secs(60), "the autoscaler leading", || {
        leading(&autoscaler)
    })
    .await;
    let a = free_addr();
    let activator = start_role(
        "activator",
        vec![
            "activator".into(),
            format!("--system-namespace={SYSTEM}"),
            format!("--listen={activator_data}"),
            format!("--admin-listen={a}"),
            "--name=activator".into(),
        ],
        a,
    )
    .await;
    until(Duration::from_secs(60), "the activator ready", || async {
        activator.get("/readyz").await.starts_with("ok")
    })
    .await;
    let roles = Arc::new(Roles {
        all: vec![
            ctl1.clone(),
            ctl2.clone(),
            autoscaler.clone(),
            activator.clone(),
        ],
    });
    println!(
        "stack up: {n_services} Services in {n_namespaces} namespaces to create; roles: {}",
        roles.line()
    );

    // Progress, each 15 s.
    let progress = {
        let (roles, ready, alive) = (roles.clone(), ready.clone(), kubelet.pods_alive.clone());
        let started = Instant::now();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(15)).await;
                println!(
                    "{:>6.0} s: {} Ready, {} pods; {}; test process {:.0} MiB",
                    started.elapsed().as_secs_f64(),
                    ready.load(Ordering::Relaxed),
                    alive.load(Ordering::Relaxed),
                    roles.line(),
                    scale_support::status_mib(std::process::id(), "VmRSS"),
                );
            }
        })
    };

    // 1. From nothing to every Service Ready.
    let test_cpu0 = scale_support::cpu_seconds(std::process::id());
    let counts0 = roles.counts();
    let stats0 = roles.stats();
    let started = Instant::now();
    let namespaces: Vec<String> = (0..n_namespaces).map(|i| format!("scale-{i:03}")).collect();
    futures::stream::iter(namespaces.clone())
        .map(|ns| {
            let api = ns_api.clone();
            async move {
                api.create(
                    &PostParams::default(),
                    &obj(serde_json::json!({"metadata": {"name": ns}})),
                )
                .await
                .map(|_| ())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .unwrap();
    futures::stream::iter(0..n_services)
        .map(|i| {
            let ns = &namespaces[i % n_namespaces];
            let api: Api<Service> = Api::namespaced(client.clone(), ns);
            let svc = service(ns, &format!("hello-{i}"));
            async move { api.create(&PostParams::default(), &svc).await.map(|_| ()) }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await
        .unwrap();
    let created = started.elapsed();
    println!(
        "{:>6.1} s: {n_services} Services created",
        created.as_secs_f64()
    );
    let deadline = started + bound;
    while ready.load(Ordering::Relaxed) < n_services && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let to_ready = started.elapsed();
    let ready_at_bound = ready.load(Ordering::Relaxed);
    let counts1 = roles.counts();
    let stats1 = roles.stats();
    let test_cpu1 = scale_support::cpu_seconds(std::process::id());
    let test_pid = std::process::id();
    println!();
    if ready_at_bound == n_services {
        println!(
            "== {n_services} Services in {n_namespaces} namespaces: created in {:.1} s, all Ready \
             after {:.1} s",
            created.as_secs_f64(),
            to_ready.as_secs_f64()
        );
    } else {
        println!(
            "== {n_services} Services in {n_namespaces} namespaces: created in {:.1} s, {ready_at_bound} \
             Ready after {:.1} s (the bound)",
            created.as_secs_f64(),
            to_ready.as_secs_f64()
        );
    }
    println!(
        "| role | CPU | peak RSS (VmHWM) | RSS now (VmRSS) | API calls | writes (Lease renewals apart) |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for r in &roles.all {
        let n = &r.name;
        let during = diff(&counts0[n], &counts1[n]);
        println!(
            "| {n} | {:.1} s | {:.0} MiB | {:.0} MiB | {} | {} |",
            stats1[n].cpu - stats0[n].cpu,
            stats1[n].hwm_mib,
            stats1[n].rss_mib,
            totals(&during),
            writes(&during),
        );
    }
    println!(
        "| test process (API server double, kubelet, gateway) | {:.1} s | {:.0} MiB | {:.0} MiB | | |",
        test_cpu1 - test_cpu0,
        scale_support::status_mib(test_pid, "VmHWM"),
        scale_support::status_mib(test_pid, "VmRSS"),
    );
    println!(
        "   pods made by the test's kubelet: {}, its writes: {}",
        kubelet.pods_made.load(Ordering::Relaxed),
        kubelet.writes.load(Ordering::Relaxed),
    );
    println!("controller-1's reconciles (kind, result: count; mean duration by kind):");
    let text = ctl1.get("/metrics").await;
    for l in text.lines().filter(|l| {
        l.starts_with("thaw_controller_reconcile_total{")
            || l.starts_with("thaw_controller_reconcile_duration_seconds_sum")
            || l.starts_with("thaw_controller_reconcile_duration_seconds_count")
    }) {
        println!("      {l}");
    }
    for r in &roles.all {
        let n = &r.name;
        println!(
            "{n}: API calls from the first create to {} ({} writes):\n{}",
            if ready_at_bound == n_services {
                "all Ready"
            } else {
                "the bound"
            },
            writes(&diff(&counts0[n], &counts1[n])),
            render(&diff(&counts0[n], &counts1[n]))
        );
    }
    assert!(
        ready_at_bound == n_services,
        "only {ready_at_bound} of {n_services} Ready after {bound:?}\n{}",
        roles.tails()
    );

    // 2. Settling: every revision at zero, then no role writing for QUIET.
    let mut last_writes = roles.total_writes();
    let mut quiet_since = Instant::now();
    let deadline = Instant::now() + bound;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let w = roles.total_writes();
        if w != last_writes {
            last_writes = w;
            quiet_since = Instant::now();
        }
        if kubelet.pods_alive.load(Ordering::Relaxed) == 0 && quiet_since.elapsed() >= QUIET {
            break;
        }
        if Instant::now() > deadline {
            failures.push(format!(
                "not settled within {bound:?}: {} pods, last role write {:.0} s ago",
                kubelet.pods_alive.load(Ordering::Relaxed),
                quiet_since.elapsed().as_secs_f64()
            ));
            break;
        }
    }
    let settled = started.elapsed();
    let counts2 = roles.counts();
    let stats2 = roles.stats();
    println!();
    println!(
        "{:>6.1} s: settled (every revision at zero, no role writing for {} s)",
        settled.as_secs_f64(),
        QUIET.as_secs()
    );
    for r in &roles.all {
        let n = &r.name;
        println!(
            "{n}: API calls while settling ({} writes):\n{}",
            writes(&diff(&counts1[n], &counts2[n])),
            render(&diff(&counts1[n], &counts2[n]))
        );
    }

    // 3. Steady state.
    let pulls2 = pods.pulls.load(Ordering::Relaxed);
    let test_cpu2 = scale_support::cpu_seconds(std::process::id());
    let steady_start = Instant::now();
    tokio::time::sleep(steady_for).await;
    let steady = steady_start.elapsed();
    let counts3 = roles.counts();
    let stats3 = roles.stats();
    let pulls3 = pods.pulls.load(Ordering::Relaxed);
    let test_cpu3 = scale_support::cpu_seconds(std::process::id());
    let ready_steady = ready.load(Ordering::Relaxed);
    println!();
    println!(
        "== steady state, {:.0} s ({ready_steady} Services Ready; stats pulls answered: {})",
        steady.as_secs_f64(),
        pulls3 - pulls2
    );
    println!(
        "| role | peak RSS (VmHWM) | steady RSS (VmRSS) | steady CPU | steady API calls/min | steady writes (Lease renewals apart) |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    let mut steady_writes = 0;
    for r in &roles.all {
        let n = &r.name;
        let during = diff(&counts2[n], &counts3[n]);
        let w = writes(&during);
        steady_writes += w;
        println!(
            "| {n} | {:.0} MiB | {:.0} MiB | {:.1} % | {} | {w} ({} Lease) |",
            stats2[n].hwm_mib.max(stats3[n].hwm_mib),
            stats3[n].rss_mib,
            100.0 * (stats3[n].cpu - stats2[n].cpu) / steady.as_secs_f64(),
            per_minute(&during, steady),
            lease_writes(&during),
        );
    }
    println!(
        "| test process (API server double, kubelet, gateway) | {:.0} MiB | {:.0} MiB | {:.1} % | | |",
        scale_support::status_mib(test_pid, "VmHWM"),
        scale_support::status_mib(test_pid, "VmRSS"),
        100.0 * (test_cpu3 - test_cpu2) / steady.as_secs_f64(),
    );
    for r in &roles.all {
        let n = &r.name;
        println!(
            "{n}: API calls in the steady {:.0} s:\n{}",
            steady.as_secs_f64(),
            render(&diff(&counts2[n], &counts3[n]))
        );
    }

    // 4. A leader change of the controller.
    let base = reconciles(&ctl2).await;
    let ctl2_counts0 = ctl2.proxy.counts();
    let ctl2_stats0 = ctl2.stats();
    let term = Instant::now();
    ctl1.sigterm();
    let mut led_after = None;
    let mut resumed_after = None;
    let mut last_print = Instant::now();
    let deadline = term + bound;
    while Instant::now() < deadline {
        if led_after.is_none() && leading(&ctl2).await {
            led_after = Some(term.elapsed());
        }
        if led_after.is_some() {
            let now = reconciles(&ctl2).await;
            let done: Vec<f64> = KINDS.iter().map(|k| now[k] - base[k]).collect();
            if done.iter().all(|d| *d >= n_services as f64) {
                resumed_after = Some(term.elapsed());
                break;
            }
            if last_print.elapsed() > Duration::from_secs(10) {
                println!(
                    "  leader change +{:.0} s: controller-2 reconciled {done:?} of {KINDS:?}",
                    term.elapsed().as_secs_f64()
                );
                last_print = Instant::now();
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ctl2_counts_resumed = ctl2.proxy.counts();
    // Writes a moment later too (a reconcile's write may trail its count).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let takeover_calls = diff(&ctl2_counts0, &ctl2.proxy.counts());
    let takeover_calls_resumed = diff(&ctl2_counts0, &ctl2_counts_resumed);
    let ctl2_stats1 = ctl2.stats();
    let ctl1_exited = ctl1.exited();
    progress.abort();
    ready_task.abort();
    println!();
    println!(
        "== leader change (SIGTERM to controller-1, which {}): controller-2 leads after {}, has \
         reconciled every Service, Configuration, Route and Revision after {}; its RSS {:.0} -> \
         {:.0} MiB (peak {:.0}), CPU {:.1} s; its API calls until then ({} writes):\n{}",
        if ctl1_exited {
            "exited"
        } else {
            "had not exited 10 s later"
        },
        led_after.map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64())),
        resumed_after.map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64())),
        ctl2_stats0.rss_mib,
        ctl2_stats1.rss_mib,
        ctl2_stats1.hwm_mib,
        ctl2_stats1.cpu - ctl2_stats0.cpu,
        writes(&takeover_calls_resumed),
        render(&takeover_calls_resumed),
    );
    println!(
        "   and until 10 s later ({} writes):\n{}",
        writes(&takeover_calls),
        render(&takeover_calls)
    );
    drop(gateway);

    if ready_steady != n_services {
        failures.push(format!(
            "{ready_steady} of {n_services} Services Ready at the end of the steady window"
        ));
    }
    if steady_writes > 0 {
        failures.push(format!(
            "{steady_writes} API writes by the roles in the steady {:.0} s",
            steady.as_secs_f64()
        ));
    }
    if resumed_after.is_none() {
        failures.push(format!(
            "controller-2 did not reconcile everything within {bound:?} of the leader's SIGTERM\n{}",
            ctl2.tail(40)
        ));
    }
    if writes(&takeover_calls) > 0 {
        failures.push(format!(
            "the new leader wrote {} times on a steady cluster",
            writes(&takeover_calls)
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
