//! `thaw crds`: prints the CRDs of [`super::crds`], or writes one file per kind.

use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `thaw crds`.
#[derive(Debug, clap::Args)]
pub struct CrdsArgs {
    /// Write one file per kind into this directory (as `deploy/crds/` holds them) instead of
    /// printing every CRD to stdout as one multi-document stream.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Runs `thaw crds`. Exit 0, or 1 when a file cannot be written (named in the error).
pub fn run(args: &CrdsArgs) -> ExitCode {
    let crds = super::crds();
    match &args.dir {
        None => {
            let docs: Vec<String> = crds.iter().map(super::crd_yaml).collect();
            print!("{}", docs.join("---\n"));
            ExitCode::SUCCESS
        }
        Some(dir) => {
            for crd in &crds {
                let path = dir.join(super::crd_file_name(crd));
                if let Err(e) = std::fs::write(&path, super::crd_yaml(crd)) {
                    eprintln!("error: writing {}: {e}", path.display());
                    return ExitCode::from(1);
                }
            }
            ExitCode::SUCCESS
        }
    }
}
