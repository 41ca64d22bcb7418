//! Stats from activators and queue sidecars into per-revision windows (Knative's
//! `autoscaler/metrics/collector.go`; docs/architecture.md, "Knative's rules").
//!
//! Reporters send through [`crate::stats::StatSink`]; the scaler drains the
//! channel into a [`Collector`], which tests and `thaw simulate` also drive directly.
//!
//! Each revision keeps four [`Window`]s, as Knative does: stable and panic windows for
//! concurrency and for requests per second. Stats from different sources in the same second
//! add up to the revision's total. One source is never counted twice in a second: a second
//! report from the same source for the same second *replaces* its first (Knative adds both,
//! which caused spurious panics, serving#6743). A poke is recorded like any stat, so the
//! source's regular report for that second later replaces it; reporters therefore send their
//! full value and never subtract the poke.
//!
//! Bounds: per revision at most [`MAX_SOURCES`] sources, each remembering its last
//! [`LATE_SECONDS`] seconds; stats older than that, from the future, negative or not finite
//! are rejected with a [`Rejected`] reason for the caller to count. Nothing is retried: a
//! rejected stat is gone (Knative's stat forwarder retries forever).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::window::Window;
use crate::config::{AutoscalingSpec, Metric};
use crate::revision::RevisionKey;
use crate::stats::Stat;

/// How long after a second a source's value for it may still arrive or be replaced.
pub const LATE_SECONDS: u64 = 16;
/// How far ahead of the collector's clock a stat's second may be (clock skew, rounding).
pub const FUTURE_SECONDS: u64 = 2;
/// Reporters remembered per revision; sources silent for [`LATE_SECONDS`] are forgotten first.
pub const MAX_SOURCES: usize = 256;

/// Why a stat was not recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    /// The revision is not in the catalog (or not yet synced).
    #[error("revision is not being collected")]
    UnknownRevision,
    /// Negative, NaN or infinite concurrency.
    #[error("value is negative or not finite")]
    Invalid,
    /// Older than [`LATE_SECONDS`] by the collector's clock.
    #[error("second is more than {LATE_SECONDS}s old")]
    TooLate,
    /// More than [`FUTURE_SECONDS`] ahead of the collector's clock.
    #[error("second is ahead of the collector's clock")]
    FromTheFuture,
    /// [`MAX_SOURCES`] other sources reported within [`LATE_SECONDS`].
    #[error("too many sources report this revision")]
    TooManySources,
}

impl Rejected {
    /// A short label value for metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::UnknownRevision => "unknown_revision",
            Self::Invalid => "invalid",
            Self::TooLate => "too_late",
            Self::FromTheFuture => "from_the_future",
            Self::TooManySources => "too_many_sources",
        }
    }
}

/// The window averages the decider needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observed {
    /// The stable-window average (revision total, never negative).
    pub stable: f64,
    /// The panic-window average (revision total, never negative).
    pub panic: f64,
}

/// What one source contributed to one second: (second, concurrency, requests).
type Contribution = (u64, f64, f64);

/// One revision's windows and the recent contributions of each source.
#[derive(Debug)]
struct RevisionWindows {
    concurrency_stable: Window,
    concurrency_panic: Window,
    rps_stable: Window,
    rps_panic: Window,
    /// Per source, its contributions of the last [`LATE_SECONDS`] (at most
    /// `LATE_SECONDS + FUTURE_SECONDS + 1` entries, one per second).
    sources: HashMap<Arc<str>, VecDeque<Contribution>>,
}

impl RevisionWindows {
    fn new(spec: &AutoscalingSpec) -> Self {
        Self {
            concurrency_stable: Window::new(spec.stable_window),
            concurrency_panic: Window::new(spec.panic_window),
            rps_stable: Window::new(spec.stable_window),
            rps_panic: Window::new(spec.panic_window),
            sources: HashMap::new(),
        }
    }

    fn resize(&mut self, spec: &AutoscalingSpec, now: u64) {
        self.concurrency_stable.resize(spec.stable_window, now);
        self.rps_stable.resize(spec.stable_window, now);
        self.concurrency_panic.resize(spec.panic_window, now);
        self.rps_panic.resize(spec.panic_window, now);
    }

    fn add(&mut self, second: u64, concurrency: f64, rps: f64) {
        self.concurrency_stable.record(second, concurrency);
        self.concurrency_panic.record(second, concurrency);
        self.rps_stable.record(second, rps);
        self.rps_panic.record(second, rps);
    }
}

/// A revision's place in the [`Collector`]: lets the scaler read a revision's averages without
/// hashing its key on every decision. Valid from [`Collector::watch`] until
/// [`Collector::forget`] of that revision (the slot may then be reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot(usize);

impl Slot {
    /// The slot's position: dense, so callers can keep per-revision data in the same order.
    pub fn index(self) -> usize {
        self.0
    }
}

/// Per-revision windows fed by stats. Single-owner (the scaler's task); no locking.
#[derive(Debug, Default)]
pub struct Collector {
    /// Revision -> its slot in `slots`.
    index: HashMap<RevisionKey, usize>,
    /// Windows stored densely so decisions walk memory with fewer cache misses.
    slots: Vec<Option<RevisionWindows>>,
    /// Free entries of `slots`.
    free: Vec<usize>,
}

impl Collector {
    /// An empty collector.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts collecting for `revision`, or applies changed window sizes from `spec` (the
    /// newest data that fits is kept). Idempotent and cheap when nothing changed. Returns
    /// the revision's [`Slot`].
    pub fn watch(&mut self, revision: &RevisionKey, spec: &AutoscalingSpec, now: u64) -> Slot {
        if let Some(&i) = self.index.get(revision) {
            if let Some(w) = &mut self.slots[i] {
                w.resize(spec, now);
            }
            return Slot(i);
        }
        let windows = Some(RevisionWindows::new(spec));
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i] = windows;
                i
            }
            None => {
                self.slots.push(windows);
                self.slots.len() - 1
            }
        };
        self.index.insert(revision.clone(), i);
        Slot(i)
    }

    /// Stops collecting for `revision` and frees its windows.
    pub fn forget(&mut self, revision: &RevisionKey) {
        if let Some(i) = self.index.remove(revision) {
            self.slots[i] = None;
            self.free.push(i);
        }
    }

    /// Whether `revision` is being collected.
    pub fn contains(&self, revision: &RevisionKey) -> bool {
        self.index.contains_key(revision)
    }

    /// `revision`'s slot, if it is being collected.
    pub fn slot(&self, revision: &RevisionKey) -> Option<Slot> {
        self.index.get(revision).copied().map(Slot)
    }

    fn windows_mut(&mut self, revision: &RevisionKey) -> Option<&mut RevisionWindows> {
        let i = *self.index.get(revision)?;
        self.slots[i].as_mut()
    }

    /// Records a periodic stat at the collector's second `now`. A second stat from the same
    /// source for the same second replaces the first.
    pub fn record(&mut self, stat: &Stat, now: u64) -> Result<(), Rejected> {
        let windows = self
            .windows_mut(&stat.revision)
            .ok_or(Rejected::UnknownRevision)?;
        // A pod's stat counts only what did not come through an activator: the activators
        // report those requests themselves (Knative's proxied share).
        if !stat.proxied_concurrency.is_finite()
            || stat.proxied_concurrency < 0.0
            || stat.proxied_concurrency > stat.average_concurrency
            || stat.proxied_requests > stat.requests
        {
            return Err(Rejected::Invalid);
        }
        let concurrency = stat.average_concurrency - stat.proxied_concurrency;
        if !concurrency.is_finite() || concurrency < 0.0 {
            return Err(Rejected::Invalid);
        }
        if stat.at > now + FUTURE_SECONDS {
            return Err(Rejected::FromTheFuture);
        }
        if stat.at + LATE_SECONDS < now {
            return Err(Rejected::TooLate);
        }
        let rps = (stat.requests - stat.proxied_requests) as f64;

        let fresh = |c: &Contribution| c.0 + LATE_SECONDS >= now;
        if !windows.sources.contains_key(&stat.source) && windows.sources.len() >= MAX_SOURCES {
            windows
                .sources
                .retain(|_, contributions| contributions.iter().any(fresh));
            if windows.sources.len() >= MAX_SOURCES {
                return Err(Rejected::TooManySources);
            }
        }
        let contributions = windows.sources.entry(stat.source.clone()).or_default();
        contributions.retain(fresh);
        let (delta_c, delta_r) = match contributions.iter_mut().find(|c| c.0 == stat.at) {
            Some(prev) => {
                let delta = (concurrency - prev.1, rps - prev.2);
                *prev = (stat.at, concurrency, rps);
                delta
            }
            None => {
                contributions.push_back((stat.at, concurrency, rps));
                (concurrency, rps)
            }
        };
        windows.add(stat.at, delta_c, delta_r);
        Ok(())
    }

    /// Records a poke: the same as [`Collector::record`] (the poke is the source's value for
    /// its second until the source's regular report replaces it). Whether it triggers an
    /// immediate decision is the scaler's call.
    pub fn poke(&mut self, stat: &Stat, now: u64) -> Result<(), Rejected> {
        self.record(stat, now)
    }

    /// The stable and panic averages of `spec`'s metric at second `now`, or `None` when
    /// nothing was recorded for more than a stable window ("no data", not "no load").
    pub fn observe(
        &self,
        revision: &RevisionKey,
        spec: &AutoscalingSpec,
        now: u64,
    ) -> Option<Observed> {
        self.observe_slot(self.slot(revision)?, spec, now)
    }

    /// [`Collector::observe`] by slot. `None` also for a slot that is free.
    pub fn observe_slot(&self, slot: Slot, spec: &AutoscalingSpec, now: u64) -> Option<Observed> {
        let w = self.slots.get(slot.0)?.as_ref()?;
        let (stable, panic) = match spec.metric {
            Metric::Concurrency => (&w.concurrency_stable, &w.concurrency_panic),
            Metric::Rps => (&w.rps_stable, &w.rps_panic),
        };
        if stable.is_empty_at(now) {
            return None;
        }
        // Reporters send a second once it has ended (an activator's stat of second s arrives
        // during s + 1), so the current second has no data yet: unless something was already
        // recorded for it, the windows are read up to the last closed second. Read at `now`,
        // a one-second panic window (a 10 s stable window) would always see the open second
        // as a gap and average to 0. The scaler decides half a second into each second, so the
        // closed second's stats are in by then.
        let at = if stable.last_write() == Some(now) {
            now
        } else {
            now.saturating_sub(1)
        };
        // Replacing values subtracts floats; never let a rounding residue go below zero.
        Some(Observed {
            stable: stable.average(at, spec.aggregation).max(0.0),
            panic: panic.average(at, spec.aggregation).max(0.0),
        })
    }
}

#[cfg(test)]
#[path = "collector_tests.rs"]
mod tests;
