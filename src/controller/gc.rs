//! Revision garbage collection per `config-gc` (Knative's "v2" collector, run after each
//! Configuration reconcile as Knative's `gc.Collect` is): the rule itself is
//! [`crate::config::gc::collectable`]; this module turns a configuration's revisions into its
//! candidates, using the routing state the Route reconciler's labeler writes. A routed revision
//! (`routingState: active`), the latest created and the latest ready are never collected.

use std::sync::Arc;

use kube::ResourceExt;
use kube::api::DeleteParams;
use tokio::time::Duration;

use super::configuration::routing_state;
use super::{Ctx, Error, EventKind};
use crate::config::GcConfig;
use crate::config::gc::{GcCandidate, collectable};
use crate::knative::names::labels;
use crate::knative::{Configuration, Revision};

fn since(
    now: k8s_openapi::jiff::Timestamp,
    then: Option<k8s_openapi::jiff::Timestamp>,
) -> Duration {
    then.and_then(|t| now.duration_since(t).try_into().ok())
        .unwrap_or(Duration::ZERO)
}

/// The candidates among `revisions` of `cfg`, as of `now`. Pure.
pub fn candidates(
    cfg: &Configuration,
    revisions: &[Arc<Revision>],
    now: k8s_openapi::jiff::Timestamp,
) -> Vec<GcCandidate<String>> {
    let st = cfg.status.clone().unwrap_or_default().fields;
    revisions
        .iter()
        .map(|r| {
            let name = r.name_any();
            let routed = r.labels().get(labels::ROUTING_STATE).map(String::as_str)
                == Some(routing_state::ACTIVE);
            let active = routed
                || st.latest_created_revision_name.as_deref() == Some(name.as_str())
                || st.latest_ready_revision_name.as_deref() == Some(name.as_str());
            let created = r.metadata.creation_timestamp.as_ref().map(|t| t.0);
            let modified = r
                .annotations()
                .get(routing_state::MODIFIED_ANNOTATION)
                .and_then(|v| v.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .or(created);
            GcCandidate {
                key: name,
                active,
                age: since(now, created),
                inactive_for: since(now, modified),
            }
        })
        .collect()
}

/// Deletes what `config` says to collect among `cfg`'s `revisions`; returns the names deleted.
pub async fn collect(
    ctx: &Ctx,
    cfg: &Configuration,
    revisions: &[Arc<Revision>],
    config: &GcConfig,
) -> Result<Vec<String>, Error> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let doomed = collectable(config, &candidates(cfg, revisions, now));
    let ns = cfg.namespace().unwrap_or_default();
    let api = ctx.api::<Revision>(&ns);
    for name in &doomed {
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => {
                tracing::info!(revision = %name, "collected");
                let note = format!("Deleted stale Revision {name:?} (config-gc)");
                // About the Revision too: each collection its own Event, not a repeat of the
                // first one's (whose note names another revision).
                match revisions.iter().find(|r| r.name_any() == *name) {
                    Some(rev) => {
                        ctx.event_related(cfg, &**rev, EventKind::Normal, "Deleted", note)
                            .await
                    }
                    None => ctx.event(cfg, EventKind::Normal, "Deleted", note).await,
                }
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(doomed)
}
