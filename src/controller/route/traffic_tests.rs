use super::*;
use crate::controller::route::fixtures::*;
use crate::knative::duck::ConditionStatus;

fn percents(t: &[RevisionTarget]) -> Vec<(String, Option<i64>)> {
    t.iter().map(|t| (t.revision.clone(), t.percent)).collect()
}

#[test]
fn a_configuration_target_follows_its_latest_ready_revision() {
    let r = route("hello").with_config("hello", 100).build();
    let refs = refs(
        vec![
            configuration("hello")
                .latest_ready("hello-00001")
                .latest_created("hello-00002")
                .build(),
        ],
        vec![
            revision("hello-00001").ready().build(),
            revision("hello-00002").build(),
        ],
    );
    let t = resolve(&r, &refs).unwrap();
    // hello-00002 is created but not Ready: traffic stays on hello-00001.
    assert_eq!(percents(&t.targets), [("hello-00001".into(), Some(100))]);
    assert_eq!(t.targets[0].latest_revision, Some(true));
    assert_eq!(t.targets[0].configuration.as_deref(), Some("hello"));
    assert_eq!(t.groups.len(), 1);

    // Once hello-00002 is Ready the configuration's latestReady moves, and so does traffic.
    let refs = super::super::fixtures::refs(
        vec![
            configuration("hello")
                .latest_ready("hello-00002")
                .latest_created("hello-00002")
                .build(),
        ],
        vec![
            revision("hello-00001").ready().build(),
            revision("hello-00002").ready().build(),
        ],
    );
    let t = resolve(&r, &refs).unwrap();
    assert_eq!(percents(&t.targets), [("hello-00002".into(), Some(100))]);
}

#[test]
fn a_services_route_without_configuration_name_uses_the_service() {
    let mut r = route("hello")
        .target(crate::knative::TrafficTarget {
            latest_revision: Some(true),
            percent: Some(100),
            ..Default::default()
        })
        .build();
    r.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "serving.knative.dev/v1".into(),
            kind: "Service".into(),
            name: "hello".into(),
            uid: "uid-svc".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        },
    ]);
    assert_eq!(referenced_configurations(&r), ["hello".to_string()].into());
    let refs = refs(
        vec![configuration("hello").latest_ready("hello-00001").build()],
        vec![revision("hello-00001").ready().build()],
    );
    assert_eq!(
        resolve(&r, &refs).unwrap().targets[0].revision,
        "hello-00001"
    );
}

#[test]
fn a_split_a_merge_and_tags() {
    let r = route("hello")
        .with_revision("hello-00001", 30)
        .with_revision("hello-00001", 20)
        .tagged("candidate", "hello-00002", 50)
        .tagged("old", "hello-00001", 0)
        .build();
    let refs = refs(
        vec![],
        vec![
            revision("hello-00001").ready().build(),
            revision("hello-00002").ready().h2c().timeout(60).build(),
        ],
    );
    let t = resolve(&r, &refs).unwrap();
    // Identical untagged targets merge; tagged ones stay apart.
    assert_eq!(
        percents(&t.targets),
        [
            ("hello-00001".into(), Some(50)),
            ("hello-00002".into(), Some(50)),
            ("hello-00001".into(), Some(0)),
        ]
    );
    assert_eq!(t.targets[0].latest_revision, Some(false));
    // The default group has one entry per revision; each tag its own group at 100%.
    assert_eq!(
        percents(&t.groups[&None]),
        [
            ("hello-00001".into(), Some(50)),
            ("hello-00002".into(), Some(50))
        ]
    );
    assert_eq!(
        percents(&t.groups[&Some("candidate".into())]),
        [("hello-00002".into(), Some(100))]
    );
    assert_eq!(
        percents(&t.groups[&Some("old".into())]),
        [("hello-00001".into(), Some(100))]
    );
    let candidate = &t.groups[&Some("candidate".into())][0];
    assert!(candidate.h2c);
    assert_eq!(candidate.timeout_seconds, Some(60));
    assert!(!t.groups[&None][0].h2c);
}

#[test]
fn missing_targets_are_false_with_knatives_reasons() {
    let r = route("hello").with_revision("nope-00001", 100).build();
    let e = resolve(&r, &refs(vec![], vec![])).unwrap_err();
    assert_eq!(
        e.condition(),
        (
            ConditionStatus::False,
            "RevisionMissing".into(),
            "Revision \"nope-00001\" referenced in traffic not found.".into()
        )
    );
    let r = route("hello").with_config("nope", 100).build();
    let e = resolve(&r, &refs(vec![], vec![])).unwrap_err();
    assert_eq!(e.condition().0, ConditionStatus::False);
    assert_eq!(e.condition().1, "ConfigurationMissing");
    assert!(e.condition().2.contains("Configuration \"nope\""), "{e:?}");
}

#[test]
fn not_ready_is_unknown_and_failed_is_false() {
    let r = route("hello").with_revision("hello-00001", 100).build();
    let e = resolve(&r, &refs(vec![], vec![revision("hello-00001").build()])).unwrap_err();
    assert_eq!(e.condition().0, ConditionStatus::Unknown);
    assert_eq!(e.condition().1, "RevisionMissing");
    assert_eq!(
        e.condition().2,
        "Revision \"hello-00001\" is not yet ready."
    );
    let e = resolve(
        &r,
        &refs(vec![], vec![revision("hello-00001").failed().build()]),
    )
    .unwrap_err();
    assert_eq!(e.condition().0, ConditionStatus::False);
    assert_eq!(
        e.condition().2,
        "Revision \"hello-00001\" failed to become ready."
    );

    let r = route("hello").with_config("hello", 100).build();
    let e = resolve(&r, &refs(vec![configuration("hello").build()], vec![])).unwrap_err();
    assert_eq!(
        e.condition(),
        (
            ConditionStatus::Unknown,
            "RevisionMissing".into(),
            "Configuration \"hello\" is waiting for a Revision to become ready.".into()
        )
    );
    let e = resolve(
        &r,
        &refs(vec![configuration("hello").failed().build()], vec![]),
    )
    .unwrap_err();
    assert_eq!(e.condition().0, ConditionStatus::False);
    assert!(e.condition().2.contains("does not have any ready Revision"));
}

#[test]
fn a_failure_wins_over_an_earlier_wait() {
    let r = route("hello")
        .with_revision("hello-00001", 50)
        .with_revision("gone-00001", 50)
        .build();
    let e = resolve(&r, &refs(vec![], vec![revision("hello-00001").build()])).unwrap_err();
    assert_eq!(
        e,
        TargetError::Missing {
            kind: "Revision",
            name: "gone-00001".into()
        }
    );
    // Two waits: the first is kept.
    let r = route("hello")
        .with_revision("a-00001", 50)
        .with_revision("b-00001", 50)
        .build();
    let e = resolve(
        &r,
        &refs(
            vec![],
            vec![revision("a-00001").build(), revision("b-00001").build()],
        ),
    )
    .unwrap_err();
    assert_eq!(
        e,
        TargetError::RevisionNotReady {
            name: "a-00001".into(),
            failed: false
        }
    );
}

#[test]
fn references_include_latest_created_and_status_revisions() {
    let r = route("hello")
        .with_config("hello", 50)
        .with_revision("hello-00001", 50)
        .status_traffic(vec![crate::knative::TrafficTarget {
            revision_name: Some("old-00003".into()),
            percent: Some(100),
            ..Default::default()
        }])
        .build();
    let cfgs = refs(
        vec![
            configuration("hello")
                .latest_ready("hello-00002")
                .latest_created("hello-00003")
                .build(),
        ],
        vec![],
    )
    .configurations;
    assert_eq!(
        referenced_revisions(&r, &cfgs),
        ["hello-00001", "hello-00002", "hello-00003", "old-00003"]
            .map(String::from)
            .into()
    );
}

#[test]
fn a_failed_latest_ready_revision_fails_its_configuration_target() {
    let r = route("hello").with_config("hello", 100).build();
    let refs = refs(
        vec![configuration("hello").latest_ready("hello-00001").build()],
        vec![revision("hello-00001").failed().build()],
    );
    let e = resolve(&r, &refs).unwrap_err();
    assert_eq!(
        e.condition(),
        (
            ConditionStatus::False,
            "RevisionMissing".into(),
            "Revision \"hello-00001\" failed to become ready.".into()
        )
    );
}

#[test]
fn a_services_route_may_only_pin_its_own_revisions() {
    let owned = |mut r: crate::knative::Route| {
        r.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "serving.knative.dev/v1".into(),
                kind: "Service".into(),
                name: "hello".into(),
                uid: "uid-svc".into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            },
        ]);
        r
    };
    let r = owned(route("hello").with_revision("other-00001", 100).build());
    let theirs = revision("other-00001")
        .ready()
        .label("serving.knative.dev/service", "other")
        .build();
    let e = resolve(&r, &refs(vec![], vec![theirs])).unwrap_err();
    assert_eq!(
        e.condition(),
        (
            ConditionStatus::False,
            "RevisionNotOwned".into(),
            "Revision \"other-00001\" belongs to Service \"other\", not Service \"hello\".".into()
        )
    );
    let loose = revision("other-00001").ready().build();
    let e = resolve(&r, &refs(vec![], vec![loose])).unwrap_err();
    assert_eq!(
        e.condition().2,
        "Revision \"other-00001\" does not belong to Service \"hello\"."
    );
    // Its own revision passes; a Route of no Service may name any revision.
    let r = owned(route("hello").with_revision("hello-00001", 100).build());
    let mine = revision("hello-00001")
        .ready()
        .label("serving.knative.dev/service", "hello")
        .build();
    assert!(resolve(&r, &refs(vec![], vec![mine])).is_ok());
    let r = route("plain").with_revision("other-00001", 100).build();
    let loose = revision("other-00001").ready().build();
    assert!(resolve(&r, &refs(vec![], vec![loose])).is_ok());
}
