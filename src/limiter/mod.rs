//! Concurrency limits with a bounded wait queue, free of revisions and endpoints.
//!
//! - [`WaitQueue`] and [`Waiting`] (in [`queue`]): the bounded, FIFO, cancel-safe queue of
//!   waiters. The activator's throttler holds its requests in one (its capacity is a slot on
//!   one of a revision's endpoints); [`Limiter`] holds permits in one.
//! - [`Limiter`]: at most `limit` permits out at once (0 = unlimited); more callers wait in
//!   arrival order, at most `queue_depth` of them; the rest are refused at once. The queue
//!   sidecar enforces containerConcurrency with it as it is.
//!
//! Room for this module: tokio, nothing else of thaw.
//!
//! Wake-up without a lost permit (the throttler's rule too): a releaser decrements the count and
//! then reads the waiter count; a waiter increments the waiter count (under the queue's lock)
//! and then tries to take a permit. Both are `SeqCst`, so at least one side sees the other and a
//! free permit is never left unused while someone waits.

pub mod queue;

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use tokio::time::{Duration, Instant};

pub use queue::{QueueOwner, WaitEnd, WaitQueue, Waiting};

/// A concurrency limit with a bounded FIFO wait queue (see the module doc). Cheap to clone;
/// clones share the limit.
#[derive(Debug, Clone)]
pub struct Limiter {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// Permits out at once; 0 = unlimited.
    limit: u32,
    /// Waiters at most.
    queue_depth: usize,
    /// Permits out now.
    in_flight: AtomicU32,
    /// Live waiters; mirrors the queue's count for the lock-free fast path and release check.
    queued: AtomicUsize,
    queue: Mutex<WaitQueue<Permit>>,
}

/// One admitted caller. Dropping it gives the permit back, to the first waiter if there is one.
#[derive(Debug)]
pub struct Permit {
    shared: Arc<Shared>,
}

/// Why a caller was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    /// `depth` callers wait already.
    #[error("queue full ({depth} waiting)")]
    QueueFull {
        /// The queue depth.
        depth: usize,
    },
    /// No permit freed before the deadline.
    #[error("no capacity within {waited:?}")]
    Timeout {
        /// How long it waited.
        waited: Duration,
    },
}

impl Limiter {
    /// At most `limit` permits at once (0 = unlimited: never waits), and at most `queue_depth`
    /// callers waiting (0 = refuse at once when full).
    pub fn new(limit: u32, queue_depth: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                limit,
                queue_depth,
                in_flight: AtomicU32::new(0),
                queued: AtomicUsize::new(0),
                queue: Mutex::new(WaitQueue::default()),
            }),
        }
    }

    /// A permit now if one is free and nobody waits (FIFO: a newcomer never overtakes a
    /// waiter). Lock-free.
    pub fn try_acquire(&self) -> Option<Permit> {
        let s = &self.shared;
        if s.queued.load(SeqCst) > 0 {
            return None;
        }
        s.take().then(|| Permit { shared: s.clone() })
    }

    /// A permit, waiting in the queue until one frees or `deadline` passes; refused at once
    /// when the queue is full. Cancel-safe: dropping the future leaves the queue, and a permit
    /// handed meanwhile goes to the next waiter.
    pub async fn acquire(&self, deadline: Instant) -> Result<Permit, Rejected> {
        if let Some(p) = self.try_acquire() {
            return Ok(p);
        }
        let started = Instant::now();
        let s = &self.shared;
        let (rx, leftover) = {
            let mut q = s.lock();
            if q.live() >= s.queue_depth {
                return Err(Rejected::QueueFull {
                    depth: s.queue_depth,
                });
            }
            let rx = q.push();
            s.queued.fetch_add(1, SeqCst);
            (rx, s.dispatch_locked(&mut q))
        };
        drop(leftover);
        match Waiting::new(s.clone(), rx).wait(deadline).await {
            Ok(permit) => Ok(permit),
            // The sender is dropped without a permit only if the limiter is dropped, which
            // this caller's handle prevents; answer as a timeout all the same.
            Err(WaitEnd::Deadline | WaitEnd::Closed) => Err(Rejected::Timeout {
                waited: started.elapsed(),
            }),
        }
    }

    /// Permits out now.
    pub fn in_flight(&self) -> u32 {
        self.shared.in_flight.load(SeqCst)
    }

    /// Callers waiting now.
    pub fn queued(&self) -> usize {
        self.shared.queued.load(SeqCst)
    }

    /// The limit (0 = unlimited).
    pub fn limit(&self) -> u32 {
        self.shared.limit
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, WaitQueue<Permit>> {
        // Every change under this lock is a single step, so a poisoned lock is still usable.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes one permit's worth of capacity if there is some.
    fn take(&self) -> bool {
        if self.limit == 0 {
            self.in_flight.fetch_add(1, SeqCst);
            return true;
        }
        self.in_flight
            .fetch_update(SeqCst, SeqCst, |n| (n < self.limit).then_some(n + 1))
            .is_ok()
    }

    /// Hands free capacity to waiters in FIFO order while both exist. Returns permits that
    /// could not be delivered, for the caller to drop after unlocking.
    fn dispatch_locked(self: &Arc<Self>, q: &mut WaitQueue<Permit>) -> Vec<Permit> {
        let mut leftover = Vec::new();
        while q.has_live_front() && self.take() {
            self.queued.fetch_sub(1, SeqCst);
            if let Err(p) = q.hand_first(Permit {
                shared: self.clone(),
            }) {
                leftover.push(p);
            }
        }
        leftover
    }
}

impl QueueOwner<Permit> for Shared {
    fn with_queue<R>(&self, f: impl FnOnce(&mut WaitQueue<Permit>) -> R) -> R {
        f(&mut self.lock())
    }

    fn waiter_left(&self, _queue: &mut WaitQueue<Permit>) {
        self.queued.fetch_sub(1, SeqCst);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let s = &self.shared;
        s.in_flight.fetch_sub(1, SeqCst);
        if s.queued.load(SeqCst) > 0 {
            let leftover = s.dispatch_locked(&mut s.lock());
            drop(leftover); // outside the lock: dropping a permit dispatches again
        }
    }
}

#[cfg(test)]
mod tests;
