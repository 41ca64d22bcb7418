//! What crosses the wire between thaw's roles on Kubernetes: the activators' stats push to the
//! autoscaler leader ([`push`], received by [`server`]), the leader's decision feed back to the
//! activators ([`feed`]), thaw's wire format for both ([`wire`]), the shared token that
//! authenticates them ([`token`]) and the proxy tags' key ([`tag_key`]).
//!
//! Room: the transport between roles. May use: `stats`, `revision`, `autoscaler::scaler` (the
//! [`crate::autoscaler::scaler::ScaleStates`] seam), `telemetry`, `clock`, `cli`. The activator
//! and the autoscaler never import it: the role wiring (`roles`) plugs it into their seams
//! (`StatSink`, the scaler's stats channel, `ScaleStates`).

pub mod feed;
pub mod push;
pub mod server;
pub mod tag_key;
pub mod token;
pub mod wire;
