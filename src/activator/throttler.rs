//! Per-revision capacity and the bounded, FIFO wait queue (the limiter's [`WaitQueue`]: the
//! queue sidecar's `crate::limiter::Limiter` is the same queue over a plain count).
//!
//! Capacity is containerConcurrency × ready endpoints (unbounded per endpoint at cc 0). A request
//! takes a slot on one endpoint (the [`Balancer`] picks and reserves it) and holds it in an
//! [`InFlight`] guard; dropping the guard gives the slot back, so a cancelled request can never
//! leak capacity.
//!
//! When no endpoint has room the request waits in the revision's queue, bounded by the
//! revision's `queue_depth` and by a [`HeldBudget`] shared by every revision. Waiters are served
//! strictly in arrival order, and only when something frees capacity: a finished request hands
//! its slot on, an endpoint update dispatches to the new endpoints. There is no polling and no
//! re-enqueue loop.
//!
//! Wake-up without a lost slot: a releaser decrements the endpoint's count and then reads the
//! queue's waiter count; a waiter increments the waiter count (under the queue lock) and then
//! picks. Both are `SeqCst`, so at least one side sees the other and a free slot is never left
//! unused while someone waits.
//!
//! Warm-up at containerConcurrency 0: an endpoint that appears while requests are held gets a
//! limit of `initial_burst` in flight. Held requests flow to it at that pace — the burst at once,
//! then one per finished request — until the revision holds nothing, when the limit is lifted.
//! At cc > 0 the per-endpoint limit (cc) already paces a waking pod.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use arc_swap::{ArcSwap, ArcSwapOption};
use prometheus_client::metrics::gauge::Gauge;
use tokio::time::{Duration, Instant};

use super::balancer::{Balancer, Policy};
use super::endpoint::{Endpoint, UNLIMITED};
use crate::percore::{LocalArc, PerCoreArc};
use crate::platform::{EndpointSnapshot, EndpointStatus};

use crate::limiter::{WaitEnd, WaitQueue, Waiting};
pub use limits::{HeldBudget, HoldLimits, Rejection};
use queue::{Outcome, Queue};

/// A slot on one endpoint. Dropping it gives the slot back and hands it to the next waiter.
#[derive(Debug)]
pub struct InFlight {
    /// Both through their core's handle (`super::percore`): taking and giving back a slot
    /// writes no reference count the other workers write too.
    shared: LocalArc<Shared>,
    endpoint: LocalArc<Endpoint>,
}

impl InFlight {
    /// The endpoint to forward to.
    pub fn addr(&self) -> SocketAddr {
        self.endpoint.addr()
    }

    /// The endpoint's accounting (its authority and Host value are formatted once).
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.endpoint.release() {
            (self.shared.on_drained)(self.endpoint.addr());
        }
        if self.shared.queued.load(SeqCst) > 0 {
            self.shared.dispatch();
        }
    }
}

/// An admitted request: its slot, and how long it was held (None when it never waited).
#[derive(Debug)]
pub struct Admission {
    /// The slot.
    pub in_flight: InFlight,
    /// How long the request waited in the queue.
    pub held_for: Option<Duration>,
}

/// One revision's throttler. Cheap to clone (one `Arc` per core).
#[derive(Clone)]
pub struct Throttler {
    shared: PerCoreArc<Shared>,
}

impl std::fmt::Debug for Throttler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Throttler")
            .field("ready", &self.ready_count())
            .field("held", &self.held())
            .finish()
    }
}

/// The endpoints one request can be admitted to, swapped whole on every update.
#[derive(Debug)]
struct EndpointSet {
    /// Sorted by address.
    ready: Vec<PerCoreArc<Endpoint>>,
    terminating: Vec<PerCoreArc<Endpoint>>,
    balancer: Arc<Balancer>,
    /// The snapshot's `reach_pending`: no ready endpoint yet only because the activator is
    /// probing how to reach the revision's ready pods (not cold).
    reach_pending: bool,
}

struct Shared {
    endpoints: ArcSwap<EndpointSet>,
    /// The reason while the platform reports the revision Failing.
    failing: ArcSwapOption<Arc<str>>,
    queue: Mutex<Queue>,
    /// Serialises `update` (the endpoint task and spec changes), so two updates never build
    /// different `Endpoint`s for one address.
    update_lock: Mutex<()>,
    /// Live waiters; mirrors `Queue::live` for the lock-free fast path and release check.
    queued: AtomicUsize,
    budget: Arc<HeldBudget>,
    /// The held-request count of the revision's namespace (in `budget`).
    ns_held: Arc<std::sync::atomic::AtomicU32>,
    /// The revision's `thaw_activator_held_requests` gauge, moved with `queued`.
    held_gauge: Gauge,
    on_drained: Box<dyn Fn(SocketAddr) + Send + Sync>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("queued", &self.queued)
            .finish()
    }
}

impl Throttler {
    /// A throttler with no endpoints. `on_drained` is called (from whichever task releases the
    /// last slot, so it must not block) when a terminating endpoint has nothing left in flight.
    /// `held_gauge` follows the number of held requests.
    pub fn new(
        budget: Arc<HeldBudget>,
        namespace: &Arc<str>,
        held_gauge: Gauge,
        on_drained: Box<dyn Fn(SocketAddr) + Send + Sync>,
    ) -> Self {
        Self {
            shared: PerCoreArc::new(Arc::new(Shared {
                endpoints: ArcSwap::from_pointee(EndpointSet {
                    ready: Vec::new(),
                    terminating: Vec::new(),
                    balancer: Arc::new(Balancer::new(Policy::RandomChoiceOfTwo)),
                    reach_pending: false,
                }),
                failing: ArcSwapOption::empty(),
                queue: Mutex::new(Queue {
                    waiters: WaitQueue::default(),
                    removed: false,
                }),
                update_lock: Mutex::new(()),
                queued: AtomicUsize::new(0),
                ns_held: budget.namespace(namespace),
                budget,
                held_gauge,
                on_drained,
            })),
        }
    }

    /// Admits at once if a slot is free and nobody is waiting (FIFO: a newcomer never overtakes
    /// a held request). Lock-free.
    #[inline]
    pub fn try_acquire(&self) -> Option<InFlight> {
        let s = &self.shared;
        if s.queued.load(SeqCst) > 0 {
            return None;
        }
        let set = s.endpoints.load();
        let endpoint = set.balancer.pick(&set.ready)?;
        Some(InFlight {
            shared: s.local(),
            endpoint: endpoint.local(),
        })
    }

    /// A slot on any ready endpoint other than `avoid` (for a retry after a connect failure),
    /// without waiting; one that is not ejected if there is one with room. Ignores the queue:
    /// the caller was already admitted once.
    pub fn try_acquire_avoiding(&self, avoid: &[SocketAddr]) -> Option<InFlight> {
        let set = self.shared.endpoints.load();
        let candidates = || set.ready.iter().filter(|e| !avoid.contains(&e.addr()));
        let endpoint = candidates()
            .find(|e| !e.is_ejected() && e.has_room() && e.try_reserve())
            .or_else(|| candidates().find(|e| e.has_room() && e.try_reserve()))?;
        Some(InFlight {
            shared: self.shared.local(),
            endpoint: endpoint.local(),
        })
    }

    /// Admits the request, holding it in the queue until a slot frees, the revision fails or is
    /// removed, or `deadline` passes. Refuses at once when the revision is failing or a queue
    /// bound is reached. Cancel-safe: dropping the future leaves the queue and returns any slot
    /// it was handed.
    pub async fn acquire(
        &self,
        limits: HoldLimits,
        deadline: Instant,
    ) -> Result<Admission, Rejection> {
        if let Some(reason) = self.shared.failing_reason() {
            return Err(Rejection::Failing(reason));
        }
        if let Some(in_flight) = self.try_acquire() {
            return Ok(Admission {
                in_flight,
                held_for: None,
            });
        }
        let started = Instant::now();
        let waiting = self.enqueue(limits)?;
        // A slot dispatched in the same instant the deadline fired is still taken.
        let outcome = match waiting.wait(deadline).await {
            Ok(outcome) => outcome,
            // The sender is only dropped by `remove`'s drain, which sends first.
            Err(WaitEnd::Closed) => Err(Rejection::Removed),
            Err(WaitEnd::Deadline) => Err(Rejection::HoldTimeout {
                waited: started.elapsed(),
            }),
        };
        outcome.map(|in_flight| Admission {
            in_flight,
            held_for: Some(started.elapsed()),
        })
    }

    fn enqueue(&self, limits: HoldLimits) -> Result<Waiting<Outcome, Shared>, Rejection> {
        let s = &self.shared;
        let mut q = s.lock();
        if q.removed {
            return Err(Rejection::Removed);
        }
        if let Some(reason) = s.failing_reason() {
            return Err(Rejection::Failing(reason));
        }
        if q.waiters.live() >= limits.queue_depth as usize {
            return Err(Rejection::QueueFull {
                depth: limits.queue_depth,
            });
        }
        s.budget
            .try_take(&s.ns_held, limits.max_held, limits.max_held_namespace)?;
        let rx = q.waiters.push();
        s.queued.fetch_add(1, SeqCst);
        s.held_gauge.inc();
        let leftover = s.shared().dispatch_locked(&mut q);
        drop(q);
        drop(leftover);
        Ok(Waiting::new(s.shared().clone(), rx))
    }

    /// Applies an endpoint snapshot: new endpoints get limits for `container_concurrency`
    /// (warm-up bursts of `initial_burst` at cc 0 while requests are held), endpoints that left
    /// `ready` stop receiving requests, idle terminating ones are reported drained, and held
    /// requests are dispatched — or, when the status is Failing, answered at once.
    pub fn update(
        &self,
        snapshot: &EndpointSnapshot,
        container_concurrency: u32,
        initial_burst: u32,
    ) {
        let s = &self.shared;
        let _serial = s.update_lock.lock().unwrap_or_else(|p| p.into_inner());
        let old = s.endpoints.load_full();
        let mut known: HashMap<SocketAddr, PerCoreArc<Endpoint>> = old
            .ready
            .iter()
            .chain(old.terminating.iter())
            .map(|e| (e.addr(), e.clone()))
            .collect();
        let held = s.queued.load(SeqCst) > 0;
        let mut ready: Vec<PerCoreArc<Endpoint>> = Vec::with_capacity(snapshot.ready.len());
        for addr in &snapshot.ready {
            let e = known
                .remove(addr)
                .unwrap_or_else(|| PerCoreArc::new(Arc::new(Endpoint::new(*addr, UNLIMITED))));
            e.revive();
            match container_concurrency {
                0 if e.is_warming() => {}
                0 if held && initial_burst > 0 && e.in_flight() == 0 => {
                    e.set_limit(initial_burst, true)
                }
                0 => e.set_limit(UNLIMITED, false),
                cc => e.set_limit(snapshot.limit.unwrap_or(cc), false),
            }
            ready.push(e);
        }
        ready.sort_by_key(|e| e.addr());
        ready.dedup_by_key(|e| e.addr());
        let mut terminating = Vec::with_capacity(snapshot.terminating.len());
        for addr in &snapshot.terminating {
            let e = known
                .remove(addr)
                .unwrap_or_else(|| PerCoreArc::new(Arc::new(Endpoint::new(*addr, UNLIMITED))));
            if e.terminate() {
                (s.on_drained)(*addr);
            }
            terminating.push(e);
        }
        for gone in known.into_values() {
            gone.retire();
        }
        let policy = Policy::for_concurrency(container_concurrency);
        let balancer = if old.balancer.policy() == policy {
            old.balancer.clone() // keeps the round-robin cursor
        } else {
            Arc::new(Balancer::new(policy))
        };
        s.endpoints.store(Arc::new(EndpointSet {
            ready,
            terminating,
            balancer,
            reach_pending: snapshot.reach_pending,
        }));
        match &snapshot.status {
            EndpointStatus::Failing { reason } => {
                s.failing.store(Some(Arc::new(reason.clone())));
                self.reject_all(Rejection::Failing(reason.clone()));
            }
            EndpointStatus::Ok => {
                s.failing.store(None);
                s.shared().dispatch();
            }
        }
    }

    /// Dispatches held requests again after `delay` (from a task on the calling runtime): an
    /// ejection that ends frees capacity no slot release or endpoint update announces. Holds
    /// the throttler weakly, so a removed revision is not kept alive by it.
    pub fn dispatch_after(&self, delay: std::time::Duration) {
        let shared = Arc::downgrade(self.shared.shared());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Some(shared) = shared.upgrade() {
                shared.dispatch();
            }
        });
    }

    /// The revision left the catalog: held requests are answered `why` (`Removed`, or the
    /// platform's failure reason) and nothing is admitted any more.
    pub fn remove(&self, why: Rejection) {
        self.shared.lock().removed = true;
        self.reject_all(why);
    }

    fn reject_all(&self, why: Rejection) {
        let s = &self.shared;
        let mut q = s.lock();
        let answered = q.waiters.answer_all(|| Err(why.clone()));
        for _ in 0..answered {
            s.left_queue();
        }
    }

    /// Requests waiting now.
    pub fn held(&self) -> usize {
        self.shared.queued.load(SeqCst)
    }

    /// Ready endpoints now.
    pub fn ready_count(&self) -> usize {
        self.shared.endpoints.load().ready.len()
    }

    /// The platform's failure reason while the revision is Failing.
    pub fn failing(&self) -> Option<Arc<str>> {
        self.shared.failing_reason()
    }

    /// Cold: no ready endpoint, none about to be (the platform's ready pods while the activator
    /// probes how to reach them, [`EndpointSnapshot::reach_pending`]), and not failing: a
    /// request would wait for a cold start.
    pub fn is_cold(&self) -> bool {
        let set = self.shared.endpoints.load();
        set.ready.is_empty() && !set.reach_pending && self.failing().is_none()
    }

    /// Per endpoint: address, in flight, limit (`None` = unlimited), terminating, ejected.
    pub fn endpoints(&self) -> Vec<EndpointView> {
        let set = self.shared.endpoints.load();
        set.ready
            .iter()
            .chain(set.terminating.iter())
            .map(|e| EndpointView {
                addr: e.addr(),
                in_flight: e.in_flight(),
                limit: (e.limit() != UNLIMITED).then(|| e.limit()),
                terminating: e.is_terminating(),
                ejected: e.is_ejected(),
            })
            .collect()
    }
}

/// A read-only view of one endpoint, for the admin API and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointView {
    /// The endpoint.
    pub addr: SocketAddr,
    /// Requests in flight to it.
    pub in_flight: u32,
    /// Its limit; `None` = unlimited.
    pub limit: Option<u32>,
    /// Whether it left `ready`.
    pub terminating: bool,
    /// Whether it is ejected after a failed connect (passed over while another endpoint is not).
    pub ejected: bool,
}

mod limits;
mod queue;

#[cfg(test)]
mod tests;
