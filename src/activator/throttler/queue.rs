//! The waiter queue: FIFO hand-off of freed slots to held requests, and cancellation that
//! leaves the queue consistent.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, MutexGuard};

use tokio::sync::oneshot;

use super::{EndpointSet, InFlight, Rejection, Shared};
use crate::percore::LocalArc;

pub(super) struct Queue {
    /// Waiters in arrival order. Entries whose waiter gave up stay until dispatch or compaction
    /// skips them (their sender reports closed); `live` counts the others.
    pub(super) waiters: VecDeque<oneshot::Sender<Result<InFlight, Rejection>>>,
    pub(super) live: usize,
    /// Set when the revision is removed: nothing is admitted any more.
    pub(super) removed: bool,
}

impl Shared {
    /// Accounting for one live waiter leaving the queue (admitted, rejected or gone).
    pub(super) fn left_queue(&self, q: &mut Queue) {
        q.live -= 1;
        self.queued.fetch_sub(1, SeqCst);
        self.budget.give_back();
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
        if q.live == 0 || self.failing.load().is_some() {
            return leftover;
        }
        let set = self.endpoints.load();
        while q.live > 0 {
            let Some(head) = q.waiters.front() else { break };
            if head.is_closed() {
                q.waiters.pop_front();
                continue;
            }
            let Some(endpoint) = set.balancer.pick(&set.ready) else {
                break;
            };
            let tx = q.waiters.pop_front().expect("front exists");
            self.left_queue(q);
            let slot = InFlight {
                shared: LocalArc::from_shared(self.clone()),
                endpoint: endpoint.local(),
            };
            // Waiters only close under this lock (Waiting::cancel), so this cannot fail; keep the
            // slot if it somehow does rather than drop it under the lock.
            if let Err(Ok(slot)) = tx.send(Ok(slot)) {
                leftover.push(slot);
            }
        }
        if q.live == 0 {
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

/// A queued request's side of the queue. Dropping it (cancellation) leaves the queue under the
/// lock, so dispatch never hands a slot to a waiter that is gone.
pub(super) struct Waiting {
    pub(super) shared: Arc<Shared>,
    pub(super) rx: oneshot::Receiver<Result<InFlight, Rejection>>,
    /// Set once the outcome was taken; nothing left to clean up.
    pub(super) done: bool,
}

impl Waiting {
    /// Leaves the queue. Returns the outcome if one was delivered before the lock was taken.
    pub(super) fn cancel(&mut self) -> Option<Result<InFlight, Rejection>> {
        let s = &self.shared;
        let mut q = s.lock();
        self.rx.close();
        match self.rx.try_recv() {
            Ok(outcome) => {
                drop(q);
                Some(outcome)
            }
            Err(_) => {
                s.left_queue(&mut q);
                if q.live == 0 {
                    s.end_warm_ups(&s.endpoints.load());
                }
                None
            }
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if !self.done {
            // Any slot delivered meanwhile is dropped here, after the lock is released.
            drop(self.cancel());
        }
    }
}
