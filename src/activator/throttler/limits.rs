//! The bounds of a hold and why a request was refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

use tokio::time::Duration;

/// The activator-wide budget of held requests (`max-held-requests`), shared by every revision's
/// throttler. Lock-free.
#[derive(Debug, Default)]
pub struct HeldBudget {
    held: AtomicU32,
    /// Held requests per namespace (`max-held-requests-namespace-percentage`): one tenant's
    /// cold storm cannot take the whole budget from the others' cold starts.
    namespaces: dashmap::DashMap<Arc<str>, Arc<AtomicU32>>,
}

impl HeldBudget {
    /// The held-request count of namespace `ns` (shared by its revisions' throttlers).
    pub fn namespace(&self, ns: &Arc<str>) -> Arc<AtomicU32> {
        if let Some(c) = self.namespaces.get(ns) {
            return c.clone();
        }
        self.namespaces.entry(ns.clone()).or_default().clone()
    }

    /// Takes one unit for a request of the namespace counted by `ns` if the namespace holds
    /// fewer than `ns_cap` and the activator fewer than `cap`.
    pub(super) fn try_take(&self, ns: &AtomicU32, cap: u32, ns_cap: u32) -> Result<(), Rejection> {
        ns.fetch_update(SeqCst, SeqCst, |n| (n < ns_cap).then_some(n + 1))
            .map_err(|_| Rejection::NamespaceShareReached { cap: ns_cap })?;
        if self
            .held
            .fetch_update(SeqCst, SeqCst, |n| (n < cap).then_some(n + 1))
            .is_err()
        {
            ns.fetch_sub(1, SeqCst);
            return Err(Rejection::HeldCapReached { cap });
        }
        Ok(())
    }

    pub(super) fn give_back(&self, ns: &AtomicU32) {
        ns.fetch_sub(1, SeqCst);
        self.held.fetch_sub(1, SeqCst);
    }

    /// Requests held for namespace `ns` now.
    pub fn held_in(&self, ns: &str) -> u32 {
        self.namespaces.get(ns).map_or(0, |c| c.load(SeqCst))
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
    /// The revision's namespace holds its share of the activator's cap.
    #[error("the namespace holds its share of {cap} held requests")]
    NamespaceShareReached {
        /// `max-held-requests` × `max-held-requests-namespace-percentage` / 100.
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
    /// The most one namespace may hold.
    pub max_held_namespace: u32,
}
