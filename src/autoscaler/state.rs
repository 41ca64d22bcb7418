//! One revision inside the scaler: its decider, lifecycle, endpoint watch, metric handles, and
//! the decision step that ties them together.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::collector::{Collector, Observed, Slot};
use super::decider::{Decider, Observation};
use super::lifecycle::{Activity, Facts, InactiveReason, Lifecycle, Verdict};
use super::scaler::{ActivatorPath, RevisionStatus, ScaleState, ScaleStates, Trigger};
use crate::clock;
use crate::config::{AutoscalingSpec, Metric};
use crate::platform::{EndpointSnapshot, Found, FoundActivity, Platform};
use crate::revision::RevisionKey;
use crate::telemetry::autoscaler::{AutoscalerMetrics, FloatGauge, MetricLabels, RevisionLabels};

/// Per-revision gauge handles, resolved once, and the values they hold: a tick over many
/// revisions only touches the handles whose value changed.
#[derive(Debug)]
struct Gauges {
    labels: RevisionLabels,
    desired: Gauge,
    ready: Gauge,
    panic: Gauge,
    excess_burst_capacity: Gauge,
    /// desired, ready, panic, excess burst capacity as last set (`None` before the first).
    values: Option<[i64; 4]>,
    /// The observed load and the target, labelled with the metric scaled on; re-resolved
    /// when a reload changes the metric.
    load: LoadGauges,
}

#[derive(Debug)]
struct LoadGauges {
    labels: MetricLabels,
    stable: FloatGauge,
    panic: FloatGauge,
    target: FloatGauge,
}

impl LoadGauges {
    fn new(labels: &RevisionLabels, metric: Metric, m: &AutoscalerMetrics) -> Self {
        let labels = MetricLabels {
            namespace: labels.namespace.clone(),
            revision: labels.revision.clone(),
            metric: metric_label(metric),
        };
        Self {
            stable: m.observed_stable.get_or_create_owned(&labels),
            panic: m.observed_panic.get_or_create_owned(&labels),
            target: m.target_per_pod.get_or_create_owned(&labels),
            labels,
        }
    }

    fn remove(&self, m: &AutoscalerMetrics) {
        m.observed_stable.remove(&self.labels);
        m.observed_panic.remove(&self.labels);
        m.target_per_pod.remove(&self.labels);
    }
}

/// The `metric` label of a revision's load gauges.
fn metric_label(metric: Metric) -> &'static str {
    match metric {
        Metric::Concurrency => "concurrency",
        Metric::Rps => "rps",
    }
}

impl Gauges {
    fn set(&mut self, values: [i64; 4]) {
        if self.values == Some(values) {
            return;
        }
        self.desired.set(values[0]);
        self.ready.set(values[1]);
        self.panic.set(values[2]);
        self.excess_burst_capacity.set(values[3]);
        self.values = Some(values);
    }

    /// The observed load (when a decision saw any) and the target under `spec`.
    fn set_load(
        &mut self,
        spec: &AutoscalingSpec,
        observed: Option<Observed>,
        m: &AutoscalerMetrics,
    ) {
        if metric_label(spec.metric) != self.load.labels.metric {
            self.load.remove(m);
            self.load = LoadGauges::new(&self.labels, spec.metric, m);
        }
        if let Some(o) = observed {
            self.load.stable.set(o.stable);
            self.load.panic.set(o.panic);
        }
        self.load.target.set(spec.target_value);
    }
}

/// What a decision needs from the scaler besides the revision itself.
pub(super) struct Env<'a> {
    pub collector: &'a Collector,
    pub platform: &'a dyn Platform,
    pub scale_states: &'a ScaleStates,
    pub metrics: &'a AutoscalerMetrics,
    pub activator_path: &'a ActivatorPath,
    pub scale_timeout: Duration,
}

#[derive(Debug)]
pub(super) struct RevisionState {
    /// The settings from the catalog; re-read at every decision, so a reload applies at the
    /// next one.
    pub spec: Arc<AutoscalingSpec>,
    /// Where the collector keeps this revision's windows.
    slot: Slot,
    endpoints: watch::Receiver<Arc<EndpointSnapshot>>,
    decider: Decider,
    lifecycle: Lifecycle,
    /// When the scaler first saw the revision (the activator fronts it from then on in local
    /// mode).
    added_at: Instant,
    /// Adopted from an earlier scaler (a leader change) with replicas or initialized: silence
    /// counts as idleness only once this scaler has watched it for a stable window.
    adopted: bool,
    /// The serving mode as found is kept until a decision made on stats (not on silence).
    hold_path: bool,
    /// Replicas last accepted by the platform; `None` before the first scale call.
    pub replicas: Option<u32>,
    /// The initial scale still to be applied: set when the revision appears, cleared by the
    /// first scale call the platform accepts.
    pub initial: Option<u32>,
    /// The decider's latest answer; −1 before its first.
    pub decided: i32,
    excess_burst_capacity: i64,
    panicking: bool,
    activator_in_path: bool,
    /// Since when `activator_in_path` has been true.
    in_path_since: Option<Instant>,
    /// When `replicas` last changed.
    decided_at: Option<Instant>,
    observed: Option<Observed>,
    ready: u32,
    gauges: Gauges,
    /// The state last published, so an unchanged one costs no shared-map access.
    published: ScaleState,
}

impl RevisionState {
    /// A revision seen for the first time at `now`, with `endpoints` already subscribed, and
    /// what the platform `found` of it (an earlier leader's replicas, initialization and
    /// serving mode, adopted as they are).
    pub fn new(
        key: &RevisionKey,
        spec: Arc<AutoscalingSpec>,
        slot: Slot,
        endpoints: watch::Receiver<Arc<EndpointSnapshot>>,
        metrics: &AutoscalerMetrics,
        now: Instant,
        found: Found,
    ) -> Self {
        let ready = ready_count(&endpoints);
        let labels = RevisionLabels {
            namespace: key.namespace.to_string(),
            revision: key.name.to_string(),
        };
        let mut gauges = Gauges {
            desired: metrics.desired_pods.get_or_create_owned(&labels),
            ready: metrics.ready_pods.get_or_create_owned(&labels),
            panic: metrics.panic_mode.get_or_create_owned(&labels),
            excess_burst_capacity: metrics.excess_burst_capacity.get_or_create_owned(&labels),
            load: LoadGauges::new(&labels, spec.metric, metrics),
            labels,
            values: None,
        };
        // Right from adoption: a revision adopted with several ready pods starts in panic
        // (Knative's rule, so a restarted autoscaler does not scale it down), and says so.
        // Before its first decision the decider reports an excess burst capacity of 0, as
        // Knative's does; the activator stays in the path until that decision regardless.
        gauges.set([0, i64::from(ready), i64::from(ready > 1), 0]);
        gauges.set_load(&spec, None, metrics);
        let lifecycle = if found.initialized {
            let recorded = found.activity.map(|a| match a {
                FoundActivity::Active { since } => Activity::Active { since },
                FoundActivity::Activating { since } => Activity::Activating { since },
                FoundActivity::Inactive { since, timed_out } => Activity::Inactive {
                    since,
                    reason: if timed_out {
                        InactiveReason::TimedOut
                    } else {
                        InactiveReason::NoTraffic
                    },
                },
            });
            Lifecycle::adopted(&spec, spec.reachable, ready, found.replicas, recorded, now)
        } else {
            Lifecycle::new(&spec, spec.reachable, now)
        };
        let in_path = found.activator_in_path.unwrap_or(true);
        Self {
            decider: Decider::new(&spec, ready, now),
            lifecycle,
            excess_burst_capacity: 0,
            panicking: ready > 1,
            spec,
            slot,
            endpoints,
            added_at: now,
            adopted: found.initialized || found.replicas.is_some_and(|r| r > 0),
            hold_path: found.activator_in_path.is_some(),
            replicas: found.replicas,
            initial: None,
            decided: -1,
            activator_in_path: in_path,
            in_path_since: in_path.then_some(now),
            decided_at: None,
            observed: None,
            ready,
            gauges,
            published: ScaleState::default(),
        }
    }

    /// Where the collector keeps this revision's windows.
    pub fn slot(&self) -> Slot {
        self.slot
    }

    /// The state to publish before the first decision: what was found.
    pub fn scale_state(&self) -> ScaleState {
        ScaleState {
            desired: self.replicas.map_or(-1, to_i32),
            decided_at: self.decided_at,
            activator_in_path: self.activator_in_path,
            initialized: self.lifecycle.initialized(),
            activity: Some(self.lifecycle.activity()),
        }
    }

    /// Pods ready now.
    pub fn ready_now(&self) -> u32 {
        ready_count(&self.endpoints)
    }

    /// Removes this revision's gauges from the registry.
    pub fn remove_gauges(&self, metrics: &AutoscalerMetrics) {
        let l = &self.gauges.labels;
        metrics.desired_pods.remove(l);
        metrics.ready_pods.remove(l);
        metrics.panic_mode.remove(l);
        metrics.excess_burst_capacity.remove(l);
        self.gauges.load.remove(metrics);
    }

    pub fn status(&self) -> RevisionStatus {
        RevisionStatus {
            desired: self.replicas.map_or(-1, to_i32),
            decided: self.decided,
            ready: self.ready,
            panicking: self.panicking,
            excess_burst_capacity: self.excess_burst_capacity,
            activator_in_path: self.activator_in_path,
            activity: self.lifecycle.activity(),
            observed: self.observed,
        }
    }

    /// Applies `replicas` to the platform (bounded by the scale timeout). Returns whether the
    /// platform accepted it; failures are logged, counted and retried at the next decision.
    pub async fn apply(
        &mut self,
        key: &RevisionKey,
        replicas: u32,
        env: &Env<'_>,
        now: Instant,
    ) -> bool {
        // Announce the decision before the platform acts on it: a replica can become ready
        // (and the activator time the cold start's "decision" phase) before this task runs
        // again after the call. A failed call is corrected by the publish after it.
        if self.replicas != Some(replicas) {
            let announced = ScaleState {
                desired: to_i32(replicas),
                decided_at: Some(now),
                activator_in_path: self.activator_in_path,
                initialized: self.lifecycle.initialized(),
                activity: Some(self.lifecycle.activity()),
            };
            env.scale_states.publish(key, announced.clone());
            self.published = announced;
        }
        match tokio::time::timeout(env.scale_timeout, env.platform.scale(key, replicas)).await {
            Ok(Ok(())) => {
                self.initial = None;
                if self.replicas != Some(replicas) {
                    self.decided_at = Some(now);
                }
                self.replicas = Some(replicas);
                true
            }
            Ok(Err(e)) => {
                env.metrics.scale_errors.inc();
                warn!(revision = %key, replicas, error = %e, "scale failed; retrying at the next decision");
                false
            }
            Err(_) => {
                env.metrics.scale_errors.inc();
                warn!(revision = %key, replicas, timeout = ?env.scale_timeout, "scale timed out; retrying at the next decision");
                false
            }
        }
    }

    /// One decision at `now`: observe, decide, bound, apply scale-to-zero rules, call the
    /// platform if the answer changed, publish the [`ScaleState`] and the gauges.
    pub async fn decide(
        &mut self,
        key: &RevisionKey,
        env: &Env<'_>,
        trigger: Trigger,
        now: Instant,
    ) {
        let spec = self.spec.clone();
        let second = clock::second_of(now);
        let ready = self.ready_now();
        self.ready = ready;

        let from_stats = env.collector.observe_slot(self.slot, &spec, second);
        let from_data = from_stats.is_some();
        let observed = from_stats.or_else(|| {
            // No stat for a whole stable window. When every request passes the activator
            // (and it reports every revision it holds requests for), silence is zero load;
            // otherwise it is only zero load when no pod could be serving.
            // A revision adopted from an earlier leader is watched for a stable window
            // before silence counts (its windows start empty, not idle).
            let watched =
                !self.adopted || now.saturating_duration_since(self.added_at) >= spec.stable_window;
            let silent_is_idle = watched
                && match env.activator_path {
                    ActivatorPath::Always { .. } => true,
                    ActivatorPath::FollowsDecision => ready == 0,
                    ActivatorPath::Confirmed(in_path) => ready == 0 || in_path.since(key).is_some(),
                };
            silent_is_idle.then_some(Observed {
                stable: 0.0,
                panic: 0.0,
            })
        });
        self.observed = observed;
        if let Some(o) = observed {
            let obs = Observation {
                stable: o.stable,
                panic: o.panic,
                ready,
                reachable: spec.reachable,
            };
            let d = self.decider.decide(&spec, &obs, now);
            if d.panicking != self.panicking {
                if d.panicking {
                    info!(revision = %key, panic = o.panic, ready, "entering panic mode");
                } else {
                    info!(revision = %key, "leaving panic mode");
                }
            }
            self.decided = to_i32(d.desired);
            self.excess_burst_capacity = d.excess_burst_capacity;
            self.panicking = d.panicking;
        } else {
            debug!(revision = %key, "no stats for a stable window; keeping the last decision");
        }

        let mut verdict =
            self.lifecycle
                .verdict(&spec, self.decided, &self.facts(key, ready, env, now));
        let turned_inactive =
            self.lifecycle
                .observe(&spec, verdict.want, &self.facts(key, ready, env, now));
        self.update_path(verdict, ready, now, from_data);
        if turned_inactive {
            // Knative reconciles again as soon as the activator is in the path; do it now.
            verdict =
                self.lifecycle
                    .verdict(&spec, self.decided, &self.facts(key, ready, env, now));
            self.lifecycle
                .observe(&spec, verdict.want, &self.facts(key, ready, env, now));
            self.update_path(verdict, ready, now, from_data);
        }

        if !verdict.apply
            && let Some(initial) = self.initial
            && self.replicas.is_none()
            && self.apply(key, initial, env, now).await
        {
            info!(revision = %key, "scale {} - -> {initial}: initial scale (retried)", key.name);
        }
        if verdict.apply {
            let to = u32::try_from(verdict.want).unwrap_or(0);
            if self.replicas != Some(to) {
                let from = self
                    .replicas
                    .map_or_else(|| "-".to_string(), |r| r.to_string());
                if self.apply(key, to, env, now).await {
                    let (stable, panic) = observed.map_or((0.0, 0.0), |o| (o.stable, o.panic));
                    info!(
                        revision = %key, from = %from, to, trigger = trigger.as_str(), why = ?verdict.why,
                        "scale {} {} -> {}: {} ({}), observed stable {:.1} panic {:.1}, target {}, ready {}{}",
                        key.name, from, to, verdict.why.describe(), trigger.as_str(), stable, panic,
                        spec.target_value, ready, if self.panicking { ", panicking" } else { "" },
                    );
                }
            }
        }

        let state = self.scale_state();
        if state != self.published {
            env.scale_states.publish(key, state.clone());
            self.published = state;
        }
        self.gauges.set([
            self.replicas.map_or(0, i64::from),
            i64::from(ready),
            i64::from(self.panicking),
            self.excess_burst_capacity,
        ]);
        self.gauges.set_load(&spec, observed, env.metrics);
    }

    fn facts(&self, key: &RevisionKey, ready: u32, env: &Env<'_>, now: Instant) -> Facts {
        let activator_since = match env.activator_path {
            ActivatorPath::Always { since } => Some((*since).max(self.added_at)),
            ActivatorPath::FollowsDecision => self.in_path_since,
            ActivatorPath::Confirmed(in_path) => in_path.since(key),
        };
        Facts {
            ready,
            reachable: self.spec.reachable,
            activator_since,
            now,
        }
    }

    /// The activator leaves the path only when the revision wants pods and has burst
    /// capacity to spare (Knative's SKS Serve mode), and never while no pod is ready. A mode
    /// adopted from an earlier leader stays until a decision made on stats (`from_data`).
    fn update_path(&mut self, verdict: Verdict, ready: u32, now: Instant, from_data: bool) {
        if self.hold_path {
            if !from_data && ready > 0 {
                return;
            }
            self.hold_path = false;
        }
        // No decision yet: the excess burst capacity is not known (it reads 0), so the
        // activator stays (Knative's SKS would leave for one tick and come back).
        let decided = self.decided >= 0;
        let in_path =
            !(decided && verdict.want > 0 && self.excess_burst_capacity >= 0) || ready == 0;
        if in_path != self.activator_in_path {
            debug!(in_path, "activator path changes");
            self.activator_in_path = in_path;
            self.in_path_since = in_path.then_some(now);
        }
    }
}

fn ready_count(rx: &watch::Receiver<Arc<EndpointSnapshot>>) -> u32 {
    u32::try_from(rx.borrow().ready.len()).unwrap_or(u32::MAX)
}

fn to_i32(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

/// The scaler's revisions, stored in the order of their collector slots so that a tick walks
/// both the states and the windows sequentially (fewer cache misses over many revisions).
#[derive(Debug, Default)]
pub(super) struct Revisions {
    index: HashMap<RevisionKey, usize>,
    slots: Vec<Option<(RevisionKey, RevisionState)>>,
}

impl Revisions {
    pub fn get(&self, key: &RevisionKey) -> Option<&RevisionState> {
        let i = *self.index.get(key)?;
        self.slots[i].as_ref().map(|(_, s)| s)
    }

    pub fn get_mut(&mut self, key: &RevisionKey) -> Option<&mut RevisionState> {
        let i = *self.index.get(key)?;
        self.slots[i].as_mut().map(|(_, s)| s)
    }

    /// Stores `state` at its collector slot.
    pub fn insert(&mut self, key: RevisionKey, state: RevisionState) {
        let i = state.slot().index();
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        self.index.insert(key.clone(), i);
        self.slots[i] = Some((key, state));
    }

    pub fn remove(&mut self, key: &RevisionKey) -> Option<RevisionState> {
        let i = self.index.remove(key)?;
        self.slots[i].take().map(|(_, s)| s)
    }

    pub fn keys(&self) -> impl Iterator<Item = &RevisionKey> {
        self.index.keys()
    }

    /// Every revision, in slot order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&RevisionKey, &mut RevisionState)> {
        self.slots.iter_mut().flatten().map(|(k, s)| (&*k, s))
    }
}
