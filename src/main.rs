//! The `thaw` binary: one executable, several roles.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use thaw::cli::EXIT_CODES;

/// jemalloc: less CPU per request than glibc's malloc on the proxy path, and memory a held
/// connection reserves but never writes (hyper's buffers) stays unbacked (docs/decisions.md).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Debug, Parser)]
#[command(
    name = "thaw",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("THAW_GIT_COMMIT"), ")"),
    about = "A scale-to-zero serving data plane",
    after_help = EXIT_CODES
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the activator, the autoscaler and local replicas in one process (no cluster).
    #[command(after_help = EXIT_CODES)]
    Local(thaw::local::run::LocalArgs),
    /// The activator on Kubernetes: holds cold requests, balances, reports to the autoscaler.
    #[command(after_help = EXIT_CODES)]
    Activator(thaw::roles::activator::ActivatorArgs),
    /// The autoscaler on Kubernetes: Knative's KPA over every Revision, leader-elected.
    #[command(after_help = EXIT_CODES)]
    Autoscaler(thaw::roles::autoscaler::AutoscalerArgs),
    /// Knative's Service, Configuration, Revision and Route reconcilers, leader-elected.
    #[command(after_help = EXIT_CODES)]
    Controller(thaw::roles::controller::ControllerArgs),
    /// Knative's defaulting and validating admission webhooks, with self-managed certificates.
    #[command(after_help = EXIT_CODES)]
    Webhook(thaw::roles::webhook::WebhookArgs),
    /// Configuration tools.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Moving from Knative Serving to thaw.
    Migrate {
        #[command(subcommand)]
        command: MigrateCommand,
    },
    /// A tiny HTTP/1.1 + h2c server to run as a replica (hello, /stream, /healthz).
    #[command(after_help = EXIT_CODES)]
    SampleApp(thaw::sample_app::SampleAppArgs),
    /// Replay a traffic trace through the autoscaler on a virtual clock.
    #[command(after_help = EXIT_CODES)]
    Simulate(thaw::autoscaler::simulate::SimulateArgs),
    /// The per-pod sidecar in front of the user container (settings from the environment).
    Queue(thaw::queue::QueueArgs),
    /// Print the serving.knative.dev/v1 CRDs (Service, Configuration, Revision, Route).
    Crds(thaw::knative::cmd::CrdsArgs),
    /// Check Knative objects (files or `kubectl get -o yaml` on stdin) as the controller would,
    /// under given config-features, config-defaults and config-autoscaler files.
    #[command(after_help = EXIT_CODES)]
    Validate(thaw::knative::check::ValidateArgs),
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Validate ConfigMap files and print the effective configuration.
    #[command(after_help = EXIT_CODES)]
    Check(thaw::config::check::CheckArgs),
}

#[derive(Debug, Subcommand)]
enum MigrateCommand {
    /// Write thaw's ConfigMaps from Knative's (files or a live cluster), naming every key
    /// that has no effect in thaw.
    #[command(after_help = EXIT_CODES)]
    Config(thaw::config::migrate::MigrateConfigArgs),
    /// The way back: once Knative's controller runs again, re-own thaw's children to
    /// Knative's ServerlessServices, PodAutoscalers and KIngresses (checked by UID) and
    /// remove what only thaw used. Exit 3: some wait for Knative; run it again.
    #[command(after_help = EXIT_CODES)]
    HandBack(thaw::controller::adopt::hand_back::cli::HandBackArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Local(args) => thaw::local::run::main(args),
        Command::Activator(args) => thaw::roles::activator::main(args),
        Command::Autoscaler(args) => thaw::roles::autoscaler::main(args),
        Command::Controller(args) => thaw::roles::controller::main(args),
        Command::Webhook(args) => thaw::roles::webhook::main(args),
        Command::Config {
            command: ConfigCommand::Check(args),
        } => thaw::config::check::run(&args),
        Command::Migrate {
            command: MigrateCommand::Config(args),
        } => thaw::config::migrate::run(&args),
        Command::Migrate {
            command: MigrateCommand::HandBack(args),
        } => thaw::controller::adopt::hand_back::cli::main(&args),
        Command::SampleApp(args) => thaw::sample_app::run(&args),
        Command::Simulate(args) => thaw::autoscaler::simulate::run(&args),
        Command::Crds(args) => thaw::knative::cmd::run(&args),
        Command::Validate(args) => thaw::knative::check::run(&args),
        Command::Queue(args) => thaw::queue::run(&args),
    }
}
