//! A leader change of `thaw autoscaler` on a steady cluster of many revisions: how long the
//! new leader takes to adopt every revision, and how many API writes it makes doing so
//! (target: none). Against the in-process API server (real HTTP, real watches), with two real
//! `thaw autoscaler` processes:
//!
//! 1. `REVISIONS` Revisions as an earlier thaw version left them: `Ready=True` and no
//!    `ScaleTargetInitialized` condition; half at one replica with a ready pod in their
//!    private slices, half at zero; public Services; the activator set.
//! 2. Autoscaler A starts and leads: the **upgrade** takeover (it writes the condition once
//!    per revision, and must make no `/scale` write).
//! 3. Once A's writes have stopped, B starts; A is killed (SIGKILL); B takes over: the
//!    **steady** takeover.
//!
//! Each takeover's figures come from the new leader's `/metrics`: `thaw_autoscaler_takeover_*`
//! and `thaw_platform_scale_patches_total`. `cargo bench --bench takeover` (set
//! `TAKEOVER_REVISIONS` for another size).

#[path = "../tests/kube_support/mod.rs"]
mod kube_support;

#[path = "../tests/takeover_support/mod.rs"]
mod takeover_support;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use takeover_support::{SYSTEM, autoscaler_with, revision, settle, takeover, wait_ready};

/// client-go's Lease timings (thaw's defaults).
const LEASE: &[&str] = &[
    "--lease-duration=15s",
    "--renew-deadline=10s",
    "--retry-period=2s",
];
use tokio::time::Instant;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::var("TAKEOVER_REVISIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let steady = takeover_support::Steady::start().await;
    let (client, dir, kubeconfig) = (steady.client.clone(), &steady.dir, &steady.kubeconfig);
    let started = Instant::now();
    for chunk in (0..n).collect::<Vec<_>>().chunks(25) {
        futures::future::join_all(
            chunk
                .iter()
                .map(|&i| revision(client.clone(), i, i % 2 == 0)),
        )
        .await;
    }
    println!(
        "{n} revisions ({} at one replica, {} at zero) written in {:.1} s",
        n.div_ceil(2),
        n / 2,
        started.elapsed().as_secs_f64()
    );

    let log_a = dir.path().join("a.log");
    let mut a = autoscaler_with(kubeconfig, &log_a, LEASE);
    let within = Duration::from_secs(600);
    let t = takeover(a.admin, &log_a, within).await;
    println!("upgrade (A, revisions without the condition): {t}");
    settle(a.admin, Duration::from_secs(3)).await;

    let log_b = dir.path().join("b.log");
    let b = autoscaler_with(kubeconfig, &log_b, LEASE);
    wait_ready(b.admin, within).await;
    let _ = a.child.kill();
    let _ = a.child.wait();
    let killed = Instant::now();
    let t = takeover(b.admin, &log_b, within).await;
    println!("steady (B after A's SIGKILL): {t}");
    let leases: Api<Lease> = Api::namespaced(client, SYSTEM);
    let holder = leases
        .get("thaw-autoscaler")
        .await
        .ok()
        .and_then(|l| l.spec?.holder_identity);
    println!(
        "B leads ({holder:?}) and has adopted everything {:.1} s after A's SIGKILL (lease duration 15 s)",
        killed.elapsed().as_secs_f64()
    );
    drop(b);
    let takeover_support::Steady { api, dir, .. } = steady;
    api.stop().await;
    if std::env::var_os("TAKEOVER_KEEP").is_some() {
        println!("logs kept in {}", dir.keep().display());
    }
}
