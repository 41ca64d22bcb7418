//! The bounds of a hold and why a request was refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

use tokio::time::Duration;

/// The activator-wide budget of held requests (`max-held-requests`), shared by every revision's
/// throttler. Lock-free.
#[derive(Debug, Default)]
pub struct HeldBudget {
    held: AtomicU32,
}

impl HeldBudget {
    /// Takes one unit if fewer than `cap` are held.
    pub(super) fn try_take(&self, cap: u32) -> bool {
        self.held
            .fetch_update(SeqCst, SeqCst, |n| (n < cap).then_some(n + 1))
            .is_ok()
    }

    pub(super) fn give_back(&self) {
        self.held.fetch_sub(1, SeqCst);
    }

    /// Requests held across all revisions now.
    pub fn held(&self) -> u32 {
        self.held.load(SeqCst)
    }
}

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Rejection {
    /// The revision's queue holds `depth` requests already.
    #[error("revision queue full ({depth} requests held)")]
    QueueFull {
        /// The revision's queue depth.
        depth: u32,
    },
    /// The activator-wide cap is reached.
    #[error("activator holds its maximum of {cap} requests")]
    HeldCapReached {
        /// `max-held-requests`.
        cap: u32,
    },
    /// The platform reports the revision Failing, with this reason.
    #[error("revision is failing: {0}")]
    Failing(Arc<str>),
    /// The revision left the catalog.
    #[error("revision was removed")]
    Removed,
    /// Held past the revision's cold-wait (or total) timeout.
    #[error("no endpoint became ready within {waited:?}")]
    HoldTimeout {
        /// How long it was held.
        waited: Duration,
    },
}

/// Bounds for one hold, read from the live config and the revision's spec per request.
#[derive(Debug, Clone, Copy)]
pub struct HoldLimits {
    /// The revision's queue depth.
    pub queue_depth: u32,
    /// The activator-wide held-requests cap.
    pub max_held: u32,
}
