//! INTERIM: the catalog fed by a Revision watch, rebuilt whole on each change. Replaced by
//! `platform::kubernetes::revisions` (incremental) when that lands.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_stream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::ConfigSet;
use crate::config::live::LiveConfig;
use crate::config::revision::{RevisionInput, resolve_revision};
use crate::knative::Revision;
use crate::knative::names::labels;
use crate::platform::kubernetes::{KubePlatform, KubeRevision};
use crate::revision::{CatalogSnapshot, RevisionCatalog, RevisionKey};

fn input(rev: &Revision) -> Option<RevisionInput> {
    let ns = rev.namespace()?;
    let name = rev.name_any();
    let secs = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok());
    let c = rev.spec.pod_spec.containers.first();
    Some(RevisionInput {
        hosts: vec![
            format!("{name}.{ns}"),
            format!("{name}.{ns}.svc"),
            format!("{name}.{ns}.svc.cluster.local"),
        ],
        namespace: ns,
        service: rev.labels().get(labels::SERVICE).cloned(),
        container_concurrency: rev
            .spec
            .container_concurrency
            .and_then(|v| u32::try_from(v).ok()),
        timeout_seconds: secs(rev.spec.timeout_seconds),
        response_start_timeout_seconds: secs(rev.spec.response_start_timeout_seconds),
        idle_timeout_seconds: secs(rev.spec.idle_timeout_seconds),
        port_name: c
            .and_then(|c| c.ports.as_ref())
            .and_then(|p| p.first())
            .and_then(|p| p.name.clone()),
        annotations: rev.annotations().clone(),
        name,
    })
}

/// Follows every Revision into `catalog` and `platform`; the receiver turns true after the
/// first list.
pub fn follow(
    client: kube::Client,
    namespace: Option<&str>,
    live: LiveConfig,
    catalog: Arc<RevisionCatalog>,
    platform: KubePlatform,
    stop: CancellationToken,
) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    let api: Api<Revision> = match namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    tokio::spawn(
        async move {
            let mut s =
                std::pin::pin!(watch_stream(api, watcher::Config::default()).default_backoff());
            let mut all: BTreeMap<RevisionKey, RevisionInput> = BTreeMap::new();
            let mut listing: Option<BTreeMap<RevisionKey, RevisionInput>> = None;
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
                        listing = Some(BTreeMap::new());
                        continue;
                    }
                    Some(Ok(Event::InitApply(r))) => {
                        if let (Some(l), Some(i)) = (listing.as_mut(), input(&r)) {
                            l.insert(RevisionKey::new(&i.namespace, &i.name), i);
                        }
                        continue;
                    }
                    Some(Ok(Event::InitDone)) => {
                        let next = listing.take().unwrap_or_default();
                        for k in all.keys().filter(|k| !next.contains_key(*k)) {
                            platform.remove(k);
                        }
                        all = next;
                    }
                    Some(Ok(Event::Apply(r))) => {
                        if let Some(i) = input(&r) {
                            all.insert(RevisionKey::new(&i.namespace, &i.name), i);
                        }
                    }
                    Some(Ok(Event::Delete(r))) => {
                        if let Some(i) = input(&r) {
                            let k = RevisionKey::new(&i.namespace, &i.name);
                            all.remove(&k);
                            platform.remove(&k);
                        }
                    }
                }
                let configs = ConfigSet {
                    autoscaler: live.autoscaler.load_full(),
                    defaults: live.defaults.load_full(),
                    activator: live.activator.load_full(),
                    gc: Default::default(),
                };
                let mut specs = Vec::new();
                for i in all.values() {
                    match resolve_revision(i, &configs) {
                        Ok(spec) => {
                            platform.upsert(KubeRevision {
                                key: spec.key.clone(),
                                protocol: spec.protocol,
                                progress_deadline: Some(spec.autoscaling.progress_deadline),
                            });
                            specs.push(spec);
                        }
                        Err(p) => tracing::warn!(revision = %i.name, problems = %p, "invalid revision skipped"),
                    }
                }
                catalog.store(CatalogSnapshot::new(specs, []));
                tx.send_replace(true);
            }
        }
        .instrument(tracing::info_span!("watch", resource = "revisions")),
    );
    rx
}
