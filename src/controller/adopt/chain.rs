//! The ownership chain an object must have for thaw to adopt it: from the object, through
//! Knative's internal objects, to the Revision or Route (or DomainMapping) that adopts it,
//! each link checked by UID.
//!
//! - a Service (`{rev}`, `{rev}-private`) or the public Service's Endpoints: controlled by a
//!   ServerlessService, controlled by a PodAutoscaler, controlled by the Revision;
//! - a HorizontalPodAutoscaler: controlled by a PodAutoscaler, controlled by the Revision;
//! - a VirtualService or HTTPRoute: controlled by a KIngress, controlled by the Route or
//!   DomainMapping.
//!
//! Each link is the current object's **controller** reference (`controller: true`) of the
//! expected kind and API group; the object it names is read from the API server (same
//! namespace, by name) and must carry the UID the reference names; the last object's
//! controller must be the adopter's UID. Any other shape is a [`Refusal`]: the object stays
//! `NotOwned`. The walk is pure over a lookup, so its cases are tested without an API.

use std::future::Future;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::KnativeKind;

/// What an object's chain must be to be adopted by a parent of kind `parent_kind`: the
/// Knative kinds between them, child first. `None`: objects of `child_kind` are never
/// adopted from that parent.
pub fn path(child_kind: &str, parent_kind: &str) -> Option<&'static [KnativeKind]> {
    use super::{INGRESS, POD_AUTOSCALER, SERVERLESS_SERVICE};
    match (child_kind, parent_kind) {
        ("Service" | "Endpoints", "Revision") => Some(&[SERVERLESS_SERVICE, POD_AUTOSCALER]),
        ("HorizontalPodAutoscaler", "Revision") => Some(&[POD_AUTOSCALER]),
        ("VirtualService" | "HTTPRoute", "Route" | "DomainMapping") => Some(&[INGRESS]),
        _ => None,
    }
}

/// Why an object is not adopted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Objects of this kind are not adopted from this parent.
    #[error("a {0} is not adopted from a {1}")]
    NoPath(String, String),
    /// The object (or a link) has no controller of the kind the chain needs.
    #[error("{at}'s controller is not a {want}")]
    WrongController { at: String, want: &'static str },
    /// The link its controller reference names does not exist.
    #[error("{kind} {name:?} does not exist")]
    Missing { kind: &'static str, name: String },
    /// The link of that name exists with another UID (a different object of the same name).
    #[error("{kind} {name:?} has UID {found:?}, not the {want:?} its dependent names")]
    UidMismatch {
        kind: &'static str,
        name: String,
        found: String,
        want: String,
    },
    /// The last link's controller is not the adopter.
    #[error("{at} is controlled by {found}, not by this {parent}")]
    OtherParent {
        at: String,
        found: String,
        parent: String,
    },
}

/// The controller reference of `meta`, when it has one.
pub fn controller(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

/// `group/version`'s group (`""` for the core group).
fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

/// One link found: its kind, name and UID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    pub kind: String,
    pub name: String,
    pub uid: String,
}

/// A chain found, child first, the adopter last (`Service hello-00001 ← ServerlessService
/// hello-00001 ← PodAutoscaler hello-00001 ← Revision hello-00001`): what the log line says.
pub fn render(hops: &[Hop]) -> String {
    hops.iter()
        .map(|h| format!("{} {}", h.kind, h.name))
        .collect::<Vec<_>>()
        .join(" ← ")
}

/// Walks from `child` (of kind `child_kind`, named `child_name`) along [`path`] to the parent
/// (`parent_kind` named `parent_name` with UID `parent_uid`), reading each link with `get(kind,
/// name)` (`None`: it does not exist; an error of the lookup ends the walk as it is). Returns
/// the hops, child first, parent last, or why the object is not adopted.
pub async fn walk<F, Fut, E>(
    child_kind: &str,
    child_name: &str,
    child: &ObjectMeta,
    parent_kind: &str,
    parent_name: &str,
    parent_uid: &str,
    get: F,
) -> Result<Result<Vec<Hop>, Refusal>, E>
where
    F: FnMut(KnativeKind, String) -> Fut,
    Fut: Future<Output = Result<Option<ObjectMeta>, E>>,
{
    let Some(links) = path(child_kind, parent_kind) else {
        return Ok(Err(Refusal::NoPath(child_kind.into(), parent_kind.into())));
    };
    walk_along(
        links,
        child_kind,
        child_name,
        child,
        parent_kind,
        parent_name,
        parent_uid,
        get,
    )
    .await
}

/// [`walk`] along `links` given (child first) rather than [`path`]'s: the hand-back
/// ([`super::hand_back`]) walks from a Knative object (a ServerlessService, a KIngress) up to
/// the Revision or Route, links no child of thaw's has.
#[allow(clippy::too_many_arguments)] // the walk's inputs, each named as `walk` names them
pub async fn walk_along<F, Fut, E>(
    links: &[KnativeKind],
    child_kind: &str,
    child_name: &str,
    child: &ObjectMeta,
    parent_kind: &str,
    parent_name: &str,
    parent_uid: &str,
    mut get: F,
) -> Result<Result<Vec<Hop>, Refusal>, E>
where
    F: FnMut(KnativeKind, String) -> Fut,
    Fut: Future<Output = Result<Option<ObjectMeta>, E>>,
{
    let mut hops = vec![Hop {
        kind: child_kind.into(),
        name: child_name.into(),
        uid: child.uid.clone().unwrap_or_default(),
    }];
    let mut current = child.clone();
    for link in links {
        let at = format!(
            "{} {}",
            hops[hops.len() - 1].kind,
            hops[hops.len() - 1].name
        );
        let Some(r) = controller(&current).filter(|r| {
            r.kind == link.kind && group_of(&r.api_version) == link.group && !r.uid.is_empty()
        }) else {
            return Ok(Err(Refusal::WrongController {
                at,
                want: link.kind,
            }));
        };
        let (name, want) = (r.name.clone(), r.uid.clone());
        let Some(found) = get(*link, name.clone()).await? else {
            return Ok(Err(Refusal::Missing {
                kind: link.kind,
                name,
            }));
        };
        let found_uid = found.uid.clone().unwrap_or_default();
        if found_uid != want {
            return Ok(Err(Refusal::UidMismatch {
                kind: link.kind,
                name,
                found: found_uid,
                want,
            }));
        }
        hops.push(Hop {
            kind: link.kind.into(),
            name,
            uid: found_uid,
        });
        current = found;
    }
    let last = &hops[hops.len() - 1];
    let at = format!("{} {}", last.kind, last.name);
    Ok(match controller(&current) {
        Some(r) if r.kind == parent_kind && r.uid == parent_uid => {
            hops.push(Hop {
                kind: parent_kind.into(),
                name: parent_name.into(),
                uid: parent_uid.into(),
            });
            Ok(hops)
        }
        Some(r) => Err(Refusal::OtherParent {
            at,
            found: format!("{} {} (UID {})", r.kind, r.name, r.uid),
            parent: parent_kind.into(),
        }),
        None => Err(Refusal::OtherParent {
            at,
            found: "nothing".into(),
            parent: parent_kind.into(),
        }),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn owned(uid: &str, by: Option<(&str, &str, &str, &str)>) -> ObjectMeta {
        ObjectMeta {
            uid: Some(uid.into()),
            owner_references: by.map(|(api_version, kind, name, uid)| {
                vec![OwnerReference {
                    api_version: api_version.into(),
                    kind: kind.into(),
                    name: name.into(),
                    uid: uid.into(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]
            }),
            ..ObjectMeta::default()
        }
    }

    const SKS: (&str, &str) = (
        "networking.internal.knative.dev/v1alpha1",
        "ServerlessService",
    );
    const PA: (&str, &str) = ("autoscaling.internal.knative.dev/v1alpha1", "PodAutoscaler");
    const REV: (&str, &str) = ("serving.knative.dev/v1", "Revision");

    /// Knative's objects of revision `hello-00001` (UID `rev`), as its reconcilers leave them.
    fn knative() -> (ObjectMeta, HashMap<(&'static str, String), ObjectMeta>) {
        let svc = owned("svc", Some((SKS.0, SKS.1, "hello-00001", "sks")));
        let mut links = HashMap::new();
        links.insert(
            ("ServerlessService", "hello-00001".to_string()),
            owned("sks", Some((PA.0, PA.1, "hello-00001", "pa"))),
        );
        links.insert(
            ("PodAutoscaler", "hello-00001".to_string()),
            owned("pa", Some((REV.0, REV.1, "hello-00001", "rev"))),
        );
        (svc, links)
    }

    async fn run(
        child: &ObjectMeta,
        links: &HashMap<(&'static str, String), ObjectMeta>,
        parent_uid: &str,
    ) -> Result<Vec<Hop>, Refusal> {
        walk(
            "Service",
            "hello-00001",
            child,
            "Revision",
            "hello-00001",
            parent_uid,
            |k, n| std::future::ready(Ok::<_, ()>(links.get(&(k.kind, n)).cloned())),
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn the_chain_leads_by_uid_to_the_revision() {
        let (svc, links) = knative();
        let hops = run(&svc, &links, "rev").await.unwrap();
        assert_eq!(
            render(&hops),
            "Service hello-00001 ← ServerlessService hello-00001 ← PodAutoscaler hello-00001 ← Revision hello-00001"
        );
    }

    #[tokio::test]
    async fn a_forged_or_broken_chain_is_refused() {
        let (svc, links) = knative();
        // The PA is another revision's.
        assert!(matches!(
            run(&svc, &links, "other-rev").await,
            Err(Refusal::OtherParent { .. })
        ));
        // The SKS of that name is another object than the one the Service names.
        let mut l = links.clone();
        l.insert(
            ("ServerlessService", "hello-00001".into()),
            owned("sks-2", Some((PA.0, PA.1, "hello-00001", "pa"))),
        );
        assert!(matches!(
            run(&svc, &l, "rev").await,
            Err(Refusal::UidMismatch {
                kind: "ServerlessService",
                ..
            })
        ));
        // A missing link.
        let mut l = links.clone();
        l.remove(&("PodAutoscaler", "hello-00001".into()));
        assert!(matches!(
            run(&svc, &l, "rev").await,
            Err(Refusal::Missing {
                kind: "PodAutoscaler",
                ..
            })
        ));
        // The PA not controlled at all; the SKS controlled by a Revision directly (a link
        // skipped).
        let mut l = links.clone();
        l.insert(("PodAutoscaler", "hello-00001".into()), owned("pa", None));
        assert!(matches!(
            run(&svc, &l, "rev").await,
            Err(Refusal::OtherParent { .. })
        ));
        let mut l = links.clone();
        l.insert(
            ("ServerlessService", "hello-00001".into()),
            owned("sks", Some((REV.0, REV.1, "hello-00001", "rev"))),
        );
        assert!(matches!(
            run(&svc, &l, "rev").await,
            Err(Refusal::WrongController {
                want: "PodAutoscaler",
                ..
            })
        ));
        // A ServerlessService of another API group; a Service with no controller.
        let forged = owned("svc", Some(("example.com/v1", SKS.1, "hello-00001", "sks")));
        assert!(matches!(
            run(&forged, &links, "rev").await,
            Err(Refusal::WrongController { .. })
        ));
        assert!(matches!(
            run(&owned("svc", None), &links, "rev").await,
            Err(Refusal::WrongController { .. })
        ));
        // A Service is never adopted from a Route; a Deployment never by a chain.
        assert_eq!(path("Service", "Route"), None);
        assert_eq!(path("Deployment", "Revision"), None);
    }

    #[tokio::test]
    async fn a_virtual_service_leads_through_its_kingress() {
        let vs = owned(
            "vs",
            Some((
                "networking.internal.knative.dev/v1alpha1",
                "Ingress",
                "hello",
                "king",
            )),
        );
        let king = owned(
            "king",
            Some(("serving.knative.dev/v1", "Route", "hello", "route")),
        );
        let get = |k: KnativeKind, n: String| {
            std::future::ready(Ok::<_, ()>(
                (k.kind == "Ingress" && n == "hello").then(|| king.clone()),
            ))
        };
        let hops = walk(
            "VirtualService",
            "hello-ingress",
            &vs,
            "Route",
            "hello",
            "route",
            get,
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(
            render(&hops),
            "VirtualService hello-ingress ← Ingress hello ← Route hello"
        );
        // Another route's KIngress.
        let other = walk(
            "VirtualService",
            "hello-ingress",
            &vs,
            "Route",
            "hello",
            "other-route",
            get,
        )
        .await
        .unwrap();
        assert!(matches!(other, Err(Refusal::OtherParent { .. })));
    }
}
