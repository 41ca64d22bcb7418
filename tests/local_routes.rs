//! End-to-end tests of what `thaw local` says about its routes: `/routes` on the admin port
//! (each route's traffic as `kn service describe` shows it), the log lines when a revision
//! becomes ready or a route is pinned, and a `containerPort` that is thaw's own data port. The
//! real binary and sample app, real sockets, the real clock; every wait polls with a deadline.

mod local_e2e_support;

use local_e2e_support::*;

const HOST: &str = "hello.default.example.com";

/// The route of service `name` in `/routes`.
async fn route(thaw: &Thaw, name: &str) -> serde_json::Value {
    let v = thaw.admin_json("/routes").await;
    v["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["service"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no route of {name} in {v:#}"))
}

/// A 50/50 split between a pinned revision and the latest one, with a tag: `/routes` shows
/// each target with its percent and tag host, the log says which share the new revision got
/// (not "all traffic"), the pin on a revision numbered at this start is warned about, and
/// requests reach both revisions through the route host and the new one through its tag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_show_the_split_and_tags_and_the_log_says_the_share() {
    let thaw = Thaw::start(
        &local_yaml(&[service("hello", &[], "one", "")]),
        FAST_AUTOSCALER,
        FAST_ACTIVATOR,
    );
    let url = format!("http://{HOST}:{}", thaw.data.port());
    let r = route(&thaw, "hello").await;
    assert_eq!(r["namespace"], "default");
    assert_eq!(r["host"], HOST);
    assert_eq!(r["url"], url.as_str());
    assert_eq!(
        r["traffic"],
        serde_json::json!([{"revisionName": "hello-00001", "percent": 100,
            "latestRevision": true, "tag": null, "tagHost": null}])
    );
    assert!(
        thaw.log_contains(&format!("route {url} -> hello-00001 100%")),
        "{}",
        thaw.dump_logs()
    );

    thaw.edit(
        "local.yaml",
        &local_yaml(&[service("hello", &[], "two", "")
            + "      traffic:\n        - {revisionName: hello-00001, percent: 50}\n        - {latestRevision: true, percent: 50, tag: next}\n"]),
    );
    until(&thaw, "the latest target on hello-00002", || async {
        route(&thaw, "hello").await["traffic"][1]["revisionName"] == "hello-00002"
    })
    .await;
    let r = route(&thaw, "hello").await;
    assert_eq!(
        r["traffic"],
        serde_json::json!([
            {"revisionName": "hello-00001", "percent": 50, "latestRevision": false,
                "tag": null, "tagHost": null},
            {"revisionName": "hello-00002", "percent": 50, "latestRevision": true,
                "tag": "next", "tagHost": "next-hello.default.example.com"},
        ])
    );
    assert!(
        thaw.log_contains("revision ready; hello.default.example.com sends it 50% of requests"),
        "{}",
        thaw.dump_logs()
    );
    assert!(
        !thaw.log_contains("previous=Some"),
        "no Rust debug output in the log:\n{}",
        thaw.dump_logs()
    );
    assert!(
        thaw.log_contains(
            "traffic pins revisionName hello-00001, a revision numbered at this start"
        ),
        "{}",
        thaw.dump_logs()
    );
    // Both revisions answer on the route host (each request draws its share).
    let seen = std::sync::Mutex::new((false, false));
    until(&thaw, "answers from both revisions", || async {
        let body = thaw.get(HOST, "/").await.2;
        let mut seen = seen.lock().unwrap();
        match body.as_str() {
            "Hello from one!\n" => seen.0 = true,
            "Hello from two!\n" => seen.1 = true,
            other => panic!("unexpected answer {other:?}"),
        }
        seen.0 && seen.1
    })
    .await;
    let (status, _, body) = thaw.get("next-hello.default.example.com", "/").await;
    assert_eq!((status, body.as_str()), (200, "Hello from two!\n"));
}

/// Knative's samples listen on 8080, thaw's own data port: the replica is given another port
/// and the log names the clash as thaw's data port (not "another replica").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_port_that_is_thaws_data_port_is_named_so() {
    // A port the kernel picked, free when thaw binds it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let svc = service("hello", &[], "one", "").replace(
        "            - command: [thaw, sample-app]\n",
        &format!(
            "            - command: [thaw, sample-app]\n              ports: [{{containerPort: {port}}}]\n"
        ),
    );
    let thaw = Thaw::start_on(
        &local_yaml(&[svc]),
        &format!("127.0.0.1:{port}"),
        "127.0.0.1:0",
    );
    assert_eq!(thaw.data.port(), port);
    let (status, _, body) = thaw.get(HOST, "/").await;
    assert_eq!((status, body.as_str()), (200, "Hello from one!\n"));
    assert!(
        thaw.log_contains(&format!(
            "containerPort {port} is thaw's data port (--listen); this replica gets PORT="
        )),
        "{}",
        thaw.dump_logs()
    );
    assert!(
        !thaw.log_contains("another replica"),
        "{}",
        thaw.dump_logs()
    );
}
