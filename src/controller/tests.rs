//! The reconcilers' pure parts, from fixture builders (as kube-rs's controller-rs does): what
//! each object becomes, given its spec, its children and the settings.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::configuration::{self, defaulted_spec, revision_name, routing_state};
use super::service::{self, conditions, service_traffic};
use super::{backoff, gc};
use crate::config::{DefaultsConfig, GcConfig};
use crate::knative::duck::{Condition, ConditionStatus, Status};
use crate::knative::names::labels;
use crate::knative::{
    Configuration, ConfigurationSpec, ConfigurationStatus, Revision, RevisionSpec, RevisionStatus,
    RevisionTemplateSpec, Route, RouteSpec, RouteStatus, Service, ServiceSpec, TrafficTarget,
    condition,
};

fn meta(name: &str, generation: i64) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some("default".into()),
        uid: Some(format!("uid-{name}")),
        generation: Some(generation),
        ..Default::default()
    }
}

fn template() -> RevisionTemplateSpec {
    RevisionTemplateSpec {
        metadata: ObjectMeta::default(),
        spec: RevisionSpec {
            pod_spec: PodSpec {
                containers: vec![Container {
                    image: Some("example.com/hello".into()),
                    ..Default::default()
                }],
                ..Default::default()
            },
            ..Default::default()
        },
    }
}

fn svc(traffic: Vec<TrafficTarget>) -> Service {
    Service {
        metadata: meta("hello", 1),
        spec: ServiceSpec {
            configuration: ConfigurationSpec {
                template: template(),
            },
            route: RouteSpec { traffic },
        },
        status: None,
    }
}

fn cfg(generation: i64) -> Configuration {
    Configuration {
        metadata: meta("hello", generation),
        spec: ConfigurationSpec {
            template: template(),
        },
        status: None,
    }
}

fn ready(type_: &str, s: ConditionStatus, reason: Option<&str>) -> Condition {
    Condition {
        reason: reason.map(Into::into),
        message: reason.map(|r| format!("because {r}")),
        ..Condition::new(type_, s)
    }
}

fn status_with(c: Condition, observed: Option<i64>) -> Status {
    Status {
        observed_generation: observed,
        conditions: vec![c],
        ..Default::default()
    }
}

fn rev(name: &str, generation: i64, is_ready: Option<bool>) -> Arc<Revision> {
    let mut m = meta(name, 1);
    m.labels = Some(
        [
            (labels::CONFIGURATION.to_string(), "hello".to_string()),
            (
                labels::CONFIGURATION_GENERATION.to_string(),
                generation.to_string(),
            ),
        ]
        .into(),
    );
    Arc::new(Revision {
        metadata: m,
        spec: RevisionSpec::default(),
        status: is_ready.map(|r| RevisionStatus {
            status: status_with(
                ready(
                    condition::READY,
                    if r {
                        ConditionStatus::True
                    } else {
                        ConditionStatus::False
                    },
                    (!r).then_some("ExitCode1"),
                ),
                Some(1),
            ),
            ..Default::default()
        }),
    })
}

#[test]
fn backoff_doubles_from_5ms_up_to_1000s() {
    assert_eq!(backoff(1), Duration::from_millis(5));
    assert_eq!(backoff(2), Duration::from_millis(10));
    assert_eq!(backoff(11), Duration::from_millis(5 * 1024));
    assert_eq!(backoff(30), Duration::from_secs(1000));
    assert_eq!(backoff(u32::MAX), Duration::from_secs(1000));
}

#[test]
fn a_service_without_traffic_sends_all_of_it_to_its_latest_ready_revision() {
    let t = service_traffic(&svc(vec![]));
    assert_eq!(
        t,
        vec![TrafficTarget {
            configuration_name: Some("hello".into()),
            latest_revision: Some(true),
            percent: Some(100),
            ..Default::default()
        }]
    );
    // A latestRevision target gets the Service's configuration; a fixed one is kept.
    let t = service_traffic(&svc(vec![
        TrafficTarget {
            latest_revision: Some(true),
            percent: Some(50),
            ..Default::default()
        },
        TrafficTarget {
            revision_name: Some("hello-00001".into()),
            latest_revision: Some(false),
            percent: Some(50),
            tag: Some("old".into()),
            ..Default::default()
        },
    ]));
    assert_eq!(t[0].configuration_name.as_deref(), Some("hello"));
    assert_eq!(t[1].configuration_name, None);
    assert_eq!(t[1].revision_name.as_deref(), Some("hello-00001"));
    let route = service::make_route(&svc(vec![]));
    assert_eq!(
        route.metadata.owner_references.as_ref().unwrap()[0].uid,
        "uid-hello"
    );
    assert_eq!(
        route
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .get(labels::SERVICE)
            .map(String::as_str),
        Some("hello")
    );
}

fn child_cfg(observed: i64, latest_ready: Option<&str>, s: ConditionStatus) -> Configuration {
    let mut c = cfg(2);
    c.status = Some(ConfigurationStatus {
        status: status_with(ready(condition::READY, s, None), Some(observed)),
        fields: crate::knative::ConfigurationStatusFields {
            latest_ready_revision_name: latest_ready.map(Into::into),
            latest_created_revision_name: Some("hello-00002".into()),
        },
    });
    c
}

fn child_route(observed: i64, s: ConditionStatus, traffic_to: &str) -> Route {
    Route {
        metadata: meta("hello", 1),
        spec: RouteSpec::default(),
        status: Some(RouteStatus {
            status: status_with(ready(condition::READY, s, None), Some(observed)),
            fields: crate::knative::RouteStatusFields {
                url: Some("http://hello.default.example.com".into()),
                traffic: vec![TrafficTarget {
                    revision_name: Some(traffic_to.into()),
                    latest_revision: Some(true),
                    percent: Some(100),
                    ..Default::default()
                }],
                ..Default::default()
            },
        }),
    }
}

#[test]
fn the_service_status_mirrors_its_children() {
    let s = svc(vec![]);
    let c = child_cfg(2, Some("hello-00002"), ConditionStatus::True);
    let r = child_route(1, ConditionStatus::True, "hello-00002");
    let st = service::compute_status(&s, Ok(Some(&c)), Ok(Some(&r)), None);
    assert!(st.status.is_true(conditions::CONFIGURATIONS_READY));
    assert!(st.status.is_true(conditions::ROUTES_READY));
    assert!(st.status.is_true(condition::READY));
    assert_eq!(st.status.observed_generation, Some(1));
    assert_eq!(
        st.configuration.latest_ready_revision_name.as_deref(),
        Some("hello-00002")
    );
    assert_eq!(
        st.route.url.as_deref(),
        Some("http://hello.default.example.com")
    );

    // A child that has not observed its generation is OutOfDate.
    let stale = child_cfg(1, Some("hello-00002"), ConditionStatus::True);
    let st = service::compute_status(&s, Ok(Some(&stale)), Ok(Some(&r)), None);
    let c = st
        .status
        .condition(conditions::CONFIGURATIONS_READY)
        .unwrap();
    assert_eq!(
        (c.status, c.reason.as_deref()),
        (ConditionStatus::Unknown, Some("OutOfDate"))
    );
    assert_eq!(
        st.status.condition(condition::READY).unwrap().status,
        ConditionStatus::Unknown
    );

    // The Route still routes to the old revision: TrafficNotMigrated.
    let old = child_route(1, ConditionStatus::True, "hello-00001");
    let st = service::compute_status(
        &s,
        Ok(Some(&child_cfg(
            2,
            Some("hello-00002"),
            ConditionStatus::True,
        ))),
        Ok(Some(&old)),
        None,
    );
    let c = st.status.condition(conditions::ROUTES_READY).unwrap();
    assert_eq!(c.reason.as_deref(), Some("TrafficNotMigrated"));

    // A failed configuration makes the Service False with its reason.
    let failed = Configuration {
        status: Some(ConfigurationStatus {
            status: status_with(
                ready(
                    condition::READY,
                    ConditionStatus::False,
                    Some("RevisionFailed"),
                ),
                Some(2),
            ),
            ..Default::default()
        }),
        ..cfg(2)
    };
    let st = service::compute_status(&s, Ok(Some(&failed)), Ok(Some(&r)), None);
    let c = st.status.condition(condition::READY).unwrap();
    assert_eq!(
        (c.status, c.reason.as_deref()),
        (ConditionStatus::False, Some("RevisionFailed"))
    );

    // A child that is not ours.
    let st = service::compute_status(&s, Err("not ours"), Ok(Some(&r)), None);
    let c = st
        .status
        .condition(conditions::CONFIGURATIONS_READY)
        .unwrap();
    assert_eq!(
        (c.status, c.reason.as_deref()),
        (ConditionStatus::False, Some("NotOwned"))
    );
}

#[test]
fn revision_names_are_generation_numbered_or_the_templates_own() {
    assert_eq!(revision_name(&cfg(3)), "hello-00003");
    let mut c = cfg(3);
    c.spec.template.metadata.name = Some("hello-blue".into());
    assert_eq!(revision_name(&c), "hello-blue");
    let mut long = cfg(1);
    long.metadata.name = Some("x".repeat(70));
    let n = revision_name(&long);
    assert_eq!(n.len(), 63);
    assert!(n.ends_with("-00001"));
    let r = configuration::make_revision(&long, &DefaultsConfig::default(), "2026-01-01T00:00:00Z");
    for (k, v) in r.metadata.labels.as_ref().unwrap() {
        assert!(v.len() <= 63, "{k}={v}");
    }
    assert_eq!(
        r.metadata
            .labels
            .as_ref()
            .unwrap()
            .get(labels::ROUTING_STATE)
            .map(String::as_str),
        Some(routing_state::PENDING)
    );
    assert_eq!(
        r.metadata
            .annotations
            .as_ref()
            .unwrap()
            .get(routing_state::MODIFIED_ANNOTATION)
            .map(String::as_str),
        Some("2026-01-01T00:00:00Z")
    );
}

#[test]
fn defaults_are_resolved_into_the_revision_spec() {
    let d = DefaultsConfig {
        container_concurrency: 7,
        revision_timeout: Duration::from_secs(120),
        revision_idle_timeout: Duration::from_secs(30),
        ..DefaultsConfig::default()
    };
    let s = defaulted_spec(&template().spec, &d);
    assert_eq!(s.container_concurrency, Some(7));
    assert_eq!(s.timeout_seconds, Some(120));
    assert_eq!(s.idle_timeout_seconds, Some(30));
    assert_eq!(s.response_start_timeout_seconds, None);
    assert_eq!(s.pod_spec.containers[0].name, "user-container");
    assert_eq!(s.pod_spec.enable_service_links, Some(false));
    // timeoutSeconds 0 means the default; what the user set stays.
    let mut t = template().spec;
    t.timeout_seconds = Some(0);
    t.container_concurrency = Some(0);
    t.pod_spec.enable_service_links = Some(true);
    t.pod_spec.containers[0].name = "app".into();
    let s = defaulted_spec(&t, &d);
    assert_eq!(s.timeout_seconds, Some(120));
    assert_eq!(s.container_concurrency, Some(0));
    assert_eq!(s.pod_spec.enable_service_links, Some(true));
    assert_eq!(s.pod_spec.containers[0].name, "app");
}

/// Knative's `RevisionSpec.applyDefault`: a container's mount of a ConfigMap, Secret or
/// projected volume becomes read-only (even set `false`), one of an emptyDir or a
/// persistentVolumeClaim stays as written, an init container's is left alone
/// (conformance/api/v1's TestConfigMapVolume sends such mounts without `readOnly`).
#[test]
fn mounts_of_read_only_volumes_default_to_read_only() {
    use k8s_openapi::api::core::v1::{Container, Volume, VolumeMount};
    let volume = |name: &str, kind: &str| -> Volume {
        serde_json::from_value(serde_json::json!({"name": name, kind: {}})).unwrap()
    };
    let mount = |name: &str, read_only: Option<bool>| VolumeMount {
        name: name.into(),
        mount_path: format!("/{name}"),
        read_only,
        ..VolumeMount::default()
    };
    let mut t = template().spec;
    t.pod_spec.volumes = Some(vec![
        volume("cm", "configMap"),
        volume("scratch", "emptyDir"),
        volume("claim", "persistentVolumeClaim"),
        volume("secret", "secret"),
    ]);
    t.pod_spec.containers[0].volume_mounts = Some(vec![
        mount("cm", None),
        mount("scratch", None),
        mount("claim", Some(false)),
        mount("secret", Some(false)),
    ]);
    t.pod_spec.init_containers = Some(vec![Container {
        name: "init".into(),
        volume_mounts: Some(vec![mount("cm", None)]),
        ..Container::default()
    }]);
    let s = defaulted_spec(&t, &DefaultsConfig::default());
    let read_only: Vec<Option<bool>> = s.pod_spec.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.read_only)
        .collect();
    assert_eq!(read_only, [Some(true), None, Some(false), Some(true)]);
    let init = &s.pod_spec.init_containers.as_ref().unwrap()[0];
    assert_eq!(init.volume_mounts.as_ref().unwrap()[0].read_only, None);
}

#[test]
fn latest_ready_moves_only_to_a_ready_revision_of_a_newer_generation() {
    let mut c = cfg(3);
    c.status = Some(ConfigurationStatus {
        fields: crate::knative::ConfigurationStatusFields {
            latest_ready_revision_name: Some("hello-00001".into()),
            latest_created_revision_name: Some("hello-00002".into()),
        },
        ..Default::default()
    });
    let revs = vec![
        rev("hello-00001", 1, Some(true)),
        rev("hello-00002", 2, Some(true)),
        rev("hello-00003", 3, None),
    ];
    let st = configuration::compute_status(&c, Some(&revs[2]), &revs, None);
    assert_eq!(
        st.fields.latest_created_revision_name.as_deref(),
        Some("hello-00003")
    );
    assert_eq!(
        st.fields.latest_ready_revision_name.as_deref(),
        Some("hello-00002")
    );
    assert_eq!(
        st.status.condition(condition::READY).unwrap().status,
        ConditionStatus::Unknown
    );
    // The latest created failed: Ready=False RevisionFailed, latestReady unchanged.
    let revs = vec![
        rev("hello-00001", 1, Some(true)),
        rev("hello-00003", 3, Some(false)),
    ];
    let st = configuration::compute_status(&c, Some(&revs[1]), &revs, None);
    let r = st.status.condition(condition::READY).unwrap();
    assert_eq!(
        (r.status, r.reason.as_deref()),
        (ConditionStatus::False, Some("RevisionFailed"))
    );
    assert!(r.message.as_deref().unwrap().contains("hello-00003"));
    assert_eq!(
        st.fields.latest_ready_revision_name.as_deref(),
        Some("hello-00001")
    );
}

#[test]
fn conditions_keep_their_transition_time_and_ready_follows_its_dependents() {
    let t1 = Time(k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap());
    let t2 = Time(k8s_openapi::jiff::Timestamp::from_second(2_000).unwrap());
    let mut s = Status::default();
    s.set(Condition::new("A", ConditionStatus::True), &t1);
    s.set(Condition::new("A", ConditionStatus::True), &t2);
    assert_eq!(
        s.condition("A").unwrap().last_transition_time,
        Some(t1.clone())
    );
    s.set(Condition::new("A", ConditionStatus::False), &t2);
    assert_eq!(
        s.condition("A").unwrap().last_transition_time,
        Some(t2.clone())
    );
    s.set(Condition::new("B", ConditionStatus::True), &t2);
    s.set_ready_from("Ready", &["A", "B"], &t2);
    assert_eq!(s.condition("Ready").unwrap().status, ConditionStatus::False);
    s.set(Condition::new("A", ConditionStatus::True), &t2);
    s.set_ready_from("Ready", &["A", "B", "C"], &t2);
    assert_eq!(
        s.condition("Ready").unwrap().status,
        ConditionStatus::Unknown
    );
    s.set_ready_from("Ready", &["A", "B"], &t2);
    assert_eq!(s.condition("Ready").unwrap().status, ConditionStatus::True);
}

#[test]
fn gc_never_collects_a_routed_or_latest_revision() {
    let mut c = cfg(30);
    c.status = Some(ConfigurationStatus {
        fields: crate::knative::ConfigurationStatusFields {
            latest_ready_revision_name: Some("hello-00029".into()),
            latest_created_revision_name: Some("hello-00030".into()),
        },
        ..Default::default()
    });
    let now = k8s_openapi::jiff::Timestamp::from_second(10_000_000).unwrap();
    let created = Time(k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap());
    let revs: Vec<Arc<Revision>> = (1..=30)
        .map(|g| {
            let mut r = (*rev(&format!("hello-{g:05}"), g, Some(true))).clone();
            r.metadata.creation_timestamp = Some(created.clone());
            let state = if g == 3 {
                routing_state::ACTIVE
            } else {
                routing_state::RESERVE
            };
            r.metadata
                .labels
                .get_or_insert_default()
                .insert(labels::ROUTING_STATE.into(), state.into());
            Arc::new(r)
        })
        .collect();
    let cands = gc::candidates(&c, &revs, now);
    let active: Vec<&str> = cands
        .iter()
        .filter(|c| c.active)
        .map(|c| c.key.as_str())
        .collect();
    assert_eq!(active, ["hello-00003", "hello-00029", "hello-00030"]);
    let gc_config = GcConfig {
        min_non_active_revisions: 2,
        ..GcConfig::default()
    };
    let doomed = crate::config::gc::collectable(&gc_config, &cands);
    assert_eq!(doomed.len(), 25, "27 non-active, 2 kept: {doomed:?}");
    for keep in ["hello-00003", "hello-00029", "hello-00030"] {
        assert!(!doomed.iter().any(|d| d == keep));
    }
}

#[test]
fn unnamed_containers_take_the_next_free_name_as_in_knative() {
    let mut t = template().spec;
    let names = [
        "",
        "user-container-0",
        "user-container-3",
        "",
        "user-container-5",
        "",
        "",
        "user-container-4",
    ];
    let base = t.pod_spec.containers[0].clone();
    t.pod_spec.containers = names
        .iter()
        .map(|n| k8s_openapi::api::core::v1::Container {
            name: n.to_string(),
            ..base.clone()
        })
        .collect();
    let s = defaulted_spec(&t, &DefaultsConfig::default());
    let got: Vec<&str> = s
        .pod_spec
        .containers
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        got,
        [
            "user-container-1",
            "user-container-0",
            "user-container-3",
            "user-container-2",
            "user-container-5",
            "user-container-6",
            "user-container-7",
            "user-container-4",
        ]
    );
}

#[test]
fn response_start_and_idle_defaults_apply_only_below_the_timeout() {
    let d = |start: u64, idle: u64| DefaultsConfig {
        revision_timeout: Duration::from_secs(300),
        revision_response_start_timeout: Some(Duration::from_secs(start)),
        revision_idle_timeout: Duration::from_secs(idle),
        ..DefaultsConfig::default()
    };
    let mut t = template().spec;
    t.timeout_seconds = Some(100);
    // Longer than the revision's 100 s: not copied (the revision would be invalid).
    let s = defaulted_spec(&t, &d(300, 300));
    assert_eq!(s.response_start_timeout_seconds, None);
    assert_eq!(s.idle_timeout_seconds, None);
    // Shorter: copied.
    let s = defaulted_spec(&t, &d(30, 60));
    assert_eq!(s.response_start_timeout_seconds, Some(30));
    assert_eq!(s.idle_timeout_seconds, Some(60));
    // Equal to the timeout (the cluster default of 400 for both): absent.
    let mut t = template().spec;
    t.timeout_seconds = None;
    let eq = DefaultsConfig {
        revision_timeout: Duration::from_secs(400),
        ..d(400, 400)
    };
    let s = defaulted_spec(&t, &eq);
    assert_eq!(s.timeout_seconds, Some(400));
    assert_eq!(s.response_start_timeout_seconds, None);
    assert_eq!(s.idle_timeout_seconds, None);
}

#[test]
fn the_default_readiness_probe_is_written_into_the_revision_spec() {
    let s = defaulted_spec(&template().spec, &DefaultsConfig::default());
    let p = s.pod_spec.containers[0].readiness_probe.clone().unwrap();
    assert_eq!(
        p.tcp_socket.unwrap().port,
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(0)
    );
    assert_eq!(p.success_threshold, Some(1));
    assert_eq!((p.period_seconds, p.failure_threshold), (None, None));
    // A user's HTTP probe with a period gets Kubernetes' thresholds, and keeps its handler.
    let mut t = template().spec;
    t.pod_spec.containers[0].readiness_probe = Some(
        serde_json::from_value(
            serde_json::json!({"httpGet": {"path": "/ready"}, "periodSeconds": 5}),
        )
        .unwrap(),
    );
    let s = defaulted_spec(&t, &DefaultsConfig::default());
    let p = s.pod_spec.containers[0].readiness_probe.clone().unwrap();
    assert!(p.tcp_socket.is_none() && p.http_get.is_some());
    assert_eq!(
        (p.success_threshold, p.failure_threshold, p.timeout_seconds),
        (Some(1), Some(3), Some(1))
    );
}

#[test]
fn every_owner_reference_blocks_the_owners_deletion() {
    // Foreground deletion waits for children only through blockOwnerDeletion.
    let o = super::owner_ref(&cfg(1));
    assert_eq!(o.controller, Some(true));
    assert_eq!(o.block_owner_deletion, Some(true));
    assert_eq!(o.kind, "Configuration");
}

#[test]
fn a_new_revision_of_a_routed_configuration_starts_active_with_its_routes_and_creator() {
    use kube::ResourceExt;
    let t = "2026-01-01T00:00:00Z";
    let r = configuration::make_revision(&cfg(1), &DefaultsConfig::default(), t);
    assert_eq!(
        r.labels().get(labels::ROUTING_STATE).map(String::as_str),
        Some(routing_state::PENDING)
    );
    let mut c = cfg(2);
    c.metadata.annotations = Some(
        [
            (
                "serving.knative.dev/routes".to_string(),
                "hello".to_string(),
            ),
            (
                "serving.knative.dev/creator".to_string(),
                "alice@example.com".to_string(),
            ),
        ]
        .into(),
    );
    let r = configuration::make_revision(&c, &DefaultsConfig::default(), t);
    assert_eq!(
        r.labels().get(labels::ROUTING_STATE).map(String::as_str),
        Some(routing_state::ACTIVE)
    );
    let a = r.annotations();
    assert_eq!(a["serving.knative.dev/routes"], "hello");
    assert_eq!(a["serving.knative.dev/creator"], "alice@example.com");
    assert_eq!(a[routing_state::MODIFIED_ANNOTATION], t);
}

/// One watch failing over and over (an API server restarting) must not keep a controller from
/// hearing another watch's event: each watch backs off alone
/// ([`super::independent_triggers`]). With kube-runtime's default, the merged stream's pause
/// doubles at each of the failing watch's errors, and the event 10 s in is heard only after it.
#[tokio::test(start_paused = true)]
async fn a_failing_watch_does_not_pause_the_others() {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::controller::{Action, Controller};
    use kube::runtime::reflector::{self, ObjectRef};
    use kube::runtime::{WatchStreamExt, watcher};

    let cm = ConfigMap {
        metadata: meta("c", 1),
        ..Default::default()
    };
    let (store, mut writer) = reflector::store::<ConfigMap>();
    // Listed: the controller reconciles only once its store is ready.
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitApply(cm.clone()));
    writer.apply_watcher_event(&watcher::Event::InitDone);
    // The main watch: an error every time it is polled, backing off on its own (0.8 s
    // doubling to 30 s, as every watch of the controllers does).
    let failing = futures::stream::repeat_with(|| {
        Err::<watcher::Event<ConfigMap>, _>(watcher::Error::NoResourceVersion)
    })
    .default_backoff()
    .touched_objects();
    // Another watch: one event 10 s in.
    let other = futures::stream::once({
        let cm = cm.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            Ok::<_, watcher::Error>(cm)
        }
    })
    .chain(futures::stream::pending());
    let started = tokio::time::Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let controller = super::independent_triggers(
        Controller::for_stream(failing, store)
            .watches_stream(other, |c: ConfigMap| Some(ObjectRef::from_obj(&c))),
    );
    tokio::spawn(
        controller
            .run(
                move |_: Arc<ConfigMap>, tx: Arc<tokio::sync::mpsc::UnboundedSender<()>>| {
                    let _ = tx.send(());
                    async { Ok::<_, kube::Error>(Action::await_change()) }
                },
                |_, _, _| Action::await_change(),
                Arc::new(tx),
            )
            .for_each(|_| async {}),
    );
    // Virtual time: the bound fails the test instead of running it for ever.
    tokio::time::timeout(Duration::from_secs(600), rx.recv())
        .await
        .expect("reconciled within 600 s")
        .expect("reconciled");
    let heard = started.elapsed();
    assert!(
        heard < Duration::from_secs(11),
        "the event 10 s in was heard after {heard:?}"
    );
}
