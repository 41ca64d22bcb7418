//! The drills of the whole stack on the real control plane (issue 48, point 6): the API server
//! made slow by a latency proxy in front of it ([`latency`]), which thaw's activator,
//! autoscaler and controller pods reach it through (their kubeconfig names the proxy:
//! [`Kubelet::set_pod_server`](crate::plane_support::kubelet::Kubelet::set_pod_server), then
//! a rollout of each; the webhook, the controller-manager and the test's own checks go to the
//! API server directly). thaw runs as deploy/ installs it: 2 replicas of each role,
//! config-leader-election's Knative defaults (lease-duration 60 s, renew-deadline 40 s,
//! retry-period 10 s; checked at the start of each drill), Knative's autoscaling defaults
//! (60 s stable window, 30 s scale-to-zero grace period).
//!
//! What each drill shows, from the API server's audit log ([`audit`]) and the roles' own
//! `/metrics` (admin port 9090 of each pod), with the Leases and Deployments read directly:
//! - the leadership changes (or none): the Lease holders seen every half second, the Leases'
//!   `leaseTransitions`, and each pod's `thaw_{controller,autoscaler}_leader_changes_total`;
//! - no re-list: each controller pod's `thaw_controller_watch_lists_total{kind}` does not grow,
//!   and the audit log holds no `list` by the controller's or the autoscaler's ServiceAccount
//!   through the drill;
//! - progress: a Service created at the start of each phase becomes Ready while the latency is
//!   on (its time to Ready is printed);
//! - no spurious `/scale` write: none for a Service held at 1 by min-scale 1, at most one (to
//!   zero) for an idle one, whose replicas are never seen to rise;
//! - an idle revision still goes to zero (made Ready just before the latency starts, so its
//!   stable window and grace period run through the drill).
//!
//! Figures printed: the Lease calls' latency as the roles saw it through the proxy (per Lease
//! and verb), the renewals that landed (audit), the leadership changes, time to Ready.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::plane_support::harness::{Case, apply};
use crate::plane_support::latency::{self, LatencyProxy, Scope};
use crate::plane_support::stack::{role_pod_objects, role_pods, scale_of, service, until};
use crate::plane_support::{Plane, audit, checks, netns};

/// This module's cases.
pub fn cases() -> Vec<Case> {
    vec![
        crate::exclusive_case!(lease_renewals_delayed_past_the_renew_deadline),
        crate::exclusive_case!(an_api_server_answering_every_call_in_3s_for_2_minutes),
    ]
}

const SYSTEM: &str = "thaw-system";
/// The roles whose pods reach the API server through the proxy.
const ROLES: [&str; 3] = ["activator", "autoscaler", "controller"];
/// The leader-elected roles (their Lease is `thaw-<role>`).
const ELECTED: [&str; 2] = ["autoscaler", "controller"];
/// The longest any awaited state may take: a Service Ready under latency, a scale to zero
/// (60 s stable window and 30 s grace period), a rollout.
const WITHIN: Duration = Duration::from_secs(420);

/// How long a Service created under latency may take to be Ready: generous, since at 12 s a
/// call each reconcile's reads and writes are serialized behind the delay; it only catches
/// progress that stopped.
const PROGRESS_WITHIN: Duration = Duration::from_secs(900);
/// The delay of each Lease call in drill (a)'s first phase: past the 40 s renew deadline even
/// for a renewal of one call (a PUT of the Lease last written), so every renewal round fails.
const LEASE_DELAY: Duration = Duration::from_secs(45);
/// When drill (a)'s first phase creates its Service: past the renew deadline of the renewal
/// round begun at most a retry period into the phase, so the leaders have given up by then.
const AFTER_LOSS: Duration = Duration::from_secs(55);
/// The delay of every call in drill (a)'s second phase: a renewal takes 12 s, within the
/// renew deadline (a leader that measured the deadline from the start of the previous
/// renewal, rather than of the current round, lost its Lease every 40 s at this delay:
/// renewals due back to back, 24 s each with a GET before the PUT).
const EVERY_DELAY: Duration = Duration::from_secs(12);
/// How long each phase of drill (a) lasts at least (longer while its Service is not Ready).
const PHASE_A: Duration = Duration::from_secs(150);
/// Drill (b): every call answered in 3 s, for 2 minutes (longer while its Service is not
/// Ready).
const SLOW: Duration = Duration::from_secs(3);
const SLOW_FOR: Duration = Duration::from_secs(120);

/// The proxy every drill of this target uses, started (and the roles rolled onto it) by the
/// first drill that runs.
static PROXY: tokio::sync::OnceCell<LatencyProxy> = tokio::sync::OnceCell::const_new();

/// A phase of a drill: what is delayed, and for how long at least.
struct Phase {
    name: &'static str,
    delay: (Scope, Duration),
    at_least: Duration,
    /// The Service created this long into it, to become Ready while the latency is on.
    service: &'static str,
    create_after: Duration,
}

// === (a) ===

/// Lease renewals delayed past the renew deadline, then latency on every call, at Knative's
/// Lease timings (lease-duration 60 s, renew-deadline 40 s, retry-period 10 s, from
/// config-leader-election as deploy/ ships it, not shortened):
/// - phase 1, at least 150 s: each Lease call (GET, PUT, watch) of the roles delayed 45 s, so
///   every renewal round misses the 40 s renew deadline: each leader gives up its term, and a
///   candidate acquires only after a GET and a PUT (90 s); a Service created 55 s in (the
///   leaders have given up by then) becomes Ready in the terms that follow;
/// - phase 2, at least 150 s: every call delayed 12 s (watches, lists, writes, renewals): a
///   renewal takes 12 s, within the deadline, so leadership holds (or changes: printed) and
///   a Service created at the phase's start becomes Ready at the API's pace.
///
/// Through both: leadership changes cost no re-list, no spurious `/scale` write, and an idle
/// revision (Ready just before phase 1) goes to zero.
async fn lease_renewals_delayed_past_the_renew_deadline(plane: Arc<Plane>, ns: String) {
    let phases = [
        Phase {
            name: "Lease calls delayed 45 s",
            delay: (Scope::Leases, LEASE_DELAY),
            at_least: PHASE_A,
            service: "during-leases",
            create_after: AFTER_LOSS,
        },
        Phase {
            name: "every call delayed 12 s",
            delay: (Scope::Every, EVERY_DELAY),
            at_least: PHASE_A,
            service: "during-every",
            create_after: Duration::ZERO,
        },
    ];
    drill(&plane, &ns, &phases).await;
}

// === (b) ===

/// The API server answering every call of the roles in 3 s for 2 minutes (each call delayed
/// 3 s: a renewal takes 6 s, well within the 40 s renew deadline, so no leadership change is
/// expected and one would be printed), at Knative's Lease timings. The same checks as (a):
/// no re-list, a Service created at the start Ready under the latency (the latency kept on
/// past 2 minutes until it is), no spurious `/scale` write, an idle revision to zero.
async fn an_api_server_answering_every_call_in_3s_for_2_minutes(plane: Arc<Plane>, ns: String) {
    let phases = [Phase {
        name: "every call answered in 3 s",
        delay: (Scope::Every, SLOW),
        at_least: SLOW_FOR,
        service: "during-slow",
        create_after: Duration::ZERO,
    }];
    drill(&plane, &ns, &phases).await;
}

// === the drill ===

async fn drill(plane: &Plane, ns: &str, phases: &[Phase]) {
    let proxy = routed(plane).await;
    // Whatever an earlier drill left (one that failed under latency).
    proxy.set_delay(None);
    others_gone(plane, ns).await;
    println!("{}", lease_timings(plane).await);
    apply(plane, ns, "warm", &service("warm", &[MIN_SCALE_1]))
        .await
        .unwrap();
    apply(plane, ns, "idle", &service("idle", &[]))
        .await
        .unwrap();
    for name in ["warm", "idle"] {
        ready(plane, ns, name).await;
    }
    until("warm at one replica", WITHIN, || async {
        (scale_of(plane, ns, "warm").await == Some(1)).then_some(())
    })
    .await;

    let before = Snapshot::take(plane).await;
    let from = audit::now();
    let monitor = Monitor::start(plane, ns);
    let started = Instant::now();
    let mut figures = Vec::new();
    for phase in phases {
        let began = Instant::now();
        let phase_from = audit::now();
        proxy.set_delay(Some(phase.delay));
        tokio::time::sleep(phase.create_after).await;
        let created = Instant::now();
        apply(plane, ns, phase.service, &service(phase.service, &[]))
            .await
            .unwrap();
        let to_ready = until(
            &format!("{} Ready during \"{}\"", phase.service, phase.name),
            PROGRESS_WITHIN,
            || async {
                is_ready(plane, ns, phase.service)
                    .await
                    .then(|| created.elapsed())
            },
        )
        .await;
        let rest = phase.at_least.saturating_sub(began.elapsed());
        tokio::time::sleep(rest).await;
        let lasted = began.elapsed();
        let line = format!(
            "phase \"{}\" ({:.0}s): {} (created {:.0}s in) Ready after {:.1}s under the \
             latency\n{}\n{}\n  leadership changes seen: {}",
            phase.name,
            lasted.as_secs_f64(),
            phase.service,
            phase.create_after.as_secs_f64(),
            to_ready.as_secs_f64(),
            lease_figures(proxy, began),
            renewals(plane, phase_from, audit::now()),
            monitor.changes_text(began),
        );
        println!("{line}");
        figures.push(line);
    }
    proxy.set_delay(None);
    let lifted = started.elapsed();
    for role in ROLES {
        rolled_out(plane, role).await;
    }
    let zero_at = until("idle at zero", WITHIN, || async {
        monitor.zero_at("idle-00001-deployment")
    })
    .await;
    let to = audit::now();
    let after = Snapshot::take(plane).await;
    monitor.stop.cancel();

    let lists = relists(plane, from, to);
    let scale_writes = audit::writes(plane, "autoscaler", from, to);
    let scale_by: BTreeMap<String, usize> = scale_writes
        .requests
        .iter()
        .filter(|r| r.is_scale_write())
        .fold(BTreeMap::new(), |mut m, r| {
            *m.entry(r.name.clone()).or_insert(0) += 1;
            m
        });
    let idle_seen = monitor.replicas("idle-00001-deployment");
    let warm_seen = monitor.replicas("warm-00001-deployment");
    let changes = monitor.changes_since(started);
    println!(
        "drill: latency lifted after {:.0}s; idle reached zero {:.0}s into the drill ({}); \
         leadership changes {}: {}\n  leaseTransitions {}\n  terms started (leader_changes_total \
         by pod): {}\n  controller watch lists by pod, before -> after: {}\n  lists in the audit \
         log over the drill (re-lists of watches): {lists:?}\n  /scale writes by the autoscaler: {scale_by:?}; idle's \
         replicas seen {idle_seen:?}, warm's {warm_seen:?}",
        lifted.as_secs_f64(),
        zero_at.as_secs_f64(),
        if zero_at <= lifted {
            "under the latency"
        } else {
            "after it was lifted"
        },
        changes.len(),
        monitor.changes_text(started),
        before.transitions_delta(&after),
        before.terms_delta(&after),
        before.lists_text(&after),
    );

    // No re-list: the controller's shared watches list nothing again, and the audit log
    // holds no list by either leader-elected role.
    let grown = before.lists_grown(&after);
    assert!(
        grown.is_empty(),
        "controller pods re-listed (thaw_controller_watch_lists_total): {grown:?}"
    );
    assert!(
        lists.is_empty(),
        "watches re-listed by thaw's roles during the drill (audit): {lists:?}"
    );
    // No spurious /scale write.
    assert_eq!(
        scale_by.get("warm-00001-deployment").copied().unwrap_or(0),
        0,
        "/scale written for warm (held at 1 by min-scale): {scale_writes}"
    );
    assert!(
        scale_by.get("idle-00001-deployment").copied().unwrap_or(0) <= 1,
        "more than one /scale write for idle: {scale_writes}"
    );
    assert!(
        idle_seen.windows(2).all(|w| w[1] <= w[0]),
        "idle's replicas rose during the drill: {idle_seen:?}"
    );
    assert!(
        warm_seen.iter().all(|r| *r == 1),
        "warm's replicas moved: {warm_seen:?}"
    );
}

/// The proxy, with the roles' pods rolled onto it (once per target).
async fn routed(plane: &Plane) -> &'static LatencyProxy {
    PROXY
        .get_or_init(|| async {
            let upstream: SocketAddr = plane.server.trim_start_matches("https://").parse().unwrap();
            let proxy = LatencyProxy::start(
                &plane.pki,
                SocketAddr::new(netns::NODE_IP.into(), 0),
                upstream,
            )
            .await;
            plane
                .kubelet
                .set_pod_server(SYSTEM, Some(proxy.url.clone()));
            let mut old = Vec::new();
            for role in ROLES {
                old.extend(role_pods(plane, role).await);
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
            }
            for role in ROLES {
                rolled_out(plane, role).await;
            }
            until("the old role pods gone", WITHIN, || async {
                let mut now = Vec::new();
                for role in ROLES {
                    now.extend(role_pods(plane, role).await);
                }
                now.iter().all(|p| !old.contains(p)).then_some(())
            })
            .await;
            let since = Instant::now() - Duration::from_secs(3600);
            until("both Leases renewed through the proxy", WITHIN, || async {
                let calls = proxy.lease_calls(since);
                ELECTED
                    .iter()
                    .all(|r| {
                        calls
                            .iter()
                            .any(|c| c.lease == format!("thaw-{r}") && c.method == "PUT")
                    })
                    .then_some(())
            })
            .await;
            let (requests, _, failed) = proxy.counts();
            println!(
                "latency proxy {} in front of {}: the roles rolled onto it; {requests} requests \
                 so far, {failed} failed",
                proxy.url, plane.server
            );
            proxy
        })
        .await
}

// === what is watched during a drill ===

/// The Lease holders and the tracked Deployments' replicas, read every half second.
struct Monitor {
    seen: Arc<Mutex<Seen>>,
    stop: CancellationToken,
}

#[derive(Default)]
struct Seen {
    /// (when, lease, new holder), the first reading of each lease included.
    holders: Vec<(Instant, String, String)>,
    /// Deployment -> each distinct `spec.replicas` in order, with when.
    replicas: BTreeMap<String, Vec<(Instant, i32)>>,
}

impl Monitor {
    fn start(plane: &Plane, ns: &str) -> Monitor {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = CancellationToken::new();
        let leases: Api<Lease> = Api::namespaced(plane.admin.clone(), SYSTEM);
        let deployments: Api<Deployment> = Api::namespaced(plane.admin.clone(), ns);
        let (s, st) = (seen.clone(), stop.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tokio::select! {
                    _ = st.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let now = Instant::now();
                for role in ELECTED {
                    let name = format!("thaw-{role}");
                    let Ok(Some(l)) = leases.get_opt(&name).await else {
                        continue;
                    };
                    let holder = l.spec.and_then(|s| s.holder_identity).unwrap_or_default();
                    let mut seen = s.lock().unwrap();
                    let last = seen
                        .holders
                        .iter()
                        .rev()
                        .find(|(_, n, _)| *n == name)
                        .map(|(_, _, h)| h.clone());
                    if last.as_ref() != Some(&holder) {
                        seen.holders.push((now, name, holder));
                    }
                }
                if let Ok(list) = deployments.list(&ListParams::default()).await {
                    let mut seen = s.lock().unwrap();
                    for d in list.items {
                        let (Some(name), Some(r)) =
                            (d.metadata.name, d.spec.and_then(|s| s.replicas))
                        else {
                            continue;
                        };
                        let v = seen.replicas.entry(name).or_default();
                        if v.last().is_none_or(|(_, last)| *last != r) {
                            v.push((now, r));
                        }
                    }
                }
            }
        });
        Monitor { seen, stop }
    }

    /// Holder changes after `since` (a lease's first reading is not a change).
    fn changes_since(&self, since: Instant) -> Vec<(Instant, String, String)> {
        let seen = self.seen.lock().unwrap();
        let mut out = Vec::new();
        for (i, (at, lease, holder)) in seen.holders.iter().enumerate() {
            let first = !seen.holders[..i].iter().any(|(_, l, _)| l == lease);
            if !first && *at >= since {
                out.push((*at, lease.clone(), holder.clone()));
            }
        }
        out
    }

    fn changes_text(&self, since: Instant) -> String {
        let changes = self.changes_since(since);
        if changes.is_empty() {
            return "none".into();
        }
        let items: Vec<String> = changes
            .iter()
            .map(|(at, lease, holder)| {
                let who = if holder.is_empty() {
                    "(released)"
                } else {
                    holder
                };
                format!(
                    "{lease} -> {who} at +{:.0}s",
                    at.duration_since(since).as_secs_f64()
                )
            })
            .collect();
        format!("{}: {}", changes.len(), items.join(", "))
    }

    /// How long after the first reading `deployment` was first seen at 0 replicas.
    fn zero_at(&self, deployment: &str) -> Option<Duration> {
        let seen = self.seen.lock().unwrap();
        let v = seen.replicas.get(deployment)?;
        let first = v.first()?.0;
        v.iter()
            .find(|(_, r)| *r == 0)
            .map(|(at, _)| at.duration_since(first))
    }

    fn replicas(&self, deployment: &str) -> Vec<i32> {
        self.seen
            .lock()
            .unwrap()
            .replicas
            .get(deployment)
            .map(|v| v.iter().map(|(_, r)| *r).collect())
            .unwrap_or_default()
    }
}

/// Each role pod's counters and restarts, and the Leases' transitions, at one point.
struct Snapshot {
    /// pod -> (role, container restarts, its /metrics text).
    pods: BTreeMap<String, (String, i32, String)>,
    transitions: BTreeMap<String, i32>,
}

impl Snapshot {
    async fn take(plane: &Plane) -> Snapshot {
        let mut pods = BTreeMap::new();
        for role in ELECTED {
            for p in role_pod_objects(plane, role).await {
                if p.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let name = p.metadata.name.clone().unwrap_or_default();
                let st = p.status.unwrap_or_default();
                let Some(ip) = st.pod_ip.and_then(|i| i.parse::<IpAddr>().ok()) else {
                    continue;
                };
                let restarts = st
                    .container_statuses
                    .iter()
                    .flatten()
                    .find(|c| c.name == role)
                    .map_or(0, |c| c.restart_count);
                let text = until(&format!("{name}'s /metrics"), WITHIN, || async {
                    checks::get(SocketAddr::new(ip, 9090), "admin", "/metrics")
                        .await
                        .ok()
                        .filter(|(code, _)| *code == 200)
                        .map(|(_, t)| t)
                })
                .await;
                pods.insert(name, (role.to_string(), restarts, text));
            }
        }
        let leases: Api<Lease> = Api::namespaced(plane.admin.clone(), SYSTEM);
        let mut transitions = BTreeMap::new();
        for role in ELECTED {
            let name = format!("thaw-{role}");
            let n = leases
                .get_opt(&name)
                .await
                .ok()
                .flatten()
                .and_then(|l| l.spec?.lease_transitions)
                .unwrap_or(0);
            transitions.insert(name, n);
        }
        Snapshot { pods, transitions }
    }

    fn transitions_delta(&self, after: &Snapshot) -> String {
        self.transitions
            .iter()
            .map(|(l, n)| format!("{l} {n} -> {}", after.transitions.get(l).unwrap_or(n)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `thaw_<role>_leader_changes_total` of each pod, before -> after.
    fn terms_delta(&self, after: &Snapshot) -> String {
        let mut out = Vec::new();
        for (pod, (role, restarts, text)) in &after.pods {
            let metric = format!("thaw_{role}_leader_changes_total");
            let now = value(text, &metric);
            let was = self
                .pods
                .get(pod)
                .filter(|(_, r, _)| r == restarts)
                .map(|(_, _, t)| value(t, &metric));
            out.push(match was {
                Some(w) => format!("{pod} {w} -> {now}"),
                None => format!("{pod} (restarted) {now}"),
            });
        }
        out.join(", ")
    }

    fn lists_text(&self, after: &Snapshot) -> String {
        let mut out = Vec::new();
        for (pod, (role, _, text)) in &after.pods {
            if role != "controller" {
                continue;
            }
            let was = self
                .pods
                .get(pod)
                .map(|(_, _, t)| watch_lists(t).values().sum::<u64>());
            out.push(format!(
                "{pod} {} -> {}",
                was.map_or("-".to_string(), |w| w.to_string()),
                watch_lists(text).values().sum::<u64>()
            ));
        }
        out.join(", ")
    }

    /// Controller pods (the same process before and after) whose watch lists grew.
    fn lists_grown(&self, after: &Snapshot) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (pod, (role, restarts, text)) in &after.pods {
            let Some((_, r, was)) = self.pods.get(pod) else {
                continue;
            };
            if role != "controller" || r != restarts {
                continue;
            }
            let (was, now) = (watch_lists(was), watch_lists(text));
            let grown: Vec<String> = now
                .iter()
                .filter(|(k, n)| **n > was.get(*k).copied().unwrap_or(0))
                .map(|(k, n)| format!("{k} {} -> {n}", was.get(k).copied().unwrap_or(0)))
                .collect();
            if !grown.is_empty() {
                out.push((pod.clone(), grown.join(", ")));
            }
        }
        out
    }
}

/// The value of an unlabelled sample `name` in a `/metrics` text (0 when absent).
fn value(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// `thaw_controller_watch_lists_total` by kind.
fn watch_lists(text: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("thaw_controller_watch_lists_total{") else {
            continue;
        };
        let Some((labels, v)) = rest.split_once("} ") else {
            continue;
        };
        let kind = labels
            .split(',')
            .find_map(|kv| kv.strip_prefix("kind=\""))
            .map(|k| k.trim_end_matches('"').to_string())
            .unwrap_or_default();
        *out.entry(kind).or_insert(0) += v.trim().parse::<f64>().unwrap_or(0.0) as u64;
    }
    out
}

/// The re-lists of watches by the leader-elected roles' ServiceAccounts in `[from, to]`,
/// by role, resource and query, from the audit log: a `list` answered 200 whose resource,
/// namespace and selectors are those of a `watch` the same role made at any time (the
/// watcher's list before its watch). Other lists (a one-off list by label, the polls of a
/// kind the API server does not serve, answered 404) are not re-lists.
fn relists(
    plane: &Plane,
    from: k8s_openapi::jiff::Timestamp,
    to: k8s_openapi::jiff::Timestamp,
) -> BTreeMap<String, usize> {
    let users: Vec<String> = ELECTED.iter().map(|r| audit::user(r)).collect();
    let text = std::fs::read_to_string(&plane.audit_log).unwrap_or_default();
    let mut watched = std::collections::BTreeSet::new();
    let mut lists = Vec::new();
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if e["stage"] != "ResponseComplete" || e["responseStatus"]["code"] != 200 {
            continue;
        }
        let user = e["user"]["username"].as_str().unwrap_or_default();
        if !users.iter().any(|u| u == user) {
            continue;
        }
        let verb = e["verb"].as_str().unwrap_or_default();
        let Some(uri) = e["requestURI"].as_str() else {
            continue;
        };
        let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
        // What names the collection and its selection, without paging, resource versions
        // and the watch's own parameters.
        let mut selection: Vec<&str> = query
            .split('&')
            .filter(|kv| kv.starts_with("labelSelector=") || kv.starts_with("fieldSelector="))
            .collect();
        selection.sort_unstable();
        let role = user.rsplit(':').next().unwrap_or_default();
        let key = format!("{role} {path}?{}", selection.join("&"));
        match verb {
            "watch" => {
                watched.insert(key);
            }
            "list" => {
                let at: Option<k8s_openapi::jiff::Timestamp> = e["requestReceivedTimestamp"]
                    .as_str()
                    .and_then(|t| t.parse().ok());
                if at.is_some_and(|at| at >= from && at <= to) {
                    lists.push(key);
                }
            }
            _ => {}
        }
    }
    let mut out = BTreeMap::new();
    for key in lists.into_iter().filter(|k| watched.contains(k)) {
        *out.entry(key).or_insert(0) += 1;
    }
    out
}

/// The Lease calls through the proxy since `since`, per Lease and verb.
fn lease_figures(proxy: &LatencyProxy, since: Instant) -> String {
    let mut by: BTreeMap<(String, String), Vec<Duration>> = BTreeMap::new();
    let mut failed = 0;
    for c in proxy.lease_calls(since) {
        if c.status >= 400 && c.status != 404 && c.status != 409 {
            failed += 1;
        }
        let lease = if c.lease.is_empty() {
            "(watch)".to_string()
        } else {
            c.lease
        };
        by.entry((lease, c.method)).or_default().push(c.took);
    }
    let mut out = format!("  Lease calls as the roles saw them ({failed} answered >= 400):");
    for ((lease, method), took) in by {
        out.push_str(&format!(
            "\n    {lease} {method}: {}",
            latency::summary(took)
        ));
    }
    out
}

/// The Lease renewals that landed (audit: `update` of a Lease), by role and pod.
fn renewals(
    plane: &Plane,
    from: k8s_openapi::jiff::Timestamp,
    to: k8s_openapi::jiff::Timestamp,
) -> String {
    let users: Vec<String> = ELECTED.iter().map(|r| audit::user(r)).collect();
    let mut by: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for r in audit::requests(plane) {
        if r.is_lease()
            && r.verb == "update"
            && users.contains(&r.user)
            && r.at >= from
            && r.at <= to
        {
            let e = by.entry(format!("{} by {}", r.name, r.pod)).or_default();
            if r.code == 200 {
                e.0 += 1;
            } else {
                e.1 += 1;
            }
        }
    }
    let items: Vec<String> = by
        .iter()
        .map(|(k, (ok, bad))| format!("{k}: {ok} ok, {bad} refused"))
        .collect();
    format!(
        "  Lease updates the API server received: {}",
        items.join("; ")
    )
}

// === helpers ===

const MIN_SCALE_1: (&str, &str) = ("min-scale", "1");

/// Waits until the namespaces of the cases before this one that are being deleted are gone
/// (their deletion is work for thaw).
async fn others_gone(plane: &Plane, ns: &str) {
    use k8s_openapi::api::core::v1::Namespace;
    let api: Api<Namespace> = Api::all(plane.admin.clone());
    until("the earlier cases' namespaces gone", WITHIN, || async {
        let list = api.list(&ListParams::default()).await.ok()?;
        // A failed case's namespace stays (steady, no work); a passed one's is being deleted.
        list.items
            .iter()
            .filter(|n| n.metadata.deletion_timestamp.is_some())
            .filter_map(|n| n.metadata.name.as_deref())
            .all(|n| !n.starts_with("case-") || n == ns)
            .then_some(())
    })
    .await;
}

/// Whether Service `ns/name` is Ready (read directly from the API server).
async fn is_ready(plane: &Plane, ns: &str, name: &str) -> bool {
    let gvk = kube::api::GroupVersionKind::gvk("serving.knative.dev", "v1", "Service");
    let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, "services");
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(plane.admin.clone(), ns, &ar);
    let Ok(Some(obj)) = api.get_opt(name).await else {
        return false;
    };
    let value = serde_json::to_value(&obj).unwrap_or_default();
    checks::condition(&value, "Ready").is_some_and(|c| c["status"] == "True")
}

/// Waits for Service `name` to be Ready.
async fn ready(plane: &Plane, ns: &str, name: &str) {
    let ok = tokio::time::timeout(WITHIN, async {
        while !is_ready(plane, ns, name).await {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    if ok.is_err() {
        let got = plane
            .kubectl(&["-n", ns, "get", "ksvc,revision,route", "-o", "yaml"])
            .await
            .unwrap_or_default();
        panic!("{ns}/{name} not Ready within {WITHIN:?}\n{got}");
    }
}

/// Waits for `role`'s Deployment to be rolled out with its 2 pods Ready.
async fn rolled_out(plane: &Plane, role: &str) {
    plane
        .kubectl(&[
            "-n",
            SYSTEM,
            "rollout",
            "status",
            &format!("deployment/{role}"),
            "--timeout=400s",
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

/// The Lease timings the roles run with: config-leader-election as installed (asserted to
/// be Knative's defaults, which the drills' timings are reasoned from) and each Lease's
/// stored duration.
async fn lease_timings(plane: &Plane) -> String {
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
    assert_eq!(
        (
            parsed.lease_duration,
            parsed.renew_deadline,
            parsed.retry_period
        ),
        (
            Duration::from_secs(60),
            Duration::from_secs(40),
            Duration::from_secs(10)
        ),
        "the drills are reasoned from Knative's Lease timings"
    );
    let leases: Api<Lease> = Api::namespaced(plane.admin.clone(), SYSTEM);
    let mut out = format!(
        "Lease timings (config-leader-election): lease-duration {:?}, renew-deadline {:?}, \
         retry-period {:?}",
        parsed.lease_duration, parsed.renew_deadline, parsed.retry_period
    );
    for role in ELECTED {
        let l = leases.get(&format!("thaw-{role}")).await.unwrap();
        let spec = l.spec.unwrap_or_default();
        out.push_str(&format!(
            "; thaw-{role}: leaseDurationSeconds {:?}, held by {:?}",
            spec.lease_duration_seconds, spec.holder_identity
        ));
    }
    out
}
