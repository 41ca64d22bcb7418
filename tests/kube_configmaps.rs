//! The system namespace's ConfigMaps followed live against the in-process API server: the
//! initial values apply, an edit changes the stable window at once, an invalid edit is
//! rejected with key, value and reason (counted) and the last good value keeps serving.

mod kube_support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use thaw::config::live::{LiveConfig, LiveEvent, SYSTEM_NAMESPACE, watch_configmaps};
use thaw::config::reload::Outcome;
use thaw::telemetry::config::{ConfigLabels, ConfigMetrics};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(30);

fn cm(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..ConfigMap::default()
    }
}

/// The next event after `seen` for `name`.
async fn next_event(rx: &mut watch::Receiver<LiveEvent>, seen: &mut u64, name: &str) -> Outcome {
    let s = *seen;
    let found = tokio::time::timeout(
        DEADLINE,
        rx.wait_for(|e| e.generation > s && e.name == name),
    )
    .await
    .ok()
    .and_then(|r| r.ok().map(|e| e.clone()));
    let e = found.unwrap_or_else(|| panic!("no event for {name}: {:?}", rx.borrow()));
    *seen = e.generation;
    e.outcome.unwrap()
}

#[tokio::test]
async fn edits_apply_live_and_invalid_ones_keep_the_last_good_value() {
    let api = kube_support::TestApi::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), SYSTEM_NAMESPACE);
    cms.create(
        &PostParams::default(),
        &cm("config-autoscaler", &[("stable-window", "30s")]),
    )
    .await
    .unwrap();
    let live = LiveConfig::default();
    let metrics = ConfigMetrics::default();
    let stop = CancellationToken::new();
    let mut rx = watch_configmaps(
        api.client(),
        SYSTEM_NAMESPACE,
        live.clone(),
        metrics.clone(),
        stop.clone(),
    );
    let mut seen = 0;

    // The value present at start applies.
    assert_eq!(
        next_event(&mut rx, &mut seen, "config-autoscaler").await,
        Outcome::Applied
    );
    assert_eq!(
        live.autoscaler.load().stable_window,
        Duration::from_secs(30)
    );

    // An edit applies live.
    cms.replace("config-autoscaler", &PostParams::default(), &{
        let mut c = cms.get("config-autoscaler").await.unwrap();
        c.data = cm("", &[("stable-window", "45s")]).data;
        c
    })
    .await
    .unwrap();
    assert_eq!(
        next_event(&mut rx, &mut seen, "config-autoscaler").await,
        Outcome::Applied
    );
    assert_eq!(
        live.autoscaler.load().stable_window,
        Duration::from_secs(45)
    );

    // An invalid edit is rejected with the key, the value and the reason; 45 s stays.
    cms.replace("config-autoscaler", &PostParams::default(), &{
        let mut c = cms.get("config-autoscaler").await.unwrap();
        c.data = cm("", &[("stable-window", "2s")]).data;
        c
    })
    .await
    .unwrap();
    let Outcome::Rejected(problems) = next_event(&mut rx, &mut seen, "config-autoscaler").await
    else {
        panic!("an invalid stable-window was applied");
    };
    assert_eq!(problems.0[0].key, "stable-window");
    assert_eq!(problems.0[0].value, "2s");
    assert!(!problems.0[0].reason.is_empty());
    assert_eq!(
        live.autoscaler.load().stable_window,
        Duration::from_secs(45)
    );
    let labels = ConfigLabels {
        config: "config-autoscaler".into(),
    };
    assert_eq!(metrics.rejected.get_or_create(&labels).get(), 1);
    assert_eq!(metrics.reloads.get_or_create(&labels).get(), 2);

    // Other ConfigMaps of the namespace are not ours; config-defaults is.
    cms.create(&PostParams::default(), &cm("unrelated", &[("a", "b")]))
        .await
        .unwrap();
    cms.create(
        &PostParams::default(),
        &cm("config-defaults", &[("revision-timeout-seconds", "120")]),
    )
    .await
    .unwrap();
    assert_eq!(
        next_event(&mut rx, &mut seen, "config-defaults").await,
        Outcome::Applied
    );
    assert_eq!(
        live.defaults.load().revision_timeout,
        Duration::from_secs(120)
    );
    assert_eq!(
        live.autoscaler.load().stable_window,
        Duration::from_secs(45)
    );
    stop.cancel();
}

/// config-certmanager is followed live: a good `issuerRef` applies, a bad one is rejected
/// naming the key and the last good issuer stays.
#[tokio::test]
async fn a_bad_issuer_ref_keeps_the_last_good_one() {
    let api = kube_support::TestApi::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), SYSTEM_NAMESPACE);
    cms.create(
        &PostParams::default(),
        &cm(
            "config-certmanager",
            &[("issuerRef", "kind: ClusterIssuer\nname: letsencrypt\n")],
        ),
    )
    .await
    .unwrap();
    let live = LiveConfig::default();
    let stop = CancellationToken::new();
    let mut rx = watch_configmaps(
        api.client(),
        SYSTEM_NAMESPACE,
        live.clone(),
        ConfigMetrics::default(),
        stop.clone(),
    );
    let mut seen = 0;
    assert_eq!(
        next_event(&mut rx, &mut seen, "config-certmanager").await,
        Outcome::Applied
    );
    assert_eq!(live.certmanager.load().issuer_ref.name, "letsencrypt");
    cms.replace("config-certmanager", &PostParams::default(), &{
        let mut c = cms.get("config-certmanager").await.unwrap();
        c.data = cm("", &[("issuerRef", "name: no-kind\n")]).data;
        c
    })
    .await
    .unwrap();
    let Outcome::Rejected(problems) = next_event(&mut rx, &mut seen, "config-certmanager").await
    else {
        panic!("an invalid issuerRef was applied");
    };
    assert_eq!(problems.0[0].key, "issuerRef");
    assert_eq!(live.certmanager.load().issuer_ref.name, "letsencrypt");
    stop.cancel();
}

/// The one rule for keys, live: a ConfigMap with keys that have no effect in thaw (an unknown
/// config-features value, a Knative key thaw does not implement) is applied — the good keys in
/// force, the unknown value's key at its default as in Knative — and the keys are counted in
/// `thaw_config_ineffective_keys{config_map}` on the roles' /metrics; an edit without them
/// brings the gauge back to 0. net-istio's older gateway keys apply live.
#[tokio::test]
async fn keys_without_effect_apply_live_and_are_counted() {
    use thaw::config::features::Flag;
    let api = kube_support::TestApi::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), SYSTEM_NAMESPACE);
    cms.create(
        &PostParams::default(),
        &cm(
            "config-features",
            &[
                ("kubernetes.podspec-affinity", "enabled"),
                ("kubernetes.podspec-volumes-emptydir", "sometimes"),
                ("autodetect-http2", "enabled"),
            ],
        ),
    )
    .await
    .unwrap();
    let telemetry = thaw::telemetry::Telemetry::new();
    let live = LiveConfig::default();
    let stop = CancellationToken::new();
    let mut rx = watch_configmaps(
        api.client(),
        SYSTEM_NAMESPACE,
        live.clone(),
        telemetry.config.clone(),
        stop.clone(),
    );
    let mut seen = 0;
    assert_eq!(
        next_event(&mut rx, &mut seen, "config-features").await,
        Outcome::Applied
    );
    let f = live.features.load();
    assert_eq!(f.podspec_affinity, Flag::Enabled);
    assert_eq!(
        f.podspec_volumes_emptydir,
        Flag::Enabled,
        "Knative's default stays"
    );
    let exposition = telemetry.encode();
    assert!(
        exposition.contains("thaw_config_ineffective_keys{config_map=\"config-features\"} 2"),
        "{exposition}"
    );

    cms.replace("config-features", &PostParams::default(), &{
        let mut c = cms.get("config-features").await.unwrap();
        c.data = cm("", &[("kubernetes.podspec-affinity", "disabled")]).data;
        c
    })
    .await
    .unwrap();
    assert_eq!(
        next_event(&mut rx, &mut seen, "config-features").await,
        Outcome::Applied
    );
    assert_eq!(live.features.load().podspec_affinity, Flag::Disabled);
    assert!(
        telemetry
            .encode()
            .contains("thaw_config_ineffective_keys{config_map=\"config-features\"} 0")
    );

    cms.create(
        &PostParams::default(),
        &cm(
            "config-istio",
            &[("gateway.edge.public", "public-gw.edge.svc.cluster.local")],
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        next_event(&mut rx, &mut seen, "config-istio").await,
        Outcome::Applied
    );
    let istio = live.istio.load();
    assert_eq!(istio.external_gateways[0].reference(), "edge/public");
    assert_eq!(
        istio.external_gateways[0].service,
        "public-gw.edge.svc.cluster.local"
    );
    stop.cancel();
}
