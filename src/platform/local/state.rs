//! One revision as the platform tracks it: the replica-set model ([`RevState`]) behind a
//! lock, the endpoint watch and the metric handles. Every change goes through a short critical
//! section (no await under the lock) that ends by publishing the snapshot and the gauges.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::watch;
use tokio::time::Instant;

use super::LocalRevision;
use super::policy::{self, RestartPolicy};
pub(crate) use super::slots::{RevState, StopSignal};
use super::status::{ReplicaState, ReplicaStatus, RevisionStatus};
use crate::platform::{EndpointSnapshot, EndpointStatus};
use crate::revision::RevisionKey;
use crate::telemetry::platform::{
    ExitLabels, ExitReason, PlatformMetrics, ReplicaStateLabel, ReplicaStateLabels, RevisionLabels,
};

/// Per-revision metric handles, resolved once.
#[derive(Debug)]
struct Handles {
    by_state: [(ReplicaStateLabel, Gauge); 4],
    startup: Histogram,
    restarts: prometheus_client::metrics::counter::Counter,
    metrics: PlatformMetrics,
}

/// One revision as the platform tracks it.
#[derive(Debug)]
pub(crate) struct RevisionEntry {
    pub key: RevisionKey,
    tx: watch::Sender<Arc<EndpointSnapshot>>,
    state: Mutex<RevState>,
    handles: Handles,
}

impl RevisionEntry {
    pub(crate) fn new(key: RevisionKey, metrics: &PlatformMetrics) -> Self {
        let labels = RevisionLabels {
            namespace: key.namespace.to_string(),
            revision: key.name.to_string(),
        };
        let gauge = |state| {
            let g = metrics.replicas.get_or_create_owned(&ReplicaStateLabels {
                namespace: labels.namespace.clone(),
                revision: labels.revision.clone(),
                state,
            });
            (state, g)
        };
        let handles = Handles {
            by_state: [
                gauge(ReplicaStateLabel::Starting),
                gauge(ReplicaStateLabel::Ready),
                gauge(ReplicaStateLabel::Backoff),
                gauge(ReplicaStateLabel::Terminating),
            ],
            startup: metrics.startup.get_or_create_owned(&labels),
            restarts: metrics.restarts.get_or_create_owned(&labels),
            metrics: metrics.clone(),
        };
        Self {
            key,
            tx: watch::Sender::new(Arc::new(EndpointSnapshot::default())),
            state: Mutex::new(RevState::default()),
            handles,
        }
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<Arc<EndpointSnapshot>> {
        self.tx.subscribe()
    }

    /// Runs `f` on the state, then republishes the snapshot and gauges.
    pub(crate) fn update<R>(&self, f: impl FnOnce(&mut RevState) -> R) -> R {
        let mut st = self.lock();
        let r = f(&mut st);
        self.publish(&st);
        r
    }

    fn lock(&self) -> MutexGuard<'_, RevState> {
        // A panic under this lock cannot leave the state half-updated in a way that matters
        // more than stopping the platform would; keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, st: &RevState) {
        let mut counts = [0i64; 4];
        for s in &st.slots {
            counts[s.state as usize] += 1;
        }
        for (i, (_, g)) in self.handles.by_state.iter().enumerate() {
            g.set(counts[i]);
        }
        let snap = st.snapshot();
        self.tx.send_if_modified(|cur| {
            if **cur == snap {
                false
            } else {
                *cur = Arc::new(snap);
                true
            }
        });
    }

    pub(crate) fn definition(&self) -> Option<Arc<LocalRevision>> {
        self.lock().def.clone()
    }

    pub(crate) fn status(&self) -> RevisionStatus {
        let st = self.lock();
        RevisionStatus {
            desired: st.desired,
            replicas: st
                .slots
                .iter()
                .map(|s| ReplicaStatus {
                    index: s.index,
                    state: s.state,
                    pid: s.pid,
                    addr: s.addr,
                    started_at: s.started_at,
                    ready_after: s.ready_after,
                    restarts: s.restarts,
                })
                .collect(),
            last_startup: st.last_startup,
            failing: failing_reason(&st.snapshot()),
            consecutive_crashes: st.consecutive_crashes,
            restarts: st.restarts,
        }
    }

    /// Counts an exit in `thaw_platform_replica_exits_total`.
    pub(crate) fn count_exit(&self, reason: ExitReason) {
        self.handles
            .metrics
            .exits
            .get_or_create(&ExitLabels {
                namespace: self.key.namespace.to_string(),
                revision: self.key.name.to_string(),
                reason,
            })
            .inc();
    }

    /// A process was spawned for slot `index`.
    pub(crate) fn slot_spawned(&self, index: u32, pid: u32, addr: SocketAddr, at: Instant) {
        self.update(|st| {
            if let Some(s) = st.slot_mut(index) {
                if s.state != ReplicaState::Terminating {
                    s.state = ReplicaState::Starting;
                }
                s.pid = Some(pid);
                s.addr = Some(addr);
                s.started_at = Some(at);
                s.ready_after = None;
            }
        });
    }

    /// Slot `index` passed its readiness probe `after` its spawn: its endpoint becomes ready
    /// (unless it is already being stopped) and the revision's crash count resets.
    pub(crate) fn slot_ready(&self, index: u32, after: Duration) {
        self.handles.startup.observe(after.as_secs_f64());
        self.update(|st| {
            st.last_startup = Some(after);
            st.consecutive_crashes = 0;
            st.crash_failure = None;
            if let Some(s) = st.slot_mut(index) {
                s.ready_after = Some(after);
                if s.state == ReplicaState::Starting {
                    s.state = ReplicaState::Ready;
                }
            }
        });
    }

    /// Slot `index`'s process ended without being asked to; `what` describes the exit. Its
    /// endpoint leaves the snapshot. An exit before ready of a slot not being stopped counts
    /// towards `Failing`.
    pub(crate) fn slot_exited(
        &self,
        index: u32,
        before_ready: bool,
        what: &str,
        p: &RestartPolicy,
    ) {
        self.update(|st| {
            // A slot already told to stop is going away: its exit is no evidence of a crash
            // loop (and must not re-fail a revision just scaled to 0).
            let stopping = st
                .slot_mut(index)
                .is_some_and(|s| s.state == ReplicaState::Terminating);
            if before_ready && !stopping {
                st.consecutive_crashes = st.consecutive_crashes.saturating_add(1);
                if p.is_failing(st.consecutive_crashes) {
                    st.crash_failure =
                        Some(policy::crash_reason(what, p.reason_quotes_output).into());
                }
            }
            if let Some(s) = st.slot_mut(index) {
                if s.state != ReplicaState::Terminating {
                    s.state = ReplicaState::Backoff;
                }
                s.pid = None;
                s.addr = None;
                s.advertised = false;
            }
        });
    }

    /// Slot `index` starts a replacement process.
    pub(crate) fn slot_restarting(&self, index: u32) {
        self.handles.restarts.inc();
        self.update(|st| {
            st.restarts += 1;
            if let Some(s) = st.slot_mut(index) {
                s.restarts = s.restarts.saturating_add(1);
            }
        });
    }

    /// Slot `index`'s supervisor ended: the slot and its endpoint disappear.
    pub(crate) fn slot_gone(&self, index: u32) {
        self.update(|st| st.slots.retain(|s| s.index != index));
    }

    /// The activator has nothing in flight to `addr`: stop its replica now.
    pub(crate) fn drained(&self, addr: SocketAddr) {
        let st = self.lock();
        for s in &st.slots {
            if s.state == ReplicaState::Terminating && s.addr == Some(addr) {
                s.stop.send_replace(StopSignal::Now);
            }
        }
    }
}

fn failing_reason(snap: &EndpointSnapshot) -> Option<Arc<str>> {
    match &snap.status {
        EndpointStatus::Ok => None,
        EndpointStatus::Failing { reason } => Some(reason.clone()),
    }
}

#[cfg(test)]
mod tests;
