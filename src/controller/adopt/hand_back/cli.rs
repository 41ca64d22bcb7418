//! The command line of `thaw migrate hand-back` ([`super`]): one run against the cluster the
//! roles' client reaches (in-cluster or `KUBECONFIG`), one line per object on stdout, a
//! summary on stderr, and the exit code the operator loops on.

use std::process::ExitCode;

use super::{HandBackError, Options, Verdict};

/// Exit code 3: objects wait for their Knative parent; run it again.
pub const EXIT_WAITING: u8 = 3;

/// Arguments of `thaw migrate hand-back`.
#[derive(Debug, clap::Args)]
pub struct HandBackArgs {
    /// List what would be done; write nothing (the exit code says whether all of it could be
    /// done now).
    #[arg(long)]
    pub dry_run: bool,
    /// Only this namespace (every namespace by default).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// thaw's namespace: its controller's and autoscaler's Deployments and its webhook Service.
    #[arg(long, default_value = crate::config::live::SYSTEM_NAMESPACE)]
    pub thaw_namespace: String,
}

/// Runs the command: 0 when everything is handed back, 3 while something waits for
/// Knative's controller (run it again), 1 when thaw still runs, something was refused (a
/// chain that does not lead to its parent), a write failed, or the API server cannot be
/// reached.
pub fn main(args: &HandBackArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            crate::cli::say(format!(
                "thaw migrate hand-back: cannot start a runtime: {e}"
            ));
            return crate::cli::invalid();
        }
    };
    let opts = Options {
        dry_run: args.dry_run,
        namespace: args.namespace.clone(),
        thaw_namespace: args.thaw_namespace.clone(),
    };
    let ran = rt.block_on(async {
        let client = kube::Client::try_default()
            .await
            .map_err(|e| format!("no Kubernetes client configuration: {e}"))?;
        super::run(&client, &opts).await.map_err(|e| match e {
            HandBackError::ThawRunning(m) => m,
            HandBackError::Kube(e) => format!("the API server: {e}"),
        })
    });
    let report = match ran {
        Ok(r) => r,
        Err(m) => {
            crate::cli::say(format!("thaw migrate hand-back: {m}"));
            return crate::cli::invalid();
        }
    };
    let mut text = String::new();
    for l in &report.lines {
        text.push_str(&l.to_string());
        text.push('\n');
    }
    crate::cli::out(&text);
    let verdict = report.verdict();
    crate::cli::say(match verdict {
        Verdict::HandedBack if args.dry_run => {
            "thaw migrate hand-back: dry run; everything listed can be handed back now"
        }
        Verdict::HandedBack => "thaw migrate hand-back: everything is Knative's",
        Verdict::Waiting => {
            "thaw migrate hand-back: some objects wait for Knative's controller; run it again"
        }
        Verdict::Incomplete => {
            "thaw migrate hand-back: some objects were refused or not written (see above)"
        }
    });
    match verdict {
        Verdict::HandedBack => ExitCode::SUCCESS,
        Verdict::Waiting => ExitCode::from(EXIT_WAITING),
        Verdict::Incomplete => crate::cli::invalid(),
    }
}
