//! Not a check but a measurement (docs/benchmarks.md, "The controller with 1,000 Services"):
//! one `thaw controller` process reconciles 1,000 Knative Services from nothing to Ready against
//! the in-process API server, the test playing kubelet (each Deployment the controller creates
//! is marked available as soon as it appears). Prints the wall time from the first create to
//! the last Service Ready, the controller's CPU time (from /proc/<pid>/stat) and its peak RSS
//! (VmHWM). Run:
//! `cargo test --release --test controller_scale -- --ignored --nocapture`.

mod kube_e2e_support;
mod kube_support;

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube_e2e_support::*;
use thaw::knative::Service;
use tokio::time::Instant;

const NS: &str = "default";
const SERVICES: usize = 1000;

fn service(name: &str) -> Service {
    obj(serde_json::json!({
        "metadata": {"name": name, "namespace": NS},
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

/// Plays kubelet and the Deployment controller: every Deployment becomes available.
async fn kubelet(client: kube::Client) {
    let api: Api<Deployment> = Api::namespaced(client, NS);
    let mut s = std::pin::pin!(
        watcher(api.clone(), watcher::Config::default())
            .default_backoff()
            .applied_objects()
    );
    while let Some(Ok(d)) = s.next().await {
        let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let generation = d.metadata.generation;
        let done = d.status.as_ref().is_some_and(|s| {
            s.observed_generation == generation && s.available_replicas == Some(want)
        });
        if done {
            continue;
        }
        let name = d.metadata.name.clone().unwrap();
        let mut d = d;
        d.status = Some(obj(serde_json::json!({
            "observedGeneration": generation,
            "replicas": want, "readyReplicas": want, "availableReplicas": want,
            "updatedReplicas": want,
            "conditions": [
                {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}
            ]
        })));
        let _ = api.replace_status(&name, &PostParams::default(), &d).await;
    }
}

fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    // utime and stime are fields 14 and 15 (1-based) of the whole line: 12 and 13 after ")".
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kb: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb / 1024.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --release --ignored --nocapture"]
async fn a_thousand_services_from_nothing_to_ready() {
    let c = Cluster::start(serde_json::json!({})).await;
    c.config_map(
        "config-deployment",
        serde_json::json!({"queue-sidecar-image": "ghcr.io/thaw-dev/thaw:test"}),
    )
    .await;
    tokio::spawn(kubelet(c.client.clone()));
    // config-istio's default gateways, answering the controller's probes.
    let _gateway = kube_support::gateway::default_gateways(&c.client).await;
    let admin = free_port();
    let ctl = c.spawn(
        "controller",
        &[
            "controller".into(),
            "--system-namespace".into(),
            SYSTEM.into(),
            "--namespace".into(),
            NS.into(),
            "--admin-listen".into(),
            format!("127.0.0.1:{admin}"),
            "--name".into(),
            "ctl".into(),
        ],
    );
    let pid = ctl.pid();
    until(Duration::from_secs(30), "the controller leads", || async {
        let t = get_text(format!("127.0.0.1:{admin}").parse().unwrap(), "/leader").await;
        t.contains("\"leading\":true").then_some(())
    })
    .await;
    let cpu0 = cpu_seconds(pid);
    let started = Instant::now();
    let svcs: Api<Service> = Api::namespaced(c.client.clone(), NS);
    futures::stream::iter(0..SERVICES)
        .map(|i| {
            let svcs = svcs.clone();
            async move {
                svcs.create(&PostParams::default(), &service(&format!("s{i}")))
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await
        .unwrap();
    let created = started.elapsed();
    let mut last_ready = 0;
    loop {
        let ready = svcs
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|s| s.status.as_ref().is_some_and(|s| s.status.is_true("Ready")))
            .count();
        if ready != last_ready {
            println!("{:>6.1} s: {ready} Ready", started.elapsed().as_secs_f64());
            last_ready = ready;
        }
        if ready == SERVICES {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(900),
            "only {ready} of {SERVICES} Ready; controller log:\n{}",
            ctl.logs()
                .lines()
                .rev()
                .take(40)
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let wall = started.elapsed();
    let cpu = cpu_seconds(pid) - cpu0;
    println!(
        "{SERVICES} Services: created in {:.1} s, all Ready after {:.1} s; controller CPU {cpu:.1} s \
         ({:.0} % of a core over the run), peak RSS {:.1} MiB",
        created.as_secs_f64(),
        wall.as_secs_f64(),
        100.0 * cpu / wall.as_secs_f64(),
        peak_rss_mib(pid)
    );
}
