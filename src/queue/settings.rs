//! The sidecar's settings, read from the environment variables whoever builds the pod sets
//! (Knative's queue-proxy names where one exists), checked before anything listens.
//!
//! Pure: [`Settings::from_lookup`] takes a lookup function, so tests pass a map (setting the
//! process environment is banned by clippy.toml). Every problem names the variable, the value
//! and the reason; all problems are reported at once.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use tokio::time::Duration;

use crate::http1::Protocol;
use crate::knative::proxy_tag::{Accepted, Expected};

/// The revision's namespace (required).
pub const SERVING_NAMESPACE: &str = "SERVING_NAMESPACE";
/// The revision's name (required).
pub const SERVING_REVISION: &str = "SERVING_REVISION";
/// The revision's Configuration.
pub const SERVING_CONFIGURATION: &str = "SERVING_CONFIGURATION";
/// The revision's Service.
pub const SERVING_SERVICE: &str = "SERVING_SERVICE";
/// The pod's name (the source of its stats); else `HOSTNAME`, as Kubernetes sets it.
pub const SERVING_POD: &str = "SERVING_POD";
/// containerConcurrency: requests admitted into the user container at once (0 = unlimited).
pub const CONTAINER_CONCURRENCY: &str = "CONTAINER_CONCURRENCY";
/// The revision's `timeoutSeconds`: a request's total time, queueing included.
pub const REVISION_TIMEOUT_SECONDS: &str = "REVISION_TIMEOUT_SECONDS";
/// The revision's `responseStartTimeoutSeconds` (0 = the total timeout).
pub const REVISION_RESPONSE_START_TIMEOUT_SECONDS: &str = "REVISION_RESPONSE_START_TIMEOUT_SECONDS";
/// The revision's `idleTimeoutSeconds` (0 = none).
pub const REVISION_IDLE_TIMEOUT_SECONDS: &str = "REVISION_IDLE_TIMEOUT_SECONDS";
/// The user container's port on 127.0.0.1 (or `THAW_USER_HOST`).
pub const USER_PORT: &str = "USER_PORT";
/// thaw's: the user container's address (default 127.0.0.1), for pods that share one network
/// namespace each on its own loopback address (a test's pods on one host). Probes go there too.
pub const THAW_USER_HOST: &str = "THAW_USER_HOST";
/// The data port (HTTP/1.1 and h2c).
pub const QUEUE_SERVING_PORT: &str = "QUEUE_SERVING_PORT";
/// The user container's readiness probe, as Knative's queue-proxy reads it (JSON of a
/// Kubernetes probe: `tcpSocket`, or `httpGet` with `path`, `port` and `httpHeaders`).
pub const SERVING_READINESS_PROBE: &str = "SERVING_READINESS_PROBE";
/// thaw's: the admin port (metrics, health, pod stats, drain).
pub const THAW_QUEUE_ADMIN_PORT: &str = "THAW_QUEUE_ADMIN_PORT";
/// thaw's: requests that may wait for a place under containerConcurrency (default 10 × CC).
pub const THAW_QUEUE_DEPTH: &str = "THAW_QUEUE_DEPTH";
/// thaw's: how long new requests are still served after SIGTERM (Go duration, default 30s).
pub const THAW_DRAIN_DELAY: &str = "THAW_DRAIN_DELAY";
/// thaw's: the user container's protocol, `http1` (default) or `h2c`.
pub const THAW_USER_PROTOCOL: &str = "THAW_USER_PROTOCOL";
/// thaw's: a request body that sends nothing for this long while forwarded is cut (408);
/// config-deployment's `request-body-idle-timeout` (Go duration in [1ms, 1h], default 60s).
pub const THAW_REQUEST_BODY_IDLE_TIMEOUT: &str = "THAW_REQUEST_BODY_IDLE_TIMEOUT";
/// thaw's: the revision's proxy tag ([`crate::knative::proxy_tag`]), which `K-Proxy-Request`
/// must carry for a request to count as proxied and its `K-Original-Host` to be believed.
/// Without it (and without [`THAW_PROXY_TAG_LEGACY`]), no request is.
pub const THAW_PROXY_TAG: &str = "THAW_PROXY_TAG";
/// thaw's, this release only: the previous release's form of the revision's tag, accepted
/// like [`THAW_PROXY_TAG`] so that no request counts as direct mid-upgrade; empty or unset:
/// none.
pub const THAW_PROXY_TAG_LEGACY: &str = "THAW_PROXY_TAG_LEGACY";

/// Every variable the sidecar reads, for `--help` and the README.
pub const VARIABLES: &[&str] = &[
    SERVING_NAMESPACE,
    SERVING_REVISION,
    SERVING_CONFIGURATION,
    SERVING_SERVICE,
    SERVING_POD,
    CONTAINER_CONCURRENCY,
    REVISION_TIMEOUT_SECONDS,
    REVISION_RESPONSE_START_TIMEOUT_SECONDS,
    REVISION_IDLE_TIMEOUT_SECONDS,
    USER_PORT,
    THAW_USER_HOST,
    QUEUE_SERVING_PORT,
    SERVING_READINESS_PROBE,
    THAW_QUEUE_ADMIN_PORT,
    THAW_QUEUE_DEPTH,
    THAW_DRAIN_DELAY,
    THAW_USER_PROTOCOL,
    THAW_REQUEST_BODY_IDLE_TIMEOUT,
    THAW_PROXY_TAG,
    THAW_PROXY_TAG_LEGACY,
];

/// `thaw queue --help`'s list of variables.
pub const HELP: &str = "\
Environment (Knative's queue-proxy names where one exists):
  SERVING_NAMESPACE, SERVING_REVISION   the revision (required)
  SERVING_CONFIGURATION, SERVING_SERVICE  its Configuration and Service (metric labels)
  SERVING_POD                           the pod's name, the source of its stats (default $HOSTNAME)
  CONTAINER_CONCURRENCY                 requests in the user container at once (0 = unlimited)
  THAW_QUEUE_DEPTH                      requests that may wait beyond it (default 10 x CC); more get 503
  REVISION_TIMEOUT_SECONDS              total time per request, queueing included (default 300)
  REVISION_RESPONSE_START_TIMEOUT_SECONDS  time to the response head (0 = the total)
  REVISION_IDLE_TIMEOUT_SECONDS         longest silence in a response body (0 = none)
  THAW_REQUEST_BODY_IDLE_TIMEOUT        longest silence in a request body: 408 (default 60s)
  USER_PORT                             the user container's port on 127.0.0.1 (default 8080)
  THAW_USER_HOST                        the user container's address instead of 127.0.0.1 (pods sharing a host)
  THAW_USER_PROTOCOL                    http1 (default) or h2c
  THAW_PROXY_TAG                        the revision's K-Proxy-Request tag (without it no
                                        request counts as proxied)
  THAW_PROXY_TAG_LEGACY                 the previous release's form of the tag, also accepted
                                        (upgrade; empty: none)
  SERVING_READINESS_PROBE               the container's readiness probe as JSON (default: TCP on USER_PORT)
  QUEUE_SERVING_PORT                    the data port (default 8012)
  THAW_QUEUE_ADMIN_PORT                 the admin port (default 9091)
  THAW_DRAIN_DELAY                      requests still served after SIGTERM for this long (default 30s)
  THAW_QUEUE_THREADS                    threads serving requests (default 1)

Exit codes: 0 stopped after a drain; 1 invalid settings, a port that cannot be bound, or (wrapper
mode) the user container exited; 2 usage.";

/// The data port when `QUEUE_SERVING_PORT` is not set (Knative's).
pub const DEFAULT_DATA_PORT: u16 = 8012;
/// The admin port when `THAW_QUEUE_ADMIN_PORT` is not set.
pub const DEFAULT_ADMIN_PORT: u16 = 9091;
/// The user port when `USER_PORT` is not set (Knative's default containerPort).
pub const DEFAULT_USER_PORT: u16 = 8080;
/// Knative's default `timeoutSeconds`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Knative's queue-proxy drains for 30 s.
pub const DEFAULT_DRAIN_DELAY: Duration = Duration::from_secs(30);
/// The queue depth is this many times containerConcurrency by default (Knative's breaker).
pub const QUEUE_DEPTH_FACTOR: u32 = 10;

/// The ports a user container may not use in a pod with the sidecar.
pub fn reserved_ports(s: &Settings) -> [u16; 2] {
    [s.data.port(), s.admin.port()]
}

/// How the user container is probed for readiness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserProbe {
    /// A TCP connect to the port.
    Tcp { host: IpAddr, port: u16 },
    /// `GET path` answered 2xx or 3xx.
    Http {
        host: IpAddr,
        port: u16,
        path: String,
        headers: Vec<(String, String)>,
    },
    /// `grpc.health.v1.Health/Check` over h2c for `service` (empty: the server as a whole)
    /// answered SERVING (Kubernetes' `grpc` probe, which Knative's queue-proxy also runs).
    Grpc {
        host: IpAddr,
        port: u16,
        service: String,
    },
}

impl UserProbe {
    /// The address probed: the user container's host (the pod's loopback) and the port.
    pub fn addr(&self) -> SocketAddr {
        let (UserProbe::Tcp { host, port }
        | UserProbe::Http { host, port, .. }
        | UserProbe::Grpc { host, port, .. }) = self;
        SocketAddr::new(*host, *port)
    }
}

/// The revision's timeouts as the sidecar applies them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// From arrival (queueing included) to the end of the response.
    pub total: Duration,
    /// From forwarding to the response head.
    pub response_start: Duration,
    /// Longest silence in the response body.
    pub idle: Option<Duration>,
}

/// Everything the sidecar needs, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub namespace: String,
    pub revision: String,
    pub configuration: Option<String>,
    pub service: Option<String>,
    /// The stats' source.
    pub pod: String,
    pub container_concurrency: u32,
    pub queue_depth: u32,
    pub timeouts: Timeouts,
    /// The user container: 127.0.0.1 (or `THAW_USER_HOST`):`USER_PORT`.
    pub user: SocketAddr,
    pub user_protocol: Protocol,
    pub probe: UserProbe,
    /// The data listener (flag, else `QUEUE_SERVING_PORT` on every interface).
    pub data: SocketAddr,
    /// The admin listener (flag, else `THAW_QUEUE_ADMIN_PORT` on every interface).
    pub admin: SocketAddr,
    pub drain_delay: Duration,
    /// `THAW_REQUEST_BODY_IDLE_TIMEOUT`: a stalled request body is cut after this.
    pub request_body_idle: Duration,
    /// The tags an activator's `K-Proxy-Request` carries (`THAW_PROXY_TAG`,
    /// `THAW_PROXY_TAG_LEGACY`).
    pub proxy_tags: Accepted,
}

/// A problem with one variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}: {reason}")]
pub struct SettingError {
    pub var: &'static str,
    pub reason: String,
}

impl Settings {
    /// Reads every variable through `get`; `data`/`admin` are the command line's listen
    /// addresses, which win over the port variables. Every problem is returned, not just the
    /// first.
    pub fn from_lookup(
        get: impl Fn(&str) -> Option<String>,
        data: Option<SocketAddr>,
        admin: Option<SocketAddr>,
    ) -> Result<Self, Vec<SettingError>> {
        let mut errs = Vec::new();
        let mut fail = |var: &'static str, reason: String| errs.push(SettingError { var, reason });
        let value = |var: &str| {
            get(var)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };

        let mut required = |var: &'static str| match value(var) {
            Some(v) => v,
            None => {
                fail(
                    var,
                    "is required (the revision's name and namespace)".into(),
                );
                String::new()
            }
        };
        let namespace = required(SERVING_NAMESPACE);
        let revision = required(SERVING_REVISION);
        let mut errs_num = Vec::new();
        let mut number = |var: &'static str, default: u64, max: u64| match value(var) {
            None => default,
            Some(v) => match v.parse::<u64>() {
                Ok(n) if n <= max => n,
                _ => {
                    errs_num.push(SettingError {
                        var,
                        reason: format!("expected a whole number from 0 to {max}, got {v:?}"),
                    });
                    default
                }
            },
        };
        let port = |n: u64| u16::try_from(n).unwrap_or(0);
        let cc = number(CONTAINER_CONCURRENCY, 0, 1000) as u32;
        let depth_default = u64::from(cc) * u64::from(QUEUE_DEPTH_FACTOR);
        let queue_depth = number(THAW_QUEUE_DEPTH, depth_default, 1_000_000) as u32;
        let total = number(REVISION_TIMEOUT_SECONDS, DEFAULT_TIMEOUT.as_secs(), 86_400);
        let start = number(REVISION_RESPONSE_START_TIMEOUT_SECONDS, 0, 86_400);
        let idle = number(REVISION_IDLE_TIMEOUT_SECONDS, 0, 86_400);
        let user_port = port(number(USER_PORT, u64::from(DEFAULT_USER_PORT), 65_535));
        let data_port = port(number(
            QUEUE_SERVING_PORT,
            u64::from(DEFAULT_DATA_PORT),
            65_535,
        ));
        let admin_port = port(number(
            THAW_QUEUE_ADMIN_PORT,
            u64::from(DEFAULT_ADMIN_PORT),
            65_535,
        ));
        errs.append(&mut errs_num);
        let mut fail = |var: &'static str, reason: String| errs.push(SettingError { var, reason });
        if user_port == 0 {
            fail(USER_PORT, "must be a port from 1 to 65535, got 0".into());
        }
        let total = if total == 0 {
            DEFAULT_TIMEOUT
        } else {
            Duration::from_secs(total)
        };
        if start > total.as_secs() {
            fail(
                REVISION_RESPONSE_START_TIMEOUT_SECONDS,
                format!(
                    "{start} exceeds {REVISION_TIMEOUT_SECONDS} ({})",
                    total.as_secs()
                ),
            );
        }
        let timeouts = Timeouts {
            total,
            response_start: if start == 0 {
                total
            } else {
                Duration::from_secs(start)
            },
            idle: (idle > 0).then(|| Duration::from_secs(idle)),
        };
        let drain_delay = match value(THAW_DRAIN_DELAY) {
            None => DEFAULT_DRAIN_DELAY,
            Some(v) => match crate::config::parse::parse_go_duration_nanos(&v) {
                Ok(n) if n >= 0 => Duration::from_nanos(n as u64),
                Ok(_) => {
                    fail(
                        THAW_DRAIN_DELAY,
                        format!("expected a duration ≥ 0, got {v:?}"),
                    );
                    DEFAULT_DRAIN_DELAY
                }
                Err(e) => {
                    fail(
                        THAW_DRAIN_DELAY,
                        format!("expected a duration such as 30s: {e}"),
                    );
                    DEFAULT_DRAIN_DELAY
                }
            },
        };
        let default_body_idle = crate::config::activator::DEFAULT_REQUEST_BODY_IDLE_TIMEOUT;
        let request_body_idle = match value(THAW_REQUEST_BODY_IDLE_TIMEOUT) {
            None => default_body_idle,
            Some(v) => {
                crate::config::activator::request_body_idle_timeout(&v).unwrap_or_else(|reason| {
                    fail(
                        THAW_REQUEST_BODY_IDLE_TIMEOUT,
                        format!("expected a duration such as 60s, got {v:?}: {reason}"),
                    );
                    default_body_idle
                })
            }
        };
        let user_protocol = match value(THAW_USER_PROTOCOL).as_deref() {
            None | Some("http1") => Protocol::Http1,
            Some("h2c") => Protocol::H2c,
            Some(other) => {
                fail(
                    THAW_USER_PROTOCOL,
                    format!("expected http1 or h2c, got {other:?}"),
                );
                Protocol::Http1
            }
        };
        let user_host = match value(THAW_USER_HOST) {
            None => IpAddr::V4(Ipv4Addr::LOCALHOST),
            Some(v) => v.parse::<IpAddr>().unwrap_or_else(|_| {
                fail(
                    THAW_USER_HOST,
                    format!("expected an IP address such as 127.0.0.1, got {v:?}"),
                );
                IpAddr::V4(Ipv4Addr::LOCALHOST)
            }),
        };
        let tcp = UserProbe::Tcp {
            host: user_host,
            port: user_port,
        };
        let probe = match value(SERVING_READINESS_PROBE) {
            None => tcp,
            Some(json) => parse_probe(&json, user_host, user_port).unwrap_or_else(|reason| {
                fail(SERVING_READINESS_PROBE, reason);
                tcp
            }),
        };
        let pod = value(SERVING_POD)
            .or_else(|| value("HOSTNAME"))
            .unwrap_or_else(|| "queue".to_string());
        let any = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        let data = data.unwrap_or(SocketAddr::new(any, data_port));
        let admin = admin.unwrap_or(SocketAddr::new(any, admin_port));
        if data.port() != 0 && data.port() == admin.port() {
            fail(
                THAW_QUEUE_ADMIN_PORT,
                format!("the data and admin ports are both {}", data.port()),
            );
        }
        if user_port == data.port() || user_port == admin.port() {
            fail(
                USER_PORT,
                format!(
                    "{user_port} is one of the sidecar's own ports (data {}, admin {})",
                    data.port(),
                    admin.port()
                ),
            );
        }
        let mut tag = |var: &'static str| {
            value(var).and_then(|v| Expected::parse(&v).map_err(|r| fail(var, r)).ok())
        };
        let proxy_tags = Accepted::new(tag(THAW_PROXY_TAG), tag(THAW_PROXY_TAG_LEGACY));
        if !errs.is_empty() {
            return Err(errs);
        }
        Ok(Settings {
            namespace,
            revision,
            configuration: value(SERVING_CONFIGURATION),
            service: value(SERVING_SERVICE),
            pod,
            container_concurrency: cc,
            queue_depth,
            timeouts,
            user: SocketAddr::new(user_host, user_port),
            user_protocol,
            probe,
            data,
            admin,
            drain_delay,
            request_body_idle,
            proxy_tags,
        })
    }
}

/// Knative's `SERVING_READINESS_PROBE`: the JSON of the user container's readiness probe.
/// `tcpSocket`, `httpGet` (`path`, `port`, `httpHeaders`) or `grpc` (`port`, `service`); a
/// missing or zero port is the user port; the host is always the user container's (`host` in
/// the JSON is ignored). `exec` probes are not the sidecar's to run.
fn parse_probe(json: &str, host: IpAddr, user_port: u16) -> Result<UserProbe, String> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("not JSON ({e}): {json:?}"))?;
    let port_of = |p: &serde_json::Value| -> Result<u16, String> {
        match p.get("port") {
            None => Ok(user_port),
            Some(serde_json::Value::Number(n)) => match n.as_u64() {
                Some(0) => Ok(user_port),
                Some(n) if n <= 65_535 => Ok(n as u16),
                _ => Err(format!("port {n} is not a port number")),
            },
            Some(other) => Err(format!(
                "port must be a number (named ports are resolved by the controller), got {other}"
            )),
        }
    };
    if let Some(tcp) = v.get("tcpSocket") {
        return Ok(UserProbe::Tcp {
            host,
            port: port_of(tcp)?,
        });
    }
    if let Some(http) = v.get("httpGet") {
        let path = http
            .get("path")
            .and_then(|p| p.as_str())
            .unwrap_or("/")
            .to_string();
        if !path.starts_with('/') {
            return Err(format!("httpGet.path must start with /, got {path:?}"));
        }
        let mut headers = Vec::new();
        if let Some(list) = http.get("httpHeaders").and_then(|h| h.as_array()) {
            for h in list {
                let (Some(n), Some(val)) = (
                    h.get("name").and_then(|n| n.as_str()),
                    h.get("value").and_then(|n| n.as_str()),
                ) else {
                    return Err("httpGet.httpHeaders: each needs a name and a value".into());
                };
                if http::HeaderName::from_bytes(n.as_bytes()).is_err()
                    || http::HeaderValue::from_str(val).is_err()
                {
                    return Err(format!("httpGet.httpHeaders: invalid header {n:?}"));
                }
                headers.push((n.to_string(), val.to_string()));
            }
        }
        return Ok(UserProbe::Http {
            host,
            port: port_of(http)?,
            path,
            headers,
        });
    }
    if let Some(grpc) = v.get("grpc") {
        let service = match grpc.get("service") {
            None | Some(serde_json::Value::Null) => String::new(),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => return Err(format!("grpc.service must be a string, got {other}")),
        };
        return Ok(UserProbe::Grpc {
            host,
            port: port_of(grpc)?,
            service,
        });
    }
    Err(
        "expected a tcpSocket, httpGet or grpc probe (exec probes are not run by the sidecar)"
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(vars: &[(&str, &str)]) -> Result<Settings, Vec<SettingError>> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_lookup(|k| map.get(k).cloned(), None, None)
    }

    const BASE: [(&str, &str); 2] = [(SERVING_NAMESPACE, "ns"), (SERVING_REVISION, "hello-00001")];

    #[test]
    fn defaults_are_knatives() {
        let s = settings(&BASE).unwrap();
        assert_eq!(s.container_concurrency, 0);
        assert_eq!(s.user, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(s.data.port(), 8012);
        assert_eq!(s.admin.port(), 9091);
        assert_eq!(s.timeouts.total, Duration::from_secs(300));
        assert_eq!(s.timeouts.response_start, Duration::from_secs(300));
        assert_eq!(s.timeouts.idle, None);
        assert_eq!(
            s.probe,
            UserProbe::Tcp {
                host: IpAddr::V4(Ipv4Addr::LOCALHOST),
                port: 8080
            }
        );
        assert_eq!(s.drain_delay, Duration::from_secs(30));
        assert_eq!(s.user_protocol, Protocol::Http1);
    }

    #[test]
    fn queue_depth_is_ten_times_cc_unless_set() {
        let mut v = BASE.to_vec();
        v.push((CONTAINER_CONCURRENCY, "3"));
        assert_eq!(settings(&v).unwrap().queue_depth, 30);
        v.push((THAW_QUEUE_DEPTH, "7"));
        assert_eq!(settings(&v).unwrap().queue_depth, 7);
    }

    #[test]
    fn every_bad_variable_is_named_with_its_value() {
        let errs = settings(&[
            (CONTAINER_CONCURRENCY, "lots"),
            (USER_PORT, "70000"),
            (THAW_DRAIN_DELAY, "soon"),
            (THAW_USER_PROTOCOL, "h3"),
            (SERVING_READINESS_PROBE, "{\"exec\":{}}"),
            (THAW_PROXY_TAG, "activator"),
            (THAW_PROXY_TAG_LEGACY, "0123"),
        ])
        .unwrap_err();
        let text: Vec<String> = errs.iter().map(ToString::to_string).collect();
        for needle in [
            "SERVING_NAMESPACE: is required",
            "SERVING_REVISION: is required",
            "CONTAINER_CONCURRENCY: expected a whole number from 0 to 1000, got \"lots\"",
            "USER_PORT: expected a whole number from 0 to 65535, got \"70000\"",
            "THAW_DRAIN_DELAY: expected a duration",
            "THAW_USER_PROTOCOL: expected http1 or h2c, got \"h3\"",
            "SERVING_READINESS_PROBE: expected a tcpSocket, httpGet or grpc probe",
            "THAW_PROXY_TAG: must be 64 lowercase hex digits",
            "THAW_PROXY_TAG_LEGACY: must be 64 lowercase hex digits",
        ] {
            assert!(
                text.iter().any(|t| t.contains(needle)),
                "{needle} not in {text:#?}"
            );
        }
    }

    #[test]
    fn a_user_port_on_the_sidecars_ports_is_refused() {
        let mut v = BASE.to_vec();
        v.push((USER_PORT, "9091"));
        let errs = settings(&v).unwrap_err();
        assert!(
            errs[0]
                .to_string()
                .contains("USER_PORT: 9091 is one of the sidecar's own ports")
        );
    }

    #[test]
    fn a_grpc_readiness_probe_is_read() {
        let mut v = BASE.to_vec();
        v.push((USER_PORT, "8081"));
        v.push((
            SERVING_READINESS_PROBE,
            r#"{"grpc":{"port":9000,"service":"thaw.Ready"},"periodSeconds":1}"#,
        ));
        assert_eq!(
            settings(&v).unwrap().probe,
            UserProbe::Grpc {
                host: IpAddr::V4(Ipv4Addr::LOCALHOST),
                port: 9000,
                service: "thaw.Ready".into()
            }
        );
        v.pop();
        v.push((SERVING_READINESS_PROBE, r#"{"grpc":{"port":0}}"#));
        assert_eq!(
            settings(&v).unwrap().probe,
            UserProbe::Grpc {
                host: IpAddr::V4(Ipv4Addr::LOCALHOST),
                port: 8081,
                service: String::new()
            }
        );
        v.pop();
        v.push((
            SERVING_READINESS_PROBE,
            r#"{"grpc":{"port":9000,"service":7}}"#,
        ));
        let errs = settings(&v).unwrap_err();
        assert!(
            errs[0]
                .to_string()
                .contains("grpc.service must be a string"),
            "{errs:?}"
        );
    }

    #[test]
    fn knatives_readiness_probe_json_is_read() {
        let mut v = BASE.to_vec();
        v.push((USER_PORT, "8081"));
        v.push((
            SERVING_READINESS_PROBE,
            r#"{"httpGet":{"path":"/ready","port":0,"httpHeaders":[{"name":"X-A","value":"b"}]},"successThreshold":1}"#,
        ));
        assert_eq!(
            settings(&v).unwrap().probe,
            UserProbe::Http {
                host: IpAddr::V4(Ipv4Addr::LOCALHOST),
                port: 8081,
                path: "/ready".into(),
                headers: vec![("X-A".into(), "b".into())]
            }
        );
        v.pop();
        v.push((
            SERVING_READINESS_PROBE,
            r#"{"tcpSocket":{"port":8082,"host":"127.0.0.1"}}"#,
        ));
        assert_eq!(
            settings(&v).unwrap().probe,
            UserProbe::Tcp {
                host: IpAddr::V4(Ipv4Addr::LOCALHOST),
                port: 8082
            }
        );
    }

    #[test]
    fn timeouts_follow_the_revision() {
        let mut v = BASE.to_vec();
        v.extend([
            (REVISION_TIMEOUT_SECONDS, "10"),
            (REVISION_RESPONSE_START_TIMEOUT_SECONDS, "3"),
            (REVISION_IDLE_TIMEOUT_SECONDS, "2"),
        ]);
        let t = settings(&v).unwrap().timeouts;
        assert_eq!(t.total, Duration::from_secs(10));
        assert_eq!(t.response_start, Duration::from_secs(3));
        assert_eq!(t.idle, Some(Duration::from_secs(2)));
        let mut v = BASE.to_vec();
        v.extend([
            (REVISION_TIMEOUT_SECONDS, "10"),
            (REVISION_RESPONSE_START_TIMEOUT_SECONDS, "11"),
        ]);
        let errs = settings(&v).unwrap_err();
        assert!(
            errs[0]
                .to_string()
                .contains("11 exceeds REVISION_TIMEOUT_SECONDS (10)")
        );
    }

    #[test]
    fn the_user_host_moves_the_user_container_and_its_probe() {
        let mut v = BASE.to_vec();
        v.push((THAW_USER_HOST, "127.0.0.7"));
        v.push((
            SERVING_READINESS_PROBE,
            r#"{"tcpSocket":{"port":8080,"host":"127.0.0.1"}}"#,
        ));
        let s = settings(&v).unwrap();
        assert_eq!(s.user, "127.0.0.7:8080".parse().unwrap());
        assert_eq!(s.probe.addr(), "127.0.0.7:8080".parse().unwrap());
        v.pop();
        assert_eq!(
            settings(&v).unwrap().probe.addr(),
            "127.0.0.7:8080".parse().unwrap()
        );
        v[2] = (THAW_USER_HOST, "pod-1");
        let errs = settings(&v).unwrap_err();
        assert!(
            errs[0].to_string().contains(
                "THAW_USER_HOST: expected an IP address such as 127.0.0.1, got \"pod-1\""
            )
        );
    }
}
