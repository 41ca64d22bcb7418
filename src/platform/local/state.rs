//! One revision's replica set: the slots, the crash count, and the endpoint snapshot and
//! gauges derived from them. Every change goes through a short critical section (no await
//! under the lock) that ends by publishing the snapshot.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::watch;
use tokio::time::Instant;

use super::LocalRevision;
use super::policy::{self, RestartPolicy};
use super::status::{ReplicaState, ReplicaStatus, RevisionStatus};
use crate::platform::{EndpointSnapshot, EndpointStatus};
use crate::revision::RevisionKey;
use crate::telemetry::platform::{
    ExitLabels, ExitReason, PlatformMetrics, ReplicaStateLabel, ReplicaStateLabels, RevisionLabels,
};

/// What a replica's supervisor is told to do; sent on its watch channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopSignal {
    Run,
    /// Its endpoint is terminating: stop once drained, or after the drain bound.
    Drain,
    /// Stop now (drained, never ready, removal or shutdown).
    Now,
}

/// One replica slot: kept running by its supervisor task until told to stop.
#[derive(Debug)]
pub(crate) struct Slot {
    pub index: u32,
    pub state: ReplicaState,
    /// Whether its endpoint is listed in the snapshot's `terminating` (it was ready when asked
    /// to stop).
    pub advertised: bool,
    pub pid: Option<u32>,
    pub addr: Option<SocketAddr>,
    pub started_at: Option<Instant>,
    pub ready_after: Option<Duration>,
    pub restarts: u32,
    pub stop: watch::Sender<StopSignal>,
}

/// Mutable state of one revision.
#[derive(Debug, Default)]
pub(crate) struct RevState {
    /// The definition new processes are started from; `None` until upserted and after removal.
    pub def: Option<Arc<LocalRevision>>,
    pub removed: Option<Arc<str>>,
    pub desired: u32,
    pub slots: Vec<Slot>,
    next_index: u32,
    consecutive_crashes: u32,
    crash_failure: Option<Arc<str>>,
    last_startup: Option<Duration>,
    restarts: u64,
}

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

/// Slots created by a reconcile, whose supervisors the caller must start.
pub(crate) type NewSlots = Vec<(u32, watch::Receiver<StopSignal>)>;

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
                    st.crash_failure = Some(policy::crash_reason(what).into());
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

impl RevState {
    fn slot_mut(&mut self, index: u32) -> Option<&mut Slot> {
        self.slots.iter_mut().find(|s| s.index == index)
    }

    /// The endpoint snapshot this state implies.
    pub(crate) fn snapshot(&self) -> EndpointSnapshot {
        let mut ready = Vec::new();
        let mut terminating = Vec::new();
        for s in &self.slots {
            match (s.state, s.addr) {
                (ReplicaState::Ready, Some(a)) => ready.push(a),
                (ReplicaState::Terminating, Some(a)) if s.advertised => terminating.push(a),
                _ => {}
            }
        }
        let status = match (&self.removed, &self.crash_failure) {
            (Some(r), _) | (None, Some(r)) => EndpointStatus::Failing { reason: r.clone() },
            (None, None) => EndpointStatus::Ok,
        };
        EndpointSnapshot {
            ready,
            terminating,
            status,
        }
    }

    /// Scale request: a new desired count. Scaling to 0 clears the crash count and `Failing`.
    pub(crate) fn set_desired(&mut self, n: u32) {
        self.desired = n;
        if n == 0 {
            self.consecutive_crashes = 0;
            self.crash_failure = None;
        }
    }

    /// Brings the number of live (not terminating) slots to `desired`: stops surplus slots
    /// (ready ones drain first; see [`pick_victims`]) and creates missing ones when `can_start`.
    pub(crate) fn reconcile(&mut self, can_start: bool) -> NewSlots {
        let live: Vec<(u32, ReplicaState)> = self
            .slots
            .iter()
            .filter(|s| s.state != ReplicaState::Terminating)
            .map(|s| (s.index, s.state))
            .collect();
        let want = self.desired as usize;
        let mut created = Vec::new();
        if live.len() > want {
            for index in pick_victims(&live, live.len() - want) {
                if let Some(s) = self.slot_mut(index) {
                    let drain = s.state == ReplicaState::Ready;
                    s.advertised = drain;
                    s.state = ReplicaState::Terminating;
                    s.stop.send_replace(if drain {
                        StopSignal::Drain
                    } else {
                        StopSignal::Now
                    });
                }
            }
        } else if can_start && self.def.is_some() {
            for _ in live.len()..want {
                let index = self.next_index;
                self.next_index += 1;
                let (stop, rx) = watch::channel(StopSignal::Run);
                self.slots.push(Slot {
                    index,
                    state: ReplicaState::Backoff,
                    advertised: false,
                    pid: None,
                    addr: None,
                    started_at: None,
                    ready_after: None,
                    restarts: 0,
                    stop,
                });
                created.push((index, rx));
            }
        }
        created
    }

    /// Tells every slot to stop now (shutdown).
    pub(crate) fn stop_all_now(&mut self) {
        self.desired = 0;
        for s in &mut self.slots {
            if s.state != ReplicaState::Terminating {
                s.advertised = s.state == ReplicaState::Ready;
                s.state = ReplicaState::Terminating;
            }
            s.stop.send_replace(StopSignal::Now);
        }
    }
}

/// Chooses `n` of the live slots `(index, state)` to stop: those not serving first (backing
/// off, then starting), then the newest ready ones.
pub(crate) fn pick_victims(live: &[(u32, ReplicaState)], n: usize) -> Vec<u32> {
    let rank = |s: ReplicaState| match s {
        ReplicaState::Backoff => 0,
        ReplicaState::Starting => 1,
        ReplicaState::Ready | ReplicaState::Terminating => 2,
    };
    let mut order: Vec<(u32, ReplicaState)> = live.to_vec();
    order.sort_by_key(|&(index, state)| (rank(state), std::cmp::Reverse(index)));
    order.into_iter().take(n).map(|(i, _)| i).collect()
}

fn failing_reason(snap: &EndpointSnapshot) -> Option<Arc<str>> {
    match &snap.status {
        EndpointStatus::Ok => None,
        EndpointStatus::Failing { reason } => Some(reason.clone()),
    }
}

#[cfg(test)]
mod tests;
