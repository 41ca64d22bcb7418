//! The activator's side of the decision feed: follows `GET /decisions` on the autoscaler leader
//! and publishes each revision's [`ScaleState`] into the activator's own [`ScaleStates`]
//! (`desired`, whether the activator stays in the path; the decision time is the receipt
//! time). Reconnects with backoff when the leader changes or the feed ends; while no leader
//! answers, the last states stay (the activator keeps serving warm traffic and holding cold
//! traffic; a held request still ends by its cold-wait deadline).

use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::watch;
use tokio::time::{Duration, Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::token::{Token, Tokens};
use super::wire::{DECISIONS_PATH, WireDecision};
use crate::autoscaler::scaler::{ScaleState, ScaleStates};
use crate::revision::RevisionKey;
use crate::telemetry::remote::RemoteMetrics;

/// The error of a session the leader refused (401).
const UNAUTHORIZED: &str = "unauthorized";

/// Longest line accepted on the feed.
const MAX_LINE: usize = 64 * 1024;

/// Follows the leader's decisions into `states` until `stop`.
pub fn follow(
    leader: watch::Receiver<Option<String>>,
    token: Tokens,
    states: Arc<ScaleStates>,
    metrics: RemoteMetrics,
    stop: CancellationToken,
) {
    tokio::spawn(
        run(leader, token, states, metrics, stop).instrument(tracing::info_span!("decision_feed")),
    );
}

async fn run(
    mut leader: watch::Receiver<Option<String>>,
    token: Tokens,
    states: Arc<ScaleStates>,
    metrics: RemoteMetrics,
    stop: CancellationToken,
) {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut backoff = Duration::from_millis(50);
    loop {
        let addr = leader.borrow_and_update().clone();
        let Some(addr) = addr else {
            tokio::select! {
                _ = stop.cancelled() => return,
                r = leader.changed() => if r.is_err() { return } else { continue },
            }
        };
        let session = async {
            let Some(current) = token.current() else {
                return Err("no stats token yet".to_string());
            };
            match follow_once(&client, &addr, &current, &states, &metrics).await {
                // The leader may not have seen a rotation yet: try the token it replaced.
                Err(e) if e == UNAUTHORIZED => match token.previous() {
                    Some(previous) => {
                        follow_once(&client, &addr, &previous, &states, &metrics).await
                    }
                    None => Err(e),
                },
                r => r,
            }
        };
        let ended = tokio::select! {
            _ = stop.cancelled() => return,
            _ = leader.changed() => {
                tracing::info!(leader = ?*leader.borrow(), "leader changed; following the new one");
                backoff = Duration::from_millis(50);
                continue;
            }
            r = session => r,
        };
        metrics.feed_connected.set(0);
        match ended {
            Ok(()) => tracing::info!(leader = %addr, "decision feed ended; reconnecting"),
            Err(e) => tracing::debug!(leader = %addr, error = %e, "decision feed failed"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = leader.changed() => backoff = Duration::from_millis(50),
            () = sleep(backoff) => backoff = (backoff * 2).min(Duration::from_secs(5)),
        }
    }
}

async fn follow_once(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>,
    addr: &str,
    token: &Token,
    states: &ScaleStates,
    metrics: &RemoteMetrics,
) -> Result<(), String> {
    let req = Request::builder()
        .method(Method::GET)
        .uri(format!("http://{addr}{DECISIONS_PATH}"))
        .header(header::AUTHORIZATION, token.header())
        .body(Empty::new())
        .map_err(|e| e.to_string())?;
    let resp = timeout(Duration::from_secs(5), client.request(req))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())?;
    if resp.status() != StatusCode::OK {
        if resp.status() == StatusCode::UNAUTHORIZED {
            tracing::warn!(leader = %addr, "decision feed refused: the stats token does not match");
        }
        if resp.status() == StatusCode::UNAUTHORIZED {
            return Err(UNAUTHORIZED.into());
        }
        return Err(format!("answered {}", resp.status()));
    }
    tracing::info!(leader = %addr, "following decisions");
    metrics.feed_connected.set(1);
    let mut body = resp.into_body();
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while let Some(i) = buf.iter().position(|b| *b == b'\n') {
            let line: Bytes = buf.split_to(i + 1).freeze();
            apply(states, &line[..i]);
        }
        if buf.len() > MAX_LINE {
            return Err("feed line too long".into());
        }
    }
    buf.advance(buf.len());
    Ok(())
}

/// Applies one feed line (ignored when malformed, with a log line).
fn apply(states: &ScaleStates, line: &[u8]) {
    let d: WireDecision = match serde_json::from_slice(line) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, "malformed decision line ignored");
            return;
        }
    };
    let key = RevisionKey::new(&d.namespace, &d.name);
    if d.removed {
        states.remove(&key);
        return;
    }
    let desired = d
        .desired
        .map_or(-1, |n| i32::try_from(n).unwrap_or(i32::MAX));
    let current = states.get(&key);
    let decided_at = match &current {
        Some(c) if c.desired == desired => c.decided_at,
        _ => Some(Instant::now()),
    };
    states.publish(
        &key,
        ScaleState {
            desired,
            decided_at,
            activator_in_path: d.activator_in_path,
            initialized: false,
            activity: None,
        },
    );
}
