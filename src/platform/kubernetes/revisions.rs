//! The Revision watch: every `serving.knative.dev/v1` Revision (in all namespaces, or one)
//! followed into the [`RevisionCatalog`] and the [`KubePlatform`], one revision at a time.
//!
//! Each Revision is turned into a [`RevisionInput`] ([`revision_input`]: containerConcurrency,
//! the timeouts, the first container's first port name (`h2c` selects HTTP/2 upstream), the
//! annotations, the service from the label `serving.knative.dev/service`, and the hosts
//! `<rev>.<ns>`, `<rev>.<ns>.svc`, `<rev>.<ns>.svc.cluster.local`, and whether its
//! `serving.knative.dev/routingState` is `reserve`: unreachable) and resolved against the live
//! ConfigMaps with the one resolver, [`resolve_revision`], that local mode uses too.
//!
//! - Added or changed: [`RevisionCatalog::upsert`] and [`KubePlatform::upsert`] (protocol, and
//!   the progress deadline from `serving.knative.dev/progress-deadline`); its UID into
//!   [`KubePlatform::observe_uid`] (its own Deployment and private Service are those it
//!   controls). O(log n) in the number of revisions; an unchanged spec (a re-list, a status
//!   update) changes nothing.
//! - Deleted: [`RevisionCatalog::remove`] and [`KubePlatform::remove`]; requests held for it are
//!   answered 503.
//! - Invalid (a bad annotation, a negative timeout, ...): logged with each field and reason,
//!   counted in `thaw_platform_revisions_rejected_total{namespace,revision}`, and skipped; a
//!   previously valid spec of the same revision stays in force.
//! - `config-defaults`, `config-autoscaler` or `config-activator` changed (a valid update swapped
//!   into the [`LiveConfig`]): every revision is resolved again from its last valid input.
//!
//! kube-runtime's watcher resumes from the last resourceVersion after an error (with backoff)
//! and re-lists only after a 410; a re-list removes the revisions it no longer finds (deleted
//! while the watch was away).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_stream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{KubePlatform, KubeRevision};
use crate::config::activator;
use crate::config::annotations::{self, PROGRESS_DEADLINE};
use crate::config::live::{LiveConfig, LiveEvent};
use crate::config::revision::{RevisionInput, resolve_revision};
use crate::config::{ConfigSet, Problem, Problems};
use crate::knative::Revision;
use crate::knative::names::labels;
use crate::revision::{RevisionCatalog, RevisionKey, RevisionSpec};
use crate::telemetry::platform::{PlatformMetrics, RevisionLabels, WatchLabels};

/// The routing state of a revision no route uses any more (the Route reconciler's labeler):
/// the autoscaler treats it as unreachable.
pub const ROUTING_STATE_RESERVE: &str = "reserve";

/// The hosts that route straight to revision `name` in `namespace`: its cluster-local names.
pub fn revision_hosts(namespace: &str, name: &str) -> Vec<String> {
    vec![
        format!("{name}.{namespace}"),
        format!("{name}.{namespace}.svc"),
        format!("{name}.{namespace}.svc.cluster.local"),
    ]
}

/// What a Revision says about itself, as the resolver takes it. Every problem of its own
/// fields (a negative number, one too large) is reported, named by its field.
pub fn revision_input(rev: &Revision) -> Result<RevisionInput, Problems> {
    let namespace = rev.namespace().unwrap_or_default();
    let name = rev.name_any();
    let mut problems = Vec::new();
    let mut whole = |field: &str, v: Option<i64>| -> Option<u64> {
        let v = v?;
        match u64::try_from(v) {
            Ok(v) => Some(v),
            Err(_) => {
                problems.push(Problem::new(field, v.to_string(), "must be at least 0"));
                None
            }
        }
    };
    let cc = whole("spec.containerConcurrency", rev.spec.container_concurrency);
    let timeout = whole("spec.timeoutSeconds", rev.spec.timeout_seconds);
    let response_start = whole(
        "spec.responseStartTimeoutSeconds",
        rev.spec.response_start_timeout_seconds,
    );
    let idle = whole("spec.idleTimeoutSeconds", rev.spec.idle_timeout_seconds);
    let cc = cc.and_then(|v| match u32::try_from(v) {
        Ok(v) => Some(v),
        Err(_) => {
            problems.push(Problem::new(
                "spec.containerConcurrency",
                v.to_string(),
                "too large",
            ));
            None
        }
    });
    if !problems.is_empty() {
        return Err(Problems(problems));
    }
    let port_name = rev
        .spec
        .pod_spec
        .containers
        .first()
        .and_then(|c| c.ports.as_ref()?.first()?.name.clone());
    Ok(RevisionInput {
        hosts: revision_hosts(&namespace, &name),
        unreachable: rev.labels().get(labels::ROUTING_STATE).map(String::as_str)
            == Some(ROUTING_STATE_RESERVE),
        namespace,
        name,
        service: rev.labels().get(labels::SERVICE).cloned(),
        container_concurrency: cc,
        timeout_seconds: timeout,
        response_start_timeout_seconds: response_start,
        idle_timeout_seconds: idle,
        port_name,
        uid: rev.uid(),
        // Only those the resolver reads: another annotation's change (a controller's
        // bookkeeping) is no change of the data plane's spec, and is not kept per revision.
        annotations: rev
            .annotations()
            .iter()
            .filter(|(k, _)| {
                k.starts_with(annotations::PREFIX)
                    || k.starts_with(activator::PREFIX)
                    || *k == PROGRESS_DEADLINE
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    })
}

/// What the platform needs of a resolved revision. The progress deadline only when the
/// revision sets one (else the platform's default applies).
fn kube_revision(input: &RevisionInput, spec: &RevisionSpec) -> KubeRevision {
    KubeRevision {
        key: spec.key.clone(),
        protocol: spec.protocol,
        progress_deadline: input
            .annotations
            .contains_key(PROGRESS_DEADLINE)
            .then_some(spec.autoscaling.progress_deadline),
    }
}

/// The Revision watch started by [`follow_revisions`].
#[derive(Debug, Clone)]
pub struct FollowedRevisions {
    synced: watch::Receiver<bool>,
}

impl FollowedRevisions {
    /// Returns once the first full list of Revisions is in the catalog (or the watch ended).
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.clone();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Whether the first full list is in the catalog.
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }
}

/// Watches Revisions (`namespace`, or all namespaces) and keeps the follower's catalog and
/// platform in step until `stop`; `config_events` (from
/// [`crate::config::live::watch_configmaps`]) says when the live configuration may have
/// changed, and so when to resolve every revision again. Returns at once; the watch runs in a
/// task. Must be called inside a tokio runtime.
pub fn follow_revisions(
    client: kube::Client,
    namespace: Option<&str>,
    follower: Follower,
    config_events: watch::Receiver<LiveEvent>,
    stop: CancellationToken,
) -> FollowedRevisions {
    let api: Api<Revision> = match namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let (synced_tx, synced) = watch::channel(false);
    let span = tracing::info_span!(
        "watch",
        resource = "revisions",
        namespace = namespace.unwrap_or("*")
    );
    tokio::spawn(
        follower
            .run(api, config_events, synced_tx, stop)
            .instrument(span),
    );
    FollowedRevisions { synced }
}

/// Applies Revisions to the catalog and the platform; keeps each revision's last valid input
/// (without its hosts, which follow from its name), for resolving it again when the
/// configuration changes. [`follow_revisions`] feeds it from a
/// watch; [`Follower::apply`] and [`Follower::delete`] are its steps.
pub struct Follower {
    catalog: Arc<RevisionCatalog>,
    platform: KubePlatform,
    config: LiveConfig,
    /// The configuration every current spec was resolved with.
    resolved_with: ConfigSet,
    metrics: PlatformMetrics,
    /// Boxed: the map's slots stay small, so its growth (capacity doubles) costs little.
    inputs: HashMap<RevisionKey, Box<RevisionInput>>,
    /// During a (re-)list: the revisions listed so far; at its end the others are removed.
    listing: Option<HashSet<RevisionKey>>,
}

impl Follower {
    /// A follower with no revision yet.
    pub fn new(
        catalog: Arc<RevisionCatalog>,
        platform: KubePlatform,
        config: LiveConfig,
        metrics: PlatformMetrics,
    ) -> Self {
        Self {
            resolved_with: config_set(&config),
            catalog,
            platform,
            config,
            metrics,
            inputs: HashMap::new(),
            listing: None,
        }
    }

    async fn run(
        mut self,
        api: Api<Revision>,
        mut config_events: watch::Receiver<LiveEvent>,
        synced: watch::Sender<bool>,
        stop: CancellationToken,
    ) {
        let labels = WatchLabels {
            resource: "revisions".to_string(),
        };
        let events = self.metrics.watch_events.get_or_create_owned(&labels);
        let errors = self.metrics.watch_errors.get_or_create_owned(&labels);
        let mut stream =
            std::pin::pin!(watch_stream(api, watcher::Config::default()).default_backoff());
        let mut config_open = true;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = config_events.changed(), if config_open => match changed {
                    Ok(()) => {
                        config_events.borrow_and_update();
                        self.config_changed();
                    }
                    Err(_) => config_open = false,
                },
                ev = stream.next() => match ev {
                    None => return,
                    Some(Err(e)) => {
                        errors.inc();
                        tracing::warn!(error = %e, "revision watch error; resuming after backoff");
                    }
                    Some(Ok(ev)) => {
                        events.inc();
                        if self.event(ev) && !*synced.borrow() {
                            tracing::info!(revisions = self.inputs.len(), "revisions synced");
                            synced.send_replace(true);
                        }
                    }
                },
            }
        }
    }

    /// Applies one watch event. Returns true at the end of a (re-)list.
    pub fn event(&mut self, ev: Event<Revision>) -> bool {
        match ev {
            Event::Init => {
                self.listing = Some(HashSet::new());
                false
            }
            Event::InitApply(rev) => {
                if let Some(seen) = &mut self.listing {
                    seen.insert(RevisionKey::new(
                        rev.namespace().unwrap_or_default(),
                        rev.name_any(),
                    ));
                }
                self.apply(&rev);
                false
            }
            Event::Apply(rev) => {
                self.apply(&rev);
                false
            }
            Event::Delete(rev) => {
                self.delete(&RevisionKey::new(
                    rev.namespace().unwrap_or_default(),
                    rev.name_any(),
                ));
                false
            }
            Event::InitDone => {
                if let Some(seen) = self.listing.take() {
                    let gone: Vec<RevisionKey> = self
                        .inputs
                        .keys()
                        .filter(|k| !seen.contains(*k))
                        .cloned()
                        .collect();
                    for key in gone {
                        tracing::info!(revision = %key, "revision gone while the watch was away");
                        self.delete(&key);
                    }
                }
                true
            }
        }
    }

    /// An added or changed Revision: resolved and applied, or rejected (the last valid spec
    /// stays).
    pub fn apply(&mut self, rev: &Revision) {
        let key = RevisionKey::new(rev.namespace().unwrap_or_default(), rev.name_any());
        // The autoscaler's part of the status, for a leader adopting the revision.
        self.platform
            .observe_status(&key, crate::knative::status::AutoscalerStatus::of(rev));
        // Its own Deployment and private Service are those it controls (by UID); even an
        // invalid or unchanged spec's Revision has them.
        self.platform.observe_uid(&key, rev.uid().as_deref());
        let input = match revision_input(rev) {
            Ok(input) => input,
            Err(problems) => return self.reject(&key, &problems),
        };
        let kept = RevisionInput {
            hosts: Vec::new(),
            ..input.clone()
        };
        if self.inputs.get(&key).is_some_and(|k| **k == kept) {
            return; // A status update or a re-list: nothing the data plane reads changed.
        }
        match resolve_revision(&input, &self.resolved_with) {
            Ok(spec) => {
                self.platform.upsert(kube_revision(&input, &spec));
                if self.catalog.upsert(spec) {
                    tracing::debug!(revision = %key, "revision applied");
                }
                self.inputs.insert(key, Box::new(kept));
            }
            Err(problems) => self.reject(&key, &problems),
        }
    }

    /// A deleted Revision: out of the catalog and the platform (its rejection series too).
    pub fn delete(&mut self, key: &RevisionKey) {
        self.inputs.remove(key);
        self.platform.remove(key);
        self.metrics.revisions_rejected.remove(&RevisionLabels {
            namespace: key.namespace.to_string(),
            revision: key.name.to_string(),
        });
        if self.catalog.remove(key) {
            tracing::info!(revision = %key, "revision deleted; held requests answered 503");
        }
    }

    fn reject(&self, key: &RevisionKey, problems: &Problems) {
        let kept = self.inputs.contains_key(key);
        for p in &problems.0 {
            tracing::warn!(revision = %key, field = %p.key, value = %p.value, reason = %p.reason,
                kept_previous = kept, "invalid revision skipped");
        }
        self.metrics
            .revisions_rejected
            .get_or_create(&RevisionLabels {
                namespace: key.namespace.to_string(),
                revision: key.name.to_string(),
            })
            .inc();
    }

    /// The ConfigMaps may have changed: when any the resolver reads did, every revision is
    /// resolved again from its last valid input. One that the new configuration makes invalid
    /// keeps its spec, and is counted.
    pub fn config_changed(&mut self) {
        let now = config_set(&self.config);
        let same = Arc::ptr_eq(&now.defaults, &self.resolved_with.defaults)
            && Arc::ptr_eq(&now.autoscaler, &self.resolved_with.autoscaler)
            && Arc::ptr_eq(&now.activator, &self.resolved_with.activator);
        if same {
            return;
        }
        self.resolved_with = now;
        tracing::info!(
            revisions = self.inputs.len(),
            "configuration changed; resolving every revision again"
        );
        let mut changed = 0usize;
        for (key, kept) in &self.inputs {
            let input = RevisionInput {
                hosts: revision_hosts(&kept.namespace, &kept.name),
                ..RevisionInput::clone(kept)
            };
            match resolve_revision(&input, &self.resolved_with) {
                Ok(spec) => {
                    self.platform.upsert(kube_revision(&input, &spec));
                    changed += usize::from(self.catalog.upsert(spec));
                }
                Err(problems) => self.reject(key, &problems),
            }
        }
        tracing::info!(changed, "revisions resolved again");
    }

    /// How many revisions are followed.
    pub fn len(&self) -> usize {
        self.inputs.len()
    }

    /// Whether no revision is followed.
    pub fn is_empty(&self) -> bool {
        self.inputs.is_empty()
    }
}

/// The configuration the resolver reads, as the live watch holds it now.
fn config_set(config: &LiveConfig) -> ConfigSet {
    ConfigSet {
        autoscaler: config.autoscaler.load_full(),
        defaults: config.defaults.load_full(),
        activator: config.activator.load_full(),
        gc: Arc::default(),
    }
}
