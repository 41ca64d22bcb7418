use super::*;
use crate::config::{AutoscalerConfig, DefaultsConfig};
use crate::controller::revision::fixtures::RevisionFixture;
use crate::controller::revision::queue::QUEUE_CONTAINER_NAME;
use crate::controller::revision::resolve::resolve;
use crate::knative::names::labels;
use crate::queue::settings as env;

fn build(rev: &Revision, replicas: Option<i32>) -> Deployment {
    build_with(rev, replicas, &FeaturesConfig::default())
}

fn build_with(rev: &Revision, replicas: Option<i32>, features: &FeaturesConfig) -> Deployment {
    let cfg = DeploymentConfig::default();
    let r = resolve(
        rev,
        &DefaultsConfig::default(),
        &AutoscalerConfig::default(),
        &cfg,
    )
    .unwrap();
    deployment(rev, &r, &cfg, features, replicas)
}

fn pod(d: &Deployment) -> &PodSpec {
    d.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
}

fn container<'a>(d: &'a Deployment, name: &str) -> &'a Container {
    pod(d).containers.iter().find(|c| c.name == name).unwrap()
}

fn env_of(c: &Container, name: &str) -> Option<String> {
    c.env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

#[test]
fn helloworld_deployment() {
    let rev = RevisionFixture::new("hello-00001")
        .port(Some("http1"), 8080)
        .container_concurrency(50)
        .timeout(300)
        .build();
    let d = build(&rev, Some(1));
    assert_eq!(d.metadata.name.as_deref(), Some("hello-00001-deployment"));
    assert_eq!(d.metadata.namespace.as_deref(), Some("default"));
    let o = &d.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (o.kind.as_str(), o.name.as_str()),
        ("Revision", "hello-00001")
    );
    assert_eq!(o.controller, Some(true));

    let spec = d.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(1));
    assert_eq!(spec.progress_deadline_seconds, Some(600));
    assert_eq!(spec.revision_history_limit, Some(0));
    let ru = spec
        .strategy
        .as_ref()
        .unwrap()
        .rolling_update
        .as_ref()
        .unwrap();
    assert_eq!(ru.max_unavailable, Some(IntOrString::Int(0)));
    assert_eq!(
        spec.selector.match_labels.as_ref().unwrap()[labels::REVISION_UID],
        "uid-hello-00001"
    );
    let tl = spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .as_ref()
        .unwrap();
    assert_eq!(tl[labels::REVISION], "hello-00001");
    assert_eq!(tl[labels::REVISION_UID], "uid-hello-00001");
    assert_eq!(tl[labels::CONFIGURATION], "hello");
    assert_eq!(tl[labels::SERVICE], "hello");

    let p = pod(&d);
    assert_eq!(p.containers.len(), 2);
    assert_eq!(
        p.containers[1].name, QUEUE_CONTAINER_NAME,
        "the sidecar comes last"
    );
    assert_eq!(p.enable_service_links, Some(false));
    assert_eq!(p.termination_grace_period_seconds, Some(30 + 300 + 10));

    let user = container(&d, "user-container");
    assert_eq!(
        user.image.as_deref(),
        Some("ghcr.io/knative/helloworld-go:latest")
    );
    assert_eq!(env_of(user, "TARGET").as_deref(), Some("World"));
    assert_eq!(env_of(user, "PORT").as_deref(), Some("8080"));
    assert_eq!(env_of(user, "K_REVISION").as_deref(), Some("hello-00001"));
    assert_eq!(env_of(user, "K_CONFIGURATION").as_deref(), Some("hello"));
    assert_eq!(env_of(user, "K_SERVICE").as_deref(), Some("hello"));
    let ports = user.ports.as_ref().unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].name.as_deref(), Some(USER_PORT_NAME));
    assert_eq!(ports[0].container_port, 8080);
    assert_eq!(
        user.readiness_probe, None,
        "readiness goes through the sidecar"
    );
    let pre = user
        .lifecycle
        .as_ref()
        .unwrap()
        .pre_stop
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    assert_eq!(pre.path.as_deref(), Some("/wait-for-drain"));
    assert_eq!(pre.port, IntOrString::Int(9091));
    assert_eq!(
        user.termination_message_policy.as_deref(),
        Some("FallbackToLogsOnError")
    );

    let q = container(&d, QUEUE_CONTAINER_NAME);
    assert!(
        q.image
            .as_deref()
            .unwrap()
            .starts_with("ghcr.io/thaw-dev/thaw:")
    );
    assert_eq!(
        q.args.as_deref(),
        Some(&["queue".to_string(), "--log-json".to_string()][..])
    );
    for (k, v) in [
        (env::SERVING_NAMESPACE, "default"),
        (env::SERVING_REVISION, "hello-00001"),
        (env::SERVING_CONFIGURATION, "hello"),
        (env::SERVING_SERVICE, "hello"),
        (env::CONTAINER_CONCURRENCY, "50"),
        (env::REVISION_TIMEOUT_SECONDS, "300"),
        (env::REVISION_RESPONSE_START_TIMEOUT_SECONDS, "300"),
        (env::REVISION_IDLE_TIMEOUT_SECONDS, "0"),
        (env::USER_PORT, "8080"),
        (env::THAW_USER_PROTOCOL, "http1"),
        (env::QUEUE_SERVING_PORT, "8012"),
        (env::THAW_QUEUE_ADMIN_PORT, "9091"),
        (env::THAW_DRAIN_DELAY, "30s"),
        (env::THAW_REQUEST_BODY_IDLE_TIMEOUT, "60s"),
    ] {
        assert_eq!(env_of(q, k).as_deref(), Some(v), "{k}");
    }
    let probe: serde_json::Value =
        serde_json::from_str(&env_of(q, env::SERVING_READINESS_PROBE).unwrap()).unwrap();
    assert_eq!(probe["tcpSocket"]["port"], 8080);
    let pod_var = q
        .env
        .iter()
        .flatten()
        .find(|e| e.name == env::SERVING_POD)
        .unwrap();
    assert_eq!(
        pod_var
            .value_from
            .as_ref()
            .unwrap()
            .field_ref
            .as_ref()
            .unwrap()
            .field_path,
        "metadata.name"
    );
    let qports: Vec<(Option<&str>, i32)> = q
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.as_deref(), p.container_port))
        .collect();
    assert_eq!(
        qports,
        [(Some("http1"), 8012), (Some("http-autometric"), 9091)]
    );
    let rp = q.readiness_probe.as_ref().unwrap();
    let get = rp.http_get.as_ref().unwrap();
    assert_eq!(
        (get.path.as_deref(), &get.port),
        (Some("/readyz"), &IntOrString::Int(9091))
    );
    assert_eq!(rp.period_seconds, Some(1));
    let res = q.resources.as_ref().unwrap();
    assert_eq!(res.requests.as_ref().unwrap()["cpu"].0, "25m");
    assert_eq!(res.limits, None);
    // The settings the sidecar is given parse as the sidecar reads them.
    let vars: BTreeMap<String, String> = q
        .env
        .iter()
        .flatten()
        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
        .chain([(env::SERVING_POD.to_string(), "p".to_string())])
        .collect();
    let s = crate::queue::Settings::from_lookup(|k| vars.get(k).cloned(), None, None)
        .expect("the sidecar accepts its settings");
    assert_eq!(s.container_concurrency, 50);
    assert_eq!(s.user.port(), 8080);
    assert_eq!(s.data.port(), 8012);
    assert_eq!(s.admin.port(), 9091);
    assert_eq!(s.configuration.as_deref(), Some("hello"));
}

#[test]
fn replicas_only_when_asked() {
    let rev = RevisionFixture::new("hello-00001").build();
    assert_eq!(build(&rev, None).spec.unwrap().replicas, None);
    let json = serde_json::to_value(build(&rev, None)).unwrap();
    assert!(json["spec"].get("replicas").is_none(), "{json}");
    assert_eq!(json["apiVersion"], "apps/v1");
    assert_eq!(json["kind"], "Deployment");
}

#[test]
fn initial_scale_follows_knative() {
    let resolved = |rev: &Revision, a: &AutoscalerConfig| {
        resolve(
            rev,
            &DefaultsConfig::default(),
            a,
            &DeploymentConfig::default(),
        )
        .unwrap()
    };
    let plain = RevisionFixture::new("a").build();
    assert_eq!(
        initial_replicas(&resolved(&plain, &AutoscalerConfig::default())),
        1
    );
    let three = RevisionFixture::new("a")
        .annotation("autoscaling.knative.dev/initial-scale", "3")
        .build();
    assert_eq!(
        initial_replicas(&resolved(&three, &AutoscalerConfig::default())),
        3
    );
    // 0 counts only where config-autoscaler allows a zero initial scale.
    let zero = RevisionFixture::new("a")
        .annotation("autoscaling.knative.dev/initial-scale", "0")
        .build();
    assert_eq!(
        initial_replicas(&resolved(&zero, &AutoscalerConfig::default())),
        1
    );
    let allow = AutoscalerConfig {
        allow_zero_initial_scale: true,
        ..AutoscalerConfig::default()
    };
    assert_eq!(initial_replicas(&resolved(&zero, &allow)), 0);
    let cluster = AutoscalerConfig {
        initial_scale: 2,
        ..AutoscalerConfig::default()
    };
    assert_eq!(initial_replicas(&resolved(&plain, &cluster)), 2);
}

#[test]
fn every_open_field_the_user_wrote_reaches_the_pod() {
    let rev = RevisionFixture::new("full-00001")
        .port(Some("h2c"), 9000)
        .with_user(|c| {
            c.command = Some(vec!["/app".into()]);
            c.args = Some(vec!["--serve".into()]);
            c.working_dir = Some("/srv".into());
            c.image_pull_policy = Some("Always".into());
            c.termination_message_policy = Some("File".into());
            c.env.get_or_insert_with(Vec::new).push(EnvVar {
                name: "PORT".into(),
                value: Some("1".into()),
                value_from: None,
            });
            c.resources = Some(
                serde_json::from_value(
                    serde_json::json!({"limits": {"cpu": "1", "memory": "256Mi"}}),
                )
                .unwrap(),
            );
            c.volume_mounts = Some(vec![
                serde_json::from_value(serde_json::json!({"name": "data", "mountPath": "/data"}))
                    .unwrap(),
            ]);
            c.security_context =
                Some(serde_json::from_value(serde_json::json!({"runAsUser": 1000})).unwrap());
            c.liveness_probe = Some(
                serde_json::from_value(
                    serde_json::json!({"httpGet": {"path": "/live", "port": "h2c"}}),
                )
                .unwrap(),
            );
            c.startup_probe = Some(
                serde_json::from_value(
                    serde_json::json!({"tcpSocket": {"port": 0}, "periodSeconds": 2}),
                )
                .unwrap(),
            );
            c.lifecycle = Some(
                serde_json::from_value(
                    serde_json::json!({"postStart": {"exec": {"command": ["true"]}}}),
                )
                .unwrap(),
            );
        })
        .readiness(serde_json::json!({
            "httpGet": {"path": "/ready", "port": 0},
            "periodSeconds": 3, "failureThreshold": 2
        }))
        .with(|r| {
            let p = &mut r.spec.pod_spec;
            p.service_account_name = Some("hello".into());
            p.enable_service_links = Some(true);
            p.termination_grace_period_seconds = Some(1000);
            p.node_selector = Some([("disk".to_string(), "ssd".to_string())].into());
            p.volumes = Some(vec![
                serde_json::from_value(serde_json::json!({"name": "data", "emptyDir": {}}))
                    .unwrap(),
            ]);
            p.image_pull_secrets = Some(vec![
                serde_json::from_value(serde_json::json!({"name": "regcred"})).unwrap(),
            ]);
        })
        .sidecar_container("logger")
        .build();
    let features = FeaturesConfig {
        podspec_node_selector: crate::config::features::Flag::Enabled,
        ..FeaturesConfig::default()
    };
    let d = build_with(&rev, None, &features);
    let p = pod(&d);
    assert_eq!(p.service_account_name.as_deref(), Some("hello"));
    assert_eq!(
        p.enable_service_links,
        Some(true),
        "the user's choice stands"
    );
    assert_eq!(
        p.termination_grace_period_seconds,
        Some(30 + 300 + 10),
        "the author's value is closed by the masks: the drain sets it"
    );
    assert_eq!(p.node_selector.as_ref().unwrap()["disk"], "ssd");
    assert_eq!(p.volumes.as_ref().unwrap()[0].name, "data");
    assert_eq!(p.image_pull_secrets.as_ref().unwrap()[0].name, "regcred");
    assert_eq!(
        p.containers
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>(),
        ["logger", "user-container", QUEUE_CONTAINER_NAME]
    );

    let user = container(&d, "user-container");
    assert_eq!(user.command.as_deref(), Some(&["/app".to_string()][..]));
    assert_eq!(user.args.as_deref(), Some(&["--serve".to_string()][..]));
    assert_eq!(user.working_dir.as_deref(), Some("/srv"));
    assert_eq!(user.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(user.termination_message_policy.as_deref(), Some("File"));
    assert_eq!(
        user.resources.as_ref().unwrap().limits.as_ref().unwrap()["memory"].0,
        "256Mi"
    );
    assert_eq!(user.volume_mounts.as_ref().unwrap()[0].mount_path, "/data");
    assert_eq!(
        user.security_context.as_ref().unwrap().run_as_user,
        Some(1000)
    );
    // PORT is Knative's, once.
    let ports: Vec<_> = user
        .env
        .iter()
        .flatten()
        .filter(|e| e.name == "PORT")
        .collect();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].value.as_deref(), Some("9000"));
    // Probes left on the user container use numbers (its port is renamed user-port).
    let live = user
        .liveness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    assert_eq!(live.port, IntOrString::Int(9000));
    let start = user.startup_probe.as_ref().unwrap();
    assert_eq!(
        start.tcp_socket.as_ref().unwrap().port,
        IntOrString::Int(9000)
    );
    assert_eq!(start.period_seconds, Some(2));
    // `lifecycle` is closed to the author (Knative's mask): only the drain's preStop is there.
    let lc = user.lifecycle.as_ref().unwrap();
    assert!(lc.post_start.is_none() && lc.pre_stop.is_some());
    assert_eq!(user.readiness_probe, None);

    // The other container gets the Knative env and the drain hook, not PORT.
    let logger = container(&d, "logger");
    assert_eq!(env_of(logger, "K_REVISION").as_deref(), Some("full-00001"));
    assert_eq!(env_of(logger, "PORT"), None);
    assert!(logger.lifecycle.as_ref().unwrap().pre_stop.is_some());

    let q = container(&d, QUEUE_CONTAINER_NAME);
    assert_eq!(env_of(q, env::USER_PORT).as_deref(), Some("9000"));
    assert_eq!(env_of(q, env::THAW_USER_PROTOCOL).as_deref(), Some("h2c"));
    let probe: serde_json::Value =
        serde_json::from_str(&env_of(q, env::SERVING_READINESS_PROBE).unwrap()).unwrap();
    assert_eq!(
        probe,
        serde_json::json!({"httpGet": {"path": "/ready", "port": 9000}})
    );
    let rp = q.readiness_probe.as_ref().unwrap();
    assert_eq!(rp.period_seconds, Some(3));
    assert_eq!(rp.failure_threshold, Some(2));
}

#[test]
fn an_unnamed_container_gets_knatives_name() {
    let rev = RevisionFixture::new("anon-00001")
        .with_user(|c| c.name = String::new())
        .build();
    let d = build(&rev, None);
    assert_eq!(pod(&d).containers[0].name, "user-container");
}

#[test]
fn a_70_character_configuration_keeps_names_and_labels_within_63() {
    let config = format!("{}-cfg", "c".repeat(66));
    assert_eq!(config.len(), 70);
    let name = crate::knative::names::child_name(&config, "-00001");
    let rev = RevisionFixture::new(&name)
        .label(labels::CONFIGURATION, &labels::value(&config))
        .with(|r| {
            r.metadata.owner_references = Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: "serving.knative.dev/v1".into(),
                    kind: "Configuration".into(),
                    name: config.clone(),
                    uid: "cfg-uid".into(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                },
            ])
        })
        .build();
    let d = build(&rev, Some(1));
    let n = d.metadata.name.clone().unwrap();
    assert!(n.len() <= 63 && n.ends_with("-deployment"), "{n}");
    let all_labels = [
        d.metadata.labels.clone().unwrap(),
        d.spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .clone()
            .unwrap()
            .labels
            .unwrap(),
        d.spec
            .as_ref()
            .unwrap()
            .selector
            .match_labels
            .clone()
            .unwrap(),
    ];
    for l in &all_labels {
        for (k, v) in l {
            assert!(v.len() <= 63, "{k}={v}");
        }
    }
    // The configuration's whole name still reaches the container.
    assert_eq!(
        env_of(container(&d, "user-container"), "K_CONFIGURATION").as_deref(),
        Some(config.as_str())
    );
}

#[test]
fn closed_fields_never_reach_the_deployment_even_past_validation() {
    // What an author could write if validation were skipped: the builder masks on its own.
    let rev = RevisionFixture::new("root-00001")
        .port(None, 8080)
        .with_user(|c| {
            c.security_context = Some(
                serde_json::from_value(serde_json::json!({
                    "privileged": true, "capabilities": {"add": ["SYS_ADMIN"], "drop": ["NET_RAW"]},
                    "runAsUser": 1000,
                }))
                .unwrap(),
            );
            c.ports.as_mut().unwrap()[0].host_port = Some(80);
        })
        .with(|r| {
            let p = &mut r.spec.pod_spec;
            p.host_network = Some(true);
            p.host_pid = Some(true);
            p.node_name = Some("node-1".into());
        })
        .build();
    let d = build(&rev, None);
    let p = pod(&d);
    assert_eq!(
        (p.host_network, p.host_pid, p.node_name.as_deref()),
        (None, None, None)
    );
    let user = container(&d, "user-container");
    let sc = user.security_context.as_ref().unwrap();
    assert_eq!(sc.privileged, None);
    assert_eq!(sc.run_as_user, Some(1000), "an open field stays");
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(
        caps.add, None,
        "SYS_ADMIN needs kubernetes.containerspec-addcapabilities"
    );
    assert_eq!(caps.drop.as_deref(), Some(&["NET_RAW".to_string()][..]));
    assert!(user.ports.iter().flatten().all(|p| p.host_port.is_none()));

    // Opened by their keys, they are written.
    let open = FeaturesConfig {
        podspec_host_network: crate::config::features::Flag::Enabled,
        containerspec_add_capabilities: crate::config::features::Flag::Allowed,
        ..FeaturesConfig::default()
    };
    let d = build_with(&rev, None, &open);
    assert_eq!(pod(&d).host_network, Some(true));
    assert_eq!(pod(&d).host_pid, None, "its own key is still closed");
    let caps = container(&d, "user-container")
        .security_context
        .as_ref()
        .unwrap()
        .capabilities
        .clone()
        .unwrap();
    assert_eq!(caps.add.as_deref(), Some(&["SYS_ADMIN".to_string()][..]));
}

#[test]
fn secure_pod_defaults_fill_what_the_author_left_unset() {
    use crate::config::features::SecurePodDefaults;
    let rev = RevisionFixture::new("safe-00001")
        .port(None, 80)
        .sidecar_container("logger")
        .with(|r| {
            // The logger chose its own capabilities and user.
            r.spec.pod_spec.containers[0].security_context = Some(
                serde_json::from_value(serde_json::json!({
                    "capabilities": {"drop": ["NET_RAW"]}, "runAsNonRoot": false,
                }))
                .unwrap(),
            );
        })
        .build();
    let with = |mode| {
        build_with(
            &rev,
            None,
            &FeaturesConfig {
                secure_pod_defaults: mode,
                ..FeaturesConfig::default()
            },
        )
    };
    let d = with(SecurePodDefaults::Disabled);
    assert_eq!(container(&d, "user-container").security_context, None);

    let d = with(SecurePodDefaults::Enabled);
    let sc = container(&d, "user-container")
        .security_context
        .clone()
        .unwrap();
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.seccomp_profile.unwrap().type_, "RuntimeDefault");
    let caps = sc.capabilities.unwrap();
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    assert_eq!(
        caps.add.as_deref(),
        Some(&["NET_BIND_SERVICE".to_string()][..]),
        "port 80 needs it"
    );
    let logger = container(&d, "logger").security_context.clone().unwrap();
    assert_eq!(
        logger.run_as_non_root,
        Some(false),
        "the author's choice stands"
    );
    assert_eq!(
        logger.capabilities.unwrap().drop.as_deref(),
        Some(&["NET_RAW".to_string()][..])
    );
    assert_eq!(logger.allow_privilege_escalation, Some(false));

    let d = with(SecurePodDefaults::AllowRootBounded);
    let sc = container(&d, "user-container")
        .security_context
        .clone()
        .unwrap();
    assert_eq!(sc.run_as_non_root, None, "root stays allowed");
    assert_eq!(sc.allow_privilege_escalation, Some(false));
}

/// A Deployment created with the initial scale and the hash of the later applies' body (which
/// leave `replicas` out) holds that whole body: its next reconcile writes nothing.
#[test]
fn the_created_deployment_is_already_applied() {
    use crate::controller::apply::{APPLIED_ANNOTATION, applied_body, applied_hash, contains};
    let rev = RevisionFixture::new("hello-00001").build();
    let later = build(&rev, None);
    let mut created = build(&rev, Some(1));
    created
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(APPLIED_ANNOTATION.into(), applied_hash(&later).unwrap());
    let body = applied_body(
        serde_json::to_value(&later).unwrap(),
        "apps/v1",
        "Deployment",
    );
    let mut have = serde_json::to_value(&created).unwrap();
    have["apiVersion"] = "apps/v1".into();
    have["kind"] = "Deployment".into();
    assert!(contains(&have, &body));
    // A later change of the revision's pod is applied.
    let mut changed = rev.clone();
    changed.metadata.labels = Some([("new".to_string(), "label".to_string())].into());
    let body = applied_body(
        serde_json::to_value(build(&changed, None)).unwrap(),
        "apps/v1",
        "Deployment",
    );
    assert!(!contains(&have, &body));
}
