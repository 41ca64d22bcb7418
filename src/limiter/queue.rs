//! The bounded-queue half of a limiter: a FIFO of waiters, each handed one value, and the
//! waiter's cancel-safe side. The activator's throttler (whose values are endpoint slots) and
//! [`super::Limiter`] (whose values are permits) both keep one under their own lock.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::time::Instant;

/// Waiters in arrival order, each waiting for one `T`. Not locked itself: its owner keeps it
/// under the owner's lock, with whatever else must change in the same step.
///
/// Entries whose waiter gave up stay until a hand-off or a compaction skips them (their sender
/// reports closed); [`WaitQueue::live`] counts the others.
#[derive(Debug)]
pub struct WaitQueue<T> {
    waiters: VecDeque<oneshot::Sender<T>>,
    live: usize,
}

impl<T> Default for WaitQueue<T> {
    fn default() -> Self {
        Self {
            waiters: VecDeque::new(),
            live: 0,
        }
    }
}

impl<T> WaitQueue<T> {
    /// Waiters still waiting.
    pub fn live(&self) -> usize {
        self.live
    }

    /// Adds a waiter at the back (the owner has checked its bounds) and returns its side. Gone
    /// entries are compacted away once they outnumber the live ones, so the deque stays bounded
    /// by about twice the live count.
    pub fn push(&mut self) -> oneshot::Receiver<T> {
        let (tx, rx) = oneshot::channel();
        self.live += 1;
        if self.waiters.len() > 2 * self.live + 64 {
            self.waiters.retain(|w| !w.is_closed());
        }
        self.waiters.push_back(tx);
        rx
    }

    /// Whether a live waiter is at the front (gone ones before it are dropped on the way).
    pub fn has_live_front(&mut self) -> bool {
        while let Some(head) = self.waiters.front() {
            if !head.is_closed() {
                return self.live > 0;
            }
            self.waiters.pop_front();
        }
        false
    }

    /// Hands `value` to the first live waiter, which leaves the queue. Gives `value` back when
    /// no live waiter is left. (Waiters only close under the owner's lock, through
    /// [`Waiting::cancel`], so a waiter found live takes the value.)
    pub fn hand_first(&mut self, value: T) -> Result<(), T> {
        if !self.has_live_front() {
            return Err(value);
        }
        let tx = self.waiters.pop_front().expect("a live front");
        self.live -= 1;
        tx.send(value)
    }

    /// Answers every live waiter with `value()` and empties the queue; returns how many.
    pub fn answer_all(&mut self, mut value: impl FnMut() -> T) -> usize {
        let mut answered = 0;
        while let Some(w) = self.waiters.pop_front() {
            if w.is_closed() {
                continue;
            }
            self.live -= 1;
            answered += 1;
            let _ = w.send(value());
        }
        answered
    }

    /// A live waiter left without a value (it gave up): the count follows.
    fn left(&mut self) {
        self.live -= 1;
    }
}

/// Whoever owns a [`WaitQueue`]: gives it out under its lock, and learns when a waiter gives up.
pub trait QueueOwner<T>: Send + Sync + 'static {
    /// Runs `f` on the queue under the owner's lock.
    fn with_queue<R>(&self, f: impl FnOnce(&mut WaitQueue<T>) -> R) -> R;

    /// Called under the lock (the queue passed back in) when a live waiter gave up without a
    /// value: the owner's own accounting of waiters follows.
    fn waiter_left(&self, queue: &mut WaitQueue<T>);
}

/// Why a wait ended without a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    /// The deadline passed.
    Deadline,
    /// The owner dropped the waiter's sender without a value (it is going away).
    Closed,
}

/// A queued waiter's side. Dropping it (cancellation) leaves the queue under the owner's lock,
/// so a value is never handed to a waiter that is gone, and a value handed in the same instant
/// is dropped after the lock is released (dropping a slot may hand it on, which locks again).
pub struct Waiting<T: Send + 'static, O: QueueOwner<T>> {
    owner: Arc<O>,
    rx: oneshot::Receiver<T>,
    /// Set once the outcome was taken; nothing left to clean up.
    done: bool,
}

impl<T: Send + 'static, O: QueueOwner<T>> Waiting<T, O> {
    /// The waiter `rx` (from [`WaitQueue::push`]) of `owner`'s queue.
    pub fn new(owner: Arc<O>, rx: oneshot::Receiver<T>) -> Self {
        Self {
            owner,
            rx,
            done: false,
        }
    }

    /// Waits for the value until `deadline`. A value handed in the instant the deadline fired
    /// is still taken. Cancel-safe (see the type's doc).
    pub async fn wait(mut self, deadline: Instant) -> Result<T, WaitEnd> {
        let outcome = match tokio::time::timeout_at(deadline, &mut self.rx).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(_)) => Err(WaitEnd::Closed),
            Err(_) => self.cancel().ok_or(WaitEnd::Deadline),
        };
        self.done = true;
        outcome
    }

    /// Leaves the queue. Returns the value if one was handed before the lock was taken.
    fn cancel(&mut self) -> Option<T> {
        let owner = &self.owner;
        let rx = &mut self.rx;
        let outcome = owner.with_queue(|q| {
            rx.close();
            match rx.try_recv() {
                Ok(value) => Some(value),
                Err(_) => {
                    q.left();
                    owner.waiter_left(q);
                    None
                }
            }
        });
        self.done = true;
        outcome
    }
}

impl<T: Send + 'static, O: QueueOwner<T>> Drop for Waiting<T, O> {
    fn drop(&mut self) {
        if !self.done {
            // Any value handed meanwhile is dropped here, after the lock is released.
            drop(self.cancel());
        }
    }
}
