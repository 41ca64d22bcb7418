//! Knative's queue-proxy stats, read by the pod-stats pull ([`super::pull`]) from pods that
//! still run Knative's sidecar (a cluster moved from Knative Serving, before their revision is
//! rolled to thaw's sidecar; docs/decisions.md, "Pods with Knative's queue-proxy").
//!
//! Knative's autoscaler scrapes `http://{pod IP}:9090/metrics` with `Accept:
//! application/protobuf`; queue-proxy answers its last report as the protobuf message `Stat`
//! (Knative's `pkg/autoscaler/metrics/stat.proto`) with `Content-Type:
//! application/protobuf`. This module holds that message (a hand-written prost message, no code
//! generation) and turns it into thaw's [`PodStats`], so the collector and the decider see the
//! same figures as from thaw's sidecar:
//!
//! - queue-proxy reports once a second (its fixed reporting period), each report covering the
//!   second before it: `average_concurrent_requests` is the time-weighted average in flight over
//!   that second (queued and in the user container), as thaw's `average_concurrency`;
//! - `request_count` is the requests of the period divided by the period (1 s), so a count:
//!   rounded into `requests`;
//! - the `proxied` fields are the share that came through an activator (queue-proxy counts a
//!   request as proxied when its `K-Proxy-Request` is exactly `activator`); the collector
//!   subtracts them, as Knative's does, since the activator reports those requests itself;
//! - `pod_name` becomes the stat's source; `process_uptime` and `timestamp` are not used: the
//!   pull stamps the stat with the second it sampled, as for thaw's sidecar, and queue-proxy
//!   leaves `timestamp` at 0.
//!
//! Bounds: the answer is read up to [`BODY_LIMIT`] bytes (Knative reads 336); a longer one, a
//! message that does not decode, a value negative or not finite, or a proxied share above its
//! whole (beyond rounding) is refused, never clamped into a stat.

use prost::Message;

use crate::stats::PodStats;

/// The path queue-proxy serves its stats on (its metrics port, 9090 by default).
pub const PATH: &str = "/metrics";
/// The media type asked for and required in the answer (Knative's `ProtobufMIMEType`).
pub const PROTOBUF: &str = "application/protobuf";
/// The longest answer read: a pod name of at most 253 bytes and six numbers take under 330.
pub const BODY_LIMIT: usize = 512;
/// How far a proxied share may exceed its whole before the stat is refused (the two averages
/// are summed separately in floating point).
const ROUNDING: f64 = 1e-9;

/// Knative's `metrics.Stat` (serving v0.42, `stat.proto`), field for field.
#[derive(Clone, PartialEq, Message)]
pub struct KnativeStat {
    /// The pod's name.
    #[prost(string, tag = "1")]
    pub pod_name: String,
    /// Time-weighted average of requests in the pod over the reporting period.
    #[prost(double, tag = "2")]
    pub average_concurrent_requests: f64,
    /// The part of it for requests through an activator.
    #[prost(double, tag = "3")]
    pub average_proxied_concurrent_requests: f64,
    /// Requests per second over the reporting period.
    #[prost(double, tag = "4")]
    pub request_count: f64,
    /// The part of it through an activator.
    #[prost(double, tag = "5")]
    pub proxied_request_count: f64,
    /// Seconds since queue-proxy started.
    #[prost(double, tag = "6")]
    pub process_uptime: f64,
    /// Seconds since the epoch (queue-proxy leaves it 0).
    #[prost(int64, tag = "7")]
    pub timestamp: i64,
}

/// Why an answer is not a usable stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("not a protobuf Stat")]
    Decode,
    #[error("a value is negative or not finite")]
    Invalid,
    #[error("a proxied share exceeds its whole")]
    ProxiedAboveWhole,
}

impl KnativeStat {
    /// Decodes one answer's body.
    pub fn decode_body(body: &[u8]) -> Result<Self, Refused> {
        Self::decode(body).map_err(|_| Refused::Decode)
    }

    /// thaw's per-pod stat for the same second (see the module docs for the mapping).
    pub fn to_pod_stats(&self) -> Result<PodStats, Refused> {
        let values = [
            self.average_concurrent_requests,
            self.average_proxied_concurrent_requests,
            self.request_count,
            self.proxied_request_count,
        ];
        if values.iter().any(|v| !v.is_finite() || *v < 0.0) {
            return Err(Refused::Invalid);
        }
        if self.average_proxied_concurrent_requests > self.average_concurrent_requests + ROUNDING
            || self.proxied_request_count > self.request_count + ROUNDING
        {
            return Err(Refused::ProxiedAboveWhole);
        }
        // A count per second over a one-second period: whole numbers, carried as doubles.
        let count = |v: f64| v.round().min(crate::stats::MAX_STAT_REQUESTS as f64) as u64;
        Ok(PodStats {
            pod: self.pod_name.clone(),
            average_concurrency: self.average_concurrent_requests,
            requests: count(self.request_count),
            proxied_concurrency: self
                .average_proxied_concurrent_requests
                .min(self.average_concurrent_requests),
            proxied_requests: count(self.proxied_request_count).min(count(self.request_count)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes gogo/protobuf writes for a Stat (fields in tag order, zero values left out),
    /// built by hand so the decoding is checked against the wire format, not against itself.
    fn wire(pod: &str, avg: f64, proxied: f64, count: f64, proxied_count: f64) -> Vec<u8> {
        let mut b = vec![0x0a, pod.len() as u8];
        b.extend_from_slice(pod.as_bytes());
        for (tag, v) in [
            (2u8, avg),
            (3, proxied),
            (4, count),
            (5, proxied_count),
            (6, 12.5),
        ] {
            if v != 0.0 {
                b.push(tag << 3 | 1);
                b.extend_from_slice(&v.to_le_bytes());
            }
        }
        b
    }

    #[test]
    fn a_queue_proxy_stat_maps_onto_thaws_pod_stat() {
        let s = KnativeStat::decode_body(&wire("hello-00001-deployment-abc", 3.25, 1.0, 7.0, 2.0))
            .unwrap();
        assert_eq!(s.process_uptime, 12.5);
        assert_eq!(s.timestamp, 0);
        assert_eq!(
            s.to_pod_stats().unwrap(),
            PodStats {
                pod: "hello-00001-deployment-abc".into(),
                average_concurrency: 3.25,
                requests: 7,
                proxied_concurrency: 1.0,
                proxied_requests: 2,
            }
        );
    }

    #[test]
    fn an_idle_pods_stat_is_zeros() {
        // queue-proxy's first answer (before its first report) carries only its name.
        let s = KnativeStat::decode_body(&wire("p", 0.0, 0.0, 0.0, 0.0)).unwrap();
        let p = s.to_pod_stats().unwrap();
        assert_eq!((p.average_concurrency, p.requests), (0.0, 0));
    }

    #[test]
    fn bad_answers_are_refused() {
        assert_eq!(
            KnativeStat::decode_body(b"# HELP text metrics\n").unwrap_err(),
            Refused::Decode
        );
        let negative = KnativeStat::decode_body(&wire("p", -1.0, 0.0, 1.0, 0.0)).unwrap();
        assert_eq!(negative.to_pod_stats().unwrap_err(), Refused::Invalid);
        let nan = KnativeStat {
            request_count: f64::NAN,
            ..negative.clone()
        };
        assert_eq!(nan.to_pod_stats().unwrap_err(), Refused::Invalid);
        let above = KnativeStat::decode_body(&wire("p", 1.0, 2.0, 1.0, 0.0)).unwrap();
        assert_eq!(
            above.to_pod_stats().unwrap_err(),
            Refused::ProxiedAboveWhole
        );
        let above = KnativeStat::decode_body(&wire("p", 1.0, 0.0, 1.0, 3.0)).unwrap();
        assert_eq!(
            above.to_pod_stats().unwrap_err(),
            Refused::ProxiedAboveWhole
        );
    }
}
