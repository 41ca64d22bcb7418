//! The whole stack on the real control plane: the serving cases (tests/real_stack/serving.rs), on a
//! plane of their own (`plane_support::harness`).

#[allow(dead_code, reason = "the plane's gateway pod uses part of it")]
#[path = "kube_support/gateway.rs"]
mod gateway;
mod plane_support;
#[path = "real_stack/serving.rs"]
mod serving;

fn main() -> std::process::ExitCode {
    plane_support::harness::main(serving::cases())
}
