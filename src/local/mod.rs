//! `thaw local`: the embedded default. The activator, the autoscaler and a local process
//! platform in one process, serving the services of `local.yaml`.
//!
//! Room: local.yaml's model and the wiring of every role in one process. May use every other
//! module; nothing imports it but `main`.

pub mod config;
pub mod controller;
pub mod model;
pub mod run;
pub mod schema;
