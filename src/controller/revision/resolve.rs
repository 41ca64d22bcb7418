//! A Revision resolved once per reconcile against the ConfigMaps in force: the numbers every
//! builder reads (user port, protocol, containerConcurrency, timeouts, scale bounds, progress
//! deadline), computed by the same resolver the data plane uses
//! ([`crate::config::revision::resolve_revision`] over
//! [`crate::platform::kubernetes::revisions::revision_input`]), so the sidecar, the activator
//! and the autoscaler agree on every value.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Container;
use kube::ResourceExt;

use crate::config::annotations::PROGRESS_DEADLINE;
use crate::config::revision::resolve_revision;
use crate::config::{
    AutoscalerConfig, AutoscalingSpec, ConfigSet, DefaultsConfig, DeploymentConfig, Problem,
    Problems,
};
use crate::knative::Revision;
use crate::knative::names::labels;
use crate::platform::kubernetes::revisions::revision_input;
use crate::queue::settings::{DEFAULT_ADMIN_PORT, DEFAULT_DATA_PORT, DEFAULT_USER_PORT};
use crate::revision::{Protocol, Timeouts};

/// The largest containerConcurrency the queue sidecar accepts (`CONTAINER_CONCURRENCY`).
pub const SIDECAR_MAX_CONCURRENCY: u32 = 1000;

/// What the builders read of one revision. Always valid: [`resolve`] reports every problem
/// instead of returning one.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The configuration's name: from the revision's controller owner reference, else the
    /// label `serving.knative.dev/configuration` ("" when it has neither).
    pub configuration: String,
    /// `serving.knative.dev/service` ("" when the revision has none).
    pub service: String,
    /// Index of the serving container in `spec.containers`: the one with a port, else the
    /// first (Knative allows one port, on one container).
    pub serving_container: usize,
    /// The serving container's port (its first `containerPort`, 8080 when none).
    pub user_port: u16,
    /// `h2c` when the serving container's port is named so.
    pub protocol: Protocol,
    pub container_concurrency: u32,
    pub timeouts: Timeouts,
    /// The effective autoscaling settings (class, scale bounds, initial scale, window).
    pub autoscaling: Arc<AutoscalingSpec>,
    /// `serving.knative.dev/progress-deadline`, else config-deployment's `progress-deadline`.
    pub progress_deadline: Duration,
    /// The revision's proxy tag (the sidecar's `THAW_PROXY_TAG`), when the tag key is known.
    pub proxy_tag: Option<String>,
    /// The previous form's tag its Deployment carries (`THAW_PROXY_TAG_LEGACY`, this release
    /// only): from the live Deployment, or computed for a new one within the upgrade window
    /// ([`crate::knative::proxy_tag`]).
    pub legacy_proxy_tag: Option<String>,
}

/// The serving container of a pod spec: the first container with a port, else the first.
pub fn serving_container(containers: &[Container]) -> usize {
    containers
        .iter()
        .position(|c| c.ports.as_ref().is_some_and(|p| !p.is_empty()))
        .unwrap_or(0)
}

/// Resolves `rev` against the ConfigMaps. Every problem is reported, named by its field or
/// annotation: the resolver's (containerConcurrency range, timeouts, annotations), a revision
/// without containers, and a user port the queue sidecar holds (8012, 9091).
pub fn resolve(
    rev: &Revision,
    defaults: &DefaultsConfig,
    autoscaler: &AutoscalerConfig,
    deployment: &DeploymentConfig,
) -> Result<Resolved, Problems> {
    let mut problems = Vec::new();
    let containers = &rev.spec.pod_spec.containers;
    if containers.is_empty() {
        problems.push(Problem::new(
            "spec.containers",
            "",
            "at least one container is required",
        ));
    }
    let serving = serving_container(containers);
    let port = containers
        .get(serving)
        .and_then(|c| c.ports.as_ref()?.first().cloned());
    let user_port = match port.as_ref().map(|p| p.container_port) {
        None | Some(0) => DEFAULT_USER_PORT,
        Some(p) => match u16::try_from(p) {
            Ok(p) if p == DEFAULT_DATA_PORT || p == DEFAULT_ADMIN_PORT => {
                problems.push(Problem::new(
                    format!("spec.containers[{serving}].ports[0].containerPort"),
                    p.to_string(),
                    format!(
                        "is reserved for the queue sidecar (data {DEFAULT_DATA_PORT}, admin \
                         {DEFAULT_ADMIN_PORT})"
                    ),
                ));
                DEFAULT_USER_PORT
            }
            Ok(p) => p,
            Err(_) => {
                problems.push(Problem::new(
                    format!("spec.containers[{serving}].ports[0].containerPort"),
                    p.to_string(),
                    "must be a port from 1 to 65535",
                ));
                DEFAULT_USER_PORT
            }
        },
    };
    let protocol = match port.as_ref().and_then(|p| p.name.as_deref()) {
        Some("h2c") => Protocol::H2c,
        _ => Protocol::Http1,
    };
    let configs = ConfigSet {
        autoscaler: Arc::new(autoscaler.clone()),
        defaults: Arc::new(defaults.clone()),
        ..ConfigSet::default()
    };
    let spec = revision_input(rev).and_then(|input| resolve_revision(&input, &configs));
    let spec = match spec {
        Ok(spec) => Some(spec),
        Err(p) => {
            problems.extend(p.0);
            None
        }
    };
    if let Some(spec) = &spec
        && spec.container_concurrency > SIDECAR_MAX_CONCURRENCY
    {
        problems.push(Problem::new(
            "spec.containerConcurrency",
            spec.container_concurrency.to_string(),
            format!("the queue sidecar admits at most {SIDECAR_MAX_CONCURRENCY}"),
        ));
    }
    let (Some(spec), true) = (spec, problems.is_empty()) else {
        return Err(Problems(problems));
    };
    let progress_deadline = if rev.annotations().contains_key(PROGRESS_DEADLINE) {
        spec.autoscaling.progress_deadline
    } else {
        deployment.progress_deadline
    };
    let label = |k: &str| rev.labels().get(k).cloned().unwrap_or_default();
    // The label holds a hashed value for a name past 63 characters; the owner reference has
    // the configuration's name whole.
    let configuration = rev
        .owner_references()
        .iter()
        .find(|o| o.kind == "Configuration" && o.controller == Some(true))
        .map(|o| o.name.clone())
        .unwrap_or_else(|| label(labels::CONFIGURATION));
    Ok(Resolved {
        namespace: rev.namespace().unwrap_or_default(),
        name: rev.name_any(),
        uid: rev.uid().unwrap_or_default(),
        configuration,
        service: label(labels::SERVICE),
        serving_container: serving,
        user_port,
        protocol,
        container_concurrency: spec.container_concurrency,
        timeouts: spec.timeouts,
        autoscaling: spec.autoscaling,
        progress_deadline,
        proxy_tag: None,
        legacy_proxy_tag: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::revision::fixtures::RevisionFixture;

    fn resolve_default(rev: &Revision) -> Result<Resolved, Problems> {
        resolve(
            rev,
            &DefaultsConfig::default(),
            &AutoscalerConfig::default(),
            &DeploymentConfig::default(),
        )
    }

    #[test]
    fn defaults_fill_what_the_revision_leaves_out() {
        let rev = RevisionFixture::new("hello-00001").build();
        let r = resolve_default(&rev).unwrap();
        assert_eq!(r.user_port, 8080);
        assert_eq!(r.protocol, Protocol::Http1);
        assert_eq!(r.container_concurrency, 0);
        assert_eq!(r.timeouts.total, Duration::from_secs(300));
        assert_eq!(r.progress_deadline, Duration::from_secs(600));
        assert_eq!(r.autoscaling.initial_scale, 1);
        assert_eq!(r.configuration, "hello");
        assert_eq!(r.service, "hello");
    }

    #[test]
    fn the_revision_and_its_annotations_win() {
        let rev = RevisionFixture::new("hello-00001")
            .port(Some("h2c"), 9000)
            .container_concurrency(10)
            .timeout(60)
            .annotation("serving.knative.dev/progress-deadline", "120s")
            .annotation("autoscaling.knative.dev/initial-scale", "3")
            .build();
        let d = DeploymentConfig {
            progress_deadline: Duration::from_secs(900),
            ..DeploymentConfig::default()
        };
        let r = resolve(
            &rev,
            &DefaultsConfig::default(),
            &AutoscalerConfig::default(),
            &d,
        )
        .unwrap();
        assert_eq!(r.user_port, 9000);
        assert_eq!(r.protocol, Protocol::H2c);
        assert_eq!(r.container_concurrency, 10);
        assert_eq!(r.timeouts.total, Duration::from_secs(60));
        assert_eq!(r.progress_deadline, Duration::from_secs(120));
        assert_eq!(r.autoscaling.initial_scale, 3);
        // Without the annotation, config-deployment's deadline.
        let rev = RevisionFixture::new("hello-00001").build();
        let r = resolve(
            &rev,
            &DefaultsConfig::default(),
            &AutoscalerConfig::default(),
            &d,
        )
        .unwrap();
        assert_eq!(r.progress_deadline, Duration::from_secs(900));
    }

    #[test]
    fn every_problem_is_named() {
        let rev = RevisionFixture::new("bad")
            .port(None, 8012)
            .container_concurrency(5000)
            .annotation("autoscaling.knative.dev/min-scale", "x")
            .build();
        let err = resolve_default(&rev).unwrap_err();
        let keys: Vec<&str> = err.0.iter().map(|p| p.key.as_str()).collect();
        assert!(
            keys.contains(&"spec.containers[0].ports[0].containerPort"),
            "{err}"
        );
        assert!(keys.contains(&"spec.containerConcurrency"), "{err}");
        assert!(keys.contains(&"autoscaling.knative.dev/min-scale"), "{err}");
        let rev = RevisionFixture::new("none").no_containers().build();
        let err = resolve_default(&rev).unwrap_err();
        assert_eq!(err.0[0].key, "spec.containers");
    }

    #[test]
    fn the_serving_container_is_the_one_with_a_port() {
        let rev = RevisionFixture::new("multi")
            .sidecar_container("logger")
            .build();
        // The fixture puts the user container (with its port) second.
        assert_eq!(rev.spec.pod_spec.containers[0].name, "logger");
        let r = resolve_default(&rev).unwrap();
        assert_eq!(r.serving_container, 1);
    }
}
