//! The local controller against the real process platform: revisions per template generation,
//! route moves to a new revision once it is ready, removal answers with a reason.

use std::sync::Arc;
use std::time::Duration;

use thaw::local::controller::LocalController;
use thaw::local::model::{LocalModel, from_file};
use thaw::platform::local::{LocalOptions, LocalPlatform};
use thaw::platform::{EndpointSource, EndpointStatus, Platform};
use thaw::revision::{RevisionCatalog, RevisionKey};
use thaw::telemetry::Telemetry;

const DEADLINE: Duration = Duration::from_secs(20);

fn model(target: &str) -> Arc<LocalModel> {
    let text = format!(
        "services:\n  - metadata: {{name: hello}}\n    spec:\n      template:\n        spec:\n          \
         containers:\n            - command: [thaw, sample-app]\n              env: [{{name: TARGET, value: {target}}}]\n"
    );
    Arc::new(from_file(thaw::local::config::parse(&text, "test").unwrap(), None).unwrap())
}

fn routed(catalog: &RevisionCatalog) -> Option<String> {
    catalog
        .load()
        .route_host("hello.default.example.com")
        .map(|s| s.key.name.to_string())
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_edit_rolls_to_next_revision_once_ready_and_removal_fails_held() {
    let telemetry = Telemetry::new();
    let opts = LocalOptions {
        thaw_exe: env!("CARGO_BIN_EXE_thaw").into(),
        ..Default::default()
    };
    let platform = LocalPlatform::new(opts, telemetry.platform.clone());
    let catalog = Arc::new(RevisionCatalog::default());
    let ctl = LocalController::start(platform.clone(), catalog.clone(), model("one"), 8080);
    let one = RevisionKey::new("default", "hello-00001");
    let two = RevisionKey::new("default", "hello-00002");
    assert_eq!(routed(&catalog).as_deref(), Some("hello-00001"));

    // The first revision becomes ready: the route stays on it.
    platform.scale(&one, 1).await.unwrap();
    let ep = platform.endpoints(&one);
    until("hello-00001 ready", || !ep.borrow().ready.is_empty()).await;

    // A template edit creates hello-00002; traffic stays on 00001 until 00002 is ready.
    ctl.apply(model("two"));
    let snap = catalog.load();
    assert!(
        snap.get(&two).is_some(),
        "the new revision is in the catalog"
    );
    assert!(
        snap.get(&one).is_some(),
        "the old one stays, reachable by its own host"
    );
    assert_eq!(routed(&catalog).as_deref(), Some("hello-00001"));
    // An unchanged template does not create a revision.
    ctl.apply(model("two"));
    assert!(
        catalog
            .load()
            .get(&RevisionKey::new("default", "hello-00003"))
            .is_none()
    );

    platform.scale(&two, 1).await.unwrap();
    until("route moves to hello-00002", || {
        routed(&catalog).as_deref() == Some("hello-00002")
    })
    .await;

    // Removing the service fails both revisions with the reason, then drops them.
    let empty = Arc::new(
        from_file(
            thaw::local::config::parse("services: []\n", "t").unwrap(),
            None,
        )
        .unwrap(),
    );
    ctl.apply(empty);
    for key in [&one, &two] {
        match &platform.endpoints(key).borrow().status {
            EndpointStatus::Failing { reason } => {
                assert!(
                    reason.contains("service default/hello was removed"),
                    "{reason}"
                )
            }
            s => panic!("{key}: expected Failing, got {s:?}"),
        }
    }
    assert!(catalog.load().is_empty());
    platform.shutdown().await;
}
