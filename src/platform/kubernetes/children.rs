//! A revision's own Deployment and private Service: the ones **named for it** and
//! **controlled by it**. The controller names them `{revision}-deployment` and
//! `{revision}-private` (Knative's `kmeta.ChildName`, [`crate::knative::names::child_name`])
//! and makes the Revision their controller (an ownerReference with `controller: true`, kind
//! `Revision`, the Revision's `uid`).
//!
//! Labels prove nothing: any namespace user can make a Deployment or a Service carrying
//! `serving.knative.dev/revision`. The platform's watches still select by label (one watch per
//! kind for every revision), and keep every object they see by name; the revision's own is then
//! the one of its name whose controller is its Revision's UID ([`judge`]). Every other one
//! carrying the labels is **ignored** (never scaled, its pods' endpoints never the revision's,
//! its slices never read), counted once in `thaw_platform_ignored_total{kind,reason}` and
//! logged once ([`IgnoredSet`]):
//! - [`Ignored::NotNamedForRevision`]: its name is not the one the controller gives the
//!   revision its label names (a labelled impostor beside the real one);
//! - [`Ignored::NotControlledByRevision`]: named for the revision, but its controller is not
//!   the Revision's UID (an object that was there before the controller, which then reports it
//!   `NotOwned`, or one left from an earlier Revision of the same name).
//!
//! Until the Revision's UID is known (the Revision watch is a separate stream) a child is
//! **pending**: not used, not counted, judged again when the UID arrives.

use dashmap::DashMap;

use crate::knative::names::{DEPLOYMENT_SUFFIX, PRIVATE_SERVICE_SUFFIX, child_name};
use crate::revision::RevisionKey;

/// Most objects the [`IgnoredSet`] remembers; past it each one is counted every time it is
/// judged (never lost from the count).
pub const MAX_IGNORED: usize = 1 << 16;

/// Which child.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChildKind {
    /// `{revision}-deployment`: scaled through `/scale`; its pods are the revision's.
    Deployment,
    /// `{revision}-private`: its EndpointSlices list the revision's pods.
    Service,
}

impl ChildKind {
    /// The label value (`kind` of `thaw_platform_ignored_total`).
    pub fn as_str(self) -> &'static str {
        match self {
            ChildKind::Deployment => "deployment",
            ChildKind::Service => "service",
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            ChildKind::Deployment => DEPLOYMENT_SUFFIX,
            ChildKind::Service => PRIVATE_SERVICE_SUFFIX,
        }
    }

    /// The name the controller gives revision `revision`'s child of this kind.
    pub fn name_for(self, revision: &str) -> String {
        child_name(revision, self.suffix())
    }
}

/// What the platform keeps of a Deployment or private Service carrying a revision's label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Child {
    /// Its `serving.knative.dev/revision` label.
    pub revision: String,
    /// Its UID (a Deployment's pods are those of the ReplicaSets it controls by UID).
    pub uid: Option<String>,
    /// The UID of the Revision that controls it; `None`: no Revision does.
    pub controller: Option<String>,
    /// A Deployment's `spec.replicas` (what `/scale` holds); `None` for Services.
    pub replicas: Option<u32>,
}

/// Why an object carrying a revision's labels is not the revision's (the `reason` label of
/// `thaw_platform_ignored_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ignored {
    /// Not the name the controller gives the revision its label names.
    NotNamedForRevision,
    /// Named for the revision, but not controlled by the Revision's UID.
    NotControlledByRevision,
    /// An EndpointSlice whose `kubernetes.io/service-name` is not the revision's private
    /// Service, or whose private Service is not the revision's.
    NotThePrivateService,
}

impl Ignored {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Ignored::NotNamedForRevision => "not_named_for_revision",
            Ignored::NotControlledByRevision => "not_controlled_by_revision",
            Ignored::NotThePrivateService => "not_the_private_service",
        }
    }
}

/// What a child is to a revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judged {
    /// The revision's own.
    Genuine,
    /// The Revision's UID (or the object) is not known yet.
    Pending,
    /// Not the revision's.
    Ignored(Ignored),
}

/// What `child`, of kind `kind` and named `name`, is to the revision its label names, whose
/// Revision has UID `revision_uid` (`None`: not known yet). The name is judged first: it needs
/// no UID.
pub fn judge(kind: ChildKind, name: &str, child: &Child, revision_uid: Option<&str>) -> Judged {
    if name != kind.name_for(&child.revision) {
        return Judged::Ignored(Ignored::NotNamedForRevision);
    }
    match revision_uid {
        None => Judged::Pending,
        Some(uid) if child.controller.as_deref() == Some(uid) => Judged::Genuine,
        Some(_) => Judged::Ignored(Ignored::NotControlledByRevision),
    }
}

/// Every Deployment and private Service the watches see, by (namespace, name). Bounded by
/// the objects carrying the revision label in the watched namespaces.
#[derive(Debug, Default)]
pub struct Children {
    deployments: DashMap<(String, String), Child>,
    services: DashMap<(String, String), Child>,
}

impl Children {
    fn map(&self, kind: ChildKind) -> &DashMap<(String, String), Child> {
        match kind {
            ChildKind::Deployment => &self.deployments,
            ChildKind::Service => &self.services,
        }
    }

    /// Records `namespace/name`; returns what was known of it before.
    pub fn put(&self, kind: ChildKind, namespace: &str, name: &str, child: Child) -> Option<Child> {
        self.map(kind)
            .insert((namespace.to_string(), name.to_string()), child)
    }

    /// Forgets `namespace/name`; returns what was known of it.
    pub fn remove(&self, kind: ChildKind, namespace: &str, name: &str) -> Option<Child> {
        self.map(kind)
            .remove(&(namespace.to_string(), name.to_string()))
            .map(|(_, c)| c)
    }

    /// Replaces every object of `kind` with a fresh list.
    pub fn replace_all(&self, kind: ChildKind, listed: Vec<((String, String), Child)>) {
        let map = self.map(kind);
        map.clear();
        for (k, c) in listed {
            map.insert(k, c);
        }
    }

    /// What is known of `namespace/name`.
    pub fn get(&self, kind: ChildKind, namespace: &str, name: &str) -> Option<Child> {
        self.map(kind)
            .get(&(namespace.to_string(), name.to_string()))
            .map(|c| c.clone())
    }

    /// Every (namespace, name) of `kind`.
    pub fn keys(&self, kind: ChildKind) -> Vec<(String, String)> {
        self.map(kind).iter().map(|e| e.key().clone()).collect()
    }

    /// The child of `kind` named for `key`, with what it is to `key` (whose Revision has UID
    /// `revision_uid`). `None` when no object of that name is known.
    pub fn of(
        &self,
        kind: ChildKind,
        key: &RevisionKey,
        revision_uid: Option<&str>,
    ) -> Option<(String, Child, Judged)> {
        let name = kind.name_for(&key.name);
        let child = self.get(kind, &key.namespace, &name)?;
        let judged = if child.revision != *key.name {
            // Named like this revision's, labelled with another: not this revision's.
            Judged::Ignored(Ignored::NotControlledByRevision)
        } else {
            judge(kind, &name, &child, revision_uid)
        };
        Some((name, child, judged))
    }
}

/// The objects found not to be a revision's, each remembered with its reason, so that it is
/// counted and logged once (again only if its reason changes, or after it was forgotten).
#[derive(Debug, Default)]
pub struct IgnoredSet {
    seen: DashMap<(ChildKind, String, String), Ignored>,
}

impl IgnoredSet {
    /// Records what `kind` `namespace/name` is now: `Some(reason)`, ignored; `None`, not (or no
    /// longer, or not known). Returns true when it is ignored and was not for this reason
    /// before: the caller counts and logs it.
    pub fn note(
        &self,
        kind: ChildKind,
        namespace: &str,
        name: &str,
        reason: Option<Ignored>,
    ) -> bool {
        let key = (kind, namespace.to_string(), name.to_string());
        let Some(reason) = reason else {
            self.seen.remove(&key);
            return false;
        };
        if let Some(mut cur) = self.seen.get_mut(&key) {
            if *cur == reason {
                return false;
            }
            *cur = reason;
            return true;
        }
        if self.seen.len() < MAX_IGNORED {
            self.seen.insert(key, reason);
        }
        true
    }

    /// Forgets the objects of `kind` that `keep` refuses (a fresh list no longer has them).
    pub fn retain(&self, kind: ChildKind, keep: impl Fn(&str, &str) -> bool) {
        self.seen
            .retain(|(k, ns, name), _| *k != kind || keep(ns, name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn child(revision: &str, controller: Option<&str>) -> Child {
        Child {
            revision: revision.into(),
            uid: Some("child-uid".into()),
            controller: controller.map(Into::into),
            replicas: None,
        }
    }

    #[test]
    fn the_revisions_own_are_named_for_it_and_controlled_by_its_uid() {
        let d = ChildKind::Deployment;
        let ours = child("hello-00001", Some("rev-uid"));
        assert_eq!(
            judge(d, "hello-00001-deployment", &ours, Some("rev-uid")),
            Judged::Genuine
        );
        // The Revision's UID not known yet: pending.
        assert_eq!(
            judge(d, "hello-00001-deployment", &ours, None),
            Judged::Pending
        );
        // A labelled impostor of another name, whatever its owner (even the Revision).
        assert_eq!(
            judge(d, "mine", &ours, Some("rev-uid")),
            Judged::Ignored(Ignored::NotNamedForRevision)
        );
        assert_eq!(
            judge(d, "mine", &ours, None),
            Judged::Ignored(Ignored::NotNamedForRevision)
        );
        // Named for it, controlled by another UID (a Revision of the same name before) or by
        // nothing.
        for controller in [Some("old-uid"), None] {
            assert_eq!(
                judge(
                    d,
                    "hello-00001-deployment",
                    &child("hello-00001", controller),
                    Some("rev-uid")
                ),
                Judged::Ignored(Ignored::NotControlledByRevision)
            );
        }
        // Services are named `-private`; a long revision name is hashed as the controller does.
        let s = ChildKind::Service;
        assert_eq!(
            judge(s, "hello-00001-private", &ours, Some("rev-uid")),
            Judged::Genuine
        );
        assert_eq!(
            judge(s, "hello-00001-deployment", &ours, Some("rev-uid")),
            Judged::Ignored(Ignored::NotNamedForRevision)
        );
        let long = "r".repeat(60);
        let name = child_name(&long, "-private");
        assert!(name.len() <= 63);
        assert_eq!(
            judge(s, &name, &child(&long, Some("u")), Some("u")),
            Judged::Genuine
        );
    }

    #[test]
    fn a_revisions_child_is_found_by_its_name() {
        let c = Children::default();
        let key = RevisionKey::new("ns", "hello-00001");
        assert!(c.of(ChildKind::Deployment, &key, Some("u")).is_none());
        c.put(
            ChildKind::Deployment,
            "ns",
            "impostor",
            child("hello-00001", Some("u")),
        );
        assert!(c.of(ChildKind::Deployment, &key, Some("u")).is_none());
        c.put(
            ChildKind::Deployment,
            "ns",
            "hello-00001-deployment",
            child("hello-00001", Some("u")),
        );
        let (name, _, judged) = c.of(ChildKind::Deployment, &key, Some("u")).unwrap();
        assert_eq!(
            (name.as_str(), judged),
            ("hello-00001-deployment", Judged::Genuine)
        );
        // Same name in another namespace: not this one's.
        assert!(
            c.of(
                ChildKind::Deployment,
                &RevisionKey::new("b", "hello-00001"),
                Some("u")
            )
            .is_none()
        );
        // Named like this revision's, labelled with another.
        c.put(
            ChildKind::Service,
            "ns",
            "hello-00001-private",
            child("other-00001", Some("u")),
        );
        assert_eq!(
            c.of(ChildKind::Service, &key, Some("u")).unwrap().2,
            Judged::Ignored(Ignored::NotControlledByRevision)
        );
    }

    #[test]
    fn an_ignored_object_is_news_once_per_reason() {
        let s = IgnoredSet::default();
        let d = ChildKind::Deployment;
        let name = Some(Ignored::NotNamedForRevision);
        let owner = Some(Ignored::NotControlledByRevision);
        assert!(s.note(d, "ns", "x", name));
        assert!(!s.note(d, "ns", "x", name));
        // The same name of another kind or namespace is another object.
        assert!(s.note(ChildKind::Service, "ns", "x", name));
        assert!(s.note(d, "b", "x", name));
        // A new reason is news; no longer ignored, then ignored again, is news.
        assert!(s.note(d, "ns", "x", owner));
        assert!(!s.note(d, "ns", "x", None));
        assert!(s.note(d, "ns", "x", owner));
        // Forgotten when a list no longer has it.
        s.retain(d, |ns, _| ns != "ns");
        assert!(s.note(d, "ns", "x", owner));
        assert!(!s.note(d, "b", "x", name));
    }
}
