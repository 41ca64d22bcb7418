//! The revision's Deployment `<revision>-deployment` (Knative's `MakeDeployment`): the user's
//! pod spec through Knative's field masks ([`crate::knative::fieldmask::mask`]: a field that
//! `config-features` keeps closed never reaches the Deployment, even if validation were
//! bypassed), with only what Knative adds:
//!
//! - with `secure-pod-defaults` on, each user and init container's security context filled
//!   where the author left it unset ([`secure_defaults`]);
//! - on every user container: `K_REVISION`, `K_CONFIGURATION`, `K_SERVICE`; a `preStop`
//!   hook that waits on the sidecar's `/wait-for-drain` (so the container stops only once
//!   every request that reached the pod has been answered); `stdin`/`tty` off; the
//!   termination message from the logs on error unless the user chose a policy;
//! - on the serving container: its one port as `user-port` (Knative's name; the protocol is
//!   read from the Revision, not from here), `PORT`, its HTTP/TCP readiness probe moved into
//!   the sidecar, and numeric ports in its liveness and startup probes;
//! - the `thaw queue` sidecar ([`super::queue`]), last;
//! - `terminationGracePeriodSeconds`: the drain delay + the revision's timeout (+10 s for the
//!   sidecar to stop; the masks keep the author's value out), `enableServiceLinks: false`
//!   unless the user set it;
//! - `progressDeadlineSeconds` from config-deployment (or the revision's annotation),
//!   `revisionHistoryLimit: 0`, rolling updates with `maxUnavailable: 0`, the pods selected by
//!   the revision's UID and labelled as [`super::meta::child_labels`].
//!
//! **Replicas.** [`deployment`] takes `replicas`: the initial scale when the Deployment is
//! created, `None` for every later apply, so the field stays the autoscaler's (`/scale`).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, HTTPGetAction, Lifecycle, LifecycleHandler,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, SeccompProfile,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::meta::{child_annotations, child_labels, owner_ref, selector};
use super::queue::{DRAIN_PATH, move_readiness, probe_port, queue_container};
use super::resolve::Resolved;
use crate::config::DeploymentConfig;
use crate::config::features::{FeaturesConfig, SecurePodDefaults};
use crate::knative::names::{DEPLOYMENT_SUFFIX, child_name};
use crate::knative::{Revision, fieldmask};
use crate::queue::settings::{DEFAULT_ADMIN_PORT, DEFAULT_DRAIN_DELAY};

/// Knative's name for the serving container's port in the pod.
pub const USER_PORT_NAME: &str = "user-port";
/// Time for the sidecar to stop after its drain, on top of drain delay + timeout.
pub const STOP_MARGIN_SECONDS: i64 = 10;

/// `<revision>-deployment`, within 63 characters.
pub fn deployment_name(revision: &str) -> String {
    child_name(revision, DEPLOYMENT_SUFFIX)
}

/// Sets `name=value` in `env`, replacing a variable of that name (the user's `PORT` or
/// `K_SERVICE` would otherwise be a duplicate the kubelet resolves by order).
fn set_env(env: &mut Vec<EnvVar>, name: &str, value: &str) {
    env.retain(|e| e.name != name);
    env.push(EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    });
}

/// A probe's port as a number (liveness and startup probes stay on the user container, whose
/// port is renamed).
fn numeric_probe(p: &mut Probe, user_port: u16, named: &BTreeMap<String, i32>) {
    if let Some(h) = &mut p.http_get {
        h.port = IntOrString::Int(probe_port(&h.port, user_port, named));
    }
    if let Some(t) = &mut p.tcp_socket {
        t.port = IntOrString::Int(probe_port(&t.port, user_port, named));
    }
}

/// The user containers as they run in the pod (from the masked pod spec `user`), and the
/// readiness probe the sidecar takes.
fn user_containers(user: &PodSpec, r: &Resolved) -> (Vec<Container>, super::queue::MovedProbe) {
    let mut moved = None;
    let containers = user
        .containers
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut c = c.clone();
            let mut env = c.env.take().unwrap_or_default();
            set_env(&mut env, "K_REVISION", &r.name);
            set_env(&mut env, "K_CONFIGURATION", &r.configuration);
            set_env(&mut env, "K_SERVICE", &r.service);
            if i == r.serving_container {
                let named: BTreeMap<String, i32> = c
                    .ports
                    .iter()
                    .flatten()
                    .filter_map(|p| Some((p.name.clone()?, p.container_port)))
                    .collect();
                set_env(&mut env, "PORT", &r.user_port.to_string());
                c.ports = Some(vec![ContainerPort {
                    name: Some(USER_PORT_NAME.into()),
                    container_port: i32::from(r.user_port),
                    protocol: Some("TCP".into()),
                    ..ContainerPort::default()
                }]);
                let (m, keep) = move_readiness(c.readiness_probe.as_ref(), r.user_port, &named);
                if !keep {
                    c.readiness_probe = None;
                }
                moved = Some(m);
                for p in [&mut c.liveness_probe, &mut c.startup_probe]
                    .into_iter()
                    .flatten()
                {
                    numeric_probe(p, r.user_port, &named);
                }
            }
            c.env = Some(env);
            let lifecycle = c.lifecycle.get_or_insert_with(Lifecycle::default);
            lifecycle.pre_stop = Some(LifecycleHandler {
                http_get: Some(HTTPGetAction {
                    path: Some(DRAIN_PATH.into()),
                    port: IntOrString::Int(i32::from(DEFAULT_ADMIN_PORT)),
                    ..HTTPGetAction::default()
                }),
                ..LifecycleHandler::default()
            });
            c.stdin = Some(false);
            c.tty = Some(false);
            if c.termination_message_policy.is_none() {
                c.termination_message_policy = Some("FallbackToLogsOnError".into());
            }
            c
        })
        .collect();
    let moved = moved.unwrap_or_else(|| move_readiness(None, r.user_port, &BTreeMap::new()).0);
    (containers, moved)
}

/// Knative's `secure-pod-defaults` on one container: what the author left unset in its
/// security context, filled as Pod Security `restricted` asks (`pod`: the pod's own).
pub fn secure_defaults(
    c: &mut Container,
    pod: Option<&PodSecurityContext>,
    mode: SecurePodDefaults,
) {
    if mode == SecurePodDefaults::Disabled {
        return;
    }
    let mut sc = c.security_context.take().unwrap_or_default();
    if sc.allow_privilege_escalation.is_none() {
        sc.allow_privilege_escalation = Some(false);
    }
    let pod_seccomp = pod
        .and_then(|p| p.seccomp_profile.as_ref())
        .is_some_and(|s| !s.type_.is_empty());
    if !pod_seccomp {
        let profile = sc
            .seccomp_profile
            .get_or_insert_with(SeccompProfile::default);
        if profile.type_.is_empty() {
            profile.type_ = "RuntimeDefault".into();
        }
    }
    if sc.capabilities.is_none() {
        let low_port = c.ports.iter().flatten().any(|p| p.container_port < 1024);
        sc.capabilities = Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: low_port.then(|| vec![fieldmask::NET_BIND_SERVICE.into()]),
        });
    }
    if mode == SecurePodDefaults::Enabled
        && sc.run_as_non_root.is_none()
        && pod.and_then(|p| p.run_as_non_root).is_none()
    {
        sc.run_as_non_root = Some(true);
    }
    c.security_context = Some(sc);
}

/// The pod spec: the user's through the field masks, with the sidecar and what Knative adds.
pub fn pod_spec(
    rev: &Revision,
    r: &Resolved,
    cfg: &DeploymentConfig,
    features: &FeaturesConfig,
) -> PodSpec {
    let mut user = fieldmask::mask(&rev.spec.pod_spec, features);
    // Knative's defaulting, for a Revision that was not created through a Configuration.
    crate::knative::names::default_container_names(&mut user);
    let (mut containers, moved) = user_containers(&user, r);
    let mode = features.secure_pod_defaults;
    for c in containers
        .iter_mut()
        .chain(user.init_containers.iter_mut().flatten())
    {
        secure_defaults(c, user.security_context.as_ref(), mode);
    }
    containers.push(queue_container(r, cfg, &moved));
    // The masks keep `terminationGracePeriodSeconds` from the author: the drain sets it.
    let grace = DEFAULT_DRAIN_DELAY.as_secs() as i64
        + r.timeouts.total.as_secs() as i64
        + STOP_MARGIN_SECONDS;
    PodSpec {
        containers,
        termination_grace_period_seconds: Some(grace),
        enable_service_links: Some(user.enable_service_links.unwrap_or(false)),
        ..user
    }
}

/// The revision's Deployment. `replicas`: `Some(initial scale)` when creating it, `None` on
/// every later apply (the autoscaler owns the field).
pub fn deployment(
    rev: &Revision,
    r: &Resolved,
    cfg: &DeploymentConfig,
    features: &FeaturesConfig,
    replicas: Option<i32>,
) -> Deployment {
    let labels = child_labels(rev);
    let annotations = child_annotations(rev);
    Deployment {
        metadata: ObjectMeta {
            name: Some(deployment_name(&r.name)),
            namespace: Some(r.namespace.clone()),
            labels: Some(labels.clone()),
            annotations: (!annotations.is_empty()).then(|| annotations.clone()),
            owner_references: Some(vec![owner_ref(rev)]),
            ..ObjectMeta::default()
        },
        spec: Some(DeploymentSpec {
            replicas,
            selector: LabelSelector {
                match_labels: Some(selector(rev)),
                match_expressions: None,
            },
            progress_deadline_seconds: Some(r.progress_deadline.as_secs() as i32),
            revision_history_limit: Some(0),
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: None,
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    annotations: (!annotations.is_empty()).then_some(annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod_spec(rev, r, cfg, features)),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

/// The replicas a new Deployment starts with: the revision's initial scale (the
/// `autoscaling.knative.dev/initial-scale` annotation, else config-autoscaler's
/// `initial-scale`; an annotation of 0 counts only while `allow-zero-initial-scale` is true,
/// as in Knative). The autoscaler raises it to min-scale if that is higher.
pub fn initial_replicas(r: &Resolved) -> i32 {
    i32::try_from(r.autoscaling.initial_scale).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests;
