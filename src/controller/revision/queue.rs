//! The queue sidecar (`thaw queue`) injected into every revision pod: its container, from the
//! revision's resolved settings and config-deployment, and the user's readiness probe moved
//! into it (Knative's `makeQueueContainer`).
//!
//! The sidecar's settings are environment variables with Knative's queue-proxy names where one
//! exists ([`crate::queue::settings`]). Its ports are thaw's: the data port 8012 serves
//! HTTP/1.1 and h2c alike, and the admin port 9091 (named
//! [`crate::stats::POD_STATS_PORT_NAME`], as the autoscaler's pull expects) serves `/readyz`,
//! `/healthz`, `/metrics`, `/stats` and `/wait-for-drain`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, Probe, ResourceRequirements, SeccompProfile, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use k8s_openapi::api::apps::v1::Deployment;

use super::resolve::Resolved;
use crate::config::DeploymentConfig;
use crate::config::deployment::SidecarResources;
use crate::knative::proxy_tag::Expected;
use crate::queue::settings as env;
use crate::queue::settings::{DEFAULT_ADMIN_PORT, DEFAULT_DATA_PORT, DEFAULT_DRAIN_DELAY};
use crate::revision::Protocol;
use crate::stats::POD_STATS_PORT_NAME;

/// The sidecar's container name (Knative's).
pub const QUEUE_CONTAINER_NAME: &str = "queue-proxy";
/// The sidecar's data port name in the pod.
pub const DATA_PORT_NAME: &str = "http1";
/// Where the user container's `preStop` hook waits until the sidecar has drained.
pub const DRAIN_PATH: &str = "/wait-for-drain";
/// The sidecar's readiness: the user container answers its probe and no drain has started.
pub const READY_PATH: &str = "/readyz";
/// The sidecar's liveness: the process serves.
pub const HEALTH_PATH: &str = "/healthz";

/// The user's readiness probe as the sidecar runs it, and what stays with the kubelet.
#[derive(Debug, Clone, PartialEq)]
pub struct MovedProbe {
    /// `SERVING_READINESS_PROBE`: the probe's JSON with numeric ports (TCP on the user port
    /// when the user gave none, or gave one the sidecar does not run).
    pub json: String,
    /// The timing of the user's probe (period, thresholds, ...) for the sidecar's own
    /// readiness probe, when one was moved.
    pub timing: Option<Probe>,
}

/// A probe port as a number: `0` or missing is the user port, a name is looked up among the
/// serving container's ports as the user wrote them.
pub fn probe_port(port: &IntOrString, user_port: u16, named: &BTreeMap<String, i32>) -> i32 {
    match port {
        IntOrString::Int(0) => i32::from(user_port),
        IntOrString::Int(p) => *p,
        IntOrString::String(s) => match s.parse::<i32>() {
            Ok(0) => i32::from(user_port),
            Ok(p) => p,
            Err(_) => named.get(s).copied().unwrap_or(i32::from(user_port)),
        },
    }
}

/// Moves the user's HTTP, TCP or gRPC readiness probe into the sidecar (Knative's queue-proxy
/// runs it against the user container; the kubelet then probes the sidecar). An `exec` probe
/// stays with the kubelet on the user container, and the sidecar checks TCP on the user port. Returns the moved probe and whether the user container keeps its own.
pub fn move_readiness(
    probe: Option<&Probe>,
    user_port: u16,
    named: &BTreeMap<String, i32>,
) -> (MovedProbe, bool) {
    let tcp = || serde_json::json!({"tcpSocket": {"port": user_port, "host": "127.0.0.1"}});
    let Some(p) = probe else {
        return (
            MovedProbe {
                json: tcp().to_string(),
                timing: None,
            },
            false,
        );
    };
    let timing = Probe {
        initial_delay_seconds: p.initial_delay_seconds,
        period_seconds: p.period_seconds,
        timeout_seconds: p.timeout_seconds,
        success_threshold: p.success_threshold,
        failure_threshold: p.failure_threshold,
        ..Probe::default()
    };
    if let Some(h) = &p.http_get {
        let mut v = serde_json::json!({
            "httpGet": {
                "path": h.path.clone().unwrap_or_else(|| "/".into()),
                "port": probe_port(&h.port, user_port, named),
            }
        });
        if let Some(headers) = &h.http_headers {
            v["httpGet"]["httpHeaders"] = serde_json::to_value(headers).unwrap_or_default();
        }
        return (
            MovedProbe {
                json: v.to_string(),
                timing: Some(timing),
            },
            false,
        );
    }
    if let Some(t) = &p.tcp_socket {
        let v = serde_json::json!({"tcpSocket": {
            "port": probe_port(&t.port, user_port, named), "host": "127.0.0.1"}});
        return (
            MovedProbe {
                json: v.to_string(),
                timing: Some(timing),
            },
            false,
        );
    }
    if let Some(g) = &p.grpc {
        let port = match g.port {
            0 => i32::from(user_port),
            p => p,
        };
        let mut v = serde_json::json!({"grpc": {"port": port}});
        if let Some(service) = &g.service {
            v["grpc"]["service"] = service.clone().into();
        }
        return (
            MovedProbe {
                json: v.to_string(),
                timing: Some(timing),
            },
            false,
        );
    }
    (
        MovedProbe {
            json: tcp().to_string(),
            timing: None,
        },
        true,
    )
}

/// The previous form's proxy tag the sidecar of `live` (a revision's Deployment as it is)
/// holds, carried into its next template so that nothing but the live object decides it
/// ([`crate::knative::proxy_tag`]): its `THAW_PROXY_TAG_LEGACY` when the template is this
/// release's (empty: none), else its `THAW_PROXY_TAG` (a previous release wrote only the
/// previous form, there). A value that is not a tag is not carried.
pub fn live_legacy_tag(live: &Deployment) -> Option<String> {
    let pod = live.spec.as_ref()?.template.spec.as_ref()?;
    let queue = pod
        .containers
        .iter()
        .find(|c| c.name == QUEUE_CONTAINER_NAME)?;
    let envs = queue.env.as_deref().unwrap_or_default();
    let find = |name: &str| envs.iter().find(|e| e.name == name);
    let held = match find(env::THAW_PROXY_TAG_LEGACY) {
        Some(legacy) => legacy,
        None => find(env::THAW_PROXY_TAG)?,
    };
    let value = held.value.as_deref()?.trim();
    Expected::parse(value).ok().map(|_| value.to_string())
}

fn var(name: &str, value: impl ToString) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.to_string()),
        value_from: None,
    }
}

fn resources(r: &SidecarResources) -> Option<ResourceRequirements> {
    let pick = |pairs: [(&str, &Option<String>); 3]| -> Option<BTreeMap<String, Quantity>> {
        let m: BTreeMap<String, Quantity> = pairs
            .into_iter()
            .filter_map(|(k, v)| Some((k.to_string(), Quantity(v.clone()?))))
            .collect();
        (!m.is_empty()).then_some(m)
    };
    let requests = pick([
        ("cpu", &r.cpu_request),
        ("memory", &r.memory_request),
        ("ephemeral-storage", &r.ephemeral_storage_request),
    ]);
    let limits = pick([
        ("cpu", &r.cpu_limit),
        ("memory", &r.memory_limit),
        ("ephemeral-storage", &r.ephemeral_storage_limit),
    ]);
    (requests.is_some() || limits.is_some()).then(|| ResourceRequirements {
        requests,
        limits,
        ..ResourceRequirements::default()
    })
}

/// The sidecar container of revision `r`.
pub fn queue_container(r: &Resolved, cfg: &DeploymentConfig, probe: &MovedProbe) -> Container {
    let t = &r.timeouts;
    let mut env = vec![
        var(env::SERVING_NAMESPACE, &r.namespace),
        var(env::SERVING_REVISION, &r.name),
        var(env::SERVING_CONFIGURATION, &r.configuration),
        var(env::SERVING_SERVICE, &r.service),
        EnvVar {
            name: env::SERVING_POD.into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.name".into(),
                    api_version: None,
                }),
                ..EnvVarSource::default()
            }),
        },
        var(env::CONTAINER_CONCURRENCY, r.container_concurrency),
        var(env::REVISION_TIMEOUT_SECONDS, t.total.as_secs()),
        var(
            env::REVISION_RESPONSE_START_TIMEOUT_SECONDS,
            t.response_start.as_secs(),
        ),
        var(
            env::REVISION_IDLE_TIMEOUT_SECONDS,
            t.idle.map_or(0, |d| d.as_secs()),
        ),
        var(env::USER_PORT, r.user_port),
        var(
            env::THAW_USER_PROTOCOL,
            match r.protocol {
                Protocol::H2c => "h2c",
                Protocol::Http1 => "http1",
            },
        ),
        var(env::QUEUE_SERVING_PORT, DEFAULT_DATA_PORT),
        var(env::THAW_QUEUE_ADMIN_PORT, DEFAULT_ADMIN_PORT),
        var(env::SERVING_READINESS_PROBE, &probe.json),
        var(
            env::THAW_DRAIN_DELAY,
            format!("{}s", DEFAULT_DRAIN_DELAY.as_secs()),
        ),
        var(
            env::THAW_REQUEST_BODY_IDLE_TIMEOUT,
            crate::config::parse::format_duration(cfg.request_body_idle_timeout),
        ),
    ];
    // The revision's tag, never the key it is computed with.
    if let Some(tag) = &r.proxy_tag {
        env.push(var(env::THAW_PROXY_TAG, tag));
    }
    // The previous form's tag, on every template this release writes (empty when there is
    // none): its presence tells [`live_legacy_tag`] that the template is of this release.
    env.push(var(
        env::THAW_PROXY_TAG_LEGACY,
        r.legacy_proxy_tag.as_deref().unwrap_or(""),
    ));
    let admin = IntOrString::Int(i32::from(DEFAULT_ADMIN_PORT));
    let timing = probe.timing.clone().unwrap_or_default();
    let readiness = Probe {
        http_get: Some(HTTPGetAction {
            path: Some(READY_PATH.into()),
            port: admin.clone(),
            ..HTTPGetAction::default()
        }),
        // The sidecar probes the user container itself (from 1 ms intervals until it
        // answers); the kubelet's probe of the sidecar should follow closely.
        period_seconds: timing.period_seconds.filter(|p| *p > 0).or(Some(1)),
        failure_threshold: timing.failure_threshold.or(Some(1)),
        ..timing
    };
    Container {
        name: QUEUE_CONTAINER_NAME.into(),
        image: Some(cfg.queue_sidecar_image.clone()),
        args: Some(vec!["queue".into(), "--log-json".into()]),
        env: Some(env),
        ports: Some(vec![
            ContainerPort {
                name: Some(DATA_PORT_NAME.into()),
                container_port: i32::from(DEFAULT_DATA_PORT),
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            },
            ContainerPort {
                name: Some(POD_STATS_PORT_NAME.into()),
                container_port: i32::from(DEFAULT_ADMIN_PORT),
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            },
        ]),
        readiness_probe: Some(readiness),
        liveness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some(HEALTH_PATH.into()),
                port: admin,
                ..HTTPGetAction::default()
            }),
            period_seconds: Some(10),
            failure_threshold: Some(6),
            ..Probe::default()
        }),
        resources: resources(&cfg.queue_sidecar_resources),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..SecurityContext::default()
        }),
        ..Container::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named() -> BTreeMap<String, i32> {
        BTreeMap::from([("http1".to_string(), 8080)])
    }

    fn probe(v: serde_json::Value) -> Probe {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn probe_ports_resolve_to_numbers() {
        assert_eq!(probe_port(&IntOrString::Int(0), 9000, &named()), 9000);
        assert_eq!(probe_port(&IntOrString::Int(81), 9000, &named()), 81);
        assert_eq!(
            probe_port(&IntOrString::String("http1".into()), 9000, &named()),
            8080
        );
        assert_eq!(
            probe_port(&IntOrString::String("7".into()), 9000, &named()),
            7
        );
        assert_eq!(
            probe_port(&IntOrString::String("unknown".into()), 9000, &named()),
            9000
        );
    }

    #[test]
    fn no_probe_is_tcp_on_the_user_port() {
        let (moved, keep) = move_readiness(None, 8080, &named());
        assert!(!keep);
        assert_eq!(moved.timing, None);
        let v: serde_json::Value = serde_json::from_str(&moved.json).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"tcpSocket": {"port": 8080, "host": "127.0.0.1"}})
        );
    }

    #[test]
    fn http_probes_move_with_their_headers_and_timing() {
        let p = probe(serde_json::json!({
            "httpGet": {"path": "/healthz", "port": 0,
                        "httpHeaders": [{"name": "X-Probe", "value": "1"}]},
            "periodSeconds": 5, "failureThreshold": 3
        }));
        let (moved, keep) = move_readiness(Some(&p), 8080, &named());
        assert!(!keep);
        let v: serde_json::Value = serde_json::from_str(&moved.json).unwrap();
        assert_eq!(v["httpGet"]["path"], "/healthz");
        assert_eq!(v["httpGet"]["port"], 8080);
        assert_eq!(v["httpGet"]["httpHeaders"][0]["name"], "X-Probe");
        let timing = moved.timing.unwrap();
        assert_eq!(timing.period_seconds, Some(5));
        assert_eq!(timing.failure_threshold, Some(3));
        assert!(timing.http_get.is_none());
        // Named ports become numbers.
        let p = probe(serde_json::json!({"tcpSocket": {"port": "http1"}}));
        let (moved, _) = move_readiness(Some(&p), 9000, &named());
        let v: serde_json::Value = serde_json::from_str(&moved.json).unwrap();
        assert_eq!(v["tcpSocket"]["port"], 8080);
    }

    #[test]
    fn grpc_probes_move_to_the_sidecar() {
        let p = probe(serde_json::json!({
            "grpc": {"port": 9000, "service": "thaw.Ready"}, "periodSeconds": 2
        }));
        let (moved, keep) = move_readiness(Some(&p), 8080, &named());
        assert!(!keep);
        let v: serde_json::Value = serde_json::from_str(&moved.json).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"grpc": {"port": 9000, "service": "thaw.Ready"}})
        );
        assert_eq!(moved.timing.unwrap().period_seconds, Some(2));
        let p = probe(serde_json::json!({"grpc": {"port": 0}}));
        let (moved, _) = move_readiness(Some(&p), 8080, &named());
        let v: serde_json::Value = serde_json::from_str(&moved.json).unwrap();
        assert_eq!(v, serde_json::json!({"grpc": {"port": 8080}}));
    }

    #[test]
    fn exec_probes_stay_with_the_kubelet() {
        let p = probe(serde_json::json!({"exec": {"command": ["true"]}}));
        let (moved, keep) = move_readiness(Some(&p), 8080, &named());
        assert!(keep);
        assert!(moved.json.contains("tcpSocket"));
    }

    #[test]
    fn only_configured_resources_are_set() {
        let r = resources(&SidecarResources {
            cpu_request: Some("25m".into()),
            memory_limit: Some("800Mi".into()),
            ..SidecarResources::default()
        })
        .unwrap();
        assert_eq!(
            r.requests.unwrap(),
            BTreeMap::from([("cpu".to_string(), Quantity("25m".into()))])
        );
        assert_eq!(
            r.limits.unwrap(),
            BTreeMap::from([("memory".to_string(), Quantity("800Mi".into()))])
        );
        assert_eq!(resources(&SidecarResources::default()), None);
    }

    /// A Deployment whose sidecar has `env` (name, value).
    fn live(env: &[(&str, Option<&str>)]) -> Deployment {
        let env: Vec<EnvVar> = env
            .iter()
            .map(|(n, v)| EnvVar {
                name: (*n).into(),
                value: v.map(Into::into),
                value_from: None,
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "spec": {
                "selector": {},
                "template": {"spec": {"containers": [
                    {"name": "user-container"},
                    {"name": QUEUE_CONTAINER_NAME, "env": env},
                ]}},
            }
        }))
        .unwrap()
    }

    #[test]
    fn the_previous_forms_tag_is_carried_from_the_live_template_only() {
        let (old, new) = ("a".repeat(64), "b".repeat(64));
        // A previous release's template: its only tag is the previous form.
        let before = live(&[(env::THAW_PROXY_TAG, Some(&old))]);
        assert_eq!(live_legacy_tag(&before), Some(old.clone()));
        // This release's: the previous form is its own variable, the tag is not carried.
        let carried = live(&[
            (env::THAW_PROXY_TAG, Some(&new)),
            (env::THAW_PROXY_TAG_LEGACY, Some(&old)),
        ]);
        assert_eq!(live_legacy_tag(&carried), Some(old.clone()));
        for none in [Some(""), None] {
            let without = live(&[
                (env::THAW_PROXY_TAG, Some(&new)),
                (env::THAW_PROXY_TAG_LEGACY, none),
            ]);
            assert_eq!(live_legacy_tag(&without), None, "{none:?}");
        }
        // Nothing to carry, or nothing that is a tag.
        assert_eq!(live_legacy_tag(&live(&[])), None);
        assert_eq!(
            live_legacy_tag(&live(&[(env::THAW_PROXY_TAG, Some("x"))])),
            None
        );
        assert_eq!(live_legacy_tag(&Deployment::default()), None);
    }
}
