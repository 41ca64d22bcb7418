//! Leader changes of `thaw autoscaler` on a steady cluster (real processes, the in-process
//! API server): revisions written by an earlier version (no `ScaleTargetInitialized`) are
//! adopted with no `/scale` write and the condition written once each; a SIGKILLed leader's
//! successor, and a SIGTERMed (rolled) leader's successor, adopt everything with no API
//! write at all; a SIGTERMed leader hands over without waiting out the Lease.
//! `benches/takeover.rs` measures the same on 1,000 revisions.

mod kube_support;
mod takeover_support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use takeover_support::{NS, Steady, autoscaler, revision, settle, takeover, wait_ready};
use tokio::time::Instant;

const REVISIONS: usize = 24;
const WITHIN: Duration = Duration::from_secs(60);

async fn replicas(client: &kube::Client) -> Vec<i32> {
    let deps: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let mut out: Vec<(String, i32)> = deps
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|d| {
            (
                d.metadata.name.unwrap_or_default(),
                d.spec.and_then(|s| s.replicas).unwrap_or(0),
            )
        })
        .collect();
    out.sort();
    out.into_iter().map(|(_, r)| r).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_changes_on_a_steady_cluster_write_nothing() {
    let steady = Steady::start().await;
    let client = steady.client.clone();
    for i in 0..REVISIONS {
        revision(client.clone(), i, i % 2 == 0).await;
    }
    let before = replicas(&client).await;

    // The upgrade: the first leader of this version finds Ready revisions without the
    // condition. Knative's defaults (initial-scale 1): the ones at zero stay there.
    let log_a = steady.dir.path().join("a.log");
    let mut a = autoscaler(&steady.kubeconfig, &log_a);
    let t = takeover(a.admin, &log_a, WITHIN).await;
    println!("upgrade: {t}");
    assert_eq!(t.scale_patches, 0.0, "{t}");
    assert_eq!(t.slice_writes, 0.0, "{t}");
    assert_eq!(
        t.status_writes, REVISIONS as f64,
        "the condition, once each: {t}"
    );
    settle(a.admin, Duration::from_secs(2)).await;

    // SIGKILL: the standby takes over once the Lease expires, and writes nothing.
    let log_b = steady.dir.path().join("b.log");
    let mut b = autoscaler(&steady.kubeconfig, &log_b);
    wait_ready(b.admin, WITHIN).await;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let t = takeover(b.admin, &log_b, WITHIN).await;
    println!("after SIGKILL: {t}");
    assert_eq!(t.writes, 0.0, "{t}");
    assert_eq!(
        t.scale_patches + t.slice_writes + t.status_writes,
        0.0,
        "{t}"
    );

    // SIGTERM (a rollout): the Lease is released, the next replica leads at once (well
    // within the 3 s lease duration it would otherwise wait out) and writes nothing.
    let log_c = steady.dir.path().join("c.log");
    let c = autoscaler(&steady.kubeconfig, &log_c);
    wait_ready(c.admin, WITHIN).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(b.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let termed = Instant::now();
    let t = takeover(c.admin, &log_c, WITHIN).await;
    let handover = termed.elapsed();
    println!("after SIGTERM: {t}; leading and adopted {handover:?} after the signal");
    assert_eq!(t.writes, 0.0, "{t}");
    assert_eq!(
        t.scale_patches + t.slice_writes + t.status_writes,
        0.0,
        "{t}"
    );
    let exited = b.child.wait().unwrap();
    assert!(exited.success(), "SIGTERM exits 0: {exited:?}");
    assert!(
        std::fs::read_to_string(&log_b)
            .unwrap()
            .contains("lease released"),
        "the leader released the Lease on SIGTERM"
    );
    assert_eq!(replicas(&client).await, before, "no revision was rescaled");
    drop(c);
    steady.api.stop().await;
}
