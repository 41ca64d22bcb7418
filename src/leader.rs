//! Leader election with a `coordination.k8s.io/v1` Lease, for the roles that run several
//! replicas of which one acts (the autoscaler, later the controller).
//!
//! [`elect`] runs client-go's protocol (the leader renews the Lease every retry period, and
//! gives up when a round of renewals has not succeeded within the renew deadline; a candidate
//! takes it over once it has seen the Lease unchanged for the lease duration, judged on its
//! own clock, so clock skew does not matter; [`k8s_controller::LeaderElection`] releases it)
//! in a loop: while this replica holds the Lease, [`Leadership::is_leader`] is true and the
//! work runs; when renewal fails the work is dropped at once and the replica rejoins the
//! election. The Lease's `holderIdentity` is the leader's **stats address** (where activators
//! push stats), so [`watch_leader`] tells every activator where to send them.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_stream};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Where the Lease is and how it is held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    /// Namespace of the Lease (the role's namespace, `thaw-system`).
    pub namespace: String,
    /// The Lease's name (one per role: `thaw-autoscaler`).
    pub name: String,
    /// This replica's identity, written to `holderIdentity` while it leads: its stats address
    /// (`10.1.2.3:8080`). Must be unique among the candidates and non-empty.
    pub identity: String,
    /// How long candidates wait after the last observed change of the Lease before taking it
    /// over (Knative's default 60 s). Whole seconds (the Lease stores seconds).
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up leading (default 40 s);
    /// less than `lease_duration`.
    pub renew_deadline: Duration,
    /// How often the leader renews and candidates retry (default 10 s); less than
    /// `renew_deadline`.
    pub retry_period: Duration,
}

impl LeaseSettings {
    /// A Lease with Knative's default timings (60 s / 40 s / 10 s, config-leader-election's).
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        let knative = crate::config::leader_election::LeaderElectionConfig::default();
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: knative.lease_duration,
            renew_deadline: knative.renew_deadline,
            retry_period: knative.retry_period,
        }
    }

    /// Checks the timings and identity (the election itself would panic on them).
    pub fn validate(&self) -> Result<(), String> {
        if self.identity.is_empty() {
            return Err("identity: must not be empty".into());
        }
        if self.lease_duration.as_secs() == 0 || self.lease_duration.subsec_nanos() != 0 {
            return Err(format!(
                "lease-duration: {:?}: must be a whole number of seconds, at least 1",
                self.lease_duration
            ));
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(format!(
                "renew-deadline: {:?}: must be less than lease-duration ({:?})",
                self.renew_deadline, self.lease_duration
            ));
        }
        if self.retry_period >= self.renew_deadline || self.retry_period.is_zero() {
            return Err(format!(
                "retry-period: {:?}: must be above 0 and less than renew-deadline ({:?})",
                self.retry_period, self.renew_deadline
            ));
        }
        Ok(())
    }
}

/// Whether this replica leads; cheap to clone.
#[derive(Debug, Clone)]
pub struct Leadership {
    rx: watch::Receiver<bool>,
}

impl Leadership {
    /// True while this replica holds the Lease (and its work runs).
    pub fn is_leader(&self) -> bool {
        *self.rx.borrow()
    }

    /// A receiver of every change (true on acquiring, false on losing).
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.rx.clone()
    }
}

/// Runs `work()` whenever this replica holds the Lease, until `stop` is cancelled.
///
/// Each time leadership is acquired a fresh `work()` future runs; when the Lease is lost it is
/// dropped at once (so spawned tasks must watch [`Leadership`] themselves) and the replica
/// becomes a candidate again. On `stop` the work is dropped and, if leading, the Lease is
/// released so another replica takes over without waiting for it to expire. Returns the
/// [`Leadership`] watch at once; the election runs in a spawned task.
///
/// The renewals follow client-go's (what Knative's leader election runs): a retry period
/// after each successful renewal a renewal round starts, which retries every retry period
/// and gives up leading when it has not renewed within the renew deadline of its start. A
/// renewal is one `replace` of the Lease this replica last wrote (a GET first only when that
/// write conflicts), so a slow API server costs a leader its Lease only when a renewal round
/// takes longer than the renew deadline, not when successive renewals are each slow.
pub fn elect<F, Fut>(
    client: kube::Client,
    settings: LeaseSettings,
    stop: CancellationToken,
    mut work: F,
) -> Result<Leadership, String>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    settings.validate()?;
    let (tx, rx) = watch::channel(false);
    let release = k8s_controller::LeaderElection::new(
        client.clone(),
        &settings.namespace,
        &settings.name,
        &settings.identity,
    )
    .with_lease_duration(settings.lease_duration)
    .with_renew_deadline(settings.renew_deadline)
    .with_retry_period(settings.retry_period);
    let mut lease = LeaseClient {
        api: Api::namespaced(client, &settings.namespace),
        settings: settings.clone(),
        held: None,
    };
    let span = tracing::info_span!("leader_election", lease = %settings.name, identity = %settings.identity);
    tokio::spawn(
        async move {
            loop {
                let tx = &tx;
                let term = async {
                    lease.acquire().await;
                    tracing::info!("leading");
                    tx.send_replace(true);
                    let job = work();
                    let job = async {
                        job.await;
                        // The work ended on its own: keep leading until stopped or lost.
                        std::future::pending::<()>().await
                    };
                    tokio::select! {
                        () = job => {}
                        () = lease.hold() => {}
                    }
                };
                tokio::select! {
                    _ = stop.cancelled() => {
                        let was = tx.send_replace(false);
                        if was {
                            release.release().await;
                            tracing::info!("stopped; lease released");
                        }
                        return;
                    }
                    _ = term => {
                        tx.send_replace(false);
                        tracing::warn!("lost the lease; rejoining the election");
                    }
                }
            }
        }
        .instrument(span),
    );
    Ok(Leadership { rx })
}

/// The Lease as one candidate reads and writes it.
struct LeaseClient {
    api: Api<Lease>,
    settings: LeaseSettings,
    /// The Lease as this replica last wrote it while holding it (its resourceVersion is what
    /// the next renewal replaces).
    held: Option<Lease>,
}

impl LeaseClient {
    /// Returns once this replica holds the Lease: it is free (no holder, or released), ours
    /// already, or unchanged for a whole lease duration as this replica observed it (its own
    /// clock: skew does not matter). Tries every retry period (jittered by up to 20 %, as
    /// client-go).
    async fn acquire(&mut self) {
        self.held = None;
        tracing::info!("attempting to acquire the lease");
        let mut observed: Option<(k8s_openapi::api::coordination::v1::LeaseSpec, Instant)> = None;
        loop {
            match self.try_acquire(&mut observed).await {
                Ok(true) => {
                    tracing::info!("acquired the lease");
                    return;
                }
                Ok(false) => tracing::debug!("the lease is held by another candidate"),
                Err(e) => tracing::warn!(error = %e, "acquiring the lease"),
            }
            let jitter = rand::RngExt::random_range(&mut rand::rng(), 1.0..1.2);
            tokio::time::sleep(self.settings.retry_period.mul_f64(jitter)).await;
        }
    }

    async fn try_acquire(
        &mut self,
        observed: &mut Option<(k8s_openapi::api::coordination::v1::LeaseSpec, Instant)>,
    ) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.settings.name).await? else {
            let lease = Lease {
                metadata: kube::api::ObjectMeta {
                    name: Some(self.settings.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.next_spec(None)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(written) => {
                    self.held = Some(written);
                    Ok(true)
                }
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.take().unwrap_or_default();
        let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty());
        let ours = holder == Some(self.settings.identity.as_str());
        if !ours && holder.is_some() {
            if observed.as_ref().is_none_or(|(last, _)| *last != spec) {
                *observed = Some((spec, Instant::now()));
                return Ok(false);
            }
            if observed
                .as_ref()
                .is_some_and(|(_, at)| at.elapsed() < self.settings.lease_duration)
            {
                return Ok(false);
            }
        }
        lease.spec = Some(self.next_spec(Some(&spec)));
        match self
            .api
            .replace(&self.settings.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                self.held = Some(written);
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Renews the Lease until it is lost, then returns: a retry period after each success a
    /// round starts, retrying every retry period, bounded by the renew deadline (client-go's
    /// `renew`).
    async fn hold(&mut self) {
        loop {
            tokio::time::sleep(self.settings.retry_period).await;
            let deadline = self.settings.renew_deadline;
            let retry = self.settings.retry_period;
            let round = tokio::time::timeout(deadline, async {
                loop {
                    match self.renew().await {
                        Ok(held) => return held,
                        Err(e) => {
                            tracing::warn!(error = %e, "renewing the lease");
                            tokio::time::sleep(retry).await;
                        }
                    }
                }
            })
            .await;
            match round {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!("the lease was taken by another candidate");
                    return;
                }
                Err(_) => {
                    tracing::warn!(
                        renew_deadline = ?deadline,
                        "the lease was not renewed within the renew deadline; giving up leadership"
                    );
                    return;
                }
            }
        }
    }

    /// One renewal: the Lease last written replaced with a new renew time; on a conflict,
    /// read again and renew only if this replica still holds it. `Ok(false)`: another holds it.
    async fn renew(&mut self) -> Result<bool, kube::Error> {
        let name = self.settings.name.clone();
        let pp = PostParams::default();
        if let Some(mut lease) = self.held.clone() {
            let prev = lease.spec.take();
            lease.spec = Some(self.next_spec(prev.as_ref()));
            match self.api.replace(&name, &pp, &lease).await {
                Ok(written) => {
                    self.held = Some(written);
                    return Ok(true);
                }
                Err(kube::Error::Api(e)) if e.code == 409 => self.held = None,
                Err(e) => return Err(e),
            }
        }
        let Some(mut lease) = self.api.get_opt(&name).await? else {
            return Ok(false);
        };
        let spec = lease.spec.take().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
            return Ok(false);
        }
        lease.spec = Some(self.next_spec(Some(&spec)));
        match self.api.replace(&name, &pp, &lease).await {
            Ok(written) => {
                self.held = Some(written);
                Ok(true)
            }
            // Written meanwhile (by another candidate, or a late write of ours): read again
            // at the next try.
            Err(kube::Error::Api(e)) if e.code == 409 => Err(kube::Error::Api(e)),
            Err(e) => Err(e),
        }
    }

    /// The spec that makes this replica the holder, renewed now, after `prev`.
    fn next_spec(
        &self,
        prev: Option<&k8s_openapi::api::coordination::v1::LeaseSpec>,
    ) -> k8s_openapi::api::coordination::v1::LeaseSpec {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let identity = &self.settings.identity;
        let ours = prev.is_some_and(|s| s.holder_identity.as_deref() == Some(identity.as_str()));
        k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: Some(identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.settings.lease_duration.as_secs()).unwrap_or(i32::MAX),
            ),
            acquire_time: if ours {
                prev.and_then(|s| s.acquire_time.clone())
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: match prev {
                None => Some(0),
                Some(s) if ours => s.lease_transitions,
                Some(s) => Some(s.lease_transitions.unwrap_or(0).saturating_add(1)),
            },
            ..Default::default()
        }
    }
}

/// Follows the Lease: the current `holderIdentity` (the leader's stats address), `None` while
/// there is no Lease or holder. Runs until `stop`; the watch resumes after errors.
pub fn watch_leader(
    client: kube::Client,
    namespace: &str,
    name: &str,
    stop: CancellationToken,
) -> watch::Receiver<Option<String>> {
    let (tx, rx) = watch::channel(None);
    let api: Api<Lease> = Api::namespaced(client, namespace);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let name = name.to_string();
    let span = tracing::info_span!("watch", resource = "leases", lease = %name);
    tokio::spawn(
        async move {
            let mut s = std::pin::pin!(watch_stream(api, cfg).default_backoff());
            let holder = |l: &Lease| l.spec.as_ref().and_then(|s| s.holder_identity.clone());
            // During a (re-)list: the holder found so far; a Lease gone meanwhile reads None.
            let mut listing: Option<Option<String>> = None;
            loop {
                let ev = tokio::select! {
                    _ = stop.cancelled() => return,
                    ev = s.next() => ev,
                };
                let new = match ev {
                    None => return,
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "lease watch error; resuming");
                        continue;
                    }
                    Some(Ok(Event::Init)) => {
                        listing = Some(None);
                        continue;
                    }
                    Some(Ok(Event::InitApply(l))) => {
                        if l.metadata.name.as_deref() == Some(&name) {
                            listing = Some(holder(&l));
                        }
                        continue;
                    }
                    Some(Ok(Event::InitDone)) => listing.take().flatten(),
                    Some(Ok(Event::Apply(l))) if l.metadata.name.as_deref() == Some(&name) => {
                        holder(&l)
                    }
                    Some(Ok(Event::Apply(_))) => continue,
                    Some(Ok(Event::Delete(_))) => None,
                };
                tx.send_if_modified(|cur| {
                    if *cur == new {
                        false
                    } else {
                        tracing::info!(leader = ?new, "leader changed");
                        *cur = new;
                        true
                    }
                });
            }
        }
        .instrument(span),
    );
    rx
}
