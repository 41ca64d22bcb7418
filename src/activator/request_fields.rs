//! The activator's reading and rewriting of a request's fields, in either form the HTTP/1
//! engine hands it ([`ClientHeaders`]): the routing and probe headers found in one pass
//! ([`Scan::scan`]), and the header hygiene before forwarding ([`Prepare::prepare`]).
//!
//! Contract: both forms give the same answers. The raw form is read as `Seen::scan` reads a map,
//! and rewritten to forward exactly what `headers::upstream_additions` leaves in a map
//! (hop-by-hop headers, those `Connection` names, Knative's routing headers and `Host` removed;
//! the same additions returned). `request_fields_tests` checks each form against the other.

use std::net::IpAddr;

use http::header::{self, HeaderValue};

use super::headers::{
    self as hdr, Additions, K_ORIGINAL_HOST, K_PROXY_REQUEST, NextHop, X_FORWARDED_FOR,
    X_FORWARDED_PROTO,
};
use super::routing::{FieldRef, Seen};
use crate::http1::fields::{ClientHeaders, HeadersRef, Known, RawFields};

/// The headers the activator reads, found in one pass.
pub trait Scan<'a> {
    /// `Seen::scan` for either form.
    fn scan(self) -> Seen<'a>;
}

impl<'a> Scan<'a> for HeadersRef<'a> {
    fn scan(self) -> Seen<'a> {
        match self {
            HeadersRef::Map(map) => Seen::scan(map),
            HeadersRef::Raw(raw) => scan_raw(raw),
        }
    }
}

fn scan_raw(raw: &RawFields) -> Seen<'_> {
    let mut s = Seen::default();
    for (known, _, value) in raw.known() {
        let slot = match known {
            Known::Host => &mut s.host,
            Known::UserAgent => &mut s.user_agent,
            Known::ServingNamespace => &mut s.namespace,
            Known::ServingRevision => &mut s.revision,
            Known::RequestId => &mut s.request_id,
            Known::NetworkProbe => &mut s.network_probe,
            Known::NetworkHash => &mut s.network_hash,
            Known::KubeletProbe => {
                s.kubelet_probe = true;
                continue;
            }
            Known::ForwardedProto | Known::ForwardedHost | Known::Forwarded | Known::RealIp => {
                s.forwarding = true;
                continue;
            }
            Known::ClientCert => &mut s.client_cert,
            _ => continue,
        };
        if known == Known::Host {
            s.host_count = s.host_count.saturating_add(1);
        } else if known == Known::ClientCert {
            s.client_cert_count = s.client_cert_count.saturating_add(1);
        }
        slot.get_or_insert(FieldRef::Raw(raw, value));
    }
    s
}

/// The header hygiene before forwarding.
pub trait Prepare {
    /// Rewrites the headers for forwarding and returns what the activator adds, exactly as
    /// [`hdr::upstream_additions`] does for a map (see its doc).
    fn prepare(
        &mut self,
        next_hop: NextHop,
        original_host: Option<HeaderValue>,
        client: Option<IpAddr>,
        upgrade: bool,
        trusted: bool,
        keep_client_cert: bool,
    ) -> Additions;
}

impl Prepare for ClientHeaders {
    fn prepare(
        &mut self,
        next_hop: NextHop,
        original_host: Option<HeaderValue>,
        client: Option<IpAddr>,
        upgrade: bool,
        trusted: bool,
        keep_client_cert: bool,
    ) -> Additions {
        match self {
            ClientHeaders::Map(map) => hdr::upstream_additions(
                map,
                next_hop,
                original_host,
                client,
                upgrade,
                trusted,
                keep_client_cert,
            ),
            ClientHeaders::Raw(raw) => prepare_raw(
                raw,
                next_hop,
                original_host,
                client,
                upgrade,
                trusted,
                keep_client_cert,
            ),
        }
    }
}

fn prepare_raw(
    raw: &mut RawFields,
    next_hop: NextHop,
    original_host: Option<HeaderValue>,
    client: Option<IpAddr>,
    upgrade: bool,
    trusted: bool,
    keep_client_cert: bool,
) -> Additions {
    let mut skip = raw.hop_by_hop(upgrade);
    for (i, (known, _, _)) in raw.known().enumerate() {
        let untrusted_forwarding = !trusted
            && matches!(
                known,
                Known::ForwardedProto | Known::ForwardedHost | Known::Forwarded | Known::RealIp
            );
        let foreign_cert = !keep_client_cert && known == Known::ClientCert;
        if untrusted_forwarding
            || foreign_cert
            || matches!(
                known,
                Known::ServingNamespace
                    | Known::ServingRevision
                    | Known::NetworkHash
                    | Known::Host
                    | Known::ProxyRequest
                    | Known::OriginalHost
            )
        {
            skip |= 1u128 << i;
        }
    }
    // What is left of X-Forwarded-For / -Proto after the hop-by-hop removal.
    let mut prev_for: Vec<&[u8]> = Vec::new();
    let mut has_proto = false;
    for (i, (known, _, value)) in raw.known().enumerate() {
        if skip & (1u128 << i) != 0 {
            continue;
        }
        match known {
            Known::ForwardedFor if client.is_some() => {
                prev_for.push(value);
                skip |= 1u128 << i;
            }
            Known::ForwardedProto => has_proto = true,
            _ => {}
        }
    }
    let mut add = Vec::with_capacity(5);
    if upgrade {
        // The map form re-adds it in `strip_hop_by_hop`; the raw form cannot add a field.
        add.push((header::CONNECTION, HeaderValue::from_static("upgrade")));
    }
    if next_hop == NextHop::Sidecar {
        add.push((K_PROXY_REQUEST, HeaderValue::from_static("activator")));
        if let Some(host) = original_host {
            add.push((K_ORIGINAL_HOST, host));
        }
    }
    if let Some(ip) = client {
        let prev = prev_for.iter().filter_map(|v| std::str::from_utf8(v).ok());
        if let Some(v) = hdr::forwarded_for(prev, ip) {
            add.push((X_FORWARDED_FOR, v));
        }
    }
    if !has_proto {
        add.push((X_FORWARDED_PROTO, HeaderValue::from_static("http")));
    }
    drop(prev_for);
    raw.skip(skip);
    add
}

#[cfg(test)]
#[path = "request_fields_tests.rs"]
mod tests;
