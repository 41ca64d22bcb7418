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
pub mod early;
pub mod endpoint;
pub mod error;
pub mod headers;
pub mod pipeline;
pub mod proxy;
pub mod report;
pub mod request_fields;
pub mod rev_state;
pub mod routing;
pub mod server;
pub mod testing;
pub mod throttler;
pub mod ticket;

pub use self::core::{Activator, ActivatorDeps};
pub use crate::http1::limits::raise_nofile_limit;
pub use headers::NextHop;
