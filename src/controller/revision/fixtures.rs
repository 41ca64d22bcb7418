//! Fixture builders for the revision reconciler's unit tests:
//! `RevisionFixture::new("hello-00001").port(Some("h2c"), 9000).build()`.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, ContainerState, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, EnvVar, Pod, PodStatus, Probe,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::knative::names::labels;
use crate::knative::{Revision, RevisionSpec};

/// A Revision as the Configuration reconciler writes it: labels, one user container.
#[derive(Debug, Clone)]
pub struct RevisionFixture {
    rev: Revision,
}

impl RevisionFixture {
    /// `name` in `default`, of configuration and service `hello`, generation 1, one container
    /// `user-container` with the helloworld image and `TARGET=World`, no port.
    pub fn new(name: &str) -> Self {
        let mut rev = Revision::new(
            name,
            RevisionSpec {
                pod_spec: k8s_openapi::api::core::v1::PodSpec {
                    containers: vec![Container {
                        name: "user-container".into(),
                        image: Some("ghcr.io/knative/helloworld-go:latest".into()),
                        env: Some(vec![EnvVar {
                            name: "TARGET".into(),
                            value: Some("World".into()),
                            ..EnvVar::default()
                        }]),
                        ..Container::default()
                    }],
                    ..Default::default()
                },
                ..RevisionSpec::default()
            },
        );
        rev.metadata = ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            // A uid is 36 characters at most, as the API server writes them.
            uid: Some(format!("uid-{name}").chars().take(36).collect()),
            generation: Some(1),
            labels: Some(BTreeMap::from([
                (labels::CONFIGURATION.to_string(), "hello".to_string()),
                (labels::SERVICE.to_string(), "hello".to_string()),
                (
                    labels::CONFIGURATION_GENERATION.to_string(),
                    "1".to_string(),
                ),
            ])),
            ..ObjectMeta::default()
        };
        Self { rev }
    }

    fn user(&mut self) -> &mut Container {
        let i = crate::controller::revision::resolve::serving_container(
            &self.rev.spec.pod_spec.containers,
        );
        &mut self.rev.spec.pod_spec.containers[i]
    }

    /// The user container's port (`h2c` selects HTTP/2).
    pub fn port(mut self, name: Option<&str>, port: i32) -> Self {
        self.user().ports = Some(vec![ContainerPort {
            name: name.map(Into::into),
            container_port: port,
            ..ContainerPort::default()
        }]);
        self
    }

    pub fn container_concurrency(mut self, cc: i64) -> Self {
        self.rev.spec.container_concurrency = Some(cc);
        self
    }

    pub fn timeout(mut self, seconds: i64) -> Self {
        self.rev.spec.timeout_seconds = Some(seconds);
        self
    }

    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.rev
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), v.into());
        self
    }

    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.rev
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), v.into());
        self
    }

    /// The user container's readiness probe.
    pub fn readiness(mut self, probe: serde_json::Value) -> Self {
        self.user().readiness_probe = Some(serde_json::from_value::<Probe>(probe).unwrap());
        self
    }

    /// Any change to the user container.
    pub fn with_user(mut self, f: impl FnOnce(&mut Container)) -> Self {
        f(self.user());
        self
    }

    /// Any change to the revision.
    pub fn with(mut self, f: impl FnOnce(&mut Revision)) -> Self {
        f(&mut self.rev);
        self
    }

    /// A second container without a port, placed first; the user container gets port 8080
    /// if it has none, so it stays the serving container.
    pub fn sidecar_container(mut self, name: &str) -> Self {
        if self.user().ports.is_none() {
            self = self.port(None, 8080);
        }
        self.rev.spec.pod_spec.containers.insert(
            0,
            Container {
                name: name.into(),
                image: Some("busybox".into()),
                ..Container::default()
            },
        );
        self
    }

    pub fn no_containers(mut self) -> Self {
        self.rev.spec.pod_spec.containers.clear();
        self
    }

    pub fn build(self) -> Revision {
        self.rev
    }
}

/// A Deployment with `replicas` wanted and the given status numbers and conditions
/// (`(type, status, reason)`).
pub fn deployment(
    replicas: i32,
    ready: i32,
    available: i32,
    conditions: &[(&str, &str, &str)],
) -> Deployment {
    Deployment {
        metadata: ObjectMeta {
            name: Some("d".into()),
            ..ObjectMeta::default()
        },
        spec: Some(k8s_openapi::api::apps::v1::DeploymentSpec {
            replicas: Some(replicas),
            ..Default::default()
        }),
        status: Some(DeploymentStatus {
            replicas: Some(replicas),
            ready_replicas: Some(ready),
            available_replicas: Some(available),
            conditions: Some(
                conditions
                    .iter()
                    .map(|(t, s, r)| DeploymentCondition {
                        type_: (*t).into(),
                        status: (*s).into(),
                        reason: Some((*r).into()),
                        message: Some(format!("{t} is {s} because {r}")),
                        ..DeploymentCondition::default()
                    })
                    .collect(),
            ),
            ..DeploymentStatus::default()
        }),
    }
}

/// A pod whose user container is in `state` with `last` as its last termination, and a
/// running queue sidecar.
pub fn pod(state: ContainerState, last: Option<ContainerStateTerminated>) -> Pod {
    let running = ContainerState {
        running: Some(Default::default()),
        ..ContainerState::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some("p".into()),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(PodStatus {
            container_statuses: Some(vec![
                ContainerStatus {
                    name: "queue-proxy".into(),
                    state: Some(running),
                    ..ContainerStatus::default()
                },
                ContainerStatus {
                    name: "user-container".into(),
                    state: Some(state),
                    last_state: last.map(|t| ContainerState {
                        terminated: Some(t),
                        ..ContainerState::default()
                    }),
                    restart_count: 2,
                    ..ContainerStatus::default()
                },
            ]),
            ..PodStatus::default()
        }),
    }
}

/// A container state waiting for `reason` with `message`.
pub fn waiting(reason: &str, message: &str) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.into()),
            message: Some(message.into()),
        }),
        ..ContainerState::default()
    }
}

/// A last termination with `code`, `reason` and `message`.
pub fn terminated(code: i32, reason: &str, message: &str) -> ContainerStateTerminated {
    ContainerStateTerminated {
        exit_code: code,
        reason: (!reason.is_empty()).then(|| reason.into()),
        message: (!message.is_empty()).then(|| message.into()),
        ..ContainerStateTerminated::default()
    }
}
