//! From a revision's own settings (Knative's Revision spec fields and annotations) and the
//! ConfigMaps to the effective [`RevisionSpec`] the data plane serves with.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::parse::{Problem, Problems};
use super::{ActivatorOverrides, ConfigSet, annotations};
use crate::revision::{Protocol, RevisionKey, RevisionSpec, Timeouts};

/// What a revision says about itself, in the shape of Knative's Revision spec. `None` fields take
/// the `config-defaults` value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RevisionInput {
    pub namespace: String,
    pub name: String,
    /// The owning Service, if any.
    pub service: Option<String>,
    /// `spec.containerConcurrency`.
    pub container_concurrency: Option<u32>,
    /// `spec.timeoutSeconds`; 0 = the configured default, as in Knative.
    pub timeout_seconds: Option<u64>,
    /// `spec.responseStartTimeoutSeconds`.
    pub response_start_timeout_seconds: Option<u64>,
    /// `spec.idleTimeoutSeconds`.
    pub idle_timeout_seconds: Option<u64>,
    /// The container port's name; `h2c` selects HTTP/2 cleartext upstream.
    pub port_name: Option<String>,
    /// `autoscaling.knative.dev/*`, `activator.thaw.dev/*` and other annotations.
    pub annotations: BTreeMap<String, String>,
    /// Hosts that route straight to this revision.
    pub hosts: Vec<String>,
    /// No route sends it traffic any more (its `serving.knative.dev/routingState` is
    /// `reserve`): Knative's PodAutoscaler reachability `Unreachable`, so min-scale no longer
    /// holds it up. `false` (reachable) for `pending`, `active` or no label.
    pub unreachable: bool,
    /// The Revision's `metadata.uid` (Kubernetes only).
    pub uid: Option<String>,
}

/// Merges `input` with `configs` (annotation over ConfigMap over default) and validates the
/// result. Every problem is reported, named by its Revision field or annotation.
pub fn resolve_revision(
    input: &RevisionInput,
    configs: &ConfigSet,
) -> Result<RevisionSpec, Problems> {
    // The namespace's `namespace-defaults` section, if any, over the cluster's defaults.
    let d = configs.defaults.for_namespace(&input.namespace);
    let mut p = Vec::new();

    let cc = input
        .container_concurrency
        .unwrap_or(d.container_concurrency);
    if cc > d.container_concurrency_max_limit {
        p.push(Problem::new(
            "spec.containerConcurrency",
            cc.to_string(),
            format!(
                "must be in [0, container-concurrency-max-limit ({})]",
                d.container_concurrency_max_limit
            ),
        ));
    } else if cc == 0 && !d.allow_container_concurrency_zero {
        p.push(Problem::new(
            "spec.containerConcurrency",
            "0",
            "must be at least 1: allow-container-concurrency-zero is false",
        ));
    }
    // As Knative's revision defaulting: absent or 0 means config-defaults' timeout.
    let total = input
        .timeout_seconds
        .filter(|s| *s > 0)
        .map_or(d.revision_timeout, Duration::from_secs);
    if total > d.max_revision_timeout {
        p.push(Problem::new(
            "spec.timeoutSeconds",
            total.as_secs().to_string(),
            format!(
                "must be in [0, max-revision-timeout-seconds ({})]; 0 = \
                 revision-timeout-seconds",
                d.max_revision_timeout.as_secs()
            ),
        ));
    }
    let response_start = match input.response_start_timeout_seconds {
        Some(s) => Duration::from_secs(s),
        None => d.response_start_timeout().min(total),
    };
    if response_start > total {
        p.push(Problem::new(
            "spec.responseStartTimeoutSeconds",
            response_start.as_secs().to_string(),
            format!("must not exceed the timeout ({}s)", total.as_secs()),
        ));
    }
    let idle = input
        .idle_timeout_seconds
        .map_or(d.revision_idle_timeout, Duration::from_secs);
    if idle > total {
        p.push(Problem::new(
            "spec.idleTimeoutSeconds",
            idle.as_secs().to_string(),
            format!("must not exceed the timeout ({}s)", total.as_secs()),
        ));
    }
    let autoscaling = annotations::resolve(&configs.autoscaler, &input.annotations, cc)
        .map_err(|e| p.extend(e.0))
        .ok();
    let overrides = ActivatorOverrides::parse(&input.annotations, &configs.activator, total)
        .map_err(|e| p.extend(e.0))
        .ok();
    let autoscaling = autoscaling.map(|mut a| {
        a.reachable = !input.unreachable;
        a
    });
    let (Some(autoscaling), Some(overrides)) = (autoscaling, overrides) else {
        return Err(Problems(p));
    };
    if !p.is_empty() {
        return Err(Problems(p));
    }
    let protocol = match input.port_name.as_deref() {
        Some("h2c") => Protocol::H2c,
        _ => Protocol::Http1,
    };
    Ok(RevisionSpec {
        key: RevisionKey::new(&input.namespace, &input.name),
        service: input.service.as_deref().map(Arc::from),
        container_concurrency: cc,
        protocol,
        timeouts: Timeouts {
            total,
            response_start: if response_start.is_zero() {
                total
            } else {
                response_start
            },
            idle: (!idle.is_zero()).then_some(idle),
            cold_wait: overrides.cold_wait.unwrap_or(total),
        },
        queue_depth: overrides
            .queue_depth
            .unwrap_or(configs.activator.queue_depth),
        initial_burst: overrides
            .initial_burst
            .unwrap_or(configs.activator.initial_burst),
        hosts: input.hosts.clone(),
        autoscaling: Arc::new(autoscaling),
        uid: input.uid.as_deref().map(Arc::from),
    })
}
