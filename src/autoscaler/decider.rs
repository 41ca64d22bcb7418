//! The KPA decision (docs/architecture.md, "Knative's rules", Knative's `scaling/autoscaler.go`): how many
//! pods a revision wants, given its settings, what was observed and the time.
//!
//! This is the contract operators reason about, so it is Knative's arithmetic step by step:
//!
//! 1. `ready_f = max(1, ready)`.
//! 2. `max_scale_up = ceil(max-scale-up-rate × ready_f)`; `max_scale_down =
//!    floor(ready_f / max-scale-down-rate)` when the revision is reachable, else 0.
//! 3. `dspc = ceil(stable / target)`, `dppc = ceil(panic / target)`, each clamped into
//!    `[max_scale_down, max_scale_up]`.
//! 4. activation-scale (when > 1): a non-zero count below it is raised to it.
//! 5. Panic: `dppc / ready_f >= panic-threshold` (dppc before clamping) enters panic mode, and
//!    every decision still over the threshold restarts the panic clock. Panic ends at the
//!    first decision not over the threshold once the clock is more than a stable window old.
//! 6. In panic the answer is `max(desired stable, desired panic)` and never goes down while
//!    panicking (the highest answer of this panic is kept).
//! 7. scale-down-delay (reachable revisions, delay > 0): the answer is the maximum answer of
//!    the last `scale-down-delay`, in 2-second slots. Unlike Knative, a changed delay applies
//!    at once (the window is resized, not left at its creation size).
//! 8. Excess burst capacity: TBC 0 → 0, TBC −1 → −1, otherwise
//!    `floor(ready × total − TBC − panic)` with the real `ready`.
//!
//! A new decider starts in panic mode when more than one pod is ready, holding that many, so
//! a restarted autoscaler that lost its history does not scale a busy revision down.
//!
//! The decider is pure: no clock, no I/O. It keeps only its panic state and the delay window.

use std::time::Duration;

use tokio::time::Instant;

use super::delay::SlidingMax;
use crate::clock;
use crate::config::AutoscalingSpec;

/// What the decider is told about a revision at one decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// The stable-window average of the scaling metric (revision total).
    pub stable: f64,
    /// The panic-window average of the scaling metric (revision total).
    pub panic: f64,
    /// Pods ready to serve now.
    pub ready: u32,
    /// Whether any route sends traffic to the revision. Unreachable revisions may scale down
    /// without limit and skip the scale-down delay.
    pub reachable: bool,
}

/// The decider's answer for one decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Pods wanted, before min/max-scale and the scale-to-zero rules (the scaler's part).
    pub desired: u32,
    /// Spare capacity beyond the target burst capacity; negative means the activator must
    /// stay in the request path. 0 when TBC is 0, −1 when TBC is −1.
    pub excess_burst_capacity: i64,
    /// Whether the decider is in panic mode after this decision.
    pub panicking: bool,
    /// Pods wanted for the stable average (after rate limits and activation-scale).
    pub desired_stable: u32,
    /// Pods wanted for the panic average (after rate limits and activation-scale).
    pub desired_panic: u32,
    /// Whether scale-down-delay held `desired` above the undelayed answer.
    pub delayed: bool,
}

/// Per-revision decider state: the panic clock and the scale-down-delay window.
#[derive(Debug, Clone)]
pub struct Decider {
    /// When the panic window last saw load over the threshold; `None` when not panicking.
    panic_since: Option<Instant>,
    /// The highest answer during the current panic; answers never go below it while
    /// panicking.
    max_panic_pods: u32,
    /// The sliding maximum of answers; present while `scale-down-delay` > 0.
    delay: Option<SlidingMax>,
    /// The `scale-down-delay` the window was sized for, to notice a change.
    delay_setting: Duration,
}

impl Decider {
    /// A decider for a revision that has `ready` pods now. With more than one ready pod it
    /// starts in panic mode, holding at least `ready` pods for a stable window.
    pub fn new(spec: &AutoscalingSpec, ready: u32, now: Instant) -> Self {
        let mut d = Self {
            panic_since: (ready > 1).then_some(now),
            max_panic_pods: ready,
            delay: None,
            delay_setting: Duration::ZERO,
        };
        d.configure_delay(spec.scale_down_delay);
        d
    }

    /// Whether the decider is in panic mode.
    pub fn panicking(&self) -> bool {
        self.panic_since.is_some()
    }

    /// Rebuilds the delay window when the setting changed (Knative keeps its creation size).
    fn configure_delay(&mut self, delay: Duration) {
        if delay == self.delay_setting && (delay.is_zero() == self.delay.is_none()) {
            return;
        }
        self.delay_setting = delay;
        if delay.is_zero() {
            self.delay = None;
        } else if let Some(w) = &mut self.delay {
            w.resize(delay);
        } else {
            self.delay = Some(SlidingMax::new(delay));
        }
    }

    /// Decides how many pods the revision wants at `now`. See the module docs for the rules.
    pub fn decide(&mut self, spec: &AutoscalingSpec, obs: &Observation, now: Instant) -> Decision {
        self.configure_delay(spec.scale_down_delay);

        let ready_f = f64::from(obs.ready.max(1));
        let max_up = (spec.max_scale_up_rate * ready_f).ceil();
        let max_down = if obs.reachable {
            (ready_f / spec.max_scale_down_rate).floor()
        } else {
            0.0
        };

        let dspc = (obs.stable / spec.target_value).ceil();
        let dppc = (obs.panic / spec.target_value).ceil();
        let mut desired_stable = to_pods(dspc.max(max_down).min(max_up));
        let mut desired_panic = to_pods(dppc.max(max_down).min(max_up));

        if spec.activation_scale > 1 {
            if dspc > 0.0 && spec.activation_scale > desired_stable {
                desired_stable = spec.activation_scale;
            }
            if dppc > 0.0 && spec.activation_scale > desired_panic {
                desired_panic = spec.activation_scale;
            }
        }

        let over = dppc / ready_f >= spec.panic_threshold;
        match self.panic_since {
            _ if over => self.panic_since = Some(now),
            Some(since) if since + spec.stable_window < now => {
                self.panic_since = None;
                self.max_panic_pods = 0;
            }
            _ => {}
        }

        let mut desired = desired_stable;
        if self.panic_since.is_some() {
            desired = desired.max(desired_panic);
            self.max_panic_pods = self.max_panic_pods.max(desired);
            desired = self.max_panic_pods;
        }

        let mut delayed = false;
        if obs.reachable
            && let Some(window) = &mut self.delay
        {
            window.record(clock::second_of(now), desired);
            let held = window.current();
            delayed = held > desired;
            desired = held;
        }

        Decision {
            desired,
            excess_burst_capacity: excess_burst_capacity(spec, f64::from(obs.ready), obs.panic),
            panicking: self.panic_since.is_some(),
            desired_stable,
            desired_panic,
            delayed,
        }
    }
}

/// `floor(ready × total − TBC − panic)`, or 0 / −1 for TBC 0 / −1.
fn excess_burst_capacity(spec: &AutoscalingSpec, ready: f64, panic: f64) -> i64 {
    let tbc = spec.target_burst_capacity;
    if tbc == 0.0 {
        0
    } else if tbc > 0.0 {
        // Saturating float-to-int conversion; the value is already whole.
        (ready * spec.total_value - tbc - panic).floor() as i64
    } else {
        -1
    }
}

/// A non-negative whole pod count as u32 (saturating; NaN is 0).
fn to_pods(v: f64) -> u32 {
    v as u32
}

#[cfg(test)]
#[path = "decider_tests.rs"]
mod tests;
