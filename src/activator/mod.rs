//! The activator: a reverse proxy that holds requests for cold revisions, wakes them through the
//! autoscaler, and forwards the moment endpoints appear.

pub mod balancer;
pub mod endpoint;
pub mod report;
pub mod throttler;
