use std::time::Duration;

use super::*;
use crate::config::AutoscalerConfig;
use crate::config::load::from_manifest;

fn manifest(data: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: config-autoscaler\ndata:\n{data}")
}

/// Waits for the next reload event after `seen`, with a generous deadline (a notification,
/// not a fixed sleep).
async fn next(rx: &mut watch::Receiver<ReloadEvent>) -> Outcome {
    tokio::time::timeout(Duration::from_secs(20), rx.changed())
        .await
        .expect("no reload event within 20s")
        .expect("watch closed");
    rx.borrow_and_update().outcome.clone().expect("an outcome")
}

fn start(path: &Path) -> (Arc<ArcSwap<AutoscalerConfig>>, FileWatch) {
    let initial = from_manifest::<AutoscalerConfig>(path).unwrap();
    let live = Arc::new(ArcSwap::from_pointee(initial));
    let w = watch_file(
        path,
        "config-autoscaler",
        from_manifest::<AutoscalerConfig>,
        Arc::clone(&live),
        ConfigMetrics::default(),
    )
    .unwrap();
    (live, w)
}

#[tokio::test]
async fn invalid_update_keeps_old_config_then_valid_update_applies() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config-autoscaler.yaml");
    std::fs::write(&path, manifest("  stable-window: 30s\n")).unwrap();
    let (live, w) = start(&path);
    let mut rx = w.events();
    assert_eq!(live.load().stable_window, Duration::from_secs(30));

    std::fs::write(
        &path,
        manifest("  stable-window: 5s\n  max-scale-up-rate: 0.5\n"),
    )
    .unwrap();
    match next(&mut rx).await {
        Outcome::Rejected(p) => {
            let keys: Vec<_> = p.0.iter().map(|p| p.key.as_str()).collect();
            assert_eq!(keys, ["max-scale-up-rate", "stable-window"]);
        }
        o => panic!("expected a rejection, got {o:?}"),
    }
    assert_eq!(
        live.load().stable_window,
        Duration::from_secs(30),
        "old config still in force"
    );

    std::fs::write(&path, manifest("  stable-window: 90s\n")).unwrap();
    assert_eq!(next(&mut rx).await, Outcome::Applied);
    assert_eq!(live.load().stable_window, Duration::from_secs(90));
}

#[tokio::test]
async fn write_by_rename_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config-autoscaler.yaml");
    std::fs::write(&path, manifest("  stable-window: 30s\n")).unwrap();
    let (live, w) = start(&path);
    let mut rx = w.events();
    let tmp = dir.path().join(".config-autoscaler.yaml.swp");
    std::fs::write(&tmp, manifest("  stable-window: 45s\n")).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    assert_eq!(next(&mut rx).await, Outcome::Applied);
    assert_eq!(live.load().stable_window, Duration::from_secs(45));
}

#[tokio::test]
async fn configmap_volume_symlink_swap_is_seen() {
    // The kubelet's layout: file -> ..data/file, ..data -> ..<timestamp>; an update writes a new
    // timestamped directory and renames a new ..data symlink over the old one.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("..v1")).unwrap();
    std::fs::write(
        d.join("..v1/config-autoscaler.yaml"),
        manifest("  stable-window: 30s\n"),
    )
    .unwrap();
    std::os::unix::fs::symlink("..v1", d.join("..data")).unwrap();
    std::os::unix::fs::symlink(
        "..data/config-autoscaler.yaml",
        d.join("config-autoscaler.yaml"),
    )
    .unwrap();
    let path = d.join("config-autoscaler.yaml");
    let (live, w) = start(&path);
    let mut rx = w.events();

    std::fs::create_dir(d.join("..v2")).unwrap();
    std::fs::write(
        d.join("..v2/config-autoscaler.yaml"),
        manifest("  stable-window: 120s\n"),
    )
    .unwrap();
    std::os::unix::fs::symlink("..v2", d.join("..data_tmp")).unwrap();
    std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
    assert_eq!(next(&mut rx).await, Outcome::Applied);
    assert_eq!(live.load().stable_window, Duration::from_secs(120));
}

#[test]
fn accesses_do_not_trigger_a_reload_but_changes_and_errors_do() {
    use notify::event::{AccessKind, AccessMode, CreateKind, DataChange, EventKind, ModifyKind};
    let event = |kind| Ok(notify::Event::new(kind));
    // A re-read opens and closes the file: were those counted, each read would cause the next.
    assert!(!may_change_content(&event(EventKind::Access(
        AccessKind::Open(AccessMode::Any)
    ))));
    assert!(!may_change_content(&event(EventKind::Access(
        AccessKind::Close(AccessMode::Read)
    ))));
    assert!(may_change_content(&event(EventKind::Access(
        AccessKind::Close(AccessMode::Write)
    ))));
    assert!(may_change_content(&event(EventKind::Modify(
        ModifyKind::Data(DataChange::Any)
    ))));
    assert!(may_change_content(&event(EventKind::Create(
        CreateKind::File
    ))));
    assert!(may_change_content(&event(EventKind::Any)));
    assert!(may_change_content(&Err(notify::Error::generic(
        "watch failed"
    ))));
}
