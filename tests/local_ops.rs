//! End-to-end tests of what operators see in `thaw local`: Knative's rules where thaw used to
//! differ (revision garbage collection), logs, signals and the local platform's reports. The
//! real binary and sample app, real sockets, the real clock; every wait polls with a deadline.

mod local_e2e_support;

use local_e2e_support::*;

const HOST: &str = "hello.default.example.com";

fn names(v: &serde_json::Value) -> Vec<String> {
    let mut n: Vec<String> = v["revisions"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| r["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    n.sort();
    n
}

/// config-gc with only a count rule: no non-active revision is kept.
const GC_KEEP_NONE: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: config-gc\ndata:\n  retain-since-create-time: disabled\n  retain-since-last-active-time: disabled\n  min-non-active-revisions: \"0\"\n  max-non-active-revisions: \"0\"\n";

fn with_gc(local: String) -> String {
    local.replace("configMaps:\n", "configMaps:\n  gc: config-gc.yaml\n")
}

/// Every edit of a revision template makes a revision; config-gc's rules collect the old ones
/// once the route has moved on, from the platform and from /revisions. The routed revision is
/// never collected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_revisions_are_collected_by_config_gc_and_the_routed_one_never() {
    let thaw = Thaw::start_with(
        &with_gc(local_yaml(&[service("hello", &[], "one", "")])),
        FAST_AUTOSCALER,
        FAST_ACTIVATOR,
        &[("config-gc.yaml", GC_KEEP_NONE)],
    );
    assert_eq!(thaw.get(HOST, "/").await.2, "Hello from one!\n");
    for (n, target) in [(2, "two"), (3, "three")] {
        thaw.edit(
            "local.yaml",
            &with_gc(local_yaml(&[service("hello", &[], target, "")])),
        );
        let want = format!("Hello from {target}!\n");
        until(&thaw, &format!("traffic on hello-0000{n}"), || async {
            thaw.get(HOST, "/").await.2 == want
        })
        .await;
    }
    until(&thaw, "hello-00001 and hello-00002 collected", || async {
        names(&thaw.admin_json("/revisions").await) == ["hello-00003"]
    })
    .await;
    assert!(
        thaw.log_contains("revision collected (config-gc)"),
        "{}",
        thaw.dump_logs()
    );
    // The routed revision still serves, and keeps serving after more GC rounds.
    assert_eq!(thaw.get(HOST, "/").await.2, "Hello from three!\n");
}
