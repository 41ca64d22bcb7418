use super::*;

fn source(name: &str, pairs: &[(&str, &str)]) -> Source {
    Source {
        origin: format!("knative-serving/{name}"),
        name: name.into(),
        data: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn notes_of<'a>(m: &'a Migration, config_map: &str) -> Vec<&'a Note> {
    m.notes
        .iter()
        .filter(|n| n.config_map == config_map)
        .collect()
}

#[test]
fn every_key_and_value_is_kept_but_example_and_the_namespace_is_rewritten() {
    let m = migrate(
        &[source(
            "config-autoscaler",
            &[
                ("_example", "# docs"),
                ("stable-window", "90s"),
                ("made-up", "x"),
            ],
        )],
        "thaw-system",
    );
    assert!(m.errors.is_empty(), "{:?}", m.errors);
    let cm = &m.config_maps[0];
    assert_eq!(cm["metadata"]["namespace"], "thaw-system");
    assert_eq!(cm["metadata"]["name"], "config-autoscaler");
    assert_eq!(
        cm["metadata"]["annotations"][MIGRATED_FROM],
        "knative-serving/config-autoscaler"
    );
    assert_eq!(
        cm["data"],
        json!({"stable-window": "90s", "made-up": "x"}),
        "kept, _example dropped"
    );
    let n = notes_of(&m, "config-autoscaler");
    assert_eq!(n.len(), 1, "{n:?}");
    assert_eq!(n[0].key.as_deref(), Some("made-up"));
    assert_eq!(
        n[0].to_string(),
        "config-autoscaler: made-up: unknown key, ignored"
    );
}

#[test]
fn older_gateway_keys_are_read_as_the_current_ones_and_named() {
    let m = migrate(
        &[source(
            "config-istio",
            &[
                (
                    "gateway.knative-serving.knative-ingress-gateway",
                    "istio-ingressgateway.istio-system.svc.cluster.local",
                ),
                (
                    "local-gateway.knative-serving.knative-local-gateway",
                    "knative-local-gateway.istio-system.svc.cluster.local",
                ),
                ("local-gateway.mesh", "mesh"),
                ("enable-virtualservice-status", "false"),
            ],
        )],
        "thaw-system",
    );
    assert!(m.errors.is_empty(), "{:?}", m.errors);
    let lines: Vec<String> = notes_of(&m, "config-istio")
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert!(
        lines.contains(
            &"config-istio: gateway.knative-serving.knative-ingress-gateway: read as \
              external-gateways"
                .to_string()
        ),
        "{lines:#?}"
    );
    assert!(
        lines.contains(
            &"config-istio: local-gateway.knative-serving.knative-local-gateway: read as \
              local-gateways"
                .to_string()
        ),
        "{lines:#?}"
    );
    for key in ["local-gateway.mesh", "enable-virtualservice-status"] {
        assert!(
            lines.iter().any(
                |l| l.starts_with(&format!("config-istio: {key}: ")) && l.contains("no effect")
            ),
            "{key}: {lines:#?}"
        );
    }
    assert_eq!(lines.len(), 4, "{lines:#?}");
    // Every key is in the written ConfigMap, the older ones included.
    assert_eq!(m.config_maps[0]["data"].as_object().unwrap().len(), 4);
}

#[test]
fn unread_config_maps_are_named_whole_and_not_written() {
    let m = migrate(
        &[
            source(
                "config-observability",
                &[("metrics.backend-destination", "prometheus")],
            ),
            source("config-logging", &[("_example", "x")]),
            source("config-gc", &[]),
        ],
        "thaw-system",
    );
    assert_eq!(m.config_maps.len(), 1);
    assert_eq!(m.config_maps[0]["metadata"]["name"], "config-gc");
    let lines: Vec<String> = m.notes.iter().map(|n| n.to_string()).collect();
    assert_eq!(
        lines,
        [
            "config-observability: a ConfigMap thaw does not read; not carried over (1 key(s))",
            "config-logging: a ConfigMap thaw does not read; not carried over (0 key(s))",
        ]
    );
}

#[test]
fn knatives_queue_proxy_image_is_not_carried_over() {
    let m = migrate(
        &[source(
            "config-deployment",
            &[
                ("queue-sidecar-image", "ko://knative.dev/serving/cmd/queue"),
                ("progress-deadline", "900s"),
            ],
        )],
        "thaw-system",
    );
    assert!(m.errors.is_empty(), "{:?}", m.errors);
    assert_eq!(
        m.config_maps[0]["data"],
        json!({"progress-deadline": "900s"})
    );
    let n = notes_of(&m, "config-deployment");
    assert_eq!(n[0].key.as_deref(), Some("queue-sidecar-image"));
    assert!(n[0].message.contains("not carried over"), "{n:?}");
}

#[test]
fn an_invalid_value_is_an_error_naming_the_config_map_and_the_stream_still_has_it() {
    let m = migrate(
        &[
            source("config-autoscaler", &[("stable-window", "1s")]),
            source(
                "config-features",
                &[("kubernetes.podspec-affinity", "sometimes")],
            ),
        ],
        "thaw-system",
    );
    assert_eq!(m.errors.len(), 1, "{:?}", m.errors);
    assert_eq!(m.errors[0].file.as_deref(), Some("config-autoscaler"));
    assert_eq!(m.errors[0].key, "stable-window");
    // An unknown flag value is not an error: the default stays, as in Knative.
    let n = notes_of(&m, "config-features");
    assert_eq!(n.len(), 1, "{n:?}");
    assert!(
        n[0].message.contains("its default, disabled, stays"),
        "{n:?}"
    );
    assert_eq!(m.config_maps.len(), 2);
    let v = render_json(&m);
    assert_eq!(v["ok"], false);
    assert_eq!(v["errors"][0]["configMap"], "config-autoscaler");
    assert_eq!(v["notes"][0]["key"], "kubernetes.podspec-affinity");
}

#[test]
fn a_config_map_given_twice_is_an_error() {
    let m = migrate(
        &[source("config-gc", &[]), source("config-gc", &[])],
        "thaw-system",
    );
    assert_eq!(m.errors.len(), 1);
    assert!(m.errors[0].reason.contains("given twice"), "{:?}", m.errors);
}

#[test]
fn lists_and_release_yaml_give_their_config_maps() {
    let text = "apiVersion: v1\nkind: Namespace\nmetadata: {name: knative-serving}\n---\n\
                apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  \
                metadata: {name: config-gc, namespace: knative-serving}\n  data:\n    \
                retain-since-create-time: \"48h\"\n    min-non-active-revisions: 20\n\
                ---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: config-domain}\n";
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).unwrap();
    let s = sources_in(&docs, "f.yaml").unwrap();
    let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["config-gc", "config-domain"]);
    assert_eq!(s[0].data["min-non-active-revisions"], "20");
    assert!(s[1].data.is_empty());
}

/// The stream keeps every value a string (a `data:` value must be one): `"true"` and `"10"`
/// stay quoted, and the documents read back as what was written.
#[test]
fn the_yaml_stream_reads_back_as_written() {
    let m = migrate(
        &[source(
            "config-autoscaler",
            &[
                ("enable-scale-to-zero", "true"),
                ("max-scale", "10"),
                ("stable-window", "60s"),
            ],
        )],
        "thaw-system",
    );
    let yaml = render_yaml(&m);
    let docs: Vec<Value> = serde_saphyr::from_multiple(&yaml).unwrap();
    assert_eq!(docs, m.config_maps, "{yaml}");
    assert_eq!(
        docs[0]["data"]["enable-scale-to-zero"],
        json!("true"),
        "{yaml}"
    );
}
