//! Integration tests of the activator on real sockets: a real `Activator::serve` on ephemeral
//! loopback ports, real hyper upstreams and clients, endpoint snapshots fed by hand.

mod drain;
mod early;
mod hardening;
mod harness;
mod hold;
mod lane;
mod lazy;
mod listener;
mod metrics;
mod proxy;
mod tenancy;
mod timeouts;
