//! The autoscaler's judgment survives a leadership term, on the whole stack
//! (tests/stack_support: the in-process API server, `thaw controller`, two `thaw autoscaler`,
//! two `thaw activator`; the test plays the Deployment controller, the kubelet with real
//! `thaw queue` + `thaw sample-app` pods, the endpoints controller and the ingress).
//!
//! Knative's default settings: config-autoscaler and config-activator empty, so a stable
//! window of 60 s, a scale-to-zero grace period of 30 s, no pod retention, a target burst
//! capacity of 200 (the activators stay in both revisions' path). The Lease timings are the
//! stack's (`--lease-duration 3s`, `--renew-deadline 2s`, `--retry-period 500ms`:
//! `stack_support::LEASE_DURATION` and its neighbours): a SIGTERMed leader releases the Lease
//! and the standby leads within a retry period; a SIGKILLed one's successor waits out the 3 s.
//!
//! Two Services: `idle` (one pod, never a request after it is Ready) and `steady` (a steady
//! client loop through the ingress: one pod, kept). The autoscaler leader is changed every
//! [`PERIOD`] (SIGKILL and SIGTERM by turns, SIGKILL first; the old leader is restarted as
//! the standby), the first change [`FIRST`] after the idle revision's pod is ready, so no term
//! lasts a whole stable window of the idle revision's activity: a new leader that started the
//! stable window over would keep the pod for as long as the churn lasts (the previous version
//! did: still there after five changes). Shown:
//! - the idle revision reaches zero, with its `Active=False NoTraffic` written before;
//! - no takeover writes `/scale` for the steady revision (its only `/scale` is its initial
//!   one), and the idle one's are its initial scale and the one to zero;
//! - once the idle revision is at zero, two more changes move nothing (no `/scale`, no
//!   public slice) and their takeovers write nothing to the API server;
//! - exactly one autoscaler reports `thaw_autoscaler_leader 1`.
//!
//! Real clock; waits poll conditions with deadlines; nothing asserts a duration (the
//! deadlines only catch a revision that never goes).

mod kube_e2e_support;
mod kube_support;
mod stack_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, PostParams};
use stack_support::ingress::Ingress;
use stack_support::roles::{Role, RoleKind};
use stack_support::traffic::SteadyLoop;
use stack_support::{NS, Stack, StackOptions};
use thaw::knative::duck::ConditionStatus;
use thaw::knative::{Revision, Service, condition};
use tokio::time::Instant;

/// Between two leader changes ("about every minute").
const PERIOD: Duration = Duration::from_secs(60);
/// From the idle revision's pod ready to the first change: half a period.
const FIRST: Duration = Duration::from_secs(30);
/// Changes before the idle revision must be at zero: it needs a stable window and the grace
/// period (90 s) after its pod came up; five minutes of churn only catch one that never goes.
const MAX_CHANGES: usize = 5;
/// Changes after it reached zero.
const AFTER_ZERO: usize = 2;
const WITHIN: Duration = Duration::from_secs(60);
/// After a takeover: a few decision rounds (2 s) and pod-stats pulls (1 s) under the new
/// leader, for anything it would move to show.
const AFTER_TAKEOVER: Duration = Duration::from_secs(5);
const PACE: Duration = Duration::from_millis(50);

const IDLE: &str = "idle";
const STEADY: &str = "steady";

fn revision(svc: &str) -> String {
    format!("{svc}-00001")
}

fn deployment(svc: &str) -> String {
    format!("{svc}-00001-deployment")
}

async fn replicas(stack: &Stack, svc: &str) -> Option<i32> {
    let api: Api<Deployment> = Api::namespaced(stack.client.clone(), NS);
    api.get_opt(&deployment(svc)).await.ok()??.spec?.replicas
}

/// How many takeovers `role` has completed (its log, across restarts).
fn takeovers(role: &Role) -> usize {
    role.logs().matches("takeover complete").count()
}

fn takeover_counts(stack: &Stack) -> BTreeMap<String, usize> {
    stack
        .roles_of(RoleKind::Autoscaler)
        .map(|r| (r.name.clone(), takeovers(r)))
        .collect()
}

/// Waits for one more takeover than `before` (per autoscaler) to complete; the new leader.
async fn next_takeover<'a>(stack: &'a Stack, before: &BTreeMap<String, usize>) -> &'a Role {
    stack
        .until(WITHIN, "a new leader's completed takeover", || async {
            stack
                .roles_of(RoleKind::Autoscaler)
                .find(|r| takeovers(r) > before.get(&r.name).copied().unwrap_or(0))
        })
        .await
}

async fn metrics(role: &Role) -> String {
    kube_e2e_support::get_text(role.admin(), "/metrics").await
}

/// Changes the leader: SIGKILL (`kill`) or SIGTERM, waits for the standby's completed
/// takeover, restarts the old leader as the standby. The new leader.
async fn change_leader(stack: &Stack, kill: bool) -> &Role {
    let before = takeover_counts(stack);
    let lead = stack.autoscaler_leader().await.expect("a leader");
    if kill {
        lead.kill9();
    } else {
        lead.sigterm();
        let exit = lead
            .wait_exit(WITHIN)
            .await
            .expect("the leader exits on SIGTERM");
        assert!(exit.success(), "{exit:?}");
    }
    let next = next_takeover(stack, &before).await;
    assert_ne!(next.name, lead.name);
    lead.restart();
    let admin = lead.admin();
    stack
        .until(
            WITHIN,
            &format!("{} ready again", lead.name),
            || async move { stack_support::ready(admin).await.then_some(()) },
        )
        .await;
    next
}

/// Polls until the idle revision's Deployment is at zero (when), or `deadline` (`None`).
async fn at_zero_by(stack: &Stack, deadline: Instant) -> Option<Instant> {
    loop {
        if replicas(stack, IDLE).await == Some(0) {
            return Some(Instant::now());
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `Active` condition of `svc`'s revision: (status, reason).
async fn active(revs: &Api<Revision>, svc: &str) -> Option<(ConditionStatus, Option<String>)> {
    let r = revs.get_status(&revision(svc)).await.ok()?;
    let st = r.status?;
    let c = st.status.condition(condition::ACTIVE)?;
    Some((c.status, c.reason.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_revision_reaches_zero_with_a_leader_change_every_minute() {
    let began = Instant::now();
    let stack = Stack::start(StackOptions {
        autoscaler: BTreeMap::new(),
        activator: BTreeMap::new(),
        controllers: 1,
        autoscalers: 2,
        activators: 2,
        graceful_pod_deletion: false,
    })
    .await;
    let services: Api<Service> = Api::namespaced(stack.client.clone(), NS);
    let revs: Api<Revision> = Api::namespaced(stack.client.clone(), NS);
    for name in [IDLE, STEADY] {
        services
            .create(
                &PostParams::default(),
                &stack_support::helloworld(name, "", None),
            )
            .await
            .expect("create a Service");
    }
    let mut hosts = BTreeMap::new();
    for name in [IDLE, STEADY] {
        let url = stack
            .until(WITHIN, &format!("{name} Ready with a URL"), || async {
                let s = services.get_status(name).await.ok()?;
                let st = s.status.as_ref()?;
                st.status.is_true(condition::READY).then_some(())?;
                st.route.url.clone()
            })
            .await;
        hosts.insert(name, url.trim_start_matches("http://").to_string());
    }
    // The idle revision's pod ready, as the autoscaler says on its status.
    stack
        .until(WITHIN, "the idle revision's pod ready", || async {
            let r = revs.get_status(&revision(IDLE)).await.ok()?;
            (r.status?.actual_replicas == Some(1)).then_some(())
        })
        .await;
    let pod_ready = Instant::now();
    let ingress = Arc::new(Ingress::start(stack.client.clone()));
    stack
        .until(WITHIN, "the ingress routing the steady Service", || async {
            (!ingress.endpoints(&hosts[STEADY]).is_empty()).then_some(())
        })
        .await;
    let steady = SteadyLoop::start(ingress.clone(), &hosts[STEADY], "/", PACE);
    println!(
        "idle pod ready {:.1}s after the start",
        (pod_ready - began).as_secs_f64()
    );

    // The churn until the idle revision is at zero.
    let mut next_change = pod_ready + FIRST;
    let mut changes = 0;
    // SIGKILL first: the old leader writes nothing more, and its successor waits out the Lease.
    let mut kill = true;
    let at_zero = loop {
        if let Some(at) = at_zero_by(&stack, next_change).await {
            break at;
        }
        assert!(
            changes < MAX_CHANGES,
            "the idle revision still has its pod after {changes} leader changes:\n{}",
            stack.records().describe()
        );
        let signalled = Instant::now();
        let next = change_leader(&stack, kill).await;
        changes += 1;
        println!(
            "change {changes} at {:.1}s after the idle pod was ready ({}): {} leads",
            (signalled - pod_ready).as_secs_f64(),
            if kill { "SIGKILL" } else { "SIGTERM" },
            next.name
        );
        kill = !kill;
        next_change = signalled + PERIOD;
    };
    println!(
        "the idle revision at zero {:.1}s after its pod was ready, after {changes} leader changes",
        (at_zero - pod_ready).as_secs_f64()
    );
    assert!(
        changes > 0,
        "the idle revision went before the first change"
    );
    assert_eq!(
        active(&revs, IDLE).await,
        Some((ConditionStatus::False, Some("NoTraffic".into())))
    );
    assert_eq!(stack.records().scale_of(&deployment(IDLE)), [1, 0]);
    assert_eq!(stack.records().scale_of(&deployment(STEADY)), [1]);

    // A steady cluster: more changes move nothing, and their takeovers write nothing.
    stack
        .until(WITHIN, "the idle revision's status at zero", || async {
            let r = revs.get_status(&revision(IDLE)).await.ok()?;
            (r.status?.actual_replicas == Some(0)).then_some(())
        })
        .await;
    tokio::time::sleep(AFTER_TAKEOVER).await;
    let settled = stack.moves();
    for i in 0..AFTER_ZERO {
        let next = change_leader(&stack, kill).await;
        kill = !kill;
        tokio::time::sleep(AFTER_TAKEOVER).await;
        assert_eq!(stack.moves(), settled, "after change {} past zero", i + 1);
        let m = metrics(next).await;
        assert_eq!(
            kube_e2e_support::metric(&m, "thaw_autoscaler_takeover_writes", &[]),
            0.0,
            "{} wrote at its takeover",
            next.name
        );
        println!(
            "change {} past zero: {} leads; nothing moved",
            i + 1,
            next.name
        );
    }
    let mut leading = Vec::new();
    for r in stack.roles_of(RoleKind::Autoscaler) {
        let m = metrics(r).await;
        leading.push((
            r.name.clone(),
            kube_e2e_support::metric(&m, "thaw_autoscaler_leader ", &[]),
        ));
    }
    let leader = stack
        .autoscaler_leader()
        .await
        .expect("a leader")
        .name
        .clone();
    for (name, v) in &leading {
        assert_eq!(*v, f64::from(u8::from(*name == leader)), "{leading:?}");
    }

    stack_support::traffic::stop_all_and_check(vec![(STEADY, steady)]).await;
    println!("{}", stack.records().describe());
    println!("wall time {:.1}s", began.elapsed().as_secs_f64());
}
