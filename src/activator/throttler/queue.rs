//! The throttler's side of its wait queue ([`crate::limiter::WaitQueue`]): FIFO hand-off of
//! freed slots to held requests, and the accounting when a held request leaves.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, MutexGuard};

use super::{EndpointSet, InFlight, Rejection, Shared};
use crate::limiter::{QueueOwner, WaitQueue};
use crate::percore::LocalArc;

/// What a held request waits for: a slot, or the reason it gets none.
pub(super) type Outcome = Result<InFlight, Rejection>;

pub(super) struct Queue {
    /// Held requests in arrival order.
    pub(super) waiters: WaitQueue<Outcome>,
    /// Set when the revision is removed: nothing is admitted any more.
    pub(super) removed: bool,
}

impl Shared {
    /// Accounting for one held request leaving the queue (admitted, rejected or gone); the
    /// queue's own count moved already.
    pub(super) fn left_queue(&self) {
        self.queued.fetch_sub(1, SeqCst);
        self.budget.give_back(&self.ns_held);
        self.held_gauge.dec();
    }

    pub(super) fn failing_reason(&self) -> Option<Arc<str>> {
        self.failing.load().as_deref().cloned()
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic while holding this lock leaves the queue consistent (every mutation is a
        // single step), so a poisoned lock is still usable.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn dispatch(self: &Arc<Self>) {
        let mut q = self.lock();
        let leftover = self.dispatch_locked(&mut q);
        drop(q);
        drop(leftover); // released outside the lock: dropping a slot may dispatch again
    }

    /// Hands free slots to waiters in FIFO order while both exist. Returns slots that could not
    /// be delivered; the caller drops them after unlocking.
    pub(super) fn dispatch_locked(self: &Arc<Self>, q: &mut Queue) -> Vec<InFlight> {
        let mut leftover = Vec::new();
        if q.waiters.live() == 0 || self.failing.load().is_some() {
            return leftover;
        }
        let set = self.endpoints.load();
        while q.waiters.has_live_front() {
            let Some(endpoint) = set.balancer.pick(&set.ready) else {
                break;
            };
            self.left_queue();
            let slot = InFlight {
                shared: LocalArc::from_shared(self.clone()),
                endpoint: endpoint.local(),
            };
            // Waiters only close under this lock, so this cannot fail; keep the slot if it
            // somehow does rather than drop it under the lock.
            if let Err(Ok(slot)) = q.waiters.hand_first(Ok(slot)) {
                leftover.push(slot);
            }
        }
        if q.waiters.live() == 0 {
            self.end_warm_ups(&set);
        }
        leftover
    }

    /// Nothing is held any more: lift every warm-up limit (containerConcurrency 0).
    pub(super) fn end_warm_ups(&self, set: &EndpointSet) {
        for e in &set.ready {
            e.end_warm_up();
        }
    }
}

impl QueueOwner<Outcome> for Shared {
    fn with_queue<R>(&self, f: impl FnOnce(&mut WaitQueue<Outcome>) -> R) -> R {
        f(&mut self.lock().waiters)
    }

    fn waiter_left(&self, queue: &mut WaitQueue<Outcome>) {
        self.left_queue();
        if queue.live() == 0 {
            self.end_warm_ups(&self.endpoints.load());
        }
    }
}
