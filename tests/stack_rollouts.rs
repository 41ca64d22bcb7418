//! Rollouts of every role on the whole stack (tests/stack_support: the in-process API server,
//! `thaw controller`, two `thaw autoscaler`, two `thaw activator`; the test plays the
//! Deployment controller, the kubelet with real `thaw queue` + `thaw sample-app` pods, the
//! endpoints controller and the ingress), each with zero failed requests under steady client
//! loops (keep-alive and fresh connections through the ingress):
//! 1. a warm containerConcurrency-1 revision with one pod and a subset of two activators:
//!    concurrent clients all get 200, and the user container never has more than one request;
//! 2. the activators rolled one at a time, as a Deployment rollout does: a new activator joins
//!    activator-service and the revisions' public slices, then the old one's pod is deleted
//!    (its endpoints go) and it gets SIGTERM: a request held on it for a cold revision is
//!    answered 200, and its h2c client's stream open across the GOAWAY finishes;
//! 3. the autoscalers rolled the same way: no `/scale` or public-slice move;
//! 4. the controller rolled: a Service created afterwards becomes Ready and serves.
//!
//! config-autoscaler keeps Knative's defaults but the windows of `stack_support::short_windows`; config-activator its
//! defaults but `drain-delay` (the time a draining activator keeps accepting so that load
//! balancers notice it leaving), shortened because the test's ingress follows EndpointSlices
//! by watch. Real clock; waits poll conditions with deadlines; nothing asserts a duration.

mod kube_e2e_support;
mod kube_support;
mod stack_support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use stack_support::ingress::{Ingress, keepalive_client};
use stack_support::roles::RoleKind;
use stack_support::traffic::SteadyLoop;
use stack_support::{NS, SYSTEM, Stack, StackOptions};
use thaw::knative::{Service, condition};
use tokio::time::Instant;

const DRAIN_DELAY: &str = "3s";

const WITHIN: Duration = Duration::from_secs(40);
const PACE: Duration = Duration::from_millis(25);
/// After the autoscalers' rollout: a few decision rounds under the new leader.
const AFTER_TAKEOVER: Duration = Duration::from_secs(5);

const PROXIED: &str = "proxied";
const SERVED: &str = "served";
const CC1: &str = "single";
/// One cold Service per activator rolled: a request is held on the activator being rolled.
const COLD: [&str; 2] = ["cold-a", "cold-b"];
const LATE: &str = "late";

fn revision(svc: &str) -> String {
    format!("{svc}-00001")
}

async fn replicas(stack: &Stack, svc: &str) -> Option<i32> {
    let api: Api<Deployment> = Api::namespaced(stack.client.clone(), NS);
    api.get_opt(&format!("{}-deployment", revision(svc)))
        .await
        .ok()??
        .spec?
        .replicas
}

fn public_now(stack: &Stack, svc: &str) -> Vec<std::net::SocketAddr> {
    stack.public_now(&revision(svc))
}

async fn ready_url(stack: &Stack, services: &Api<Service>, name: &str) -> String {
    let url = stack
        .until(WITHIN, &format!("{name} Ready with a URL"), || async {
            let s = services.get_status(name).await.ok()?;
            let st = s.status.as_ref()?;
            st.status.is_true(condition::READY).then_some(())?;
            st.route.url.clone()
        })
        .await;
    url.trim_start_matches("http://").to_string()
}

/// GET `path` for `svc` straight to `addr` (an activator), on a connection of its own, with the
/// headers the Route's VirtualService sets.
async fn get_direct(
    addr: SocketAddr,
    host: &str,
    svc: &str,
    path: &str,
) -> Result<(u16, String), String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header("host", host)
        .header("knative-serving-namespace", NS)
        .header("knative-serving-revision", revision(svc))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// What the h2c client on a draining activator saw.
#[derive(Debug)]
struct H2cOutcome {
    status: u16,
    lines: usize,
    /// The connection's end: `Ok` for a graceful close (GOAWAY, open streams finished).
    connection: Result<(), String>,
    /// Whether a new request on the same connection was refused as closed afterwards.
    refused_after: bool,
}

/// An h2c (prior knowledge) connection to `addr` with one long stream of `chunks` lines;
/// `started` fires once the response head is in.
async fn h2c_stream(
    addr: SocketAddr,
    host: String,
    svc: &'static str,
    chunks: usize,
    started: tokio::sync::oneshot::Sender<()>,
) -> Result<H2cOutcome, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    let conn = tokio::spawn(conn);
    let req = http::Request::get(format!("http://{host}/stream?chunks={chunks}&delay=200ms"))
        .header("knative-serving-namespace", NS)
        .header("knative-serving-revision", revision(svc))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let _ = started.send(());
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("the stream broke: {e}"))?
        .to_bytes();
    let lines = body.iter().filter(|b| **b == b'\n').count();
    let connection = match tokio::time::timeout(WITHIN, conn).await {
        Ok(Ok(r)) => r.map_err(|e| e.to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the connection was never closed".into()),
    };
    let again = http::Request::get(format!("http://{host}/"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let refused_after = send.send_request(again).await.is_err();
    Ok(H2cOutcome {
        status,
        lines,
        connection,
        refused_after,
    })
}

/// The user container's `/inflight` (`{"inFlight":N,"peak":M}`) of each of `svc`'s pods.
async fn app_peaks(stack: &Stack, svc: &str) -> Vec<u64> {
    let pods: Api<Pod> = Api::namespaced(stack.client.clone(), NS);
    let lp =
        ListParams::default().labels(&format!("serving.knative.dev/revision={}", revision(svc)));
    let mut out = Vec::new();
    for p in pods.list(&lp).await.unwrap().items {
        let Some(ip) = p.status.and_then(|s| s.pod_ip) else {
            continue;
        };
        let addr: SocketAddr = format!("{ip}:8080").parse().unwrap();
        let text = kube_e2e_support::get_text(addr, "/inflight").await;
        let v: serde_json::Value = serde_json::from_str(&text).expect("/inflight JSON");
        out.push(v["peak"].as_u64().unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_every_role_fails_no_request() {
    let began = Instant::now();
    let mut stack = Stack::start(StackOptions {
        autoscaler: stack_support::short_windows(),
        activator: BTreeMap::from([("drain-delay".into(), DRAIN_DELAY.into())]),
        controllers: 1,
        autoscalers: 2,
        activators: 2,
        graceful_pod_deletion: false,
    })
    .await;
    let services: Api<Service> = Api::namespaced(stack.client.clone(), NS);
    let pinned =
        r#""autoscaling.knative.dev/min-scale": "1", "autoscaling.knative.dev/max-scale": "1""#;
    let specs: Vec<(&str, &str, Option<u32>)> = vec![
        (PROXIED, "", None),
        (
            SERVED,
            r#""autoscaling.knative.dev/target-burst-capacity": "0""#,
            None,
        ),
        (CC1, pinned, Some(1)),
        (COLD[0], "", None),
        (COLD[1], "", None),
    ];
    for (name, annotations, cc) in &specs {
        services
            .create(
                &PostParams::default(),
                &stack_support::helloworld(name, annotations, *cc),
            )
            .await
            .expect("create a Service");
    }
    let mut hosts = BTreeMap::new();
    for (name, _, _) in &specs {
        hosts.insert(*name, ready_url(&stack, &services, name).await);
    }
    let ingress = Arc::new(Ingress::start(stack.client.clone()));
    for name in [PROXIED, SERVED, CC1] {
        stack
            .until(WITHIN, &format!("the ingress routing {name}"), || async {
                (!ingress.endpoints(&hosts[name]).is_empty()).then_some(())
            })
            .await;
    }
    let loops: Vec<(&str, SteadyLoop)> = [PROXIED, SERVED, CC1]
        .into_iter()
        .map(|s| (s, SteadyLoop::start(ingress.clone(), &hosts[s], "/", PACE)))
        .collect();
    for name in COLD {
        stack
            .until(WITHIN, &format!("{name} at zero"), || async {
                (replicas(&stack, name).await == Some(0)).then_some(())
            })
            .await;
    }

    // 1. containerConcurrency 1, one pod, two activators: both may send it one request; the
    //    sidecar holds the second, and the user container never has two.
    let subset = public_now(&stack, CC1);
    assert_eq!(subset.len(), 2, "{CC1}'s public slices: {subset:?}");
    assert!(subset.iter().all(|a| stack.is_activator(a)), "{subset:?}");
    let burst: Vec<_> = (0..6)
        .map(|_| {
            let ingress = ingress.clone();
            let host = hosts[CC1].clone();
            tokio::spawn(async move {
                let client = keepalive_client();
                let mut statuses = Vec::new();
                for _ in 0..12 {
                    statuses.push(
                        ingress
                            .get(&client, &host, "/stream?chunks=2&delay=20ms")
                            .await
                            .map(|r| r.status),
                    );
                }
                statuses
            })
        })
        .collect();
    let mut answered = 0;
    for t in burst {
        for s in t.await.unwrap() {
            assert_eq!(s, Ok(200), "a concurrent request to {CC1}");
            answered += 1;
        }
    }
    let peaks = app_peaks(&stack, CC1).await;
    assert_eq!(peaks, vec![1], "{CC1}'s user container at most 1 at once");
    println!(
        "{CC1}: {answered} concurrent requests through 2 activators, all 200; app peak {peaks:?}"
    );

    // 2. The activators rolled one at a time.
    for (i, old) in ["activator-1", "activator-2"].into_iter().enumerate() {
        let new = stack.add_role(RoleKind::Activator).await;
        let new_addr = stack.role(&new).data();
        stack
            .until(
                WITHIN,
                &format!("activator-service listing {new}"),
                || async {
                    stack
                        .activator_service()
                        .await
                        .contains(&new_addr)
                        .then_some(())
                },
            )
            .await;
        // Knative's default subset at zero pods is 3 activators: the new one joins every
        // proxied revision.
        stack
            .until(
                WITHIN,
                &format!("{new} in {PROXIED}'s public slices"),
                || async {
                    public_now(&stack, PROXIED)
                        .contains(&new_addr)
                        .then_some(())
                },
            )
            .await;
        let old_role = stack.role(old);
        let old_addr = old_role.data();
        // A request held on the old activator for a revision at zero.
        let cold = COLD[i];
        let held = tokio::spawn({
            let host = hosts[cold].clone();
            async move { get_direct(old_addr, &host, cold, "/").await }
        });
        stack
            .until(WITHIN, &format!("a request held on {old}"), || async {
                let v = stack.activator_view(old_role, NS, &revision(cold)).await?;
                (v["held"].as_u64()? > 0 || v["ready"]["count"].as_u64()? > 0).then_some(())
            })
            .await;
        // An h2c client with a stream across the drain (5 s of lines).
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let h2 = tokio::spawn(h2c_stream(
            old_addr,
            hosts[PROXIED].clone(),
            PROXIED,
            25,
            started_tx,
        ));
        tokio::time::timeout(WITHIN, started_rx)
            .await
            .expect("the h2c stream starts")
            .expect("the h2c stream starts");
        // The rollout takes the old pod: its endpoints go, and the kubelet sends SIGTERM.
        let pods: Api<Pod> = Api::namespaced(stack.client.clone(), SYSTEM);
        pods.delete(old, &DeleteParams::default())
            .await
            .expect("delete the old activator's pod");
        old_role.sigterm();
        let exit = old_role
            .wait_exit(WITHIN)
            .await
            .expect("the old activator exits after draining");
        assert!(exit.success(), "{old}: {exit:?}");
        let (status, body) = held.await.unwrap().expect("the held request is answered");
        assert_eq!(status, 200, "the request held on {old}: {body}");
        let h2 = h2.await.unwrap().expect("the h2c stream");
        assert_eq!(h2.status, 200, "{h2:?}");
        assert_eq!(
            h2.lines, 25,
            "the stream open at the GOAWAY finished: {h2:?}"
        );
        assert_eq!(
            h2.connection,
            Ok(()),
            "closed gracefully, not reset: {h2:?}"
        );
        assert!(h2.refused_after, "the client was told to go: {h2:?}");
        stack
            .until(
                WITHIN,
                &format!("{old} out of the public slices"),
                || async { (!public_now(&stack, PROXIED).contains(&old_addr)).then_some(()) },
            )
            .await;
        println!(
            "{old} rolled to {new}: the held request got 200, the h2c stream finished across the GOAWAY"
        );
    }

    // 3. The autoscalers rolled the same way: a new replica first, then SIGTERM to an old one.
    let steady = stack.moves();
    for old in ["autoscaler-1", "autoscaler-2"] {
        let new = stack.add_role(RoleKind::Autoscaler).await;
        let old_role = stack.role(old);
        old_role.sigterm();
        let exit = old_role
            .wait_exit(WITHIN)
            .await
            .expect("the old autoscaler exits");
        assert!(exit.success(), "{old}: {exit:?}");
        println!("{old} rolled to {new}");
    }
    let leader = stack
        .until(WITHIN, "a new autoscaler leading", || async {
            let l = stack.autoscaler_leader().await?;
            (l.name != "autoscaler-1" && l.name != "autoscaler-2").then(|| l.name.clone())
        })
        .await;
    tokio::time::sleep(AFTER_TAKEOVER).await;
    assert_eq!(
        stack.moves(),
        steady,
        "the autoscalers' rollout moved something"
    );
    println!("autoscalers rolled: {leader} leads; no /scale or public-slice move");

    // 4. The controller rolled; a Service created afterwards becomes Ready and serves.
    let new = stack.add_role(RoleKind::Controller).await;
    let old_role = stack.role("controller-1");
    old_role.sigterm();
    let exit = old_role
        .wait_exit(WITHIN)
        .await
        .expect("the old controller exits");
    assert!(exit.success(), "controller-1: {exit:?}");
    services
        .create(
            &PostParams::default(),
            &stack_support::helloworld(LATE, "", None),
        )
        .await
        .expect("create a Service");
    let late_host = ready_url(&stack, &services, LATE).await;
    let reply = stack
        .until(WITHIN, &format!("{LATE} answering"), || async {
            ingress
                .get(&keepalive_client(), &late_host, "/")
                .await
                .ok()
                .filter(|r| r.status == 200)
        })
        .await;
    assert!(reply.body.contains("Hello"), "{}", reply.body);
    println!("controller-1 rolled to {new}: {LATE} became Ready and serves");

    stack_support::traffic::stop_all_and_check(loops).await;
    println!("{}", stack.records().describe());
    println!("wall time {:.1}s", began.elapsed().as_secs_f64());
}
