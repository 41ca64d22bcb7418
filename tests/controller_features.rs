//! Knative's field masks through `thaw controller` as a real process against the in-process API
//! server: a Revision that sets a field `config-features` keeps closed is `Ready=False` naming
//! the field and the key that opens it, with a Warning Event, and gets no Deployment; a live
//! edit of `config-features` opens the keyed fields and their Deployments are written with
//! them, while fields no key opens stay refused. And the upgrade case: a Revision whose
//! Deployment an earlier version already wrote keeps it untouched (not updated, not deleted,
//! its scale left to the autoscaler) while it reads `Ready=False` with the same message. And
//! `kubernetes.podspec-dryrun`: a pod the namespace refuses (a 403 injected by the relay, as
//! Pod Security admission answers) refuses the revision before any Deployment exists.
//! Waits poll with deadlines; nothing asserts a duration.

mod kube_e2e_support;
mod kube_support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube_e2e_support::*;
use serde_json::{Value, json};
use thaw::knative::duck::ConditionStatus;
use thaw::knative::{Revision, condition};

const WAIT: Duration = Duration::from_secs(30);

fn controller(c: &Cluster) -> Proc {
    c.spawn(
        "controller",
        &[
            "controller".into(),
            "--system-namespace".into(),
            SYSTEM.into(),
            "--namespace".into(),
            NS.into(),
            "--admin-listen".into(),
            format!("127.0.0.1:{}", free_port()),
            "--name".into(),
            "ctl".into(),
        ],
    )
}

/// A revision's spec: one container serving on 8080, with `pod` merged into the pod spec and
/// `container` into the container.
fn spec(pod: Value, container: Value) -> Value {
    let mut c = json!({"image": "registry.example/app", "ports": [{"containerPort": 8080}]});
    c.as_object_mut()
        .unwrap()
        .extend(container.as_object().unwrap().clone());
    let mut p = json!({"containers": [c]});
    p.as_object_mut()
        .unwrap()
        .extend(pod.as_object().unwrap().clone());
    p
}

/// One masked field: the revision's spec, the field's path under the pod spec, and the key
/// that opens it (`None`: no key does).
struct Case {
    name: &'static str,
    spec: Value,
    path: &'static str,
    key: Option<&'static str>,
}

fn cases() -> Vec<Case> {
    let mount = |extra: Value| {
        let mut m = json!({"name": "v", "mountPath": "/v"});
        m.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"volumeMounts": [m]})
    };
    vec![
        Case {
            name: "host-network",
            spec: spec(json!({"hostNetwork": true}), json!({})),
            path: "hostNetwork",
            key: Some("kubernetes.podspec-hostnetwork"),
        },
        Case {
            name: "host-pid",
            spec: spec(json!({"hostPID": true}), json!({})),
            path: "hostPID",
            key: Some("kubernetes.podspec-hostpid"),
        },
        Case {
            name: "node-selector",
            spec: spec(json!({"nodeSelector": {"disk": "ssd"}}), json!({})),
            path: "nodeSelector",
            key: Some("kubernetes.podspec-nodeselector"),
        },
        Case {
            name: "run-as-user",
            spec: spec(json!({"securityContext": {"runAsUser": 1000}}), json!({})),
            path: "securityContext.runAsUser",
            key: Some("kubernetes.podspec-securitycontext"),
        },
        Case {
            name: "add-sys-admin",
            spec: spec(
                json!({}),
                json!({"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}),
            ),
            path: "containers[0].securityContext.capabilities.add",
            key: Some("kubernetes.containerspec-addcapabilities"),
        },
        Case {
            name: "host-path",
            spec: spec(
                json!({"volumes": [{"name": "v", "hostPath": {"path": "/"}}]}),
                mount(json!({})),
            ),
            path: "volumes[0].hostPath",
            key: Some("kubernetes.podspec-volumes-hostpath"),
        },
        Case {
            name: "propagation",
            spec: spec(
                json!({"volumes": [{"name": "v", "emptyDir": {}}]}),
                mount(json!({"mountPropagation": "Bidirectional"})),
            ),
            path: "containers[0].volumeMounts[0].mountPropagation",
            key: Some("kubernetes.podspec-volumes-mount-propagation"),
        },
        Case {
            name: "field-ref",
            spec: spec(
                json!({}),
                json!({"env": [{"name": "NODE",
                    "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]}),
            ),
            path: "containers[0].env[0].valueFrom.fieldRef",
            key: Some("kubernetes.podspec-fieldref"),
        },
        Case {
            name: "privileged",
            spec: spec(json!({}), json!({"securityContext": {"privileged": true}})),
            path: "containers[0].securityContext.privileged",
            key: None,
        },
        Case {
            name: "host-port",
            spec: spec(
                json!({}),
                json!({"ports": [{"containerPort": 8080, "hostPort": 80}]}),
            ),
            path: "containers[0].ports[0].hostPort",
            key: None,
        },
        Case {
            name: "node-name",
            spec: spec(json!({"nodeName": "node-1"}), json!({})),
            path: "nodeName",
            key: None,
        },
    ]
}

fn revision(name: &str, spec: &Value) -> Revision {
    obj(json!({
        "apiVersion": "serving.knative.dev/v1", "kind": "Revision",
        "metadata": {"name": name, "namespace": NS,
            "labels": {"serving.knative.dev/service": "masks"}},
        "spec": spec,
    }))
}

/// `Ready=False` with a message holding every needle (the last status seen in the failure).
async fn refused(c: &Cluster, name: &str, needles: &[String]) -> String {
    let api: Api<Revision> = Api::namespaced(c.client.clone(), NS);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let r = api.get_opt(name).await.unwrap();
        let ready = r.as_ref().and_then(|r| {
            r.status
                .as_ref()?
                .status
                .condition(condition::READY)
                .cloned()
        });
        if let Some(ready) = &ready {
            let msg = ready.message.clone().unwrap_or_default();
            if ready.status == ConditionStatus::False
                && needles.iter().all(|n| msg.contains(n.as_str()))
            {
                return msg;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} not refused with {needles:?}; Ready: {ready:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value at `path` (`a.b[0].c`) of `v`.
fn lookup<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = v;
    for part in path.split('.') {
        let (name, index) = match part.split_once('[') {
            Some((n, i)) => (n, Some(i.trim_end_matches(']').parse::<usize>().unwrap())),
            None => (part, None),
        };
        cur = cur.get(name)?;
        if let Some(i) = index {
            cur = cur.get(i)?;
        }
    }
    Some(cur)
}

fn needles(case: &Case) -> Vec<String> {
    vec![
        format!("must not set the field(s): spec.{}", case.path),
        match case.key {
            Some(k) => format!("\"{k}: enabled\" in config-features opens it"),
            None => "no config-features key opens it".into(),
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_fields_are_refused_until_a_live_config_features_edit_opens_them() {
    let c = Cluster::start(json!({})).await;
    let _ctl = controller(&c);
    let revs: Api<Revision> = Api::namespaced(c.client.clone(), NS);
    let deps: Api<Deployment> = Api::namespaced(c.client.clone(), NS);
    let cases = cases();
    for case in &cases {
        revs.create(&PostParams::default(), &revision(case.name, &case.spec))
            .await
            .unwrap();
    }
    // A control: nothing closed, so its Deployment is written; the others' are not.
    revs.create(
        &PostParams::default(),
        &revision("plain", &spec(json!({}), json!({}))),
    )
    .await
    .unwrap();
    until(WAIT, "plain's deployment", || async {
        deps.get_opt("plain-deployment").await.ok()?
    })
    .await;
    for case in &cases {
        let msg = refused(&c, case.name, &needles(case)).await;
        let r = revs.get(case.name).await.unwrap();
        let available = r
            .status
            .as_ref()
            .unwrap()
            .status
            .condition(condition::RESOURCES_AVAILABLE)
            .unwrap()
            .clone();
        assert_eq!(available.reason.as_deref(), Some("InvalidSpec"), "{msg}");
        assert!(
            deps.get_opt(&format!("{}-deployment", case.name))
                .await
                .unwrap()
                .is_none(),
            "{}: a Deployment was written for a refused revision",
            case.name
        );
    }
    // The refusal is an Event too, naming the key.
    let events: Api<Event> = Api::namespaced(c.client.clone(), NS);
    let warned = until(WAIT, "a Warning Event for host-network", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("host-network")
                && e.type_.as_deref() == Some("Warning")
        })
    })
    .await;
    assert!(
        warned
            .note
            .unwrap_or_default()
            .contains("kubernetes.podspec-hostnetwork"),
        "the Event names the key"
    );

    // The operator opens every key, live.
    let all: serde_json::Map<String, Value> = thaw::config::features::KEYS
        .iter()
        .filter(|k| k.name != "secure-pod-defaults")
        .map(|k| (k.name.to_string(), Value::from("enabled")))
        .collect();
    c.config_map("config-features", Value::Object(all)).await;
    for case in cases.iter().filter(|c| c.key.is_some()) {
        let d = until(WAIT, &format!("{}'s deployment", case.name), || async {
            deps.get_opt(&format!("{}-deployment", case.name))
                .await
                .ok()?
        })
        .await;
        let d = serde_json::to_value(&d).unwrap();
        let pod = &d["spec"]["template"]["spec"];
        assert!(
            lookup(pod, case.path).is_some(),
            "{}: {} is not in the written pod spec: {pod}",
            case.name,
            case.path
        );
        let api: Api<Revision> = Api::namespaced(c.client.clone(), NS);
        until(
            WAIT,
            &format!("{} no longer refused", case.name),
            || async {
                let r = api.get(case.name).await.ok()?;
                let ready = r
                    .status
                    .as_ref()?
                    .status
                    .condition(condition::READY)?
                    .clone();
                (!ready.message.unwrap_or_default().contains("must not set")).then_some(())
            },
        )
        .await;
    }
    // No key opens the others: still refused, still nothing written.
    for case in cases.iter().filter(|c| c.key.is_none()) {
        refused(&c, case.name, &needles(case)).await;
        assert!(
            deps.get_opt(&format!("{}-deployment", case.name))
                .await
                .unwrap()
                .is_none()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_deployment_of_a_now_refused_revision_is_left_as_it_is() {
    let c = Cluster::start(json!({})).await;
    let revs: Api<Revision> = Api::namespaced(c.client.clone(), NS);
    let deps: Api<Deployment> = Api::namespaced(c.client.clone(), NS);
    // What an earlier thaw wrote: the revision and its Deployment with hostNetwork, at 2.
    let legacy = spec(json!({"hostNetwork": true}), json!({}));
    let rev = revs
        .create(&PostParams::default(), &revision("legacy", &legacy))
        .await
        .unwrap();
    let dep: Deployment = obj(json!({
        "metadata": {"name": "legacy-deployment", "namespace": NS,
            "labels": {"serving.knative.dev/revision": "legacy"},
            "ownerReferences": [{"apiVersion": "serving.knative.dev/v1", "kind": "Revision",
                "name": "legacy", "uid": rev.uid().unwrap(), "controller": true,
                "blockOwnerDeletion": true}]},
        "spec": {"replicas": 2,
            "selector": {"matchLabels": {"serving.knative.dev/revision": "legacy"}},
            "template": {"metadata": {"labels": {"serving.knative.dev/revision": "legacy"}},
                "spec": {"hostNetwork": true,
                    "containers": [{"name": "user-container", "image": "registry.example/app"}]}}},
    }));
    let before = deps.create(&PostParams::default(), &dep).await.unwrap();

    // The upgraded controller starts.
    let _ctl = controller(&c);
    let case = &cases()[0];
    refused(&c, "legacy", &needles(case)).await;
    // The autoscaler keeps scaling it: its /scale write stands.
    deps.patch_scale(
        "legacy-deployment",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 3}})),
    )
    .await
    .unwrap();
    // A settings change re-queues every revision; the Deployment is still not touched.
    c.config_map(
        "config-features",
        json!({"kubernetes.podspec-nodeselector": "enabled"}),
    )
    .await;
    // Wait for a reconcile after the edit: the control revision below gets its Deployment.
    revs.create(
        &PostParams::default(),
        &revision(
            "after",
            &spec(json!({"nodeSelector": {"a": "b"}}), json!({})),
        ),
    )
    .await
    .unwrap();
    until(WAIT, "after's deployment", || async {
        deps.get_opt("after-deployment").await.ok()?
    })
    .await;
    refused(&c, "legacy", &needles(case)).await;
    let now = deps.get("legacy-deployment").await.unwrap();
    let spec = now.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(3), "the scale is the autoscaler's");
    assert_eq!(
        spec.template,
        before.spec.unwrap().template,
        "the pod template is as the earlier version wrote it"
    );
}

/// The namespace refuses every pod (as Pod Security admission answers: 403) until cleared.
fn refuse_pods(c: &Cluster) {
    c.relay
        .fail_next("POST /api/v1/namespaces/default/pods", &[403; 1000]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_dry_run_refused_by_the_namespace_refuses_the_revision() {
    let c = Cluster::start(json!({})).await;
    c.config_map(
        "config-features",
        json!({"kubernetes.podspec-dryrun": "enabled"}),
    )
    .await;
    let _ctl = controller(&c);
    let revs: Api<Revision> = Api::namespaced(c.client.clone(), NS);
    let deps: Api<Deployment> = Api::namespaced(c.client.clone(), NS);
    let plain = || spec(json!({}), json!({}));
    let deployment = |name: &'static str| {
        let deps = deps.clone();
        async move {
            until(WAIT, &format!("{name}'s deployment"), || async {
                deps.get_opt(&format!("{name}-deployment")).await.ok()?
            })
            .await
        }
    };
    refuse_pods(&c);
    revs.create(&PostParams::default(), &revision("denied", &plain()))
        .await
        .unwrap();
    let msg = refused(&c, "denied", &["dry run failed with injected".to_string()]).await;
    assert!(!msg.contains("must not set"), "{msg}");
    assert!(deps.get_opt("denied-deployment").await.unwrap().is_none());

    // A pod the API server accepts: the dry run passes, nothing is stored, the Deployment is
    // written.
    c.relay.clear_faults();
    revs.create(&PostParams::default(), &revision("accepted", &plain()))
        .await
        .unwrap();
    deployment("accepted").await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(c.client.clone(), NS);
    assert_eq!(
        pods.list(&ListParams::default()).await.unwrap().items.len(),
        0
    );
    assert!(
        c.relay
            .requests()
            .iter()
            .any(|l| l.starts_with("POST /api/v1/namespaces/default/pods")
                && l.contains("dryRun=All")),
        "the dry runs asked for dryRun=All"
    );

    // `allowed`: only a revision annotated for it is dry-run, so with the namespace refusing
    // pods again, the plain one gets its Deployment and the annotated one is refused.
    c.config_map(
        "config-features",
        json!({"kubernetes.podspec-dryrun": "allowed"}),
    )
    .await;
    refuse_pods(&c);
    revs.create(&PostParams::default(), &revision("quiet", &plain()))
        .await
        .unwrap();
    let mut asked = revision("asked", &plain());
    asked.metadata.annotations = Some(
        [(
            "features.knative.dev/podspec-dryrun".to_string(),
            "enabled".to_string(),
        )]
        .into(),
    );
    revs.create(&PostParams::default(), &asked).await.unwrap();
    deployment("quiet").await;
    refused(&c, "asked", &["dry run failed with injected".to_string()]).await;
    assert!(deps.get_opt("asked-deployment").await.unwrap().is_none());
    c.relay.clear_faults();
}
