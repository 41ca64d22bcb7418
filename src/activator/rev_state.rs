//! One revision's state in the activator: its spec, throttler, concurrency window, metric handles
//! and cold-start tracker, plus the task that applies its endpoint snapshots.
//!
//! Created on a revision's first use (the first request routed to it; for every revision at
//! once when the platform needs drain reports), with the endpoint snapshot of that moment
//! applied before the request goes on, so a warm revision's first request finds its endpoints.
//! Removed when the revision leaves the catalog, which answers its held requests 503 and stops
//! its endpoint task.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use arc_swap::ArcSwap;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::Instrument;

use super::cold_start::ColdStart;
use super::concurrency::ShardedWindow;
use super::throttler::{HeldBudget, Rejection, Throttler};
use crate::autoscaler::scaler::ScaleStates;
use crate::knative::proxy_tag::TagCell;
use crate::platform::{EndpointSnapshot, EndpointSource, EndpointStatus};
use crate::revision::{RevisionKey, RevisionSpec};
use crate::telemetry::activator::{ActivatorMetrics, RevisionMetrics};

/// Everything the activator keeps per revision. Shared (`Arc`) by in-flight requests.
#[derive(Debug)]
pub struct RevisionState {
    /// The revision.
    pub key: RevisionKey,
    /// The revision's current spec, swapped when the catalog changes.
    pub spec: ArcSwap<RevisionSpec>,
    /// Capacity and the hold queue.
    pub throttler: Throttler,
    /// Requests present (held or in flight) over the current report interval, one shard per
    /// data worker.
    window: ShardedWindow,
    /// Handles resolved once; the request path only increments them.
    pub metrics: RevisionMetrics,
    /// Cold-start phase tracking.
    pub cold: ColdStart,
    /// The endpoint watch; `borrow()` is the latest snapshot (for re-applying limits and the
    /// admin API).
    endpoints: watch::Receiver<Arc<EndpointSnapshot>>,
    /// Set when the revision left the catalog.
    removed: AtomicBool,
    /// The endpoint task; aborted on drop.
    watcher: Mutex<Option<AbortHandle>>,
    all_metrics: ActivatorMetrics,
    scale_states: Option<Arc<ScaleStates>>,
    /// The revision's `K-Proxy-Request` value, computed on first use per UID and key.
    pub proxy_tag: TagCell,
    /// The latest snapshot's [`EndpointSnapshot::queue_proxy`]: some of its pods run Knative's
    /// queue-proxy, so forwarded requests say `K-Proxy-Request: activator` rather than the tag.
    queue_proxy: AtomicBool,
}

impl RevisionState {
    /// Creates the state and its metric series, applies the current endpoint snapshot
    /// synchronously, and spawns the task that applies later ones on `runtime`.
    pub fn spawn(
        spec: Arc<RevisionSpec>,
        endpoints: &Arc<dyn EndpointSource>,
        budget: Arc<HeldBudget>,
        metrics: &ActivatorMetrics,
        scale_states: Option<Arc<ScaleStates>>,
        runtime: &tokio::runtime::Handle,
    ) -> Arc<Self> {
        let key = spec.key.clone();
        let rev_metrics = metrics.revision(&key, spec.service.as_deref());
        let source = endpoints.clone();
        let drained_key = key.clone();
        let throttler = Throttler::new(
            budget,
            &key.namespace,
            rev_metrics.held.clone(),
            Box::new(move |addr| {
                tracing::debug!(revision = %drained_key, %addr, "terminating endpoint drained");
                source.drained(&drained_key, addr);
            }),
        );
        let mut rx = endpoints.endpoints(&key);
        let first = rx.borrow_and_update().clone();
        let state = Arc::new(Self {
            key: key.clone(),
            spec: ArcSwap::new(spec),
            throttler,
            window: ShardedWindow::new(Instant::now()),
            metrics: rev_metrics,
            cold: ColdStart::default(),
            endpoints: rx.clone(),
            removed: AtomicBool::new(false),
            watcher: Mutex::new(None),
            all_metrics: metrics.clone(),
            scale_states,
            proxy_tag: TagCell::default(),
            queue_proxy: AtomicBool::new(false),
        });
        state.apply(&first);
        let task = runtime.spawn(
            watch_endpoints(Arc::downgrade(&state), rx)
                .instrument(tracing::debug_span!("endpoints", revision = %key)),
        );
        *state.watcher.lock().unwrap_or_else(|p| p.into_inner()) = Some(task.abort_handle());
        state
    }

    /// Applies one endpoint snapshot: throttler limits and dispatch, the ready gauge, and the
    /// cold-start phase "ready".
    fn apply(&self, snap: &EndpointSnapshot) {
        // Before the throttler releases anything: a released request reads it.
        self.queue_proxy.store(snap.queue_proxy, SeqCst);
        // The cold-start phase "ready" is recorded before the throttler releases held
        // requests: a released request can be forwarded and answered on a data worker before
        // this thread gets further, and its first byte must find the episode awaiting it.
        let decided_at = self
            .scale_states
            .as_ref()
            .and_then(|s| s.get(&self.key))
            .and_then(|s| s.decided_at);
        self.cold.on_endpoints(
            Instant::now(),
            snap.ready.len(),
            decided_at,
            &self.all_metrics,
            &self.key,
        );
        let spec = self.spec.load();
        self.throttler
            .update(snap, spec.container_concurrency, spec.initial_burst);
        self.metrics.ready_endpoints.set(snap.ready.len() as i64);
        if let EndpointStatus::Failing { reason } = &snap.status {
            tracing::warn!(revision = %self.key, %reason, "revision failing; held requests answered 503");
        }
    }

    /// Swaps in a new spec; limits are re-applied when containerConcurrency or the burst
    /// changed.
    pub fn update_spec(&self, spec: Arc<RevisionSpec>) {
        let old = self.spec.swap(spec.clone());
        if old.container_concurrency != spec.container_concurrency
            || old.initial_burst != spec.initial_burst
        {
            let snap = self.endpoints.borrow().clone();
            self.apply(&snap);
        }
    }

    /// The revision left the catalog: held requests get 503, the endpoint task stops. If the
    /// platform already failed the revision (a removed service, say), the latest snapshot holds
    /// its reason even when this task has not seen it yet, and held requests get that reason.
    pub fn remove(&self) {
        self.removed.store(true, SeqCst);
        let why = match &self.endpoints.borrow().status {
            EndpointStatus::Failing { reason } => Rejection::Failing(reason.clone()),
            EndpointStatus::Ok => Rejection::Removed,
        };
        self.throttler.remove(why);
        if let Some(task) = self.watcher_lock().take() {
            task.abort();
        }
        self.all_metrics
            .forget(&self.key, self.spec.load().service.as_deref());
    }

    fn watcher_lock(&self) -> MutexGuard<'_, Option<AbortHandle>> {
        self.watcher.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether some of the revision's pods run Knative's queue-proxy
    /// ([`EndpointSnapshot::queue_proxy`]).
    pub fn queue_proxy(&self) -> bool {
        self.queue_proxy.load(SeqCst)
    }

    /// The latest endpoint snapshot.
    pub fn snapshot(&self) -> Arc<EndpointSnapshot> {
        self.endpoints.borrow().clone()
    }

    /// The concurrency window (arrivals, departures, reports).
    pub fn window(&self) -> &ShardedWindow {
        &self.window
    }
}

impl Drop for RevisionState {
    fn drop(&mut self) {
        if let Some(task) = self.watcher_lock().take() {
            task.abort();
        }
    }
}

/// Applies each new snapshot until the state is dropped or the source closes the watch.
async fn watch_endpoints(
    state: Weak<RevisionState>,
    mut rx: watch::Receiver<Arc<EndpointSnapshot>>,
) {
    // The snapshot seen at creation was applied synchronously; wait for the next one.
    while rx.changed().await.is_ok() {
        let snap = rx.borrow_and_update().clone();
        let Some(state) = state.upgrade() else { return };
        tracing::debug!(
            ready = snap.ready.len(),
            terminating = snap.terminating.len(),
            "endpoint update"
        );
        state.apply(&snap);
    }
}
