//! What the controller writes to Revisions: it creates them, replaces their status and
//! merge-patches their metadata (routing state, routes annotation), and never sends a spec
//! update to an existing one (Knative's Revisions are immutable; a changed spec would roll
//! its pods). Every reconciler runs in-process against the in-process API server through the
//! relay, which keeps every write's bytes. Waits poll with deadlines; nothing asserts a
//! duration.

mod kube_support;

use std::future::Future;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use thaw::controller::{Ctx, Settings};
use thaw::knative::{Configuration, Revision, Service};

const NS: &str = "default";

async fn until<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn service(target: &str, traffic: Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": "hello", "namespace": NS},
        "spec": {
            "template": {"spec": {"containers": [{
                "image": "ghcr.io/knative/helloworld-go:latest",
                "env": [{"name": "TARGET", "value": target}],
            }]}},
            "traffic": traffic,
        },
    }))
    .unwrap()
}

/// The JSON body of a write's bytes (after the head).
fn body(bytes: &[u8]) -> Value {
    let at = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a request head");
    serde_json::from_slice(&bytes[at + 4..]).unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_never_updates_an_existing_revisions_spec() {
    let api = kube_support::TestApi::start().await;
    let relay = kube_support::relay::Relay::start(api.addr()).await;
    let direct = api.client();
    let ctx = Ctx::new(kube_support::client_at(relay.addr()), Settings::default());
    let task = tokio::spawn(thaw::roles::controller::run_controllers(ctx.clone()));
    let svcs: Api<Service> = Api::namespaced(direct.clone(), NS);
    let revs: Api<Revision> = Api::namespaced(direct.clone(), NS);
    let cfgs: Api<Configuration> = Api::namespaced(direct.clone(), NS);

    svcs.create(&PostParams::default(), &service("v1", json!([])))
        .await
        .unwrap();
    let first = until("hello-00001", || async {
        revs.get_opt("hello-00001").await.ok().flatten()
    })
    .await;

    // What could tempt a reconciler to rewrite it: other config-defaults in force (every
    // object re-queued), traffic pinned to it by name (the Route labels it), then a new
    // template (a second revision the route moves to).
    let mut settings = Settings::default();
    settings.defaults.container_concurrency = 5;
    settings.defaults.revision_timeout = Duration::from_secs(77);
    ctx.set_settings(settings);
    let pinned = json!([{"revisionName": "hello-00001", "percent": 100}]);
    // Patches, not read-and-replace: the controller writes the Service's status meanwhile.
    let spec_patch = |s: Service| json!({"spec": serde_json::to_value(s.spec).unwrap()});
    svcs.patch(
        "hello",
        &PatchParams::default(),
        &Patch::Merge(spec_patch(service("v1", pinned))),
    )
    .await
    .unwrap();
    svcs.patch(
        "hello",
        &PatchParams::default(),
        &Patch::Merge(spec_patch(service("v2", json!([])))),
    )
    .await
    .unwrap();
    let second = until("hello-00002", || async {
        revs.get_opt("hello-00002").await.ok().flatten()
    })
    .await;
    assert_eq!(
        second.spec.container_concurrency,
        Some(5),
        "the new defaults are in force"
    );
    until("the Configuration's status naming hello-00002", || async {
        let c = cfgs.get("hello").await.ok()?;
        (c.status?.fields.latest_created_revision_name.as_deref() == Some("hello-00002"))
            .then_some(())
    })
    .await;
    let routed = until("the Route's labeler patch of hello-00001", || async {
        relay
            .writes()
            .iter()
            .any(|(l, _)| l.starts_with("PATCH ") && l.contains("/revisions/hello-00001"))
            .then_some(())
    })
    .await;
    let () = routed;

    let now = revs.get("hello-00001").await.unwrap();
    assert_eq!(now.spec, first.spec, "hello-00001's spec changed");
    let writes = relay.writes();
    // The relay saw the controller's writes to Revisions: their creation carries a spec.
    assert!(
        writes.iter().any(|(l, b)| l.starts_with("POST ")
            && l.contains("/revisions?")
            && body(b).get("spec").is_some()),
        "no Revision creation seen: {:?}",
        writes.iter().map(|(l, _)| l).collect::<Vec<_>>()
    );
    for (line, bytes) in writes.iter().filter(|(l, _)| l.contains("/revisions/")) {
        let path = line.split(' ').nth(1).unwrap_or("");
        let path = path.split('?').next().unwrap_or("");
        if path.ends_with("/status") {
            continue;
        }
        assert!(
            line.starts_with("PATCH "),
            "a write to an existing Revision other than a metadata patch: {line}"
        );
        let b = body(bytes);
        let keys: Vec<&String> = b
            .as_object()
            .map(|o| o.keys().collect())
            .unwrap_or_default();
        assert!(
            keys.iter()
                .all(|k| ["metadata", "apiVersion", "kind"].contains(&k.as_str())),
            "{line} sends more than metadata: {b}"
        );
    }
    task.abort();
}
