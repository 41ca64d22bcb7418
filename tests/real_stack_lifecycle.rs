//! The whole stack on the real control plane: the lifecycle cases (tests/real_stack/lifecycle.rs), on a
//! plane of their own (`plane_support::harness`).

#[allow(dead_code, reason = "the plane's gateway pod uses part of it")]
#[path = "kube_support/gateway.rs"]
mod gateway;
#[path = "real_stack/lifecycle.rs"]
mod lifecycle;
mod plane_support;

fn main() -> std::process::ExitCode {
    plane_support::harness::main(lifecycle::cases())
}
