//! Live reload: watch a file's directory, re-read the file on change, validate, and swap the new
//! value into an `ArcSwap` — or reject it, log every problem, count it, and keep serving the last
//! good value.
//!
//! The directory is watched, not the file: an editor that writes by rename replaces the file's
//! inode, and a mounted ConfigMap swaps its `..data` symlink; a watch on the file itself would
//! miss both. Events are coalesced (a short settle delay) and a content that did not change is
//! not re-applied.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use notify::{RecursiveMode, Watcher};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tracing::{Instrument, info, info_span, warn};

use super::parse::Problems;
use crate::telemetry::config::{ConfigLabels, ConfigMetrics};

/// How long to wait after a change event for more events before reading (editors and the
/// kubelet write in several steps).
const SETTLE: Duration = Duration::from_millis(50);

/// Whether a directory event may have changed a watched file. Any event may be ours (renames,
/// symlink swaps), and content dedup keeps unrelated ones cheap; errors are re-checked the same
/// way. Read accesses are not: inotify reports opens and closes-without-write, so counting them
/// would make every re-read (this watch's or another watch's on the same directory) trigger the
/// next one — a loop re-reading the files ~20 times a second forever. A close after writing
/// still counts.
fn may_change_content(res: &notify::Result<notify::Event>) -> bool {
    use notify::event::{AccessKind, AccessMode, EventKind};
    match res {
        Ok(e) => match e.kind {
            EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
            EventKind::Access(_) => false,
            _ => true,
        },
        Err(_) => true,
    }
}

/// The result of one reload attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The file changed and the new value is now in force.
    Applied,
    /// The file changed but is invalid (or unreadable); the previous value is still in force.
    Rejected(Problems),
}

/// A reload attempt, numbered so a waiter can tell a new event from one it has seen.
#[derive(Debug, Clone, PartialEq)]
pub struct ReloadEvent {
    pub generation: u64,
    pub outcome: Option<Outcome>,
}

/// A running watch. Dropping it stops watching.
pub struct FileWatch {
    events: watch::Receiver<ReloadEvent>,
    _watcher: notify::RecommendedWatcher,
    task: JoinHandle<()>,
}

impl FileWatch {
    /// Reload events (the initial value has generation 0 and no outcome).
    pub fn events(&self) -> watch::Receiver<ReloadEvent> {
        self.events.clone()
    }
}

impl Drop for FileWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Watches `path` and keeps `target` at the last valid value `load` returned for it.
///
/// `target` must already hold the current (valid) value; the file's current content counts as
/// seen. `name` labels logs and the `thaw_config_reloads_total` /
/// `thaw_config_reload_rejected_total` counters. Must be called inside a tokio runtime.
pub fn watch_file<T, F>(
    path: &Path,
    name: &str,
    load: F,
    target: Arc<ArcSwap<T>>,
    metrics: ConfigMetrics,
) -> notify::Result<FileWatch>
where
    T: Send + Sync + 'static,
    F: Fn(&Path) -> Result<T, Problems> + Send + 'static,
{
    let path = absolute(path);
    let dir = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let changed = Arc::new(Notify::new());
    let notify_cb = Arc::clone(&changed);
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if may_change_content(&res) {
            notify_cb.notify_one();
        }
    })?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;

    let (tx, rx) = watch::channel(ReloadEvent {
        generation: 0,
        outcome: None,
    });
    let labels = ConfigLabels {
        config: name.to_string(),
    };
    let span = info_span!("config_watch", config = %name, path = %path.display());
    let mut last = std::fs::read(&path).ok();
    let task = tokio::spawn(
        async move {
            loop {
                changed.notified().await;
                tokio::time::sleep(SETTLE).await;
                let now = std::fs::read(&path).ok();
                if now.is_some() && now == last {
                    continue;
                }
                let outcome = apply(load(&path), &target, &metrics, &labels);
                last = now;
                tx.send_modify(|e| {
                    e.generation += 1;
                    e.outcome = Some(outcome);
                });
            }
        }
        .instrument(span),
    );
    Ok(FileWatch {
        events: rx,
        _watcher: watcher,
        task,
    })
}

/// Stores a valid update into `target`, or rejects an invalid one: each problem is logged with
/// its key, value and reason, the rejection is counted, and the last good value stays. The one
/// place both the file watch and the ConfigMap watch ([`super::live`]) decide.
pub fn apply<T>(
    update: Result<T, Problems>,
    target: &ArcSwap<T>,
    metrics: &ConfigMetrics,
    labels: &ConfigLabels,
) -> Outcome {
    match update {
        Ok(v) => {
            target.store(Arc::new(v));
            metrics.reloads.get_or_create(labels).inc();
            info!("configuration reloaded");
            Outcome::Applied
        }
        Err(problems) => {
            metrics.rejected.get_or_create(labels).inc();
            for p in &problems.0 {
                warn!(key = %p.key, value = %p.value, reason = %p.reason,
                    "configuration update rejected; the last good configuration \
                     stays in force");
            }
            Outcome::Rejected(problems)
        }
    }
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}

#[cfg(test)]
mod tests;
