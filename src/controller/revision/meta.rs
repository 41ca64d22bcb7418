//! What every child of a revision carries: its labels, the annotations propagated from the
//! revision, and the owner reference (Knative's `revision/resources/meta.go`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};

use crate::knative::Revision;
use crate::knative::names::{MAX_NAME_LEN, labels};

/// The label Knative adds for tracing when the revision sets none: the revision's name.
pub const APP_LABEL: &str = "app";

/// Revision labels that change while the revision lives (the route's labeler writes them):
/// not propagated, so they never roll the pods.
const EXCLUDED_LABELS: &[&str] = &[labels::ROUTE, labels::ROUTING_STATE];

/// Revision annotations with the same fate: bookkeeping that changes while the revision lives.
const EXCLUDED_ANNOTATIONS: &[&str] = &[
    "serving.knative.dev/lastPinned",
    "serving.knative.dev/preserve",
    "serving.knative.dev/routingStateModified",
    "serving.knative.dev/routes",
];

/// The labels of the revision's Deployment, pods and Services: the revision's own (less the
/// routing ones), `serving.knative.dev/revision` and `/revisionUID`, and `app` when the
/// revision has none (Knative's `makeLabels`). A revision label whose value is longer than a
/// label value may be (63) is left off: no API server admits it on a child (a real one would
/// not have admitted the revision either; the configuration's name, which may be longer, still
/// reaches the pod as `K_CONFIGURATION`).
pub fn child_labels(rev: &Revision) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = rev
        .labels()
        .iter()
        .filter(|(k, v)| !EXCLUDED_LABELS.contains(&k.as_str()) && v.len() <= MAX_NAME_LEN)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.insert(labels::REVISION.into(), rev.name_any());
    out.insert(labels::REVISION_UID.into(), rev.uid().unwrap_or_default());
    out.entry(APP_LABEL.into())
        .or_insert_with(|| rev.name_any());
    out
}

/// The selector of the revision's pods: its UID, which a re-created revision of the same
/// name does not share (Knative's `makeSelector`).
pub fn selector(rev: &Revision) -> BTreeMap<String, String> {
    BTreeMap::from([(labels::REVISION_UID.into(), rev.uid().unwrap_or_default())])
}

/// The revision's annotations less the bookkeeping ones (Knative's `excludeAnnotations`).
pub fn child_annotations(rev: &Revision) -> BTreeMap<String, String> {
    rev.annotations()
        .iter()
        .filter(|(k, _)| !EXCLUDED_ANNOTATIONS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The owner reference of every child: the revision, as controller, blocking its deletion.
pub fn owner_ref(rev: &Revision) -> OwnerReference {
    // A revision read from the API server has a uid; a child of one without is never owned.
    rev.controller_owner_ref(&())
        .map(|mut o| {
            o.block_owner_deletion = Some(true);
            o
        })
        .unwrap_or_else(|| OwnerReference {
            api_version: Revision::api_version(&()).into(),
            kind: Revision::kind(&()).into(),
            name: rev.name_any(),
            uid: String::new(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::revision::fixtures::RevisionFixture;

    #[test]
    fn labels_propagate_less_the_routing_ones() {
        let rev = RevisionFixture::new("hello-00001")
            .label(labels::ROUTING_STATE, "active")
            .label(labels::ROUTE, "hello")
            .label("team", "a")
            .build();
        let l = child_labels(&rev);
        assert_eq!(l[labels::REVISION], "hello-00001");
        assert_eq!(l[labels::REVISION_UID], "uid-hello-00001");
        assert_eq!(l[labels::CONFIGURATION], "hello");
        assert_eq!(l[labels::SERVICE], "hello");
        assert_eq!(l["team"], "a");
        assert_eq!(l[APP_LABEL], "hello-00001");
        assert!(!l.contains_key(labels::ROUTING_STATE));
        assert!(!l.contains_key(labels::ROUTE));
        // A user's own app label is kept.
        let rev = RevisionFixture::new("hello-00001")
            .label(APP_LABEL, "mine")
            .build();
        assert_eq!(child_labels(&rev)[APP_LABEL], "mine");
    }

    #[test]
    fn annotations_propagate_less_the_bookkeeping() {
        let rev = RevisionFixture::new("hello-00001")
            .annotation("autoscaling.knative.dev/min-scale", "1")
            .annotation(
                "serving.knative.dev/routingStateModified",
                "2026-01-01T00:00:00Z",
            )
            .annotation("serving.knative.dev/routes", "hello")
            .build();
        let a = child_annotations(&rev);
        assert_eq!(a.len(), 1);
        assert_eq!(a["autoscaling.knative.dev/min-scale"], "1");
    }

    #[test]
    fn owner_reference_is_a_blocking_controller_ref() {
        let rev = RevisionFixture::new("hello-00001").build();
        let o = owner_ref(&rev);
        assert_eq!(o.api_version, "serving.knative.dev/v1");
        assert_eq!(o.kind, "Revision");
        assert_eq!(o.name, "hello-00001");
        assert_eq!(o.uid, "uid-hello-00001");
        assert_eq!(o.controller, Some(true));
        assert_eq!(o.block_owner_deletion, Some(true));
    }
}
