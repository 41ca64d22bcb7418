//! One Service's ready endpoints from its EndpointSlices (label `kubernetes.io/service-name`),
//! per port name: how the activators learn the activator set (`activator-service`) for their
//! capacity split, and the autoscaler learns where the ready activators are for the
//! serving-mode swap. Merged across the Service's slices, deduplicated, sorted; the watch
//! resumes after errors and re-lists only after a 410.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_stream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::knative::names::labels;

/// A Service's ready endpoints: port name -> sorted addresses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServiceEndpoints {
    pub ports: BTreeMap<String, Vec<SocketAddr>>,
    /// Whether the first list has completed.
    pub synced: bool,
}

impl ServiceEndpoints {
    /// The ready addresses of the port named `name` (empty when none).
    pub fn port(&self, name: &str) -> &[SocketAddr] {
        self.ports.get(name).map_or(&[], Vec::as_slice)
    }
}

/// The ready endpoints of one slice, per port name.
pub fn slice_ports(slice: &EndpointSlice) -> BTreeMap<String, BTreeSet<SocketAddr>> {
    let mut out: BTreeMap<String, BTreeSet<SocketAddr>> = BTreeMap::new();
    let ports: Vec<(String, u16)> = slice
        .ports
        .iter()
        .flatten()
        .filter_map(|p| {
            Some((
                p.name.clone().unwrap_or_default(),
                u16::try_from(p.port?).ok()?,
            ))
        })
        .collect();
    for ep in &slice.endpoints {
        let cond = ep.conditions.as_ref();
        let ready = cond.and_then(|c| c.ready).unwrap_or(true)
            && !cond.and_then(|c| c.terminating).unwrap_or(false);
        if !ready {
            continue;
        }
        for a in &ep.addresses {
            let Ok(ip) = a.parse::<IpAddr>() else {
                continue;
            };
            for (name, port) in &ports {
                out.entry(name.clone())
                    .or_default()
                    .insert(SocketAddr::new(ip, *port));
            }
        }
    }
    out
}

/// Follows `namespace/service`'s ready endpoints until `stop`.
pub fn watch_service(
    client: kube::Client,
    namespace: &str,
    service: &str,
    stop: CancellationToken,
) -> watch::Receiver<Arc<ServiceEndpoints>> {
    let (tx, rx) = watch::channel(Arc::new(ServiceEndpoints::default()));
    let api: Api<EndpointSlice> = Api::namespaced(client, namespace);
    let cfg = watcher::Config::default()
        .labels(&format!("{}={service}", labels::ENDPOINTSLICE_SERVICE_NAME));
    let span = tracing::info_span!("watch", resource = "endpointslices", service = %service);
    tokio::spawn(
        async move {
            let mut s = std::pin::pin!(watch_stream(api, cfg).default_backoff());
            let mut slices: HashMap<String, BTreeMap<String, BTreeSet<SocketAddr>>> =
                HashMap::new();
            let mut listing: Option<HashMap<String, BTreeMap<String, BTreeSet<SocketAddr>>>> = None;
            let mut synced = false;
            loop {
                let ev = tokio::select! {
                    _ = stop.cancelled() => return,
                    ev = s.next() => ev,
                };
                match ev {
                    None => return,
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "watch error; resuming");
                        continue;
                    }
                    Some(Ok(Event::Init)) => {
                        listing = Some(HashMap::new());
                        continue;
                    }
                    Some(Ok(Event::InitApply(sl))) => {
                        if let Some(l) = listing.as_mut() {
                            l.insert(sl.name_any(), slice_ports(&sl));
                        }
                        continue;
                    }
                    Some(Ok(Event::InitDone)) => {
                        slices = listing.take().unwrap_or_default();
                        synced = true;
                    }
                    Some(Ok(Event::Apply(sl))) => {
                        slices.insert(sl.name_any(), slice_ports(&sl));
                    }
                    Some(Ok(Event::Delete(sl))) => {
                        slices.remove(&sl.name_any());
                    }
                }
                let mut merged: BTreeMap<String, BTreeSet<SocketAddr>> = BTreeMap::new();
                for ports in slices.values() {
                    for (name, addrs) in ports {
                        merged.entry(name.clone()).or_default().extend(addrs);
                    }
                }
                let next = ServiceEndpoints {
                    ports: merged
                        .into_iter()
                        .map(|(k, v)| (k, v.into_iter().collect()))
                        .collect(),
                    synced,
                };
                tx.send_if_modified(|cur| {
                    if **cur == next {
                        false
                    } else {
                        tracing::info!(ports = ?next.ports, "service endpoints changed");
                        *cur = Arc::new(next);
                        true
                    }
                });
            }
        }
        .instrument(span),
    );
    rx
}
