//! The activator: a reverse proxy that holds requests for cold revisions, wakes them through the
//! autoscaler, and forwards the moment endpoints appear (ARCHITECTURE.md; knative-dataplane.md §1).
//!
//! Entry points: [`Activator::new`] with [`ActivatorDeps`], then [`Activator::serve`];
//! [`raise_nofile_limit`] at process start. The request path is composed in [`pipeline`]; each
//! step lives in its own module.

pub mod admin;
pub mod balancer;
pub mod body;
pub mod cold_start;

pub mod concurrency;
mod core;
pub mod direct;
pub mod early;
pub mod endpoint;
pub mod error;
pub mod fields;
pub mod head_clock;
pub mod headers;
pub mod lane;
pub mod limits;
pub mod pipeline;
pub mod pool;
pub mod proxy;
pub mod report;
pub mod rev_state;
pub mod routing;
pub mod server;
pub mod testing;
pub mod throttler;
pub mod ticket;

pub use self::core::{Activator, ActivatorDeps};
pub use headers::NextHop;
pub use limits::raise_nofile_limit;
