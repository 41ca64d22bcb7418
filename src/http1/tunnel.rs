//! An upgraded connection (websocket) as a tunnel: the client's and the upstream's upgraded
//! connections joined, bytes copied both ways. The activator and the queue sidecar each spawn
//! one per upgrade, holding the request's accounting for as long as it runs.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::time::Duration;
use tokio_util::io::InspectReader;
use tokio_util::sync::CancellationToken;

/// Waits for both upgrades, then copies bytes both ways until either side closes, `cancel`
/// fires (drain), or — with an `idle` timeout — no byte has moved either way for that long
/// (checked every `idle`, so an idle tunnel closes after one to two periods). No total timeout:
/// a tunnel lives as long as it is used.
pub async fn run(
    client: OnUpgrade,
    upstream: OnUpgrade,
    idle: Option<Duration>,
    cancel: CancellationToken,
) {
    let (client, upstream) = match tokio::try_join!(client, upstream) {
        Ok(pair) => pair,
        Err(e) => {
            tracing::debug!(error = %e, "upgrade failed");
            return;
        }
    };
    // Bytes read from either side, for the idle timeout.
    let moved = AtomicU64::new(0);
    let count = |bytes: &[u8]| {
        moved.fetch_add(bytes.len() as u64, Relaxed);
    };
    let mut c = InspectReader::new(TokioIo::new(client), count);
    let mut u = InspectReader::new(TokioIo::new(upstream), count);
    tokio::select! {
        r = tokio::io::copy_bidirectional(&mut c, &mut u) => {
            tracing::debug!(result = ?r, "tunnel closed");
        }
        _ = super::activity::quiet_for(idle.unwrap_or_default(), || moved.load(Relaxed), || false) => {
            tracing::debug!(idle = ?idle, "tunnel closed: idle timeout");
        }
        _ = cancel.cancelled() => tracing::debug!("tunnel cancelled by drain"),
    }
}
