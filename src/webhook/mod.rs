//! `thaw webhook`'s parts: Knative's admission as pure functions ([`admit`]), the
//! certificates as data ([`certs`]), their management against the API server ([`rotation`]),
//! the TLS listener ([`server`]) and its connection seats ([`seats`]), and the check that Knative Serving is not installed beside
//! thaw ([`coexist`]). The role's wiring is [`crate::roles::webhook`].
//!
//! Room: admission and its certificates. May use `knative`, `controller` (the settings and
//! the defaulting and validation the controller applies), `config`, `telemetry`.

pub mod admit;
pub mod certs;
pub mod coexist;
pub mod rotation;
pub mod seats;
pub mod server;
