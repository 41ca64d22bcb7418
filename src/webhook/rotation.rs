//! The webhook's certificates against the API server: every replica follows the Secret and
//! serves its current pair ([`follow_secret`]); the Lease holder alone writes ([`manage`]):
//! the Secret, by [`super::certs::plan`], and the `caBundle` of every webhook in the two
//! configurations it owns. Every write is a compare-and-swap (create, or replace at the read
//! `resourceVersion`): a conflict, e.g. a former leader's late write, is skipped and the next
//! tick starts from what is stored.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use time::OffsetDateTime;
use tokio::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::certs::{self, Lifetimes, Step, Stored};
use super::server::CertSlot;
use crate::telemetry::webhook::WebhookMetrics;

/// Where the certificates live and who they are for.
#[derive(Debug, Clone)]
pub struct CertTarget {
    pub namespace: String,
    pub secret: String,
    /// The webhook Service's name (its DNS names are the certificate's).
    pub service: String,
    pub validating: String,
    pub mutating: String,
    pub lifetimes: Lifetimes,
    /// How often the leader checks (and how soon it retries after a conflict).
    pub interval: Duration,
}

impl CertTarget {
    /// The serving certificate's names: the Service's in-cluster DNS names.
    pub fn dns_names(&self) -> Vec<String> {
        let (s, ns) = (&self.service, &self.namespace);
        vec![
            format!("{s}.{ns}.svc"),
            format!("{s}.{ns}.svc.cluster.local"),
            format!("{s}.{ns}"),
            s.clone(),
        ]
    }
}

fn stored_of(s: &Secret) -> Stored {
    let data: BTreeMap<String, String> = s
        .data
        .iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), String::from_utf8(v.0.clone()).ok()?)))
        .collect();
    let staged = s
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(certs::STAGED_AT_ANNOTATION));
    Stored::from_data(&data, staged.map(String::as_str))
}

/// Follows the Secret until `stop`, loading each current pair into `slot`. A pair that does
/// not load is logged; the previous one keeps being served.
pub async fn follow_secret(
    client: kube::Client,
    target: CertTarget,
    slot: Arc<CertSlot>,
    metrics: WebhookMetrics,
    stop: CancellationToken,
) {
    let api: Api<Secret> = Api::namespaced(client, &target.namespace);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={}", target.secret));
    let mut s = std::pin::pin!(watcher(api, cfg).applied_objects().default_backoff());
    loop {
        let ev = tokio::select! {
            _ = stop.cancelled() => return,
            ev = s.next() => ev,
        };
        let secret = match ev {
            None => return,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "certificate Secret watch error; resuming");
                continue;
            }
            Some(Ok(s)) => s,
        };
        let Some(p) = stored_of(&secret).current else {
            continue;
        };
        match slot.load(&p.server_cert, &p.server_key) {
            Ok(()) => {
                if let Some(t) = certs::not_after(&p.server_cert) {
                    metrics.certificate_expiry.set(t.unix_timestamp());
                }
                tracing::info!("serving the certificate from the Secret");
            }
            Err(e) => tracing::warn!(error = %e, "the Secret's certificate cannot be served"),
        }
    }
}

/// The leader's loop, until `stop`: one [`tick`] each `interval`. `slot`: this replica's
/// served pair (whether it serves one decides how a lost Secret is replaced).
pub async fn manage(
    client: kube::Client,
    target: CertTarget,
    metrics: WebhookMetrics,
    slot: Arc<CertSlot>,
    stop: CancellationToken,
) {
    let span = tracing::info_span!("certificates", secret = %target.secret);
    async move {
        loop {
            if let Err(e) = tick(&client, &target, &metrics, slot.loaded()).await {
                metrics.step("error");
                tracing::warn!(error = %e, "certificate check failed; retrying");
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(target.interval) => {}
            }
        }
    }
    .instrument(span)
    .await
}

/// The `caBundle`s of a configuration's webhooks.
fn bundles<'a>(it: impl Iterator<Item = Option<&'a ByteString>>) -> Vec<Vec<u8>> {
    it.map(|b| b.map(|b| b.0.clone()).unwrap_or_default())
        .collect()
}

/// One check: read the Secret and both configurations, write the Secret if the plan says so,
/// then bring every webhook's `caBundle` to the Secret's bundle. `serving`: this replica
/// serves a pair loaded earlier.
pub async fn tick(
    client: &kube::Client,
    target: &CertTarget,
    metrics: &WebhookMetrics,
    serving: bool,
) -> Result<(), kube::Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &target.namespace);
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mwcs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let secret = secrets.get_opt(&target.secret).await?;
    let vwc = vwcs.get_opt(&target.validating).await?;
    let mwc = mwcs.get_opt(&target.mutating).await?;
    let stored = secret.as_ref().map(stored_of);
    let mut all: Vec<Vec<u8>> = Vec::new();
    if let Some(c) = &vwc {
        all.extend(bundles(
            c.webhooks
                .iter()
                .flatten()
                .map(|w| w.client_config.ca_bundle.as_ref()),
        ));
    }
    if let Some(c) = &mwc {
        all.extend(bundles(
            c.webhooks
                .iter()
                .flatten()
                .map(|w| w.client_config.ca_bundle.as_ref()),
        ));
    }
    // An absent configuration sends no calls: nothing to publish to.
    let published = stored
        .as_ref()
        .and_then(|s| s.next.as_ref())
        .is_some_and(|n| all.iter().all(|b| certs::bundle_contains(b, &n.ca_cert)));
    let now = OffsetDateTime::now_utc();
    let names = target.dns_names();
    let mut fresh = || certs::generate(&names, now, target.lifetimes.validity);
    let trusted: Vec<String> = all
        .iter()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect();
    let step = certs::plan(
        stored.as_ref(),
        now,
        &target.lifetimes,
        published,
        &trusted,
        serving,
        &mut fresh,
    )
    .map_err(|e| kube::Error::Service(e.into()))?;
    let bundle = match step {
        Step::Keep => stored.map(|s| s.bundle).unwrap_or_default(),
        Step::Write(next, why) => {
            let mut annotations = BTreeMap::new();
            if let Some(t) = next.staged_at_text() {
                annotations.insert(certs::STAGED_AT_ANNOTATION.to_string(), t);
            }
            let body = Secret {
                metadata: ObjectMeta {
                    name: Some(target.secret.clone()),
                    namespace: Some(target.namespace.clone()),
                    resource_version: secret
                        .as_ref()
                        .and_then(|s| s.metadata.resource_version.clone()),
                    labels: Some(BTreeMap::from([(
                        "app.kubernetes.io/part-of".to_string(),
                        "thaw".to_string(),
                    )])),
                    annotations: Some(annotations),
                    ..Default::default()
                },
                data: Some(
                    next.to_data()
                        .into_iter()
                        .map(|(k, v)| (k, ByteString(v.into_bytes())))
                        .collect(),
                ),
                type_: Some("Opaque".into()),
                ..Default::default()
            };
            let written = match &secret {
                None => secrets.create(&PostParams::default(), &body).await,
                Some(_) => {
                    secrets
                        .replace(&target.secret, &PostParams::default(), &body)
                        .await
                }
            };
            match written {
                Ok(_) => {
                    metrics.step(why);
                    tracing::info!(step = why, "certificate Secret written");
                    next.bundle.clone()
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    // Another writer got there first: start from its state next tick.
                    metrics.step("conflict");
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
    };
    if bundle.is_empty() {
        return Ok(());
    }
    let want = ByteString(bundle.into_bytes());
    if let Some(c) = vwc {
        bring_to_bundle(&vwcs, &target.validating, c, &want, metrics, |c| {
            c.webhooks
                .iter_mut()
                .flatten()
                .map(|w| &mut w.client_config)
                .collect()
        })
        .await?;
    }
    if let Some(c) = mwc {
        bring_to_bundle(&mwcs, &target.mutating, c, &want, metrics, |c| {
            c.webhooks
                .iter_mut()
                .flatten()
                .map(|w| &mut w.client_config)
                .collect()
        })
        .await?;
    }
    Ok(())
}

/// Sets every webhook's `caBundle` in `config` to `want` and replaces it, when one differs.
async fn bring_to_bundle<K>(
    api: &Api<K>,
    name: &str,
    mut config: K,
    want: &ByteString,
    metrics: &WebhookMetrics,
    hooks: fn(&mut K) -> Vec<&mut WebhookClientConfig>,
) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut configs = hooks(&mut config);
    if configs.iter().all(|c| c.ca_bundle.as_ref() == Some(want)) {
        return Ok(());
    }
    for c in &mut configs {
        c.ca_bundle = Some(want.clone());
    }
    write_configuration(api, name, &config, metrics).await
}

async fn write_configuration<K>(
    api: &Api<K>,
    name: &str,
    body: &K,
    metrics: &WebhookMetrics,
) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.replace(name, &PostParams::default(), body).await {
        Ok(_) => {
            metrics.step("configuration");
            tracing::info!(
                configuration = name,
                "caBundle brought to the Secret's bundle"
            );
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 => {
            metrics.step("conflict");
            Ok(())
        }
        Err(e) => Err(e),
    }
}
