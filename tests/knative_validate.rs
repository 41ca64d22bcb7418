//! `thaw::knative::validate`: Knative's webhook rules, one test per rule, each checking the
//! field path and Knative's message as `render` prints them.

use serde_json::{Value, json};
use thaw::config::{AutoscalerConfig, ConfigMap, DefaultsConfig, FeaturesConfig};
use thaw::knative::validate::{self, FieldError, reason, render};
use thaw::knative::{Configuration, Revision, Route, Service};

/// Knative's helloworld-go Service, with tagged traffic and `latestRevision`.
fn hello() -> Value {
    json!({
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Service",
        "metadata": {"name": "hello", "namespace": "default"},
        "spec": {
            "template": {
                "metadata": {
                    "name": "hello-world",
                    "annotations": {
                        "autoscaling.knative.dev/min-scale": "1",
                        "autoscaling.knative.dev/target": "10"
                    }
                },
                "spec": {
                    "containerConcurrency": 50,
                    "timeoutSeconds": 300,
                    "containers": [{
                        "image": "ghcr.io/knative/helloworld-go:latest",
                        "ports": [{"containerPort": 8080, "name": "http1"}],
                        "env": [{"name": "TARGET", "value": "World"}],
                        "readinessProbe": {"httpGet": {"path": "/healthz"}}
                    }]
                }
            },
            "traffic": [
                {"tag": "current", "revisionName": "hello-world", "percent": 100},
                {"tag": "latest", "latestRevision": true, "percent": 0}
            ]
        }
    })
}

fn service_errors_with(v: Value, d: &DefaultsConfig) -> Vec<FieldError> {
    let svc: Service = serde_json::from_value(v).expect("a Service");
    validate::service(
        &svc,
        d,
        &AutoscalerConfig::default(),
        &FeaturesConfig::default(),
    )
}

fn service_errors(v: Value) -> Vec<FieldError> {
    service_errors_with(v, &DefaultsConfig::default())
}

/// The rendered problems of `v` (a Service).
fn svc(v: Value) -> String {
    render(&service_errors(v))
}

fn route(traffic: Value) -> String {
    let r: Route = serde_json::from_value(json!({
        "apiVersion": "serving.knative.dev/v1", "kind": "Route",
        "metadata": {"name": "r", "namespace": "default"},
        "spec": {"traffic": traffic}
    }))
    .unwrap();
    render(&validate::route(&r))
}

fn edit(f: impl FnOnce(&mut Value)) -> Value {
    let mut v = hello();
    f(&mut v);
    v
}

fn container(v: &mut Value) -> &mut Value {
    &mut v["spec"]["template"]["spec"]["containers"][0]
}

#[test]
fn helloworld_is_valid_as_service_configuration_and_revision() {
    assert_eq!(svc(hello()), "");
    let h = hello();
    let cfg: Configuration = serde_json::from_value(json!({
        "apiVersion": "serving.knative.dev/v1", "kind": "Configuration",
        "metadata": h["metadata"], "spec": {"template": h["spec"]["template"]}
    }))
    .unwrap();
    let d = DefaultsConfig::default();
    let a = AutoscalerConfig::default();
    assert_eq!(
        validate::configuration(&cfg, &d, &a, &FeaturesConfig::default()),
        []
    );
    let rev: Revision = serde_json::from_value(json!({
        "apiVersion": "serving.knative.dev/v1", "kind": "Revision",
        "metadata": {"name": "hello-world", "namespace": "default",
                     "annotations": h["spec"]["template"]["metadata"]["annotations"]},
        "spec": h["spec"]["template"]["spec"]
    }))
    .unwrap();
    assert_eq!(
        validate::revision(&rev, &d, &a, &FeaturesConfig::default()),
        []
    );
    // The Service's default traffic (none written) is 100 % to the latest revision.
    assert_eq!(svc(edit(|v| v["spec"]["traffic"] = json!([]))), "");
}

#[test]
fn percent_out_of_range() {
    let out = svc(edit(|v| {
        v["spec"]["traffic"] = json!([
            {"revisionName": "hello-world", "percent": 150},
            {"latestRevision": true, "percent": -50}
        ])
    }));
    assert_eq!(
        out,
        "expected 0 <= 150 <= 100: spec.traffic[0].percent\n\
         expected 0 <= -50 <= 100: spec.traffic[1].percent"
    );
}

#[test]
fn percents_sum_to_100() {
    let out = svc(edit(|v| v["spec"]["traffic"][1]["percent"] = json!(10)));
    assert_eq!(out, "Traffic targets sum to 110, want 100: spec.traffic");
    assert_eq!(
        route(json!([{"configurationName": "c", "percent": 90}])),
        "Traffic targets sum to 90, want 100: spec.traffic"
    );
    // A Route must say where its traffic goes.
    assert_eq!(
        route(json!([])),
        "Traffic targets sum to 0, want 100: spec.traffic"
    );
    assert_eq!(
        route(json!([{"configurationName": "c", "percent": 60},
                     {"revisionName": "c-00001", "percent": 40}])),
        ""
    );
}

#[test]
fn a_target_names_exactly_one_of_revision_and_configuration() {
    assert_eq!(
        route(json!([{"revisionName": "r-1", "configurationName": "c", "percent": 100}])),
        "expected exactly one, got both: spec.traffic[0].revisionName, \
         spec.traffic[0].configurationName"
    );
    assert_eq!(
        route(json!([{"percent": 100}])),
        "expected exactly one, got neither: spec.traffic[0].revisionName, \
         spec.traffic[0].configurationName"
    );
    // In a Service the configuration is its own: naming one is not allowed.
    assert_eq!(
        svc(edit(
            |v| v["spec"]["traffic"][1]["configurationName"] = json!("other")
        )),
        "must not set the field(s): spec.traffic[1].configurationName"
    );
    // latestRevision must agree with revisionName.
    assert_eq!(
        svc(edit(
            |v| v["spec"]["traffic"][0]["latestRevision"] = json!(true)
        )),
        "may not set revisionName \"hello-world\" when latestRevision is true: \
         spec.traffic[0].latestRevision"
    );
    assert_eq!(
        svc(edit(
            |v| v["spec"]["traffic"][1]["latestRevision"] = json!(false)
        )),
        "may not set revisionName \"\" when latestRevision is false: \
         spec.traffic[1].latestRevision"
    );
    assert_eq!(
        route(json!([{"revisionName": "Not_A/Name!", "percent": 100}])),
        "invalid key name \"Not_A/Name!\": spec.traffic[0].revisionName"
    );
    assert_eq!(
        route(json!([{"configurationName": "c", "percent": 100, "url": "http://x"}])),
        "must not set the field(s): spec.traffic[0].url"
    );
}

#[test]
fn tags_are_unique_dns_1035_labels() {
    let out = svc(edit(|v| v["spec"]["traffic"][1]["tag"] = json!("current")));
    assert_eq!(
        out,
        "Multiple definitions for \"current\": spec.traffic[1].tag, spec.traffic[0].tag"
    );
    let out = svc(edit(|v| v["spec"]["traffic"][1]["tag"] = json!("Latest_1")));
    assert!(
        out.starts_with("invalid value: not a DNS 1035 label: [a DNS-1035 label must consist"),
        "{out}"
    );
    assert!(out.ends_with(": spec.traffic[1].tag"), "{out}");
    let out = svc(edit(|v| {
        v["spec"]["traffic"][1]["tag"] = json!("x".repeat(64))
    }));
    assert!(out.contains("must be no more than 63 characters"), "{out}");
}

#[test]
fn names_are_dns_1035_labels_and_a_revision_name_has_the_parent_prefix() {
    let out = svc(edit(|v| v["metadata"]["name"] = json!("Hello_World")));
    assert!(out.starts_with("not a DNS 1035 label: ["), "{out}");
    assert!(out.contains(": metadata.name"), "{out}");
    // The BYO revision name no longer starts with the new name either.
    assert!(out.contains("must have prefix \"Hello_World-\""), "{out}");
    let long = "a".repeat(64);
    let out = svc(edit(|v| {
        v["metadata"]["name"] = json!(long);
        v["spec"]["template"]["metadata"]["name"] = json!(format!("{long}-x"));
        v["spec"]["traffic"] = json!([]);
    }));
    assert_eq!(
        out,
        "not a DNS 1035 label: [must be no more than 63 characters]: metadata.name\n\
         invalid value: not a DNS 1035 label: [must be no more than 63 characters]: \
         spec.template.metadata.name"
    );
    let out = svc(edit(|v| {
        v["spec"]["template"]["metadata"]["name"] = json!("other-world");
        v["spec"]["traffic"] = json!([]);
    }));
    assert_eq!(
        out,
        "invalid value: \"other-world\" must have prefix \"hello-\": spec.template.metadata.name"
    );
    let out = svc(edit(|v| v["metadata"] = json!({"namespace": "default"})));
    assert!(
        out.starts_with("name or generateName is required: metadata.name"),
        "{out}"
    );
}

#[test]
fn container_concurrency_within_the_configured_range() {
    let set = |cc: i64| edit(|v| v["spec"]["template"]["spec"]["containerConcurrency"] = json!(cc));
    assert_eq!(
        svc(set(1001)),
        "expected 0 <= 1001 <= 1000: spec.template.spec.containerConcurrency"
    );
    assert_eq!(
        svc(set(-1)),
        "expected 0 <= -1 <= 1000: spec.template.spec.containerConcurrency"
    );
    assert_eq!(svc(set(0)), "");
    assert_eq!(svc(set(1000)), "");
    // config-defaults: zero not allowed, a lower max.
    let strict = DefaultsConfig {
        allow_container_concurrency_zero: false,
        container_concurrency: 1,
        container_concurrency_max_limit: 100,
        ..DefaultsConfig::default()
    };
    assert_eq!(
        render(&service_errors_with(set(0), &strict)),
        "expected 1 <= 0 <= 100: spec.template.spec.containerConcurrency"
    );
    assert_eq!(
        render(&service_errors_with(set(101), &strict)),
        "expected 1 <= 101 <= 100: spec.template.spec.containerConcurrency"
    );
}

#[test]
fn the_namespace_section_of_config_defaults_applies() {
    let data = [(
        "namespace-defaults".to_string(),
        "team-a:\n  container-concurrency-max-limit: \"20\"\n  max-revision-timeout-seconds: \"900\"\n"
            .to_string(),
    )]
    .into_iter()
    .collect();
    let d = DefaultsConfig::parse(&data).unwrap().config;
    let in_ns = |ns: &str, cc: i64, timeout: i64| {
        render(&service_errors_with(
            edit(|v| {
                v["metadata"]["namespace"] = json!(ns);
                v["spec"]["template"]["spec"]["containerConcurrency"] = json!(cc);
                v["spec"]["template"]["spec"]["timeoutSeconds"] = json!(timeout);
            }),
            &d,
        ))
    };
    assert_eq!(
        in_ns("default", 50, 700),
        "expected 0 <= 700 <= 600: spec.template.spec.timeoutSeconds"
    );
    assert_eq!(
        in_ns("team-a", 50, 700),
        "expected 0 <= 50 <= 20: spec.template.spec.containerConcurrency"
    );
    assert_eq!(in_ns("team-a", 20, 900), "");
}

#[test]
fn timeouts_within_max_revision_timeout() {
    let set = |field: &str, t: i64| {
        let field = field.to_string();
        svc(edit(move |v| {
            v["spec"]["template"]["spec"][&field] = json!(t)
        }))
    };
    assert_eq!(
        set("timeoutSeconds", 601),
        "expected 0 <= 601 <= 600: spec.template.spec.timeoutSeconds"
    );
    assert_eq!(
        set("timeoutSeconds", -1),
        "expected 0 <= -1 <= 600: spec.template.spec.timeoutSeconds"
    );
    // 0 means the default, as in Knative.
    assert_eq!(set("timeoutSeconds", 0), "");
    assert_eq!(
        set("responseStartTimeoutSeconds", 301),
        "expected 0 <= 301 <= 300: spec.template.spec.responseStartTimeoutSeconds"
    );
    assert_eq!(
        set("idleTimeoutSeconds", 601),
        "expected 0 <= 601 <= 600: spec.template.spec.idleTimeoutSeconds"
    );
}

#[test]
fn containers_are_required_and_one_port_serves() {
    assert_eq!(
        svc(edit(
            |v| v["spec"]["template"]["spec"]["containers"] = json!([])
        )),
        "missing field(s): spec.template.spec.containers"
    );
    assert_eq!(
        svc(edit(|v| container(v)["image"] = json!(""))),
        "missing field(s): spec.template.spec.containers[0].image"
    );
    // One container: at most one port.
    let out = svc(edit(|v| {
        container(v)["ports"] = json!([{"containerPort": 8080}, {"containerPort": 8081}])
    }));
    assert_eq!(
        out,
        "more than one container port is set: spec.template.spec.containers[*].ports\n\
         Only a single port is allowed across all containers"
    );
    // Several containers: exactly one has a port.
    let sidecar = json!({"name": "sidecar", "image": "envoy"});
    let out = svc(edit(|v| {
        container(v)["name"] = json!("user");
        container(v).as_object_mut().unwrap().remove("ports");
        v["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(sidecar.clone());
    }));
    assert_eq!(
        out,
        "missing field(s): spec.template.spec.containers[*].ports"
    );
    let out = svc(edit(|v| {
        container(v)["name"] = json!("user");
        let mut s = sidecar.clone();
        s["ports"] = json!([{"containerPort": 9000}]);
        v["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(s);
    }));
    assert!(
        out.starts_with("more than one container port is set"),
        "{out}"
    );
    let ok = svc(edit(|v| {
        container(v)["name"] = json!("user");
        v["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(sidecar.clone());
    }));
    assert_eq!(ok, "");
    let out = svc(edit(|v| {
        container(v)["name"] = json!("same");
        let mut s = sidecar.clone();
        s["name"] = json!("same");
        v["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(s);
    }));
    assert_eq!(
        out,
        "duplicate container name \"same\": spec.template.spec.containers[1].name"
    );
    assert_eq!(
        svc(edit(|v| container(v)["name"] = json!("queue-proxy"))),
        "\"queue-proxy\" is a reserved container name: spec.template.spec.containers[0].name"
    );
}

#[test]
fn the_sidecars_ports_are_reserved() {
    // thaw's sidecar's own ports are in Knative's reserved set.
    for p in [
        thaw::queue::settings::DEFAULT_DATA_PORT,
        thaw::queue::settings::DEFAULT_ADMIN_PORT,
    ] {
        assert!(validate::RESERVED_PORTS.contains(&i32::from(p)), "{p}");
    }
    for &port in validate::RESERVED_PORTS {
        let out = svc(edit(|v| {
            container(v)["ports"][0]["containerPort"] = json!(port)
        }));
        assert_eq!(
            out,
            format!(
                "invalid value: {port} is a reserved port: \
                 spec.template.spec.containers[0].ports.containerPort\n\
                 {port} is a reserved port, please use a different value"
            )
        );
    }
    assert_eq!(
        svc(edit(
            |v| container(v)["ports"][0]["containerPort"] = json!(70000)
        )),
        "expected 0 <= 70000 <= 65535: spec.template.spec.containers[0].ports.containerPort"
    );
    assert_eq!(
        svc(edit(|v| container(v)["ports"][0]["name"] = json!("grpc"))),
        "Port name grpc is not allowed: spec.template.spec.containers[0].ports\n\
         Name must be empty, or one of: 'h2c', 'http1'"
    );
    assert_eq!(
        svc(edit(|v| container(v)["ports"][0]["protocol"] = json!("UDP"))),
        "invalid value: UDP: spec.template.spec.containers[0].ports.protocol"
    );
    assert_eq!(
        svc(edit(|v| container(v)["ports"][0]["name"] = json!("h2c"))),
        ""
    );
}

#[test]
fn reserved_env_vars() {
    let out = svc(edit(|v| {
        container(v)["env"] = json!([
            {"name": "PORT", "value": "1"}, {"name": "K_SERVICE", "value": "x"},
            {"name": "K_CONFIGURATION", "value": "x"}, {"name": "K_REVISION", "value": "x"},
            {"name": "OK", "value": "x"}
        ])
    }));
    assert_eq!(
        out,
        "\"PORT\" is a reserved environment variable: spec.template.spec.containers[0].env[0].name\n\
         \"K_SERVICE\" is a reserved environment variable: spec.template.spec.containers[0].env[1].name\n\
         \"K_CONFIGURATION\" is a reserved environment variable: spec.template.spec.containers[0].env[2].name\n\
         \"K_REVISION\" is a reserved environment variable: spec.template.spec.containers[0].env[3].name"
    );
    // A sidecar may set PORT (it is not the serving container), not K_REVISION.
    let out = svc(edit(|v| {
        container(v)["name"] = json!("user");
        v["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "side", "image": "x",
                         "env": [{"name": "PORT", "value": "9"}, {"name": "K_REVISION", "value": "x"}]}));
    }));
    assert_eq!(
        out,
        "\"K_REVISION\" is a reserved environment variable: spec.template.spec.containers[1].env[1].name"
    );
    assert_eq!(
        svc(edit(|v| container(v)["envFrom"] = json!([{}]))),
        "expected exactly one, got neither: spec.template.spec.containers[0].envFrom[0].configMapRef, \
         spec.template.spec.containers[0].envFrom[0].secretRef"
    );
}

#[test]
fn volumes_and_reserved_mount_paths() {
    let with = |mounts: Value, volumes: Value| {
        svc(edit(|v| {
            container(v)["volumeMounts"] = mounts;
            v["spec"]["template"]["spec"]["volumes"] = volumes;
        }))
    };
    let cfg = json!([{"name": "cfg", "configMap": {"name": "c"}}]);
    for path in ["/", "/dev", "/dev/log", "/dev/log/", "/dev/./log"] {
        let clean = if path == "/" {
            "/"
        } else if path.starts_with("/dev/") {
            "/dev/log"
        } else {
            "/dev"
        };
        assert_eq!(
            with(
                json!([{"name": "cfg", "mountPath": path, "readOnly": true}]),
                cfg.clone()
            ),
            format!(
                "mountPath \"{clean}\" is a reserved path: \
                 spec.template.spec.containers[0].volumeMounts[0].mountPath"
            )
        );
    }
    // /tmp and /var are allowed, as in current Knative.
    assert_eq!(
        with(
            json!([{"name": "tmp", "mountPath": "/tmp"}]),
            json!([{"name": "tmp", "emptyDir": {}}])
        ),
        ""
    );
    assert_eq!(
        with(
            json!([{"name": "cfg", "mountPath": "/etc/cfg"}]),
            cfg.clone()
        ),
        "volume mount should be readOnly for this type of volume: \
         spec.template.spec.containers[0].volumeMounts[0].readOnly"
    );
    assert_eq!(
        with(
            json!([{"name": "nope", "mountPath": "/etc/cfg", "readOnly": true}]),
            cfg.clone()
        ),
        "volume with name \"cfg\" not mounted: spec.template.spec.volumes[0].name\n\
         volumeMount has no matching volume: spec.template.spec.containers[0].volumeMounts[0].name"
    );
    assert_eq!(
        with(
            json!([{"name": "v", "mountPath": "/v"}]),
            json!([{"name": "v", "emptyDir": {}, "configMap": {"name": "c"}}])
        ),
        "expected exactly one, got both: spec.template.spec.volumes[0].configMap, \
         spec.template.spec.volumes[0].emptyDir"
    );
}

#[test]
fn probes_have_one_handler_on_the_serving_port() {
    let probe = |p: Value| svc(edit(|v| container(v)["readinessProbe"] = p));
    assert_eq!(
        probe(json!({"httpGet": {"path": "/"}, "tcpSocket": {}})),
        "expected exactly one, got both: spec.template.spec.containers[0].readinessProbe.httpGet, \
         spec.template.spec.containers[0].readinessProbe.tcpSocket"
    );
    assert_eq!(
        probe(json!({"httpGet": {"port": "admin"}})),
        "invalid value: admin: spec.template.spec.containers[0].readinessProbe.httpGet.port\n\
         Probe port must match container port"
    );
    assert_eq!(probe(json!({"httpGet": {"port": "http1"}})), "");
    assert_eq!(
        probe(json!({"tcpSocket": {}, "periodSeconds": 0, "failureThreshold": 3})),
        "failureThreshold is disallowed when periodSeconds is zero: \
         spec.template.spec.containers[0].readinessProbe.failureThreshold"
    );
    assert_eq!(
        probe(json!({"tcpSocket": {}, "periodSeconds": 5, "failureThreshold": 3})),
        ""
    );
}

#[test]
fn autoscaling_annotations_use_the_data_planes_parser() {
    let out = svc(edit(|v| {
        let a = &mut v["spec"]["template"]["metadata"]["annotations"];
        a["autoscaling.knative.dev/min-scale"] = json!("-1");
        a["autoscaling.knative.dev/target-utilization-percentage"] = json!("150");
        a["autoscaling.knative.dev/window"] = json!("3s");
    }));
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines.contains(&"invalid value: -1: spec.template.metadata.annotations.autoscaling.knative.dev/min-scale"),
        "{out}"
    );
    assert!(
        lines.contains(&"invalid value: 150: spec.template.metadata.annotations.autoscaling.knative.dev/target-utilization-percentage"),
        "{out}"
    );
    assert!(
        lines.contains(
            &"invalid value: 3s: spec.template.metadata.annotations.autoscaling.knative.dev/window"
        ),
        "{out}"
    );
    // The reason (the parser's) is the detail line.
    assert!(lines.contains(&"must be in [1, 100]"), "{out}");
    // max-scale-limit from config-autoscaler applies.
    let limited = AutoscalerConfig {
        max_scale_limit: 10,
        ..AutoscalerConfig::default()
    };
    let s: Service = serde_json::from_value(edit(|v| {
        v["spec"]["template"]["metadata"]["annotations"]["autoscaling.knative.dev/max-scale"] =
            json!("20")
    }))
    .unwrap();
    let out = render(&validate::service(
        &s,
        &DefaultsConfig::default(),
        &limited,
        &FeaturesConfig::default(),
    ));
    assert_eq!(
        out,
        "invalid value: 20: spec.template.metadata.annotations.autoscaling.knative.dev/max-scale\n\
         must be in [1, max-scale-limit (10)]"
    );
    // On the Service itself they do nothing: an error, as in Knative.
    let out = svc(edit(|v| {
        v["metadata"]["annotations"] = json!({"autoscaling.knative.dev/min-scale": "1"})
    }));
    assert_eq!(
        out,
        "invalid key name \"autoscaling.knative.dev/min-scale\": metadata.annotations\n\
         autoscaling annotations must be put under \"spec.template.metadata.annotations\" to work"
    );
    assert_eq!(
        svc(edit(|v| {
            v["spec"]["template"]["metadata"]["annotations"]["queue.sidecar.serving.knative.dev/resource-percentage"] =
                json!("200")
        })),
        "expected 0.1 <= 200 <= 100: spec.template.metadata.annotations.queue.sidecar.serving.knative.dev/resource-percentage"
    );
}

#[test]
fn labels_as_knative() {
    assert_eq!(
        svc(edit(
            |v| v["metadata"]["labels"] = json!({"networking.knative.dev/visibility": "public"})
        )),
        "invalid value: public: metadata.labels.networking.knative.dev/visibility"
    );
    assert_eq!(
        svc(edit(
            |v| v["metadata"]["labels"] =
                json!({"networking.knative.dev/visibility": "cluster-local"})
        )),
        ""
    );
    assert_eq!(
        svc(edit(
            |v| v["metadata"]["labels"] = json!({"serving.knative.dev/route": "x"})
        )),
        "invalid key name \"serving.knative.dev/route\": metadata.labels"
    );
    // A Route claiming a Service it is not owned by.
    let r: Route = serde_json::from_value(json!({
        "apiVersion": "serving.knative.dev/v1", "kind": "Route",
        "metadata": {"name": "r", "labels": {"serving.knative.dev/service": "s"}},
        "spec": {"traffic": [{"configurationName": "c", "percent": 100}]}
    }))
    .unwrap();
    assert_eq!(
        render(&validate::route(&r)),
        "missing field(s): metadata.labels.serving.knative.dev/service"
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let errs = service_errors(edit(|v| {
        v["spec"]["template"]["spec"]["containerConcurrency"] = json!(5000);
        container(v)["ports"][0]["containerPort"] = json!(8012);
        container(v)["env"] = json!([{"name": "PORT", "value": "1"}]);
        v["spec"]["traffic"][0]["percent"] = json!(150);
    }));
    let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
    for want in [
        "spec.template.spec.containerConcurrency",
        "spec.template.spec.containers[0].ports.containerPort",
        "spec.template.spec.containers[0].env[0].name",
        "spec.traffic[0].percent",
        "spec.traffic",
    ] {
        assert!(paths.contains(&want), "{want} missing from {paths:?}");
    }
}

#[test]
fn reasons_and_messages_for_the_conditions() {
    let template = service_errors(edit(|v| {
        v["spec"]["template"]["spec"]["containerConcurrency"] = json!(5000)
    }));
    assert_eq!(
        reason::for_service(&template),
        ("ConfigurationsReady", "RevisionFailed")
    );
    assert_eq!(
        validate::revision_creation_failed(&template),
        "Revision creation failed with message: expected 0 <= 5000 <= 1000: \
         spec.template.spec.containerConcurrency."
    );
    let traffic = service_errors(edit(|v| v["spec"]["traffic"][0]["percent"] = json!(90)));
    assert_eq!(
        reason::for_service(&traffic),
        ("RoutesReady", "InvalidSpec")
    );
    // Display: one FieldError as one Knative line.
    assert_eq!(
        traffic[0].to_string(),
        "Traffic targets sum to 90, want 100: spec.traffic"
    );
}

/// The types' own helloworld fixture (src/knative/testdata/) is valid too.
#[test]
fn the_types_helloworld_fixture_is_valid() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/knative/testdata/helloworld.yaml"
    ))
    .unwrap();
    let svc: Service = serde_saphyr::from_str(&text).unwrap();
    let errors = validate::service(
        &svc,
        &DefaultsConfig::default(),
        &AutoscalerConfig::default(),
        &FeaturesConfig::default(),
    );
    assert!(errors.is_empty(), "{}", render(&errors));
}

#[test]
fn rollout_duration_is_a_whole_non_negative_duration() {
    let with = |d: &str| {
        let mut v = hello();
        v["metadata"]["annotations"] = json!({"serving.knative.dev/rollout-duration": d});
        svc(v)
    };
    assert_eq!(with("180s"), "");
    assert_eq!(with("2m"), "");
    assert_eq!(
        with("CLXXXIIIs"),
        "invalid value: CLXXXIIIs: metadata.annotations.serving.knative.dev/rollout-duration"
    );
    assert_eq!(
        with("1.5s"),
        "rollout-duration=1.5s is not at second precision: \
         metadata.annotations.serving.knative.dev/rollout-duration"
    );
    assert_eq!(
        with("-10s"),
        "rollout-duration=-10s must be positive: \
         metadata.annotations.serving.knative.dev/rollout-duration"
    );
}

#[test]
fn a_template_may_not_carry_the_visibility_annotation() {
    let mut v = hello();
    v["spec"]["template"]["metadata"]["annotations"]["networking.knative.dev/visibility"] =
        json!("cluster-local");
    assert_eq!(
        svc(v),
        "invalid key name \"networking.knative.dev/visibility\": spec.template.metadata.annotations"
    );
}

fn domain_mapping(v: Value) -> String {
    let dm: thaw::knative::DomainMapping = serde_json::from_value(v).unwrap();
    render(&validate::domain_mapping(&dm))
}

fn dm(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "serving.knative.dev/v1beta1", "kind": "DomainMapping",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    })
}

#[test]
fn a_domain_mapping_names_a_domain_outside_the_cluster_and_a_ref_of_its_namespace() {
    let ok_ref =
        json!({"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": "hello"});
    assert_eq!(
        domain_mapping(dm("hello.example.org", json!({"ref": ok_ref}))),
        ""
    );
    assert_eq!(
        domain_mapping(dm(
            "hello.example.org",
            json!({"ref": ok_ref, "tls": {"secretName": "c"}})
        )),
        ""
    );
    assert_eq!(
        domain_mapping(dm("localhost", json!({"ref": ok_ref}))),
        "invalid name \"localhost\": name: Invalid value: \"localhost\": should be a domain \
         with at least two segments separated by dots: metadata.name"
    );
    assert_eq!(
        domain_mapping(dm("Hello.example.org", json!({"ref": ok_ref}))),
        "invalid name \"Hello.example.org\": name: Invalid value: \"Hello.example.org\": a \
         lowercase RFC 1123 subdomain must consist of \
         lower case alphanumeric characters, '-' or '.', and must start and end with an \
         alphanumeric character (e.g. 'example.com', regex used for validation is \
         '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*'): metadata.name"
    );
    // Knative's IsFullyQualifiedDomainName: a label too long for DNS names that label.
    let long = "a".repeat(64);
    assert_eq!(
        domain_mapping(dm(&format!("{long}.example.org"), json!({"ref": ok_ref}))),
        format!(
            "invalid name \"{long}.example.org\": name: Invalid value: \"{long}\": must be no \
             more than 63 characters: metadata.name"
        )
    );
    assert_eq!(
        domain_mapping(dm(
            "hello.default.svc.cluster.local",
            json!({"ref": ok_ref})
        )),
        "invalid name \"hello.default.svc.cluster.local\": must not be a subdomain of cluster \
         local domain \"cluster.local\": metadata.name"
    );
    assert_eq!(
        domain_mapping(dm(
            "hello.example.org",
            json!({"ref": {"apiVersion": "", "kind": "", "name": ""}})
        )),
        "missing field(s): spec.ref.apiVersion, spec.ref.kind, spec.ref.name"
    );
    assert_eq!(
        domain_mapping(dm(
            "hello.example.org",
            json!({"ref": {"apiVersion": "serving.knative.dev/v1", "kind": "Service",
                "name": "hello", "namespace": "other"}})
        )),
        "mismatched namespaces: spec.ref.namespace\nparent namespace: \"default\" does not \
         match ref: \"other\""
    );
    assert_eq!(
        domain_mapping(dm(
            "hello.example.org",
            json!({"ref": ok_ref, "tls": {"secretName": ""}})
        )),
        "missing field(s): spec.tls.secretName"
    );
}

/// Knative's `ErrInvalidValue(name, "serviceAccountName", reason)` for each of Kubernetes'
/// `IsDNS1123Subdomain` reasons, the reason on the line after (conformance/api/v1's
/// TestServiceAccountValidation looks for it).
#[test]
fn a_service_account_name_is_a_dns_1123_subdomain() {
    let with = |name: &str| {
        svc(edit(|v| {
            v["spec"]["template"]["spec"]["serviceAccountName"] = json!(name);
        }))
    };
    assert_eq!(with("builder.ci-2"), "");
    assert_eq!(
        with("foo@bar.baz"),
        "invalid value: foo@bar.baz: spec.template.spec.serviceAccountName\n\
         a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, \
         '-' or '.', and must start and end with an alphanumeric character (e.g. \
         'example.com', regex used for validation is \
         '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
    );
    // A part longer than a label's 63 characters is still a subdomain's.
    assert_eq!(with(&"a".repeat(64)), "");
}

/// Knative's `validateSecurityContext` and `ValidatePodSecurityContext`: user and group ids
/// within [0, MaxInt32] (conformance/runtime's TestShouldNotContainerConstraints/TestInvalidUID
/// sends `runAsUser: -10`).
#[test]
fn security_context_ids_are_within_bounds() {
    let errs = svc(edit(|v| {
        container(v)["securityContext"] = json!({"runAsUser": -10, "runAsGroup": 2147483648i64});
    }));
    assert!(
        errs.contains(
            "expected 0 <= -10 <= 2147483647: spec.template.spec.containers[0].securityContext.runAsUser"
        ),
        "{errs}"
    );
    assert!(
        errs.contains(
            "expected 0 <= 2147483648 <= 2147483647: spec.template.spec.containers[0].securityContext.runAsGroup"
        ),
        "{errs}"
    );
    let ok = svc(edit(|v| {
        container(v)["securityContext"] = json!({"runAsUser": 0, "runAsGroup": 2147483647});
    }));
    assert_eq!(ok, "");
    let pod = service_errors(edit(|v| {
        v["spec"]["template"]["spec"]["securityContext"] =
            json!({"runAsUser": -1, "fsGroup": -2, "supplementalGroups": [5, -3]});
    }));
    let paths: Vec<&str> = pod.iter().map(|e| e.path.as_str()).collect();
    for want in [
        "spec.template.spec.securityContext.runAsUser",
        "spec.template.spec.securityContext.fsGroup",
        "spec.template.spec.securityContext.supplementalGroups[1]",
    ] {
        assert!(paths.contains(&want), "{want} not in {paths:?}");
    }
}
