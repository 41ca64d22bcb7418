//! Fixture builders for the route's unit tests: `revision("hello-00001").ready()`,
//! `configuration("hello").latest_ready("hello-00001")`, `route("hello").with_config("hello", 100)`.

use k8s_openapi::api::core::v1::{Container, ContainerPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::knative::duck::{Condition, ConditionStatus};
use crate::knative::names::labels;
use crate::knative::{
    Configuration, ConfigurationSpec, ConfigurationStatus, Revision, RevisionSpec, RevisionStatus,
    Route, RouteSpec, RouteStatus, TrafficTarget, condition,
};

pub const NS: &str = "default";

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(NS.into()),
        uid: Some(format!("uid-{name}")),
        generation: Some(1),
        ..ObjectMeta::default()
    }
}

fn ready(status: ConditionStatus) -> Condition {
    Condition::new(condition::READY, status)
}

/// A revision builder.
pub struct Rev(pub Revision);

/// A revision of configuration `hello` (from its name's prefix), not yet Ready.
pub fn revision(name: &str) -> Rev {
    let mut m = meta(name);
    let cfg = name.rsplit_once('-').map_or(name, |(c, _)| c);
    m.labels = Some([(labels::CONFIGURATION.to_string(), cfg.to_string())].into());
    let mut r = Revision::new(name, RevisionSpec::default());
    r.metadata = m;
    Rev(r)
}

impl Rev {
    fn status(mut self, s: ConditionStatus) -> Self {
        let st = self.0.status.get_or_insert_with(RevisionStatus::default);
        st.status.conditions = vec![ready(s)];
        self
    }
    pub fn ready(self) -> Self {
        self.status(ConditionStatus::True)
    }
    pub fn failed(self) -> Self {
        self.status(ConditionStatus::False)
    }
    pub fn h2c(mut self) -> Self {
        self.0.spec.pod_spec.containers = vec![Container {
            ports: Some(vec![ContainerPort {
                name: Some("h2c".into()),
                container_port: 8080,
                ..ContainerPort::default()
            }]),
            ..Container::default()
        }];
        self
    }
    pub fn timeout(mut self, s: i64) -> Self {
        self.0.spec.timeout_seconds = Some(s);
        self
    }
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_default()
            .insert(k.into(), v.into());
        self
    }
    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(k.into(), v.into());
        self
    }
    pub fn build(self) -> Revision {
        self.0
    }
}

/// A configuration builder.
pub struct Cfg(pub Configuration);

pub fn configuration(name: &str) -> Cfg {
    let mut c = Configuration::new(name, ConfigurationSpec::default());
    c.metadata = meta(name);
    c.status = Some(ConfigurationStatus::default());
    Cfg(c)
}

impl Cfg {
    fn st(&mut self) -> &mut ConfigurationStatus {
        self.0.status.get_or_insert_with(Default::default)
    }
    pub fn latest_ready(mut self, rev: &str) -> Self {
        self.st().fields.latest_ready_revision_name = Some(rev.into());
        self
    }
    pub fn latest_created(mut self, rev: &str) -> Self {
        self.st().fields.latest_created_revision_name = Some(rev.into());
        self
    }
    pub fn failed(mut self) -> Self {
        self.st().status.conditions = vec![ready(ConditionStatus::False)];
        self
    }
    pub fn build(self) -> Configuration {
        self.0
    }
}

/// A route builder.
pub struct Rt(pub Route);

pub fn route(name: &str) -> Rt {
    let mut r = Route::new(name, RouteSpec::default());
    r.metadata = meta(name);
    Rt(r)
}

impl Rt {
    pub fn target(mut self, t: TrafficTarget) -> Self {
        self.0.spec.traffic.push(t);
        self
    }
    /// `configurationName: cfg`, `latestRevision: true`, `percent`.
    pub fn with_config(self, cfg: &str, percent: i64) -> Self {
        self.target(TrafficTarget {
            configuration_name: Some(cfg.into()),
            latest_revision: Some(true),
            percent: Some(percent),
            ..TrafficTarget::default()
        })
    }
    /// `revisionName: rev`, `percent`.
    pub fn with_revision(self, rev: &str, percent: i64) -> Self {
        self.target(TrafficTarget {
            revision_name: Some(rev.into()),
            percent: Some(percent),
            ..TrafficTarget::default()
        })
    }
    /// A tagged `revisionName` target.
    pub fn tagged(self, tag: &str, rev: &str, percent: i64) -> Self {
        self.target(TrafficTarget {
            tag: Some(tag.into()),
            revision_name: Some(rev.into()),
            percent: Some(percent),
            ..TrafficTarget::default()
        })
    }
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_default()
            .insert(k.into(), v.into());
        self
    }
    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(k.into(), v.into());
        self
    }
    pub fn status_traffic(mut self, traffic: Vec<TrafficTarget>) -> Self {
        self.0
            .status
            .get_or_insert_with(RouteStatus::default)
            .fields
            .traffic = traffic;
        self
    }
    pub fn build(self) -> Route {
        self.0
    }
}

/// `Referenced` from lists of fixtures.
pub fn refs(
    configurations: Vec<Configuration>,
    revisions: Vec<Revision>,
) -> super::traffic::Referenced {
    use kube::ResourceExt;
    super::traffic::Referenced {
        configurations: configurations
            .into_iter()
            .map(|c| (c.name_any(), c))
            .collect(),
        revisions: revisions.into_iter().map(|r| (r.name_any(), r)).collect(),
    }
}
