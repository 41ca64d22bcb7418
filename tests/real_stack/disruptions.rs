//! The disruptions cases of the whole stack on the real control plane (issue 46, items 4 and
//! 7): thaw's roles losing their leader, rolled, and the API server restarted, on a steady
//! cluster and under a steady client, as thaw is installed from deploy/ (2 replicas of each
//! role, Knative's default settings, the Lease timings deploy/ runs with: no `--lease-*` flag,
//! so config-leader-election's, Knative's 60 s lease duration, 40 s renew deadline, 10 s retry
//! period).
//!
//! What a role wrote is counted from the API server's audit log ([`audit`]), not from thaw's
//! own counters; the requests are counted by the client ([`traffic`]) through the ingress
//! gateway pod. Every case runs alone (it disturbs the whole plane). Waits poll a condition
//! with a deadline; the only fixed wait is [`OBSERVE`], the time a new leader is watched
//! for writes after it took over.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use crate::plane_support::harness::{Case, apply};
use crate::plane_support::stack::{role_pod_objects, role_pods, scale_of, service, until};
use crate::plane_support::traffic::{Report, SteadyLoop};
use crate::plane_support::{Plane, audit, checks};

/// This module's cases.
pub fn cases() -> Vec<Case> {
    vec![
        crate::exclusive_case!(leader_changes_write_nothing_on_a_steady_cluster),
        crate::exclusive_case!(rollouts_and_an_api_server_restart_fail_no_request),
    ]
}

const SYSTEM: &str = "thaw-system";
/// The longest any awaited state may take: a Service Ready, a scale to zero (Knative's
/// default 60 s stable window and 30 s scale-to-zero grace period), a rollout.
const WITHIN: Duration = Duration::from_secs(240);
/// A new leader is watched this long after it completed its takeover: three decision rounds
/// (every 2 s) and pod-stats pulls (every second) for anything it would move to show.
const OBSERVE: Duration = Duration::from_secs(6);
/// thaw's roles are steady once neither the autoscaler nor the controller has written
/// anything but its Lease for this long (both act within a 2 s tick of any change).
const QUIET: Duration = Duration::from_secs(6);
/// Each client loop's pause between requests (4 loops: about 40 requests a second through
/// the gateway, which reads the Service and its slices from the API for each).
const PACE: Duration = Duration::from_millis(100);

// === case 4 ===

/// Leader changes on a steady cluster (a Service held at 1 replica by min-scale 1, one at
/// 0) write nothing:
/// - the autoscaler leader's process SIGKILLed (the kubelet restarts its container): the
///   process that leads next makes no `/scale` write and no public-slice write;
/// - the autoscaler leader's pod deleted (SIGTERM, graceful: the Lease is released): the
///   other replica leads and makes no `/scale` write and no public-slice write;
/// - the controller leader's pod deleted: the other replica reconciles every Service,
///   Configuration, Route, Revision and DomainMapping and writes nothing at all.
///
/// The writes are those the API server's audit log shows from the change to the end of
/// [`OBSERVE`] (Leases aside: leading is renewing one); nothing is rescaled either.
async fn leader_changes_write_nothing_on_a_steady_cluster(plane: Arc<Plane>, ns: String) {
    others_gone(&plane, &ns).await;
    println!("{}", lease_timings(&plane).await);
    apply(&plane, &ns, "warm", &service("warm", &[MIN_SCALE_1]))
        .await
        .unwrap();
    apply(&plane, &ns, "idle", &service("idle", &[]))
        .await
        .unwrap();
    for name in ["warm", "idle"] {
        ready_host(&plane, &ns, name).await;
    }
    // A DomainMapping of the warm Service's Route (its domain unclaimed: reconciled to
    // DomainClaimed=False, and steady so).
    apply(
        &plane,
        &ns,
        "mapping",
        &format!(
            "apiVersion: serving.knative.dev/v1beta1\nkind: DomainMapping\nmetadata:\n  name: warm.{ns}.example.org\nspec:\n  ref:\n    apiVersion: serving.knative.dev/v1\n    kind: Route\n    name: warm\n"
        ),
    )
    .await
    .unwrap();
    let began = Instant::now();
    until("idle at zero and warm at one ready pod", WITHIN, || async {
        let idle = revision_pods(&plane, &ns, "idle").await;
        let warm = revision_pods(&plane, &ns, "warm").await;
        (scale_of(&plane, &ns, "idle").await == Some(0)
            && idle.is_empty()
            && scale_of(&plane, &ns, "warm").await == Some(1)
            && warm.len() == 1
            && warm[0].1)
            .then_some(())
    })
    .await;
    until(
        "the autoscaler and the controller quiet",
        WITHIN,
        || async { audit::quiet_for(&plane, &["autoscaler", "controller"], QUIET).then_some(()) },
    )
    .await;
    let steady = scales(&plane, &ns).await;
    println!(
        "steady after {:.1}s: {steady:?}",
        began.elapsed().as_secs_f64()
    );

    // 1. SIGKILL of the leader's process.
    let leader = autoscaler_leader(&plane).await;
    let before = takeovers(&plane);
    let from = audit::now();
    plane
        .kubelet
        .signal(SYSTEM, &leader, "autoscaler", Signal::SIGKILL)
        .unwrap();
    let next = next_takeover(&plane, &before).await;
    tokio::time::sleep(OBSERVE).await;
    let writes = audit::writes(&plane, "autoscaler", from, audit::now());
    // The kubelet restarts the container at once; the new process has the pod's address, the
    // Lease's identity, so it takes the Lease back without waiting out the lease duration.
    println!(
        "autoscaler leader {leader}'s process SIGKILLed (container restarts: {}): the process \
         leading next runs in {next}, Lease holder {}; {writes}",
        restarts(&plane, &leader, "autoscaler").await,
        lease_holder(&plane, "thaw-autoscaler")
            .await
            .unwrap_or_default()
    );
    assert_eq!(
        writes.scale(),
        0,
        "/scale written after the SIGKILL: {writes}"
    );
    assert_eq!(
        writes.slices(),
        0,
        "public slices written after the SIGKILL: {writes}"
    );
    assert_eq!(scales(&plane, &ns).await, steady, "after the SIGKILL");
    rolled_out(&plane, "autoscaler").await;

    // 2. SIGTERM: the leader's pod deleted, gracefully.
    let leader = autoscaler_leader(&plane).await;
    let before = takeovers(&plane);
    let from = audit::now();
    plane
        .kubectl(&["-n", SYSTEM, "delete", "pod", &leader, "--wait=false"])
        .await
        .unwrap();
    let next = next_takeover(&plane, &before).await;
    assert_ne!(next, leader, "a deleted pod cannot lead");
    tokio::time::sleep(OBSERVE).await;
    let writes = audit::writes(&plane, "autoscaler", from, audit::now());
    println!(
        "autoscaler leader pod {leader} deleted (SIGTERM, the Lease released): {next} leads; \
         {writes}"
    );
    assert_eq!(
        writes.scale(),
        0,
        "/scale written after the SIGTERM: {writes}"
    );
    assert_eq!(
        writes.slices(),
        0,
        "public slices written after the SIGTERM: {writes}"
    );
    let log = role_log(&plane, &leader, "autoscaler");
    assert!(
        log.contains("lease released"),
        "{leader} did not release the Lease on SIGTERM:\n{log}"
    );
    assert_eq!(scales(&plane, &ns).await, steady, "after the SIGTERM");
    rolled_out(&plane, "autoscaler").await;

    // 3. The controller's leader pod deleted.
    let leader = lease_holder(&plane, "thaw-controller")
        .await
        .expect("a controller leads");
    let objects = knative_objects(&plane).await;
    let from = audit::now();
    plane
        .kubectl(&["-n", SYSTEM, "delete", "pod", &leader, "--wait=false"])
        .await
        .unwrap();
    let next = until("another controller holding the Lease", WITHIN, || async {
        lease_holder(&plane, "thaw-controller")
            .await
            .filter(|h| *h != leader)
    })
    .await;
    let ip = pod_ip(&plane, &next).await;
    let reconciled = until(
        "the new controller leader reconciling every object",
        WITHIN,
        || async {
            let text = checks::get(SocketAddr::new(ip, 9090), "admin", "/metrics")
                .await
                .ok()?
                .1;
            let done = reconciles(&text);
            objects
                .iter()
                .all(|(kind, n)| done.get(&(kind.clone(), "ok".into())).copied().unwrap_or(0) >= *n)
                .then_some(done)
        },
    )
    .await;
    tokio::time::sleep(OBSERVE).await;
    let writes = audit::writes(&plane, "controller", from, audit::now());
    println!(
        "controller leader pod {leader} deleted: {next} leads; objects {objects:?}; its \
         reconciles {reconciled:?}; {writes}"
    );
    let failed: Vec<_> = reconciled.iter().filter(|((_, r), _)| r != "ok").collect();
    assert!(failed.is_empty(), "reconciles that failed: {failed:?}");
    assert!(
        writes.is_empty(),
        "the controller wrote on a steady cluster: {writes}"
    );
    assert_eq!(
        scales(&plane, &ns).await,
        steady,
        "after the controller's change"
    );
    rolled_out(&plane, "controller").await;
}

// === case 7 ===

/// Rollouts of the activator, the autoscaler and the controller (`kubectl rollout restart`,
/// then `kubectl rollout status` and the old pods gone), then an API server restart (SIGKILL,
/// etcd kept), under a steady client through the ingress gateway: a Service held at 1 by
/// min-scale 1 and served by its pods (`target-burst-capacity: "0"`), and one free to scale
/// to zero whose requests all go through the activator (Knative's default
/// target-burst-capacity, 200, keeps the activator in the path of a revision with a few pods;
/// checked on its public slices before the first rollout). No request fails. After
/// the restart, a Service created through the API goes Ready and answers: every role's
/// watches resumed.
async fn rollouts_and_an_api_server_restart_fail_no_request(plane: Arc<Plane>, ns: String) {
    others_gone(&plane, &ns).await;
    apply(
        &plane,
        &ns,
        "served",
        &service("served", &[MIN_SCALE_1, ("target-burst-capacity", "0")]),
    )
    .await
    .unwrap();
    apply(&plane, &ns, "proxied", &service("proxied", &[]))
        .await
        .unwrap();
    let served = ready_host(&plane, &ns, "served").await;
    let proxied = ready_host(&plane, &ns, "proxied").await;
    let gateway = checks::service_endpoint(&plane, "istio-system", "istio-ingressgateway")
        .await
        .expect("the ingress gateway's endpoint");
    for host in [&served, &proxied] {
        answers(gateway, host).await;
    }
    let loops: Vec<SteadyLoop> = [&served, &proxied]
        .into_iter()
        .map(|h| SteadyLoop::start(gateway, h, "/", PACE))
        .collect();
    // The paths: the served one's public slices on its pod, the proxied one's on the
    // activators.
    until(
        "served by its pod, proxied by the activators",
        WITHIN,
        || async {
            let activators = role_ips(&plane, "activator").await;
            let pods: Vec<String> = revision_pods(&plane, &ns, "served")
                .await
                .into_iter()
                .map(|p| p.0)
                .collect();
            let s = public_addresses(&plane, &ns, "served").await;
            let p = public_addresses(&plane, &ns, "proxied").await;
            (!s.is_empty()
                && s.iter().all(|a| pods.contains(a))
                && !p.is_empty()
                && p.iter().all(|a| activators.contains(a)))
            .then_some(())
        },
    )
    .await;
    until("both loops answered", WITHIN, || async {
        loops
            .iter()
            .all(|l| {
                let r = l.report();
                r.keepalive.ok > 0 && r.fresh.ok > 0
            })
            .then_some(())
    })
    .await;

    let mut phases: Vec<(String, Vec<Report>)> = Vec::new();
    for role in ["activator", "autoscaler", "controller"] {
        let before: Vec<Report> = loops.iter().map(SteadyLoop::report).collect();
        let from = audit::now();
        let started = Instant::now();
        let old = role_pods(&plane, role).await;
        plane
            .kubectl(&[
                "-n",
                SYSTEM,
                "rollout",
                "restart",
                &format!("deployment/{role}"),
            ])
            .await
            .unwrap();
        plane
            .kubectl(&[
                "-n",
                SYSTEM,
                "rollout",
                "status",
                &format!("deployment/{role}"),
                "--timeout=300s",
            ])
            .await
            .unwrap();
        until(&format!("{role}'s old pods gone"), WITHIN, || async {
            let now = role_pods(&plane, role).await;
            now.iter().all(|p| !old.contains(p)).then_some(())
        })
        .await;
        let took = started.elapsed();
        let spans: Vec<Report> = loops
            .iter()
            .zip(&before)
            .map(|(l, b)| l.report().since(b))
            .collect();
        let to = audit::now();
        println!("{role} rollout ({:.1}s):", took.as_secs_f64());
        for r in &spans {
            println!("  {r}");
        }
        for writer in ["autoscaler", "controller"] {
            println!("  {}", audit::writes(&plane, writer, from, to));
        }
        phases.push((format!("the {role} rollout"), spans));
    }

    // The API server restarted; then a new Service through it.
    let before: Vec<Report> = loops.iter().map(SteadyLoop::report).collect();
    let away = plane.restart_apiserver().await;
    println!(
        "API server killed and ready again in {:.1}s",
        away.as_secs_f64()
    );
    apply(&plane, &ns, "late", &service("late", &[]))
        .await
        .unwrap();
    let late = ready_host(&plane, &ns, "late").await;
    answers(gateway, &late).await;
    let spans: Vec<Report> = loops
        .iter()
        .zip(&before)
        .map(|(l, b)| l.report().since(b))
        .collect();
    println!("API server restart, then late Ready and answering:");
    for r in &spans {
        println!("  {r}");
    }
    phases.push(("the API server restart".into(), spans));

    let mut whole = Vec::new();
    for l in loops {
        whole.push(l.stop().await);
    }
    println!("whole run:");
    for r in &whole {
        println!("  {r}");
    }
    for (phase, spans) in &phases {
        for r in spans {
            assert!(
                r.keepalive.requests > 0 && r.fresh.requests > 0,
                "no request during {phase}: {r}"
            );
            assert_eq!(r.failures(), 0, "failed requests during {phase}: {r}");
        }
    }
    for r in &whole {
        assert_eq!(r.failures(), 0, "{r}");
    }
}

// === helpers ===

const MIN_SCALE_1: (&str, &str) = ("min-scale", "1");

/// Waits until the namespaces of the cases before this one are gone: a namespace being
/// deleted is work for thaw (its revisions' pods go, their public slices are refused), so the
/// cluster is not steady until then.
async fn others_gone(plane: &Plane, ns: &str) {
    use k8s_openapi::api::core::v1::Namespace;
    let api: Api<Namespace> = Api::all(plane.admin.clone());
    until("the earlier cases' namespaces gone", WITHIN, || async {
        let list = api.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .filter_map(|n| n.metadata.name.as_deref())
            .all(|n| !n.starts_with("case-") || n == ns)
            .then_some(())
    })
    .await;
}

/// Waits for Service `name` to be Ready; its URL's host.
async fn ready_host(plane: &Plane, ns: &str, name: &str) -> String {
    let timeout = format!("--timeout={}s", WITHIN.as_secs());
    let ksvc = format!("ksvc/{name}");
    if let Err(e) = plane
        .kubectl(&["-n", ns, "wait", &ksvc, "--for=condition=Ready", &timeout])
        .await
    {
        let got = plane
            .kubectl(&["-n", ns, "get", "ksvc,revision,route", "-o", "yaml"])
            .await
            .unwrap_or_default();
        panic!("{e}\n{got}");
    }
    let url = plane
        .kubectl(&["-n", ns, "get", &ksvc, "-o", "jsonpath={.status.url}"])
        .await
        .unwrap();
    url.trim().trim_start_matches("http://").to_string()
}

/// Waits until `host` answers 200 through the gateway.
async fn answers(gateway: SocketAddr, host: &str) {
    until(
        &format!("{host} answering through the gateway"),
        WITHIN,
        || async { matches!(checks::get(gateway, host, "/").await, Ok((200, _))).then_some(()) },
    )
    .await;
}

/// Every Deployment's `spec.replicas` in `ns`.
async fn scales(plane: &Plane, ns: &str) -> BTreeMap<String, Option<i32>> {
    let api: Api<Deployment> = Api::namespaced(plane.admin.clone(), ns);
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|d| {
            (
                d.metadata.name.unwrap_or_default(),
                d.spec.and_then(|s| s.replicas),
            )
        })
        .collect()
}

/// The pods of revision `{svc}-00001` (not terminating): IP and whether Ready.
async fn revision_pods(plane: &Plane, ns: &str, svc: &str) -> Vec<(String, bool)> {
    let api: Api<Pod> = Api::namespaced(plane.admin.clone(), ns);
    let lp = ListParams::default().labels(&format!("serving.knative.dev/revision={svc}-00001"));
    let Ok(list) = api.list(&lp).await else {
        return Vec::new();
    };
    list.items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let st = p.status.unwrap_or_default();
            let ready = st
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            (st.pod_ip.unwrap_or_default(), ready)
        })
        .collect()
}

/// The addresses in revision `{svc}-00001`'s public EndpointSlices (the autoscaler's).
async fn public_addresses(plane: &Plane, ns: &str, svc: &str) -> Vec<String> {
    let api: Api<EndpointSlice> = Api::namespaced(plane.admin.clone(), ns);
    let lp = ListParams::default().labels(&format!(
        "serving.knative.dev/revision={svc}-00001,endpointslice.kubernetes.io/managed-by=autoscaler.thaw.dev"
    ));
    let Ok(list) = api.list(&lp).await else {
        return Vec::new();
    };
    list.items
        .into_iter()
        .flat_map(|s| s.endpoints)
        .flat_map(|e| e.addresses)
        .collect()
}

/// The IPs of `role`'s pods that are not terminating.
async fn role_ips(plane: &Plane, role: &str) -> Vec<String> {
    role_pod_objects(plane, role)
        .await
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.status?.pod_ip)
        .collect()
}

/// The restart count of `container` of thaw-system pod `pod`.
async fn restarts(plane: &Plane, pod: &str, container: &str) -> i32 {
    let api: Api<Pod> = Api::namespaced(plane.admin.clone(), SYSTEM);
    api.get(pod)
        .await
        .ok()
        .and_then(|p| p.status?.container_statuses)
        .into_iter()
        .flatten()
        .find(|c| c.name == container)
        .map_or(0, |c| c.restart_count)
}

async fn pod_ip(plane: &Plane, pod: &str) -> std::net::IpAddr {
    let api: Api<Pod> = Api::namespaced(plane.admin.clone(), SYSTEM);
    until(&format!("{pod}'s IP"), WITHIN, || async {
        api.get(pod).await.ok()?.status?.pod_ip?.parse().ok()
    })
    .await
}

/// Waits for `role`'s Deployment to be rolled out and Available again (2 ready replicas,
/// the pods replaced or restarted).
async fn rolled_out(plane: &Plane, role: &str) {
    plane
        .kubectl(&[
            "-n",
            SYSTEM,
            "rollout",
            "status",
            &format!("deployment/{role}"),
            "--timeout=300s",
        ])
        .await
        .unwrap();
    until(&format!("{role}'s pods all ready"), WITHIN, || async {
        let pods = role_pod_objects(plane, role).await;
        (pods.len() == 2
            && pods.iter().all(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
            }))
        .then_some(())
    })
    .await;
}

/// The `holderIdentity` of Lease thaw-system/`name`.
async fn lease_holder(plane: &Plane, name: &str) -> Option<String> {
    let api: Api<Lease> = Api::namespaced(plane.admin.clone(), SYSTEM);
    api.get_opt(name)
        .await
        .ok()??
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

/// The autoscaler pod holding thaw-system/thaw-autoscaler (its identity is its stats
/// address, `POD_IP:8080`).
async fn autoscaler_leader(plane: &Plane) -> String {
    until("an autoscaler leading", WITHIN, || async {
        let holder = lease_holder(plane, "thaw-autoscaler").await?;
        let ip = holder.rsplit_once(':')?.0.to_string();
        role_pod_objects(plane, "autoscaler")
            .await
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .find(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_deref()) == Some(&ip))?
            .metadata
            .name
    })
    .await
}

/// The log of `container` of thaw-system pod `pod`, every start of it.
fn role_log(plane: &Plane, pod: &str, container: &str) -> String {
    let name = format!("{SYSTEM}/{pod}/{container}");
    plane
        .kubelet
        .logs()
        .into_iter()
        .filter(|(n, _)| *n == name)
        .map(|(_, p)| std::fs::read_to_string(p).unwrap_or_default())
        .collect()
}

/// Completed takeovers per autoscaler pod (its log says so at the end of each: every
/// revision adopted).
fn takeovers(plane: &Plane) -> BTreeMap<String, usize> {
    plane
        .kubelet
        .logs()
        .into_iter()
        .filter_map(|(n, _)| {
            let mut parts = n.split('/');
            let (ns, pod, ctr) = (parts.next()?, parts.next()?, parts.next()?);
            (ns == SYSTEM && ctr == "autoscaler").then(|| pod.to_string())
        })
        .map(|pod| {
            let n = role_log(plane, &pod, "autoscaler")
                .matches("takeover complete")
                .count();
            (pod, n)
        })
        .collect()
}

/// Waits for one more completed takeover than `before` in some autoscaler pod; that pod.
async fn next_takeover(plane: &Plane, before: &BTreeMap<String, usize>) -> String {
    until("a completed takeover", WITHIN, || async {
        takeovers(plane)
            .into_iter()
            .find(|(pod, n)| *n > before.get(pod).copied().unwrap_or(0))
            .map(|(pod, _)| pod)
    })
    .await
}

/// How many Services, Configurations, Routes and Revisions the cluster has, by the
/// controller's kind label.
async fn knative_objects(plane: &Plane) -> BTreeMap<String, u64> {
    let text = plane
        .kubectl(&[
            "get",
            "services.serving.knative.dev,configurations,routes,revisions,domainmappings",
            "-A",
            "-o",
            "json",
        ])
        .await
        .unwrap();
    let list: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut out = BTreeMap::new();
    for item in list["items"].as_array().into_iter().flatten() {
        *out.entry(item["kind"].as_str().unwrap_or_default().to_string())
            .or_insert(0) += 1;
    }
    out
}

/// `thaw_controller_reconcile_total` by (kind, result) from a `/metrics` text.
fn reconciles(metrics: &str) -> BTreeMap<(String, String), u64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("thaw_controller_reconcile_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |k: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{k}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        let n: f64 = value.trim().parse().unwrap_or(0.0);
        out.insert((label("kind"), label("result")), n as u64);
    }
    out
}

/// The Lease timings the leader-elected roles run with: the Leases' duration as stored,
/// config-leader-election's keys, and any `--lease-duration`, `--renew-deadline`,
/// `--retry-period` in their Deployments (none: the ConfigMap's, Knative's defaults where it
/// gives none).
async fn lease_timings(plane: &Plane) -> String {
    let leases: Api<Lease> = Api::namespaced(plane.admin.clone(), SYSTEM);
    let deployments: Api<Deployment> = Api::namespaced(plane.admin.clone(), SYSTEM);
    let config: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(plane.admin.clone(), SYSTEM);
    let data = config
        .get_opt("config-leader-election")
        .await
        .unwrap()
        .and_then(|c| c.data)
        .unwrap_or_default();
    let parsed = thaw::config::leader_election::LeaderElectionConfig::parse_map(&data)
        .expect("deploy/'s config-leader-election is valid")
        .config;
    let mut out = format!(
        "Lease timings: config-leader-election {data:?}: lease-duration {:?}, renew-deadline \
         {:?}, retry-period {:?}",
        parsed.lease_duration, parsed.renew_deadline, parsed.retry_period
    );
    for role in ["autoscaler", "controller"] {
        let duration = until(&format!("Lease thaw-{role}"), WITHIN, || async {
            leases
                .get_opt(&format!("thaw-{role}"))
                .await
                .ok()??
                .spec?
                .lease_duration_seconds
        })
        .await;
        assert_eq!(
            u64::try_from(duration).unwrap(),
            parsed.lease_duration.as_secs(),
            "thaw-{role}'s Lease is not held for config-leader-election's lease-duration"
        );
        let flags: Vec<String> = deployments
            .get(role)
            .await
            .unwrap()
            .spec
            .and_then(|s| s.template.spec)
            .map(|s| s.containers)
            .into_iter()
            .flatten()
            .flat_map(|c| c.args.unwrap_or_default())
            .filter(|a| {
                a.starts_with("--lease") || a.starts_with("--renew") || a.starts_with("--retry")
            })
            .collect();
        let flags = if flags.is_empty() {
            "no --lease-* flag".to_string()
        } else {
            flags.join(" ")
        };
        out.push_str(&format!(
            "\n  thaw-{role}: leaseDurationSeconds {duration} in the Lease; {flags}"
        ));
    }
    out
}
