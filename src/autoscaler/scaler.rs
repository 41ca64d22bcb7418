//! The scaler loop, and the [`ScaleState`] it publishes per revision.
//!
//! [`Scaler::run`] owns every revision's decider and windows on one task: it drains the stats
//! channel into the [`Collector`], decides every revision each tick (2 s, as Knative) and at
//! once when a stat with load arrives for a revision whose answer is 0 (a poke from a cold
//! request), applies min/max/initial-scale and the scale-to-zero rules
//! ([`super::lifecycle`]), calls [`Platform::scale`] only when the answer changes, and
//! publishes a [`ScaleState`] per revision. It follows the [`RevisionCatalog`]: revisions are
//! added and dropped when the catalog changes, and changed settings (window sizes included)
//! apply at the next decision. Only revisions of the KPA class are scaled: one of another
//! class (Knative's HPA) is never scaled nor taken to zero here.
//!
//! The same steps are public ([`Scaler::sync_catalog`], [`Scaler::ingest`], [`Scaler::tick`],
//! [`Scaler::decide`]) with the time passed in, so `thaw simulate` and tests drive the real
//! scaler on a virtual clock.

use std::future::Future;
use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{Instrument, debug, debug_span, info, info_span, warn};

use super::collector::Collector;
use super::lifecycle::Activity;
pub use super::options::{ActivatorPath, InPath, RevisionStatus, ScalerOptions, Trigger};
use super::state::{Env, RevisionState, Revisions};
use crate::clock;
use crate::config::annotations::KPA_CLASS;
use crate::platform::{Found, Platform, PlatformError};
use crate::revision::{Delta, RevisionCatalog, RevisionKey};
use crate::stats::StatMessage;
use crate::telemetry::Telemetry;
use crate::telemetry::autoscaler::{AutoscalerMetrics, RejectLabels};

/// How far into a clock second the periodic decisions run: the reporters' stats for the second
/// just closed arrive at its end, so a decision at the boundary would race them (and a
/// one-second panic window would read a gap).
const DECIDE_OFFSET: tokio::time::Duration = tokio::time::Duration::from_millis(500);

/// The autoscaler's decision loop over every revision in the catalog. See the module docs.
pub struct Scaler {
    catalog: Arc<RevisionCatalog>,
    platform: Arc<dyn Platform>,
    scale_states: Arc<ScaleStates>,
    metrics: AutoscalerMetrics,
    options: ScalerOptions,
    collector: Collector,
    revisions: Revisions,
    /// The catalog version last followed; `None` before the first sync.
    catalog_seen: Option<u64>,
}

impl Scaler {
    /// A scaler over `catalog`'s revisions. Nothing happens until [`Scaler::run`] (or the
    /// step methods) are called.
    pub fn new(
        catalog: Arc<RevisionCatalog>,
        platform: Arc<dyn Platform>,
        scale_states: Arc<ScaleStates>,
        telemetry: &Telemetry,
        options: ScalerOptions,
    ) -> Self {
        Self {
            catalog,
            platform,
            scale_states,
            metrics: telemetry.autoscaler.clone(),
            options,
            collector: Collector::new(),
            revisions: Revisions::default(),
            catalog_seen: None,
        }
    }

    /// Runs until `shutdown` completes: syncs the catalog, then ticks every
    /// [`ScalerOptions::tick`], ingests stats as they come (deciding at once on a poke), and
    /// follows catalog changes. If the stats channel closes it keeps ticking. On shutdown it
    /// stops deciding and leaves every revision's replicas as they are.
    pub async fn run(
        mut self,
        mut stats: mpsc::Receiver<StatMessage>,
        shutdown: impl Future<Output = ()>,
    ) {
        async move {
            let mut catalog_changed = self.catalog.subscribe();
            catalog_changed.mark_unchanged();
            self.sync_catalog(Instant::now()).await;
            // Reporters close a second at its start (the activator at each whole second, the
            // pod-stats puller likewise): deciding half a second later reads the second just
            // closed with its stats in, never the instant they are on their way.
            let first = clock::next_at_offset(Instant::now(), DECIDE_OFFSET);
            let mut ticker = tokio::time::interval_at(first, self.options.tick);
            ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
            let mut stats_open = true;
            tokio::pin!(shutdown);
            loop {
                tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    _ = ticker.tick() => {
                        self.tick(Instant::now()).await;
                        self.options.rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Ok(()) = catalog_changed.changed() => self.sync_catalog(Instant::now()).await,
                    msg = stats.recv(), if stats_open => match msg {
                        Some(msg) => {
                            let now = Instant::now();
                            if let Some(key) = self.ingest(msg, now) {
                                self.decide(&key, Trigger::Poke, now).await;
                            }
                        }
                        None => {
                            warn!("stats channel closed; deciding on what was collected");
                            stats_open = false;
                        }
                    },
                }
            }
            info!("autoscaler stopped; replicas left as they are");
        }
        .instrument(info_span!("autoscaler"))
        .await
    }

    /// Follows the catalog: starts tracking new revisions (asking the platform for their
    /// initial scale when fewer pods are ready), takes changed settings for the next
    /// decision, and forgets removed revisions (scaling them to 0 if they had replicas).
    /// Only the revisions changed since the last call are looked at
    /// ([`RevisionCatalog::delta`]); the first call, a catalog replaced whole, or a change log
    /// that no longer reaches back compares every revision.
    pub async fn sync_catalog(&mut self, now: Instant) {
        let snapshot = self.catalog.load();
        let delta = match self.catalog_seen {
            Some(seen) => self.catalog.delta(seen, snapshot.version()),
            None => Delta::Resync,
        };
        self.catalog_seen = Some(snapshot.version());
        let keys = match delta {
            Delta::Revisions(keys) => keys,
            Delta::Resync => {
                let mut keys: Vec<RevisionKey> = self
                    .revisions
                    .keys()
                    .filter(|k| snapshot.get(k).is_none())
                    .cloned()
                    .collect();
                keys.extend(snapshot.revisions().map(|r| r.key.clone()));
                keys
            }
        };
        let mut added = Vec::new();
        for key in keys {
            let Some(rev) = snapshot.get(&key) else {
                self.forget(&key, true).await;
                continue;
            };
            // A revision of another autoscaler class (Knative's HPA) belongs to that
            // autoscaler: never scaled here, never taken to zero; one that changed class is
            // let go as it is.
            if rev.autoscaling.class != KPA_CLASS {
                self.forget(&key, false).await;
                continue;
            }
            match self.revisions.get_mut(&rev.key) {
                Some(state) => {
                    if !Arc::ptr_eq(&state.spec, &rev.autoscaling) {
                        // New window sizes take effect at the next decision.
                        self.collector
                            .watch(&rev.key, &rev.autoscaling, clock::second_of(now));
                        state.spec = rev.autoscaling.clone();
                    }
                }
                None => {
                    let found = self.platform.found(&rev.key);
                    let endpoints = self.platform.endpoints(&rev.key);
                    let slot =
                        self.collector
                            .watch(&rev.key, &rev.autoscaling, clock::second_of(now));
                    let state = RevisionState::new(
                        &rev.key,
                        rev.autoscaling.clone(),
                        slot,
                        endpoints,
                        &self.metrics,
                        now,
                        found,
                    );
                    self.scale_states.publish(&rev.key, state.scale_state());
                    self.revisions.insert(rev.key.clone(), state);
                    added.push((rev.key.clone(), found));
                }
            }
        }
        for (key, found) in added {
            self.start(&key, found, now).await;
        }
    }

    /// A new revision gets its initial scale, as a new Deployment does, unless it was
    /// initialized before (Knative's `ScaleTargetInitialized`: a leader change adopts it as
    /// found), that many pods are ready, or that many are asked for already. If the platform
    /// refuses (e.g. it does not know the revision yet), the next decisions retry.
    async fn start(&mut self, key: &RevisionKey, found: Found, now: Instant) {
        let Some(state) = self.revisions.get_mut(key) else {
            return;
        };
        let initial = state.spec.initial_scale;
        let ready = state.ready_now();
        info!(revision = %key, initial_scale = initial, ready, replicas = ?found.replicas,
            initialized = found.initialized, in_path = ?found.activator_in_path, "tracking revision");
        if initial > 0
            && ready < initial
            && !found.initialized
            && found.replicas.is_none_or(|r| r < initial)
        {
            let env = env(
                &self.collector,
                &*self.platform,
                &self.scale_states,
                &self.metrics,
                &self.options,
            );
            state.initial = Some(initial);
            if state.apply(key, initial, &env, now).await {
                info!(revision = %key, "scale {} - -> {initial}: initial scale", key.name);
            }
        }
    }

    /// Stops scaling `key`; with `to_zero` (it left the catalog) its replicas are scaled to 0,
    /// otherwise (another autoscaler owns it now) they are left as they are.
    async fn forget(&mut self, key: &RevisionKey, to_zero: bool) {
        let Some(state) = self.revisions.remove(key) else {
            return;
        };
        self.collector.forget(key);
        self.scale_states.remove(key);
        state.remove_gauges(&self.metrics);
        if !to_zero {
            info!(revision = %key, "revision no longer of the KPA class; replicas left as they are");
            return;
        }
        info!(revision = %key, "revision removed from the catalog; forgetting it");
        if state.replicas.is_some_and(|r| r > 0) {
            let call = self.platform.scale(key, 0);
            match tokio::time::timeout(self.options.scale_timeout, call).await {
                Ok(Ok(())) | Ok(Err(PlatformError::UnknownRevision(_))) => {}
                Ok(Err(e)) => {
                    warn!(revision = %key, error = %e, "scaling a removed revision to 0 failed")
                }
                Err(_) => warn!(revision = %key, "scaling a removed revision to 0 timed out"),
            }
        }
    }

    /// Records one stat at `now`. Returns the revision when it must be decided at once: the
    /// stat carries load and the revision's latest answer is 0 (or none yet). Values above the
    /// ceilings are clamped ([`crate::stats::Stat::clamp`], counted in
    /// `thaw_autoscaler_stats_clamped_total`); rejected stats are counted in
    /// `thaw_autoscaler_stats_rejected_total`.
    pub fn ingest(&mut self, msg: StatMessage, now: Instant) -> Option<RevisionKey> {
        let (mut stat, kind) = match msg {
            StatMessage::Record(s) => (s, "record"),
            StatMessage::Poke(s) => (s, "poke"),
        };
        if stat.clamp() {
            self.metrics.stats_clamped.inc();
            debug!(revision = %stat.revision, source = %stat.source, kind, "stat clamped to the ceiling");
        }
        if let Err(reason) = self.collector.record(&stat, clock::second_of(now)) {
            self.metrics
                .stats_rejected
                .get_or_create(&RejectLabels {
                    reason: reason.label(),
                })
                .inc();
            debug!(revision = %stat.revision, source = %stat.source, kind, %reason, "stat rejected");
            return None;
        }
        let state = self.revisions.get(&stat.revision)?;
        (stat.average_concurrency > 0.0 && state.decided <= 0).then_some(stat.revision)
    }

    /// Decides every revision at `now`.
    pub async fn tick(&mut self, now: Instant) {
        let started = Instant::now();
        let env = env(
            &self.collector,
            &*self.platform,
            &self.scale_states,
            &self.metrics,
            &self.options,
        );
        let revisions = &mut self.revisions;
        // One span per round, not per revision: every event inside names its revision.
        async move {
            for (key, state) in revisions.iter_mut() {
                state.decide(key, &env, Trigger::Tick, now).await;
            }
        }
        .instrument(debug_span!("tick"))
        .await;
        self.metrics
            .decision_seconds
            .observe(started.elapsed().as_secs_f64());
    }

    /// Decides one revision at `now` (no-op for an unknown one).
    pub async fn decide(&mut self, key: &RevisionKey, trigger: Trigger, now: Instant) {
        let started = Instant::now();
        let env = env(
            &self.collector,
            &*self.platform,
            &self.scale_states,
            &self.metrics,
            &self.options,
        );
        if let Some(state) = self.revisions.get_mut(key) {
            state
                .decide(key, &env, trigger, now)
                .instrument(debug_span!("decide", revision = %key, trigger = trigger.as_str()))
                .await;
        }
        self.metrics
            .decision_seconds
            .observe(started.elapsed().as_secs_f64());
    }

    /// `revision`'s state as of its last decision.
    pub fn status(&self, revision: &RevisionKey) -> Option<RevisionStatus> {
        self.revisions.get(revision).map(RevisionState::status)
    }

    /// The revisions being scaled.
    pub fn revisions(&self) -> impl Iterator<Item = &RevisionKey> {
        self.revisions.keys()
    }
}

fn env<'a>(
    collector: &'a Collector,
    platform: &'a dyn Platform,
    scale_states: &'a ScaleStates,
    metrics: &'a AutoscalerMetrics,
    options: &'a ScalerOptions,
) -> Env<'a> {
    Env {
        collector,
        platform,
        scale_states,
        metrics,
        activator_path: &options.activator_path,
        scale_timeout: options.scale_timeout,
    }
}

/// The scaler's latest answer for one revision.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleState {
    /// Desired replicas; -1 until the first decision.
    pub desired: i32,
    /// When `desired` was last changed (the activator times cold-start phases from it).
    pub decided_at: Option<Instant>,
    /// Whether the activator must stay in the request path (cold, or short of burst capacity).
    pub activator_in_path: bool,
    /// Whether the revision reached its initial scale once (Knative's
    /// `ScaleTargetInitialized`); never set back.
    pub initialized: bool,
    /// The revision's activity and since when (Knative's PodAutoscaler `Active`): the leader
    /// records it on the Revision's status, so the next leader continues from it. `None`
    /// where no scaler tracks the revision (a follower's copy, another autoscaler class).
    pub activity: Option<Activity>,
}

impl Default for ScaleState {
    fn default() -> Self {
        Self {
            desired: -1,
            decided_at: None,
            activator_in_path: true,
            initialized: false,
            activity: None,
        }
    }
}

/// Every revision's [`ScaleState`] on a watch channel, shared by the scaler (writer) and the
/// activator and admin API (readers). Each change is also announced by key on a bounded
/// broadcast ([`ScaleStates::changes`]), so a follower (the decision feed) sends only what
/// changed; one that falls behind re-reads them all.
#[derive(Debug)]
pub struct ScaleStates {
    map: DashMap<RevisionKey, watch::Sender<ScaleState>>,
    changes: tokio::sync::broadcast::Sender<RevisionKey>,
}

impl Default for ScaleStates {
    fn default() -> Self {
        Self {
            map: DashMap::new(),
            changes: tokio::sync::broadcast::channel(CHANGES_BACKLOG).0,
        }
    }
}

/// Changes a follower of [`ScaleStates::changes`] may fall behind by before it must re-read
/// every state.
const CHANGES_BACKLOG: usize = 4096;

impl ScaleStates {
    /// An empty, shareable set.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// A receiver for `revision`'s state (created at the default state if not yet decided).
    pub fn subscribe(&self, revision: &RevisionKey) -> watch::Receiver<ScaleState> {
        self.map
            .entry(revision.clone())
            .or_insert_with(|| watch::channel(ScaleState::default()).0)
            .subscribe()
    }

    /// Publishes a new state; receivers are woken only if it differs from the last one.
    pub fn publish(&self, revision: &RevisionKey, state: ScaleState) {
        let tx = self
            .map
            .entry(revision.clone())
            .or_insert_with(|| watch::channel(ScaleState::default()).0)
            .clone();
        let changed = tx.send_if_modified(|cur| {
            if *cur == state {
                false
            } else {
                *cur = state;
                true
            }
        });
        if changed {
            let _ = self.changes.send(revision.clone());
        }
    }

    /// The current state of `revision`, if it was ever published or subscribed.
    pub fn get(&self, revision: &RevisionKey) -> Option<ScaleState> {
        self.map.get(revision).map(|tx| tx.borrow().clone())
    }

    /// Forgets a removed revision; its receivers see the channel close.
    pub fn remove(&self, revision: &RevisionKey) {
        if self.map.remove(revision).is_some() {
            let _ = self.changes.send(revision.clone());
        }
    }

    /// Every revision's current state.
    pub fn all(&self) -> Vec<(RevisionKey, ScaleState)> {
        self.map
            .iter()
            .map(|e| (e.key().clone(), e.value().borrow().clone()))
            .collect()
    }

    /// The keys of revisions whose state changes (or that are removed) from now on.
    pub fn changes(&self) -> tokio::sync::broadcast::Receiver<RevisionKey> {
        self.changes.subscribe()
    }
}
