//! The harness of a test target on the plane: the target's `main` calls [`main`] with its
//! cases. It lists and filters like libtest (libtest-mimic); when a case is to run, it builds
//! the plane's Go binaries, re-executes the binary in the plane's namespaces, starts the
//! plane, installs thaw (or only the ingress, [`Setup`]), and runs each case in a namespace of its own (deleted when it
//! passes). The same binary, run by the kubelet stand-in as the ingress gateway pod, plays
//! that pod instead ([`install::POD_ROLE_ENV`]).

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};
use libtest_mimic::{Arguments, Failed, Trial};

use super::{Plane, install, netns};

/// A case: the plane and its own namespace.
pub type CaseFn = fn(Arc<Plane>, String) -> Pin<Box<dyn Future<Output = ()> + Send>>;

/// Held by a case while it changes thaw-system's ConfigMaps: such cases run one at a time.
pub static SYSTEM_CONFIG: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Every case runs holding it: shared by ordinary cases, alone by an exclusive one (a case
/// that disturbs the whole plane: a role's leader killed, a rollout, the API server
/// restarted), so no other case runs through its disturbance.
static PLANE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// One case of a target.
pub struct Case {
    pub name: &'static str,
    pub run: CaseFn,
    /// Runs with no other case beside it ([`exclusive_case!`]).
    pub exclusive: bool,
    /// Run only when asked (`--ignored`, `--include-ignored`): a case whose ground another
    /// case of the target covers, kept out of the suite's time budget ([`ignored_case!`]).
    pub ignored: bool,
}

/// A [`Case`] for an `async fn name(plane: Arc<Plane>, ns: String)`.
#[macro_export]
macro_rules! case {
    ($f:path) => {
        $crate::plane_support::harness::Case {
            name: stringify!($f).rsplit("::").next().unwrap().trim(),
            run: (|p, ns| Box::pin($f(p, ns))) as $crate::plane_support::harness::CaseFn,
            exclusive: false,
            ignored: false,
        }
    };
}

/// An [`exclusive_case!`] run only when asked (`--ignored`).
#[macro_export]
macro_rules! ignored_case {
    ($f:path) => {
        $crate::plane_support::harness::Case {
            ignored: true,
            ..$crate::exclusive_case!($f)
        }
    };
}

/// A [`Case`] that runs alone: one that disturbs what every case relies on.
#[macro_export]
macro_rules! exclusive_case {
    ($f:path) => {
        $crate::plane_support::harness::Case {
            exclusive: true,
            ..$crate::case!($f)
        }
    };
}

/// What the plane gets before the cases run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    /// thaw as the README installs it, with the ingress ([`install::install`]).
    Thaw,
    /// Only the ingress (Istio's CRDs and the gateway pod, [`install::install_ingress`]): a
    /// cluster before any Knative, for targets that install Knative (and thaw later, if at
    /// all) in their cases. Such a target's cases run one at a time in the order given,
    /// whatever `--test-threads` says: a case may leave the cluster moved on for the next
    /// (the move onto thaw deletes Knative), so the order is part of the target.
    IngressOnly,
}

/// Runs `cases` on one plane with thaw installed; the target's exit code.
pub fn main(cases: Vec<Case>) -> ExitCode {
    main_with(cases, Setup::Thaw)
}

/// Runs `cases` on one plane set up as `setup` says; the target's exit code.
pub fn main_with(cases: Vec<Case>, setup: Setup) -> ExitCode {
    if std::env::var(install::POD_ROLE_ENV).as_deref() == Ok("ingress-gateway") {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(install::run_ingress_gateway());
        return ExitCode::SUCCESS;
    }
    let mut args = Arguments::from_args();
    if setup == Setup::IngressOnly {
        args.test_threads = Some(1);
    }
    let listed = || {
        cases
            .iter()
            .map(|c| Trial::test(c.name, || Ok(())).with_ignored_flag(c.ignored))
            .collect::<Vec<_>>()
    };
    let runs = listed()
        .iter()
        .any(|t| !args.is_filtered_out(t) && !args.is_ignored(t));
    if args.list || !runs {
        // Nothing to run here (a filter for other targets' tests): no plane.
        let trials = listed()
            .into_iter()
            .map(|t| {
                let name = t.name().to_string();
                Trial::test(name, || Ok(()))
            })
            .collect();
        return libtest_mimic::run(&args, trials).exit_code();
    }
    if !netns::inside() {
        if let Err(e) = super::build() {
            eprintln!("real_plane: {e}");
            return ExitCode::FAILURE;
        }
        return netns::reexec().unwrap_or_else(|e| {
            eprintln!("real_plane: {e}");
            ExitCode::FAILURE
        });
    }

    let rt = tokio::runtime::Runtime::new().unwrap();
    let bins = super::bin_dir().join("bin");
    let started = tokio::time::Instant::now();
    let plane = Arc::new(rt.block_on(Plane::start(&bins)));
    eprintln!(
        "real_plane: Kubernetes {} up in {:.1?}",
        super::KUBE_VERSION,
        started.elapsed()
    );
    let (what, installed) = match setup {
        Setup::Thaw => ("thaw", rt.block_on(install::install(&plane))),
        Setup::IngressOnly => ("the ingress", rt.block_on(install::install_ingress(&plane))),
    };
    if let Err(e) = installed {
        eprintln!(
            "real_plane: installing {what} failed: {e}\n{}",
            plane.dump()
        );
        return ExitCode::FAILURE;
    }
    eprintln!("real_plane: {what} installed in {:.1?}", started.elapsed());

    let trials = cases
        .into_iter()
        .map(
            |Case {
                 name,
                 run,
                 exclusive,
                 ignored,
             }| {
                let plane = plane.clone();
                let handle = rt.handle().clone();
                Trial::test(name, move || {
                    let ns = format!("case-{}", name.replace('_', "-"))
                        .chars()
                        .take(50)
                        .collect::<String>()
                        .trim_end_matches('-')
                        .to_string();
                    handle.block_on(async {
                        let _turn = if exclusive {
                            (None, Some(PLANE.write().await))
                        } else {
                            (Some(PLANE.read().await), None)
                        };
                        create_namespace(&plane, &ns).await;
                        let outcome = tokio::spawn(run(plane.clone(), ns.clone())).await;
                        match outcome {
                            Ok(()) => {
                                delete_namespace(&plane, &ns).await;
                                Ok(())
                            }
                            Err(e) => Err(Failed::from(panic_message(e))),
                        }
                    })
                })
                .with_ignored_flag(ignored)
            },
        )
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    if conclusion.has_failed() || std::env::var_os("REAL_PLANE_LOGS").is_some() {
        eprintln!("{}", plane.dump());
    }
    if (conclusion.has_failed() || std::env::var_os("REAL_PLANE_KEEP").is_some())
        && let Ok(plane) = Arc::try_unwrap(plane)
    {
        eprintln!(
            "real_plane: the plane's files are kept in {}",
            plane.keep().display()
        );
    }
    conclusion.exit_code()
}

fn panic_message(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(p) => p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".into()),
        Err(e) => e.to_string(),
    }
}

async fn create_namespace(plane: &Plane, ns: &str) {
    let api: Api<Namespace> = Api::all(plane.admin.clone());
    let obj: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": ns}
    }))
    .unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
    // Pods need the namespace's default ServiceAccount, made by the controller-manager.
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(plane.admin.clone(), ns);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while sas.get_opt("default").await.unwrap().is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{ns}: no default ServiceAccount"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Deletes a passed case's namespace; the namespace controller and the garbage collector
/// clean up behind it.
async fn delete_namespace(plane: &Plane, ns: &str) {
    let api: Api<Namespace> = Api::all(plane.admin.clone());
    let _ = api.delete(ns, &DeleteParams::default()).await;
}

pub fn show(what: &str, text: &str) {
    if std::env::var_os("REAL_PLANE_SHOW").is_some() {
        println!("----- {what} -----\n{text}");
    }
}

/// Writes `yaml` to a file in the plane's directory and applies it with kubectl in `ns`.
pub async fn apply(plane: &Plane, ns: &str, name: &str, yaml: &str) -> Result<String, String> {
    let path = plane.dir.path().join(format!("{ns}-{name}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    plane
        .kubectl(&["-n", ns, "apply", "-f", &path.display().to_string()])
        .await
}
