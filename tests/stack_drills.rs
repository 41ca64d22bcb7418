//! Drills on the whole stack (tests/stack_support: the in-process API server, `thaw
//! controller`, two `thaw autoscaler`, two `thaw activator`; the test plays the Deployment
//! controller, the kubelet with real `thaw queue` + `thaw sample-app` pods, the endpoints
//! controller and the ingress). Three Knative Services at Knative's default settings but the
//! windows of `stack_support::short_windows`: one warm behind the activators (the default target burst capacity keeps them
//! in its path), one warm served by its pods (`target-burst-capacity: "0"`), one idle at zero.
//! Under a steady client loop (keep-alive and fresh connections through the ingress) each
//! drill must leave every `/scale` and every public EndpointSlice as it was, and fail no
//! request:
//! 1. SIGKILL the autoscaler leader: the standby takes over;
//! 2. SIGTERM the leader (a rollout): it releases the Lease, the other leads within seconds;
//! 3. cut every role off the API server for 10 s: warm traffic flows, nothing rescales, all
//!    resumes;
//! 4. revisions as the previous version left them (no `ScaleTargetInitialized`), then a
//!    takeover: no `/scale` write, and the condition written back.
//!
//! Real clock; waits poll conditions with deadlines; nothing asserts a duration.

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
use thaw::knative::{Revision, Service, condition};
use tokio::time::Instant;

const WITHIN: Duration = Duration::from_secs(40);
/// After a takeover: a few decision rounds (2 s) and pod-stats pulls (1 s) under the new
/// leader, for anything it would move to show.
const AFTER_TAKEOVER: Duration = Duration::from_secs(5);
const CUT_FOR: Duration = Duration::from_secs(10);
const PACE: Duration = Duration::from_millis(25);

fn service(name: &str, annotations: &str) -> Service {
    stack_support::helloworld(name, annotations, None)
}

const PROXIED: &str = "proxied";
const SERVED: &str = "served";
const IDLE: &str = "idle";

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

fn autoscalers(stack: &Stack) -> Vec<&Role> {
    stack.roles_of(RoleKind::Autoscaler).collect()
}

/// Waits for one more takeover than `before` (per autoscaler) to complete; the new leader.
async fn next_takeover<'a>(stack: &'a Stack, before: &BTreeMap<String, usize>) -> &'a Role {
    stack
        .until(WITHIN, "a new leader's completed takeover", || async {
            autoscalers(stack)
                .into_iter()
                .find(|r| takeovers(r) > before.get(&r.name).copied().unwrap_or(0))
        })
        .await
}

fn takeover_counts(stack: &Stack) -> BTreeMap<String, usize> {
    autoscalers(stack)
        .into_iter()
        .map(|r| (r.name.clone(), takeovers(r)))
        .collect()
}

/// The public endpoints of `svc`'s revision as last recorded.
fn public_now(stack: &Stack, svc: &str) -> Vec<std::net::SocketAddr> {
    stack.public_now(&revision(svc))
}

async fn ready_again(stack: &Stack, role: &Role) {
    let admin = role.admin();
    stack
        .until(
            WITHIN,
            &format!("{} ready again", role.name),
            || async move { stack_support::ready(admin).await.then_some(()) },
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_changes_and_an_api_cut_are_non_events() {
    let began = Instant::now();
    let stack = Stack::start(StackOptions {
        autoscaler: stack_support::short_windows(),
        controllers: 1,
        autoscalers: 2,
        activators: 2,
        activator: BTreeMap::new(),
        graceful_pod_deletion: false,
    })
    .await;
    let services: Api<Service> = Api::namespaced(stack.client.clone(), NS);
    for (name, annotations) in [
        (PROXIED, ""),
        (
            SERVED,
            r#""autoscaling.knative.dev/target-burst-capacity": "0""#,
        ),
        (IDLE, ""),
    ] {
        services
            .create(&PostParams::default(), &service(name, annotations))
            .await
            .expect("create a Service");
    }
    let mut hosts = BTreeMap::new();
    for name in [PROXIED, SERVED, IDLE] {
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
    let ingress = Arc::new(Ingress::start(stack.client.clone()));
    for name in [PROXIED, SERVED] {
        stack
            .until(WITHIN, &format!("the ingress routing {name}"), || async {
                (!ingress.endpoints(&hosts[name]).is_empty()).then_some(())
            })
            .await;
    }
    // Warm traffic from now on, so the two warm Services stay warm while the idle one goes.
    let loops: Vec<(&str, SteadyLoop)> = [PROXIED, SERVED]
        .into_iter()
        .map(|s| (s, SteadyLoop::start(ingress.clone(), &hosts[s], "/", PACE)))
        .collect();
    stack
        .until(WITHIN, "the idle Service at zero", || async {
            (replicas(&stack, IDLE).await == Some(0)).then_some(())
        })
        .await;
    stack
        .until(
            WITHIN,
            "the served Service's public slices on its pods",
            || async {
                let p = public_now(&stack, SERVED);
                (!p.is_empty() && p.iter().all(|a| stack.net.is_pod(a.ip()))).then_some(())
            },
        )
        .await;
    let proxied = public_now(&stack, PROXIED);
    assert!(
        !proxied.is_empty() && proxied.iter().all(|a| stack.is_activator(a)),
        "the proxied Service behind the activators: {proxied:?}"
    );
    // Every revision initialized, said on its status by the autoscaler.
    let revs: Api<Revision> = Api::namespaced(stack.client.clone(), NS);
    for name in [PROXIED, SERVED, IDLE] {
        stack
            .until(
                WITHIN,
                &format!("{name}'s ScaleTargetInitialized"),
                || async {
                    let r = revs.get_status(&revision(name)).await.ok()?;
                    r.status?
                        .status
                        .is_true(condition::SCALE_TARGET_INITIALIZED)
                        .then_some(())
                },
            )
            .await;
    }
    let steady = stack.moves();
    println!(
        "steady after {:.1}s: {steady:?}",
        began.elapsed().as_secs_f64()
    );

    // 1. SIGKILL the leader.
    let before = takeover_counts(&stack);
    let lead = stack.autoscaler_leader().await.expect("a leader");
    lead.kill9();
    let next = next_takeover(&stack, &before).await;
    assert_ne!(next.name, lead.name);
    tokio::time::sleep(AFTER_TAKEOVER).await;
    assert_eq!(stack.moves(), steady, "after the SIGKILL of {}", lead.name);
    println!(
        "SIGKILL {}: {} took over; nothing moved",
        lead.name, next.name
    );
    lead.restart();
    ready_again(&stack, lead).await;

    // 2. SIGTERM the leader: the Lease is released, the other leads at once.
    let before = takeover_counts(&stack);
    let lead = stack.autoscaler_leader().await.expect("a leader");
    let termed = Instant::now();
    lead.sigterm();
    let next = next_takeover(&stack, &before).await;
    let handover = termed.elapsed();
    assert_ne!(next.name, lead.name);
    let exit = lead
        .wait_exit(WITHIN)
        .await
        .expect("the leader exits on SIGTERM");
    assert!(exit.success(), "{exit:?}");
    assert!(lead.logs().contains("lease released"));
    tokio::time::sleep(AFTER_TAKEOVER).await;
    assert_eq!(stack.moves(), steady, "after the SIGTERM of {}", lead.name);
    println!(
        "SIGTERM {}: {} led and had adopted everything {handover:?} after the signal; nothing moved",
        lead.name, next.name
    );
    lead.restart();
    ready_again(&stack, lead).await;

    // 3. Every role cut off the API server for 10 s.
    let before = takeover_counts(&stack);
    stack.cut_all();
    tokio::time::sleep(CUT_FOR).await;
    assert_eq!(stack.moves(), steady, "during the cut");
    stack.restore_all();
    let next = next_takeover(&stack, &before).await;
    tokio::time::sleep(AFTER_TAKEOVER).await;
    assert_eq!(stack.moves(), steady, "after the cut");
    println!(
        "API cut for {CUT_FOR:?}: {} leads again; nothing moved",
        next.name
    );

    // 4. The previous version's revisions: no ScaleTargetInitialized. Both autoscalers stop,
    //    the condition is taken off, one autoscaler comes back.
    for r in autoscalers(&stack) {
        r.sigterm();
        r.wait_exit(WITHIN)
            .await
            .expect("an autoscaler exits on SIGTERM");
    }
    for name in [PROXIED, SERVED, IDLE] {
        let mut r = revs.get_status(&revision(name)).await.unwrap();
        let st = r.status.as_mut().unwrap();
        st.status
            .conditions
            .retain(|c| c.type_ != condition::SCALE_TARGET_INITIALIZED);
        revs.replace_status(&revision(name), &PostParams::default(), &r)
            .await
            .unwrap();
    }
    let before = takeover_counts(&stack);
    let one = autoscalers(&stack)[0];
    one.restart();
    let next = next_takeover(&stack, &before).await;
    tokio::time::sleep(AFTER_TAKEOVER).await;
    assert_eq!(stack.moves(), steady, "after the upgrade takeover");
    let metrics = kube_e2e_support::get_text(next.admin(), "/metrics").await;
    assert_eq!(
        kube_e2e_support::metric(&metrics, "thaw_platform_scale_patches_total", &[]),
        0.0,
        "no /scale write"
    );
    for name in [PROXIED, SERVED, IDLE] {
        stack
            .until(
                WITHIN,
                &format!("{name}'s condition written back"),
                || async {
                    let r = revs.get_status(&revision(name)).await.ok()?;
                    r.status?
                        .status
                        .is_true(condition::SCALE_TARGET_INITIALIZED)
                        .then_some(())
                },
            )
            .await;
    }
    println!(
        "upgrade: {} adopted every revision with no /scale write",
        next.name
    );

    stack_support::traffic::stop_all_and_check(loops).await;
    println!("{}", stack.records().describe());
    println!("wall time {:.1}s", began.elapsed().as_secs_f64());
}
