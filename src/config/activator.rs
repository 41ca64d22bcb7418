//! `config-activator`: thaw's own activator limits, and their per-revision overrides under the
//! `activator.thaw.dev/` annotation prefix.

use std::time::Duration;

/// Limits of the activator's listeners, queues and drain. Defaults are for production; each is
/// explained where it is parsed and in `config/config-activator.yaml`.
#[derive(Debug, Clone, PartialEq)]
pub struct ActivatorConfig {
    /// `queue-depth`: requests one revision may hold while it has no capacity.
    pub queue_depth: u32,
    /// `max-held-requests`: requests held across all revisions; a single revision's
    /// `queue-depth` must stay below it, so no revision can fill it alone.
    pub max_held_requests: u32,
    /// `max-held-requests-namespace-percentage`: the share of `max-held-requests` one
    /// namespace may hold (percent, 1-100), so one tenant's cold storm leaves room for the
    /// others' cold starts.
    pub max_held_namespace_percentage: u32,
    /// `max-header-count`: request headers beyond this get 431.
    pub max_header_count: u32,
    /// `max-header-bytes`: total request-header bytes (names + values) beyond this get 431.
    pub max_header_bytes: u32,
    /// `header-read-timeout`: a client must finish sending headers within this.
    pub header_read_timeout: Duration,
    /// `keep-alive-timeout`: idle client connections are closed after this.
    pub keep_alive_timeout: Duration,
    /// `request-body-idle-timeout`: a request body that sends nothing for this long while it is
    /// forwarded is cut (408, or the connection closed once the response has started), so a
    /// stalled body does not hold its place under the revision's capacity.
    pub request_body_idle_timeout: Duration,
    /// `max-connections`: client connections beyond this wait in the accept backlog.
    pub max_connections: u32,
    /// `h2-max-concurrent-streams`: streams per HTTP/2 client connection.
    pub h2_max_concurrent_streams: u32,
    /// `drain-delay`: after SIGTERM, readiness fails at once and new connections are still
    /// accepted for this long, so load balancers notice before the listener closes.
    pub drain_delay: Duration,
    /// `drain-timeout`: the longest the activator waits for in-flight and held requests after
    /// the drain delay.
    pub drain_timeout: Duration,
    /// `connect-retries`: other endpoints tried after a connect failure before 502.
    pub connect_retries: u32,
    /// `connect-timeout`: connecting to an endpoint. Dials that time out within it are repeated
    /// at once with longer timeouts (50 ms, then 1.4 times longer each, as Knative's
    /// `DialWithBackOff`), so a dropped SYN costs 50 ms, not the kernel's one-second resend.
    pub connect_timeout: Duration,
    /// `initial-burst`: requests released per new endpoint at once when containerConcurrency is
    /// 0 (then one more per finished request), so a waking pod is not flooded.
    pub initial_burst: u32,
    /// `retry-after`: the `Retry-After` value sent with 503s.
    pub retry_after: Duration,
    /// `fast-lane`: whether thaw's own HTTP/1 loop serves bodiless requests (`false`: hyper's
    /// server reads every request; slower, same answers). A switch for operators and for the
    /// differential tests that compare the two.
    pub fast_lane: bool,
    /// `trusted-proxies`: the peers whose `Knative-Serving-Namespace`/`-Revision` routing
    /// headers and `X-Forwarded-Proto`/`-Host`, `Forwarded` and `X-Real-IP` are believed.
    pub trusted_proxies: TrustedProxies,
    /// `routing-grace`: how long a revision a Route stopped routing (or a deleted Route's
    /// revision) is still served for that Route's hosts, so requests the gateways send while
    /// they catch up with a rollout are not refused.
    pub routing_grace: Duration,
    /// `pod-probe-budget`: on Kubernetes, how many of a revision's not-yet-ready pods the
    /// activator probes at once, to send to them as soon as their sidecar answers instead of
    /// when the kubelet marks them ready (`crate::roles::early_ready`); 0 turns that off.
    pub pod_probe_budget: u32,
    /// `allowed-upgrades`: the `Upgrade` protocols passed through as tunnels (lower case); any
    /// other is answered 501. `h2c` is never a tunnel: such a request is served over HTTP/1.1.
    pub allowed_upgrades: Vec<String>,
}

/// Which peers the activator believes about routing and forwarding (`trusted-proxies`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TrustedProxies {
    /// `""`: the role's default: on Kubernetes the ready endpoints of config-istio's gateway
    /// Services (followed live), none in `thaw local` (where thaw is itself the ingress).
    #[default]
    RoleDefault,
    /// `"*"`: every peer.
    Every,
    /// A list of addresses and CIDR ranges (`"none"`: the empty list).
    Only(Vec<ipnet::IpNet>),
}

impl TrustedProxies {
    /// Whether `peer` is trusted; `role_default` answers for [`TrustedProxies::RoleDefault`]
    /// (called only then).
    pub fn trusts(
        &self,
        peer: std::net::IpAddr,
        role_default: impl FnOnce(std::net::IpAddr) -> bool,
    ) -> bool {
        match self {
            TrustedProxies::RoleDefault => role_default(peer),
            TrustedProxies::Every => true,
            TrustedProxies::Only(nets) => {
                let peer = peer.to_canonical();
                nets.iter().any(|n| n.contains(&peer))
            }
        }
    }

    fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "" => Ok(Self::RoleDefault),
            "*" => Ok(Self::Every),
            "none" => Ok(Self::Only(Vec::new())),
            list => list
                .split(',')
                .map(str::trim)
                .map(|e| {
                    e.parse::<ipnet::IpNet>()
                        .or_else(|_| e.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                        .map_err(|_| format!("{e:?} is not an IP address or CIDR range"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Self::Only),
        }
    }

    fn show(&self) -> String {
        match self {
            TrustedProxies::RoleDefault => String::new(),
            TrustedProxies::Every => "*".into(),
            TrustedProxies::Only(n) if n.is_empty() => "none".into(),
            TrustedProxies::Only(n) => n
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

impl ActivatorConfig {
    /// The most one namespace may hold: `max-held-requests` ×
    /// `max-held-requests-namespace-percentage` / 100, at least 1.
    pub fn namespace_held_cap(&self) -> u32 {
        let cap =
            u64::from(self.max_held_requests) * u64::from(self.max_held_namespace_percentage) / 100;
        u32::try_from(cap).unwrap_or(u32::MAX).max(1)
    }
}

impl Default for ActivatorConfig {
    fn default() -> Self {
        Self {
            queue_depth: 10_000,
            max_held_requests: 50_000,
            max_held_namespace_percentage: 50,
            max_header_count: 100,
            max_header_bytes: 64 * 1024,
            header_read_timeout: Duration::from_secs(10),
            keep_alive_timeout: Duration::from_secs(75),
            request_body_idle_timeout: DEFAULT_REQUEST_BODY_IDLE_TIMEOUT,
            max_connections: 50_000,
            h2_max_concurrent_streams: 250,
            drain_delay: Duration::from_secs(15),
            drain_timeout: Duration::from_secs(300),
            connect_retries: 3,
            connect_timeout: Duration::from_secs(1),
            initial_burst: 100,
            retry_after: Duration::from_secs(1),
            fast_lane: true,
            trusted_proxies: TrustedProxies::RoleDefault,
            routing_grace: Duration::from_secs(60),
            pod_probe_budget: 8,
            allowed_upgrades: vec!["websocket".to_string()],
        }
    }
}

/// Per-revision overrides from `activator.thaw.dev/*` annotations; `None` = use the ConfigMap.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ActivatorOverrides {
    /// `activator.thaw.dev/queue-depth`.
    pub queue_depth: Option<u32>,
    /// `activator.thaw.dev/cold-wait`: the longest a request may be held for a cold start.
    pub cold_wait: Option<Duration>,
    /// `activator.thaw.dev/initial-burst`.
    pub initial_burst: Option<u32>,
}

use std::collections::BTreeMap;

use super::autoscaler::duration_in;
use super::keys::{self, ConfigMap, Key};
use super::parse::{Problem, Problems, parse_bool, parse_i64};

/// Name of the ConfigMap.
pub const NAME: &str = "config-activator";
/// `request-body-idle-timeout`'s default, in config-activator and config-deployment alike.
pub const DEFAULT_REQUEST_BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// `request-body-idle-timeout`'s range, in config-activator and config-deployment alike.
pub fn request_body_idle_timeout(s: &str) -> Result<Duration, String> {
    duration_in(s, MS, HOUR, false)
}
/// The prefix of thaw's per-revision activator annotations.
pub const PREFIX: &str = "activator.thaw.dev/";

fn int_in(s: &str, lo: i64, hi: i64) -> Result<u32, String> {
    let v = parse_i64(s)?;
    if v < lo || v > hi {
        return Err(format!("must be in [{lo}, {hi}]"));
    }
    Ok(v as u32)
}

const MS: Duration = Duration::from_millis(1);
const HOUR: Option<Duration> = Some(Duration::from_secs(3600));

/// Every key of `config-activator`.
pub static KEYS: &[Key<ActivatorConfig>] = &[
    Key {
        name: "queue-depth",
        unit: "requests per revision",
        help: "Requests one revision may hold while it has no free capacity; more get 503.",
        parse: |c, s| {
            c.queue_depth = int_in(s, 1, 1_000_000)?;
            Ok(())
        },
        show: |c| keys::show_u32(c.queue_depth),
    },
    Key {
        name: "max-held-requests",
        unit: "requests, all revisions",
        help: "Requests held across all revisions; must exceed queue-depth so that no single \
               revision can fill it alone.",
        parse: |c, s| {
            c.max_held_requests = int_in(s, 2, 10_000_000)?;
            Ok(())
        },
        show: |c| keys::show_u32(c.max_held_requests),
    },
    Key {
        name: "max-held-requests-namespace-percentage",
        unit: "percent of max-held-requests",
        help: "The share of max-held-requests the revisions of one namespace may hold together; \
               more get 503, so one namespace's cold storm cannot starve another's cold starts \
               (100: no share).",
        parse: |c, s| {
            c.max_held_namespace_percentage = int_in(s, 1, 100)?;
            Ok(())
        },
        show: |c| keys::show_u32(c.max_held_namespace_percentage),
    },
    Key {
        name: "max-header-count",
        unit: "headers",
        help: "Request headers allowed; more get 431.",
        parse: |c, s| {
            c.max_header_count = int_in(s, 1, 10_000)?;
            Ok(())
        },
        show: |c| keys::show_u32(c.max_header_count),
    },
    Key {
        name: "max-header-bytes",
        unit: "bytes",
        help: "Total size of request header names and values; more get 431.",
        parse: |c, s| {
            c.max_header_bytes = int_in(s, 1024, 1024 * 1024)?;
            Ok(())
        },
        show: |c| keys::show_u32(c.max_header_bytes),
    },
    Key {
        name: "header-read-timeout",
        unit: "duration",
        help: "A client must send its request headers within this (slow-client protection).",
        parse: |c, s| {
            c.header_read_timeout = duration_in(s, MS, HOUR, false)?;
            Ok(())
        },
        show: |c| keys::show_duration(c.header_read_timeout),
    },
    Key {
        name: "request-body-idle-timeout",
        unit: "duration",
        help: "A request body that sends nothing for this long while forwarded is cut: 408 \
               (the connection closed if the response has started).",
        parse: |c, s| {
            c.request_body_idle_timeout = request_body_idle_timeout(s)?;
            Ok(())
        },
        show: |c| keys::show_duration(c.request_body_idle_timeout),
    },
    Key {
        name: "keep-alive-timeout",
        unit: "duration",
        help: "Idle client connections are closed after this.",
        parse: |c, s| {
            c.keep_alive_timeout = duration_in(s, MS, HOUR, false)?;
            Ok(())
        },
        show: |c| keys::show_duration(c.keep_alive_timeout),
    },
    Key {
        name: "max-connections",
        unit: "connections",
        help: "Client connections served at once; more wait in the listen backlog.",
        parse: |c, s| {
            c.max_connections = int_in(s, 1, 10_000_000)?;
            Ok(())
        },
        show: |c| keys::show_u32(c.max_connections),
    },
    Key {
        name: "h2-max-concurrent-streams",
        unit: "streams per connection",
        help: "Concurrent HTTP/2 streams one client connection may open.",
        parse: |c, s| {
            c.h2_max_concurrent_streams = int_in(s, 1, 100_000)?;
            Ok(())
        },
        show: |c| keys::show_u32(c.h2_max_concurrent_streams),
    },
    Key {
        name: "drain-delay",
        unit: "duration",
        help: "After SIGTERM, readiness fails at once but connections are accepted this long, \
               so load balancers stop sending before the listener closes.",
        parse: |c, s| {
            c.drain_delay = duration_in(s, Duration::ZERO, HOUR, false)?;
            Ok(())
        },
        show: |c| keys::show_duration(c.drain_delay),
    },
    Key {
        name: "drain-timeout",
        unit: "duration",
        help: "After the drain delay, the longest to wait for in-flight and held requests.",
        parse: |c, s| {
            c.drain_timeout = duration_in(s, Duration::ZERO, HOUR, false)?;
            Ok(())
        },
        show: |c| keys::show_duration(c.drain_timeout),
    },
    Key {
        name: "connect-retries",
        unit: "attempts",
        help: "Other endpoints tried after a connect failure (before any byte was sent).",
        parse: |c, s| {
            c.connect_retries = int_in(s, 0, 10)?;
            Ok(())
        },
        show: |c| keys::show_u32(c.connect_retries),
    },
    Key {
        name: "connect-timeout",
        unit: "duration",
        help: "Connecting to an endpoint; timed-out dials are repeated within it (50 ms, then 1.4x longer each).",
        parse: |c, s| {
            c.connect_timeout = duration_in(s, MS, Some(Duration::from_secs(60)), false)?;
            Ok(())
        },
        show: |c| keys::show_duration(c.connect_timeout),
    },
    Key {
        name: "initial-burst",
        unit: "requests per new endpoint",
        help: "With containerConcurrency 0, held requests released to a new endpoint at once; \
               then one more per finished request.",
        parse: |c, s| {
            c.initial_burst = int_in(s, 1, 1_000_000)?;
            Ok(())
        },
        show: |c| keys::show_u32(c.initial_burst),
    },
    Key {
        name: "retry-after",
        unit: "duration, whole seconds",
        help: "The Retry-After value sent with 503 answers.",
        parse: |c, s| {
            c.retry_after = duration_in(s, Duration::from_secs(1), HOUR, true)?;
            Ok(())
        },
        show: |c| keys::show_duration(c.retry_after),
    },
    Key {
        name: "fast-lane",
        unit: "true or false",
        help: "Whether thaw's own HTTP/1 loop serves bodiless requests; false hands every \
               request to hyper's server (slower, same answers).",
        parse: |c, s| {
            c.fast_lane = parse_bool(s)?;
            Ok(())
        },
        show: |c| keys::show_bool(c.fast_lane),
    },
    Key {
        name: "trusted-proxies",
        unit: "addresses and CIDR ranges, \"*\", \"none\" or empty",
        help: "Peers whose Knative-Serving-Namespace/-Revision headers route and whose \
               X-Forwarded-Proto/-Host, Forwarded and X-Real-IP are kept; from anyone else they \
               are ignored and replaced. Empty: the ready endpoints of config-istio's gateway \
               Services on Kubernetes, none in thaw local.",
        parse: |c, s| {
            c.trusted_proxies = TrustedProxies::parse(s)?;
            Ok(())
        },
        show: |c| {
            let v = c.trusted_proxies.show();
            (v.clone(), serde_json::Value::from(v))
        },
    },
    Key {
        name: "routing-grace",
        unit: "duration",
        help: "On Kubernetes, how long a revision a Route stopped routing is still served for \
               that Route's hosts (gateways catching up with a rollout); after it, 404.",
        parse: |c, s| {
            c.routing_grace = duration_in(s, Duration::ZERO, HOUR, false)?;
            Ok(())
        },
        show: |c| keys::show_duration(c.routing_grace),
    },
    Key {
        name: "pod-probe-budget",
        unit: "pods",
        help: "On Kubernetes, how many of a revision's not-yet-ready pods each activator probes \
               at once (K-Network-Probe: queue, every 25 ms at first) to send to them as soon as \
               their sidecar answers, before the kubelet marks them ready. 0: off (wait for the \
               kubelet).",
        parse: |c, s| {
            c.pod_probe_budget = int_in(s, 0, 1000)?;
            Ok(())
        },
        show: |c| keys::show_u32(c.pod_probe_budget),
    },
    Key {
        name: "allowed-upgrades",
        unit: "comma-separated protocol names",
        help: "Upgrade protocols tunnelled to the revision (websocket); a request asking for any \
               other gets 501. h2c is never tunnelled: such a request is served over HTTP/1.1.",
        parse: |c, s| {
            let list: Vec<String> = s
                .split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .filter(|t| !t.is_empty())
                .collect();
            if let Some(bad) = list.iter().find(|t| {
                t.bytes()
                    .any(|b| !(b.is_ascii_alphanumeric() || b"-._/".contains(&b)))
            }) {
                return Err(format!("{bad:?} is not a protocol name"));
            }
            if list.iter().any(|t| t == "h2c") {
                return Err(
                    "h2c cannot be tunnelled (such requests are served over HTTP/1.1)".into(),
                );
            }
            c.allowed_upgrades = list;
            Ok(())
        },
        show: |c| {
            let v = c.allowed_upgrades.join(", ");
            (v.clone(), serde_json::Value::from(v))
        },
    },
];

fn validate(c: &ActivatorConfig, data: &BTreeMap<String, String>) -> Vec<Problem> {
    let mut p = Vec::new();
    if c.queue_depth >= c.max_held_requests {
        let key = if data.contains_key("queue-depth") {
            "queue-depth"
        } else {
            "max-held-requests"
        };
        p.push(Problem::new(
            key,
            keys::written(KEYS, data, c, key),
            format!(
                "queue-depth ({}) must be below max-held-requests ({}) so one revision cannot \
                 fill the activator alone",
                c.queue_depth, c.max_held_requests
            ),
        ));
    }
    p
}

impl ConfigMap for ActivatorConfig {
    const NAME: &'static str = NAME;

    fn keys() -> &'static [Key<Self>] {
        KEYS
    }

    fn validate(&self, data: &BTreeMap<String, String>) -> Vec<Problem> {
        validate(self, data)
    }
}

impl ActivatorOverrides {
    /// Reads `activator.thaw.dev/*` annotations. `queue-depth` must stay below the ConfigMap's
    /// `max-held-requests`; `cold-wait` must be positive and at most `total_timeout`. Unknown
    /// names under the prefix are problems (a typo would otherwise silently do nothing).
    pub fn parse(
        annotations: &BTreeMap<String, String>,
        config: &ActivatorConfig,
        total_timeout: Duration,
    ) -> Result<Self, Problems> {
        let mut o = Self::default();
        let mut p = Vec::new();
        for (k, raw) in annotations {
            let Some(name) = k.strip_prefix(PREFIX) else {
                continue;
            };
            let v = raw.trim();
            let r = match name {
                "queue-depth" => int_in(v, 1, i64::from(config.max_held_requests) - 1)
                    .map(|d| o.queue_depth = Some(d)),
                "initial-burst" => int_in(v, 1, 1_000_000).map(|b| o.initial_burst = Some(b)),
                "cold-wait" => duration_in(v, MS, Some(total_timeout), false)
                    .map_err(|e| format!("{e} (the revision's timeout)"))
                    .map(|d| o.cold_wait = Some(d)),
                _ => {
                    Err("unknown annotation (known: queue-depth, cold-wait, initial-burst)".into())
                }
            };
            if let Err(reason) = r {
                p.push(Problem::new(k, raw, reason));
            }
        }
        if p.is_empty() {
            Ok(o)
        } else {
            Err(Problems(p))
        }
    }
}
