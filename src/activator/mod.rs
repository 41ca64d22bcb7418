//! The activator: a reverse proxy that holds requests for cold revisions, wakes them through the
//! autoscaler, and forwards the moment endpoints appear (docs/architecture.md).
//!
//! Entry points: [`Activator::new`] with [`ActivatorDeps`], then [`Activator::serve`];
//! [`raise_nofile_limit`] at process start. The request path is composed in [`pipeline`]; each
//! step lives in its own module.
//!
//! Room: the activator's own policy — routing, probes, holding and cold starts, throttling and
//! balancing over a revision's endpoints, header hygiene, errors as answers, per-revision
//! metrics, the stats it reports, its admin port and drain. It is a [`crate::http1::Handler`]:
//! connections, HTTP/1 parsing and writing, hyper and the upstream pool are the engine's.
//! May use: `http1` (the engine), `limiter` (its wait queue), `percore`, `stats`, `revision`,
//! `platform` (the endpoint seam), `config`, `telemetry`, `clock`, `knative::proxy_tag`, and the autoscaler's
//! `ScaleState` feed. Nothing outside it imports its internals but `local` (which wires it).

pub mod admin;
pub mod balancer;
pub mod body;
pub mod catch_up;
pub mod cold_start;

pub mod concurrency;
mod core;
pub mod early;
pub mod endpoint;
pub mod error;
pub mod headers;
pub mod mesh_identity;
pub mod pipeline;
pub mod proxy;
pub mod report;
pub mod request_fields;
pub mod rev_state;
pub mod route_check;
pub mod routing;
pub mod server;
pub mod testing;
pub mod throttler;
pub mod ticket;

pub use self::core::{Activator, ActivatorDeps};
pub use crate::http1::limits::raise_nofile_limit;
pub use headers::NextHop;
