//! Leader election with a `coordination.k8s.io/v1` Lease, for the roles that run several
//! replicas of which one acts (the autoscaler, later the controller).
//!
//! [`elect`] runs [`k8s_controller::LeaderElection`] (client-go's protocol: the leader renews
//! the Lease every retry period; a candidate takes it over once it has seen the Lease
//! unchanged for the lease duration, judged on its own clock, so clock skew does not matter)
//! in a loop: while this replica holds the Lease, [`Leadership::is_leader`] is true and the
//! work runs; when renewal fails the work is dropped at once and the replica rejoins the
//! election. The Lease's `holderIdentity` is the leader's **stats address** (where activators
//! push stats), so [`watch_leader`] tells every activator where to send them.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_stream};
use tokio::sync::watch;
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
    let election = k8s_controller::LeaderElection::new(
        client,
        &settings.namespace,
        &settings.name,
        &settings.identity,
    )
    .with_lease_duration(settings.lease_duration)
    .with_renew_deadline(settings.renew_deadline)
    .with_retry_period(settings.retry_period);
    let span = tracing::info_span!("leader_election", lease = %settings.name, identity = %settings.identity);
    tokio::spawn(
        async move {
            loop {
                let tx = &tx;
                let job = work();
                let held = election.with_lease(async move {
                    tracing::info!("leading");
                    tx.send_replace(true);
                    job.await;
                    // The work ended on its own: keep leading until stopped.
                    std::future::pending::<()>().await
                });
                tokio::select! {
                    _ = stop.cancelled() => {
                        let was = tx.send_replace(false);
                        if was {
                            election.release().await;
                            tracing::info!("stopped; lease released");
                        }
                        return;
                    }
                    _ = held => {
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
