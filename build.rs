//! Build script: the git commit for `thaw_build_info` and `thaw --version`
//! (`THAW_GIT_COMMIT`), from the environment when set (`THAW_GIT_COMMIT`, else `GIT_COMMIT`:
//! the Dockerfile's build argument, as the image is built without `.git`), else
//! `git rev-parse`, else `unknown`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=THAW_GIT_COMMIT");
    println!("cargo:rerun-if-env-changed=GIT_COMMIT");
    // HEAD moves on checkout; logs/HEAD changes on every commit of this worktree.
    for path in ["HEAD", "logs/HEAD"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    let from_env = |name: &str| std::env::var(name).ok().filter(|c| !c.trim().is_empty());
    let commit = from_env("THAW_GIT_COMMIT")
        .or_else(|| from_env("GIT_COMMIT"))
        .map(|c| c.trim().to_string())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    assert!(
        commit.len() <= 64
            && commit
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)),
        "GIT_COMMIT / THAW_GIT_COMMIT: expected a commit id (letters, digits, . _ -; at most 64), got {commit:?}"
    );
    println!("cargo:rustc-env=THAW_GIT_COMMIT={commit}");
}
