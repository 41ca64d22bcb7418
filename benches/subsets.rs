//! Activator subsetting on a cluster of many revisions: how many public-slice writes the
//! autoscaler leader makes when one activator joins (10 → 11) and when one leaves (11 → 10),
//! against how many revisions' subsets the change enters (target: exactly those; listing
//! every activator in every revision would rewrite all of them). Against the in-process API
//! server (real HTTP, real watches) with a real `thaw autoscaler` process:
//!
//! 1. `SUBSET_REVISIONS` revisions at zero (the activators front them; Knative's default
//!    subset at zero pods is 3 activators), activator-service listing 10 activators.
//! 2. The leader writes each revision's subset; once it is quiet, an 11th activator joins
//!    activator-service; the writes until quiet again are counted. Then one of the first ten
//!    leaves.
//!
//! `cargo bench --bench subsets` (set `SUBSET_REVISIONS` for another size).

#[path = "../tests/kube_support/mod.rs"]
mod kube_support;

#[path = "../tests/takeover_support/mod.rs"]
mod takeover_support;

use std::time::Duration;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams};
use takeover_support::{
    NS, SYSTEM, autoscaler, metrics, revision, settle, takeover, value, wait_ready,
};
use thaw::roles::subset::{choose_subset, num_activators};

fn activators(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("10.0.0.{i}")).collect()
}

async fn set_activators(client: &kube::Client, ips: &[String]) {
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), SYSTEM);
    let endpoints: Vec<serde_json::Value> = ips
        .iter()
        .map(|ip| serde_json::json!({"addresses": [ip], "conditions": {"ready": true}}))
        .collect();
    slices
        .patch(
            "activator-service-1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"endpoints": endpoints})),
        )
        .await
        .unwrap();
}

/// The revisions whose subset of `n` among `ips` (port 8012) holds `ip`.
fn holding(revisions: usize, ips: &[String], n: usize, ip: &str) -> usize {
    let names: Vec<String> = ips.iter().map(|i| format!("{i}:8012")).collect();
    let me = format!("{ip}:8012");
    (0..revisions)
        .filter(|i| {
            choose_subset(&names, n, &format!("{NS}/rev-{i:05}"))
                .iter()
                .any(|j| names[*j] == me)
        })
        .count()
}

fn slice_writes(m: &str) -> f64 {
    value(
        m,
        "thaw_autoscaler_api_writes_total{resource=\"endpointslices\"}",
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::var("SUBSET_REVISIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let steady = takeover_support::Steady::start().await;
    let (client, dir, kubeconfig) = (steady.client.clone(), &steady.dir, &steady.kubeconfig);
    let ten = activators(10);
    set_activators(&client, &ten).await;
    for chunk in (0..n).collect::<Vec<_>>().chunks(25) {
        futures::future::join_all(chunk.iter().map(|&i| revision(client.clone(), i, false))).await;
    }
    let size = num_activators(&thaw::config::AutoscalingSpec::default(), 0);
    println!("{n} revisions at zero, 10 activators, a subset of {size} each");

    let log = dir.path().join("autoscaler.log");
    let a = autoscaler(kubeconfig, &log);
    let within = Duration::from_secs(600);
    wait_ready(a.admin, within).await;
    takeover(a.admin, &log, within).await;
    settle(a.admin, Duration::from_secs(3)).await;
    let first = slice_writes(&metrics(a.admin).await);
    println!("the leader wrote {first} public slices to put every revision on its subset");

    let eleven = activators(11);
    set_activators(&client, &eleven).await;
    settle(a.admin, Duration::from_secs(3)).await;
    let joined = slice_writes(&metrics(a.admin).await) - first;
    let expected = holding(n, &eleven, size, "10.0.0.11");
    println!(
        "one activator joins (10 → 11): {joined} public-slice writes; its subsets: {expected} of {n} revisions"
    );

    let mut without = eleven.clone();
    without.remove(2);
    set_activators(&client, &without).await;
    settle(a.admin, Duration::from_secs(3)).await;
    let left = slice_writes(&metrics(a.admin).await) - first - joined;
    let expected_left = holding(n, &eleven, size, "10.0.0.3");
    println!(
        "one activator leaves (11 → 10): {left} public-slice writes; its subsets: {expected_left} of {n} revisions"
    );
    drop(a);
    let takeover_support::Steady { api, .. } = steady;
    api.stop().await;
}
