//! The labeler (Knative's `labeler` v2, run after each Route reconcile): which revisions and
//! configurations a route uses, written on them.
//!
//! - Annotation `serving.knative.dev/routes` on Revisions and Configurations: the sorted,
//!   comma-separated names of the routes that use them.
//! - Label `serving.knative.dev/routingState` on Revisions: `active` while some route uses
//!   them, `reserve` once none does (`pending`, from creation, until a route first decides),
//!   with annotation `serving.knative.dev/routingStateModified` (RFC 3339, UTC) stamped at
//!   each change.
//!
//! A route uses: every revision named in its spec or status traffic (that exists), the
//! configuration each such revision belongs to (its controller owner), every configuration its
//! spec names, and — for `latestRevision: true` targets — that configuration's latest
//! *created* revision too, so a new revision is `active` (min-scale holds, scale-up from
//! initial-scale) before it takes traffic, as in Knative.
//!
//! Writes are JSON merge patches of `metadata` only, sent only when something changes. The
//! autoscaler reads the label ([`crate::config::revision::RevisionInput`]): a `reserve`
//! revision is unreachable and its min-scale no longer holds it up.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use serde_json::{Map, Value, json};

use super::traffic::Referenced;
use crate::controller::configuration::routing_state;
use crate::knative::names::labels;
use crate::knative::{Revision, Route, TrafficTarget};

/// The routes using an object: a sorted, comma-separated list of route names.
pub const ROUTES_ANNOTATION: &str = "serving.knative.dev/routes";

/// The revisions and configurations `route` uses, given its new status traffic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Used {
    pub revisions: BTreeSet<String>,
    pub configurations: BTreeSet<String>,
}

/// The configuration that controls `rev` (Knative's labeler reads the owner reference; the
/// label's value may be a hash for a long name).
pub fn configuration_of(rev: &Revision) -> Option<String> {
    rev.owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "Configuration")
        .map(|o| o.name.clone())
}

/// What `route` uses (see the module docs). Pure.
pub fn used(route: &Route, status_traffic: &[TrafficTarget], refs: &Referenced) -> Used {
    let mut u = Used::default();
    for t in status_traffic.iter().chain(&route.spec.traffic) {
        let mut configuration = t.configuration_name.clone();
        if let Some(name) = &t.revision_name {
            let Some(rev) = refs.revisions.get(name) else {
                continue;
            };
            u.revisions.insert(name.clone());
            if let Some(c) = configuration_of(rev) {
                configuration = Some(c);
            }
        }
        if t.revision_name.is_none() && configuration.is_none() {
            configuration = super::traffic::service_of(route);
        }
        let Some(cfg_name) = configuration else {
            continue;
        };
        let Some(cfg) = refs.configurations.get(&cfg_name) else {
            continue;
        };
        u.configurations.insert(cfg_name);
        if t.latest_revision == Some(true)
            && let Some(latest) = cfg
                .status
                .as_ref()
                .and_then(|s| s.fields.latest_created_revision_name.clone())
            && refs.revisions.contains_key(&latest)
        {
            u.revisions.insert(latest);
        }
    }
    u
}

fn route_set(meta: &ObjectMeta) -> BTreeSet<String> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(ROUTES_ANNOTATION))
        .map(|v| {
            v.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The routes `meta`'s routes annotation lists.
pub fn listed(meta: &ObjectMeta) -> BTreeSet<String> {
    route_set(meta)
}

/// Whether `meta`'s routes annotation lists `route`.
pub fn lists(meta: &ObjectMeta, route: &str) -> bool {
    route_set(meta).contains(route)
}

/// The merge patch that marks `meta` as used (`routed`) or not by `route`, or `None` when
/// nothing changes. `routing_state`: also keep the routing-state label (revisions), stamping
/// `modified` (RFC 3339) when it changes. Knative's `makeMetadataPatch`.
pub fn metadata_patch(
    meta: &ObjectMeta,
    route: &str,
    routed: bool,
    routing_state: bool,
    modified: &str,
) -> Option<Value> {
    let mut set = route_set(meta);
    let changed = if routed {
        set.insert(route.to_string())
    } else {
        set.remove(route)
    };
    let mut annotations = Map::new();
    let mut labels_patch = Map::new();
    if changed {
        let v = if set.is_empty() {
            Value::Null
        } else {
            Value::from(set.iter().cloned().collect::<Vec<_>>().join(","))
        };
        annotations.insert(ROUTES_ANNOTATION.into(), v);
    }
    if routing_state {
        let want = if set.is_empty() {
            routing_state::RESERVE
        } else {
            routing_state::ACTIVE
        };
        let have = meta
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::ROUTING_STATE))
            .map(String::as_str);
        if have != Some(want) {
            labels_patch.insert(labels::ROUTING_STATE.into(), want.into());
            annotations.insert(routing_state::MODIFIED_ANNOTATION.into(), modified.into());
        }
    }
    if annotations.is_empty() && labels_patch.is_empty() {
        return None;
    }
    let mut m = Map::new();
    if !labels_patch.is_empty() {
        m.insert("labels".into(), Value::Object(labels_patch));
    }
    if !annotations.is_empty() {
        m.insert("annotations".into(), Value::Object(annotations));
    }
    Some(json!({ "metadata": m }))
}

/// The patches to send: for each object name, its patch. `current`: every object of the kind
/// in the route's namespace (those listing the route and not used lose it); `used`: the
/// names to mark. Pure.
pub fn patches<'a>(
    current: impl IntoIterator<Item = (&'a str, &'a ObjectMeta)>,
    used: &BTreeSet<String>,
    route: &str,
    routing_state: bool,
    modified: &str,
) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for (name, meta) in current {
        let routed = used.contains(name);
        if !routed && !lists(meta, route) {
            continue;
        }
        if let Some(p) = metadata_patch(meta, route, routed, routing_state, modified) {
            out.insert(name.to_string(), p);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::route::fixtures::*;

    const T: &str = "2026-11-25T22:00:00Z";

    #[test]
    fn a_routed_pending_revision_becomes_active_with_the_time() {
        let r = revision("hello-00001")
            .label(labels::ROUTING_STATE, "pending")
            .build();
        let p = metadata_patch(&r.metadata, "hello", true, true, T).unwrap();
        assert_eq!(
            p,
            json!({"metadata": {
                "labels": {"serving.knative.dev/routingState": "active"},
                "annotations": {
                    "serving.knative.dev/routes": "hello",
                    "serving.knative.dev/routingStateModified": T,
                }
            }})
        );
    }

    #[test]
    fn a_second_route_joins_the_list_without_touching_the_state() {
        let r = revision("hello-00001")
            .label(labels::ROUTING_STATE, "active")
            .annotation(ROUTES_ANNOTATION, "zeta")
            .build();
        let p = metadata_patch(&r.metadata, "alpha", true, true, T).unwrap();
        assert_eq!(
            p,
            json!({"metadata": {"annotations": {"serving.knative.dev/routes": "alpha,zeta"}}})
        );
        // Already listed and active: nothing to send.
        let r = revision("hello-00001")
            .label(labels::ROUTING_STATE, "active")
            .annotation(ROUTES_ANNOTATION, "alpha,zeta")
            .build();
        assert_eq!(metadata_patch(&r.metadata, "alpha", true, true, T), None);
    }

    #[test]
    fn the_last_route_leaving_makes_it_reserve() {
        let r = revision("hello-00001")
            .label(labels::ROUTING_STATE, "active")
            .annotation(ROUTES_ANNOTATION, "hello")
            .build();
        let p = metadata_patch(&r.metadata, "hello", false, true, T).unwrap();
        assert_eq!(
            p,
            json!({"metadata": {
                "labels": {"serving.knative.dev/routingState": "reserve"},
                "annotations": {
                    "serving.knative.dev/routes": null,
                    "serving.knative.dev/routingStateModified": T,
                }
            }})
        );
        // One of two leaving: still active.
        let r = revision("hello-00001")
            .label(labels::ROUTING_STATE, "active")
            .annotation(ROUTES_ANNOTATION, "a,hello")
            .build();
        let p = metadata_patch(&r.metadata, "hello", false, true, T).unwrap();
        assert_eq!(
            p,
            json!({"metadata": {"annotations": {"serving.knative.dev/routes": "a"}}})
        );
        // Configurations carry the list only.
        let c = configuration("hello").build();
        let p = metadata_patch(&c.metadata, "hello", true, false, T).unwrap();
        assert_eq!(
            p,
            json!({"metadata": {"annotations": {"serving.knative.dev/routes": "hello"}}})
        );
    }

    #[test]
    fn used_follows_spec_status_and_latest_created() {
        let mut owned = revision("hello-00001").ready().build();
        owned.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "serving.knative.dev/v1".into(),
                kind: "Configuration".into(),
                name: "hello".into(),
                uid: "uid-hello".into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            },
        ]);
        let refs = refs(
            vec![
                configuration("hello")
                    .latest_ready("hello-00002")
                    .latest_created("hello-00003")
                    .build(),
                configuration("other").build(),
            ],
            vec![
                owned,
                revision("hello-00002").ready().build(),
                revision("hello-00003").build(),
                revision("old-00001").ready().build(),
            ],
        );
        let r = route("hello")
            .with_config("hello", 50)
            .with_revision("hello-00001", 50)
            .with_revision("missing-00001", 0)
            .build();
        let status = vec![TrafficTarget {
            revision_name: Some("old-00001".into()),
            percent: Some(100),
            ..TrafficTarget::default()
        }];
        let u = used(&r, &status, &refs);
        assert_eq!(
            u.revisions,
            ["hello-00001", "hello-00003", "old-00001"]
                .map(String::from)
                .into()
        );
        assert_eq!(u.configurations, ["hello".to_string()].into());

        // Patches: the used ones marked, a listed unused one released, others untouched.
        let listed = revision("gone-00001")
            .label(labels::ROUTING_STATE, "active")
            .annotation(ROUTES_ANNOTATION, "hello")
            .build();
        let stranger = revision("x-00001")
            .label(labels::ROUTING_STATE, "reserve")
            .build();
        let hello3 = revision("hello-00003").build();
        let all = [&listed, &stranger, &hello3];
        let p = patches(
            all.iter()
                .map(|r| (r.metadata.name.as_deref().unwrap(), &r.metadata)),
            &u.revisions,
            "hello",
            true,
            T,
        );
        assert_eq!(
            p.keys().cloned().collect::<Vec<_>>(),
            ["gone-00001", "hello-00003"]
        );
        assert_eq!(
            p["gone-00001"]["metadata"]["labels"]["serving.knative.dev/routingState"],
            "reserve"
        );
    }
}
