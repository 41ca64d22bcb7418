//! One task per scaled revision: applies the latest replica count to the revision's own
//! Deployment (named for it and controlled by its Revision, [`super::children`]; never a
//! labelled impostor) through `/scale`, retrying with backoff, and tracks the activation
//! timeout.
//! Tasks are independent, so one revision's retries never delay another's patch.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until};
use tracing::Instrument;

use super::Inner;
use super::state::RevEntry;
use crate::revision::RevisionKey;
use crate::telemetry::platform::{ScaleLabels, ScaleOutcome};

/// The field manager of thaw's autoscaler, owner of every revision Deployment's `/scale`.
pub const FIELD_MANAGER: &str = "autoscaler.thaw.dev";

/// Bound on one patch request (the client's own read timeout is long, for watches): the API
/// server's own default `--request-timeout`, past which it gives up on a request itself. A
/// shorter bound gave up on every patch of an API server answering in 12 s (the request
/// dropped before it reached the server, retried the same way): no revision could be scaled
/// until the latency went (`real_stack_drills`).
const PATCH_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs until shutdown. `entry.desired` carries the latest count asked for.
pub(super) async fn run(inner: Arc<Inner>, entry: Arc<RevEntry>) {
    let span = tracing::info_span!("scaler", revision = %entry.key);
    async move {
        let mut desired = entry.desired.subscribe();
        let mut endpoints = entry.subscribe();
        let mut applied: Option<u32> = None;
        let mut term = inner.term_id.load(Ordering::Relaxed);
        // Deadline of the current activation (scale-up from zero with no ready endpoint).
        let mut activating: Option<Instant> = None;
        loop {
            if entry.read(|st| st.removed) {
                return;
            }
            let now_term = inner.term_id.load(Ordering::Relaxed);
            if now_term != term {
                // A new leadership term: what this task applied in an earlier one may have
                // been changed since by another leader; the new term's counts are compared
                // with the Deployment as the watch shows it.
                term = now_term;
                applied = None;
            }
            let want = *desired.borrow_and_update();
            if let Some(want) = want
                && Some(want) != applied
            {
                let n = match apply(&inner, &entry, &mut desired, want).await {
                    Applied::Done(n) => n,
                    Applied::Dropped => {
                        applied = None;
                        continue;
                    }
                    Applied::Shutdown => return,
                };
                if n == 0 {
                    activating = None;
                    entry.update(|st| st.timed_out = false);
                } else if applied.unwrap_or(0) == 0 && !entry.read(|st| st.has_ready()) {
                    let timeout = inner.activation_timeout(&entry);
                    activating = Some(Instant::now() + timeout);
                    entry.update(|st| st.timed_out = false);
                    tracing::debug!(?timeout, "activating");
                }
                applied = Some(n);
                continue;
            }
            if applied == Some(0) && activating.is_none() && idle_exit(&entry) {
                tracing::debug!("at zero; scaler task ends until the next scale");
                return;
            }
            let deadline = activating.unwrap_or_else(Instant::now);
            tokio::select! {
                _ = inner.shutdown.cancelled() => return,
                r = desired.changed() => if r.is_err() { return },
                r = endpoints.changed() => {
                    if r.is_err() {
                        return;
                    }
                    if entry.read(|st| st.has_ready()) {
                        activating = None;
                        entry.update(|st| st.timed_out = false);
                    }
                }
                _ = sleep_until(deadline), if activating.is_some() => {
                    activating = None;
                    tracing::warn!(
                        timeout = ?inner.activation_timeout(&entry),
                        "no ready endpoint within the activation timeout; revision failing (TimedOut)"
                    );
                    entry.update(|st| st.timed_out = true);
                }
            }
        }
    }
    .instrument(span)
    .await
}

/// Whether a scaler at zero may end (so idle revisions hold no task). Exactly one task runs
/// per revision: [`super::KubePlatform`]'s `scale` starts one when `scaler_started` was false,
/// and this only returns true after clearing it with no newer count pending, or after a
/// newer count's `scale` has started a successor.
fn idle_exit(entry: &RevEntry) -> bool {
    entry.scaler_started.store(false, Ordering::SeqCst);
    let pending = entry.desired.borrow().is_some_and(|n| n != 0);
    if !pending {
        return true;
    }
    // A count arrived meanwhile: keep going, unless its `scale` already started a successor.
    entry.scaler_started.swap(true, Ordering::SeqCst)
}

enum Outcome {
    Ok,
    /// Retryable: 409, 429, 5xx, transport, timeout. (kube's client first retries 429, 503
    /// and 504 itself, a few times with backoff; what still fails lands here.)
    Retry(String),
    /// The revision's own Deployment is not there (not in the index, or 404).
    Missing,
    /// Rejected otherwise: retried at the longest backoff.
    Failed(String),
}

/// How [`apply`] ended.
enum Applied {
    /// The count is in place (written, or the Deployment said so already).
    Done(u32),
    /// The count was withdrawn (a new leadership term): nothing more to write for it.
    Dropped,
    Shutdown,
}

/// Patches until the latest wanted count is applied. A newer count replaces the one being
/// retried; a withdrawn one (`None`: the term changed) ends it.
async fn apply(
    inner: &Inner,
    entry: &RevEntry,
    desired: &mut watch::Receiver<Option<u32>>,
    mut want: u32,
) -> Applied {
    let mut backoff = inner.opts.retry_initial;
    let mut missing_since: Option<Instant> = None;
    let mut deployments = inner.deployments_changed.subscribe();
    loop {
        if desired.has_changed().unwrap_or(false) {
            match *desired.borrow_and_update() {
                Some(n) => want = n,
                None => return Applied::Dropped,
            }
        }
        let fence = inner.fence.load_full();
        let Ok(term) = fence.term() else {
            // Not leading: this count is dropped; the next leader decides again.
            tracing::debug!(replicas = want, "not leading; scale not written");
            tokio::select! {
                _ = inner.shutdown.cancelled() => return Applied::Shutdown,
                r = desired.changed() => if r.is_err() { return Applied::Shutdown },
            }
            match *desired.borrow_and_update() {
                Some(n) => want = n,
                None => return Applied::Dropped,
            }
            backoff = inner.opts.retry_initial;
            continue;
        };
        if desired.has_changed().unwrap_or(false) {
            continue; // withdrawn or replaced meanwhile (a new term withdraws first)
        }
        let known = inner.deployment(&entry.key);
        let term_id = inner.term_id.load(Ordering::Relaxed);
        if let Some(d) = &known
            && d.replicas == Some(want)
            && entry.wrote_in_term.load(Ordering::Relaxed) != term_id
        {
            // Knative's rule: the scale already says so; nothing to write. Trusted only until
            // this term's first write: after it, the watch may lag behind that write.
            tracing::debug!(replicas = want, deployment = %d.name, "scale unchanged");
            entry.update(|st| st.deployment_missing = false);
            return Applied::Done(want);
        }
        let outcome = match &known {
            None => Outcome::Missing,
            Some(d) => {
                inner.writes.fetch_add(1, Ordering::Relaxed);
                entry.wrote_in_term.store(term_id, Ordering::Relaxed);
                let call = patch(inner, &entry.key, &d.name, want);
                match term {
                    None => call.await,
                    Some(term) => tokio::select! {
                        o = call => o,
                        () = term.cancelled() => Outcome::Retry("leadership ended".into()),
                    },
                }
            }
        };
        let name = known.map(|d| d.name);
        count(inner, &entry.key, &outcome);
        let missing = matches!(outcome, Outcome::Missing);
        let wait = match outcome {
            Outcome::Ok => {
                tracing::info!(replicas = want, deployment = name.as_deref(), "scaled");
                entry.update(|st| st.deployment_missing = false);
                return Applied::Done(want);
            }
            Outcome::Missing if want == 0 => {
                // Nothing runs without a Deployment: zero is already true.
                return Applied::Done(0);
            }
            Outcome::Missing => {
                let since = *missing_since.get_or_insert_with(Instant::now);
                let grace = inner.opts.missing_deployment_grace;
                if since.elapsed() >= grace {
                    if !entry.read(|st| st.deployment_missing) {
                        tracing::warn!(
                            ?grace,
                            "no Deployment named for this revision and controlled by it; \
                             revision failing (DeploymentMissing), still retrying"
                        );
                    }
                    entry.update(|st| st.deployment_missing = true);
                    backoff
                } else {
                    tracing::debug!("no Deployment for this revision yet; waiting");
                    backoff.min(grace - since.elapsed())
                }
            }
            Outcome::Retry(e) => {
                tracing::warn!(replicas = want, error = %e, ?backoff, "scale patch failed; retrying");
                backoff
            }
            Outcome::Failed(e) => {
                backoff = inner.opts.retry_max;
                tracing::error!(replicas = want, error = %e, ?backoff, "scale patch rejected; retrying");
                backoff
            }
        };
        tokio::select! {
            _ = inner.shutdown.cancelled() => return Applied::Shutdown,
            _ = desired.changed() => {}
            // A Deployment appearing ends the wait for it, not a backoff after an error.
            _ = deployments.changed(), if missing => {}
            _ = sleep(wait) => {}
        }
        backoff = (backoff * 2).min(inner.opts.retry_max);
    }
}

async fn patch(inner: &Inner, key: &RevisionKey, name: &str, replicas: u32) -> Outcome {
    let api: Api<Deployment> = Api::namespaced(inner.client.clone(), &key.namespace);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let body = Patch::Merge(serde_json::json!({ "spec": { "replicas": replicas } }));
    match tokio::time::timeout(PATCH_TIMEOUT, api.patch_scale(name, &params, &body)).await {
        Err(_) => Outcome::Retry(format!("no answer within {PATCH_TIMEOUT:?}")),
        Ok(Ok(_)) => Outcome::Ok,
        Ok(Err(kube::Error::Api(status))) => match status.code {
            404 => Outcome::Missing,
            409 | 429 | 500..=599 => Outcome::Retry(format!("{} {}", status.code, status.message)),
            code => Outcome::Failed(format!("{code} {}", status.message)),
        },
        Ok(Err(e)) => Outcome::Retry(e.to_string()),
    }
}

fn count(inner: &Inner, key: &RevisionKey, outcome: &Outcome) {
    let outcome = match outcome {
        Outcome::Ok => ScaleOutcome::Ok,
        Outcome::Retry(_) => ScaleOutcome::Retried,
        Outcome::Missing => ScaleOutcome::Missing,
        Outcome::Failed(_) => ScaleOutcome::Failed,
    };
    inner
        .metrics
        .scale_patches
        .get_or_create(&ScaleLabels {
            namespace: key.namespace.to_string(),
            revision: key.name.to_string(),
            outcome,
        })
        .inc();
}
