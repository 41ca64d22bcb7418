//! The pure model of one revision's replica set: slots, their states, the crash count, the
//! endpoint snapshot they imply, and which slots to start or stop for a desired count.
//! No I/O and no clock; [`super::state::RevisionEntry`] wraps it in a lock and publishes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::LocalRevision;
use super::status::ReplicaState;
use crate::platform::{EndpointSnapshot, EndpointStatus};

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
    pub consecutive_crashes: u32,
    pub crash_failure: Option<Arc<str>>,
    pub last_startup: Option<Duration>,
    pub restarts: u64,
}

/// Slots created by a reconcile, whose supervisors the caller must start.
pub(crate) type NewSlots = Vec<(u32, watch::Receiver<StopSignal>)>;

impl RevState {
    pub(crate) fn slot_mut(&mut self, index: u32) -> Option<&mut Slot> {
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
            limit: None,
            ready,
            terminating,
            starting: Vec::new(),
            status,
            reach_pending: false,
            // Local replicas are `thaw queue` or the app itself.
            queue_proxy: false,
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
