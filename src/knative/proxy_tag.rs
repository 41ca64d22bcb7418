//! `K-Proxy-Request`'s per-revision tag: HMAC-SHA256 keyed by the **tag key**
//! ([`crate::remote::tag_key`], the Secret `thaw-proxy-tag-key`) over
//! `namespace/revision/uid`, in lowercase hex.
//!
//! The queue sidecar counts a request as proxied (through an activator, which the autoscaler
//! subtracts) and believes its `K-Original-Host` only when `K-Proxy-Request` carries its
//! revision's tag. The controller computes the tag into the sidecar's environment
//! ([`crate::queue::settings::THAW_PROXY_TAG`]) and an activator computes it once per revision
//! ([`Tagger`]); the key itself stays in the system namespace. A client that sends
//! `K-Proxy-Request` without the tag (the ingress strips it; a client inside the cluster can
//! still reach a pod) is counted as a direct request, and the header, like `K-Original-Host`,
//! never reaches the application.
//!
//! **What the tag proves:** the request was forwarded by a holder of the tag key (an
//! activator), or by someone who read this revision's tag (its Deployment is readable by its
//! namespace's users), for this one revision **of this UID**: a revision deleted and created
//! again with the same name has a new UID and so a new tag, and the old one is refused.
//!
//! **Rotation.** The tag key is its own Secret, apart from the stats token: rotating the stats
//! token changes no tag and no pod template. Rotating the tag key (rare, deliberate: edit or
//! delete the Secret) changes every tag: the controller rolls the revisions' Deployments to the
//! new one, and for [`crate::remote::tag_key::PREVIOUS_GRACE`] an activator sends the tag under
//! the previous key too, so pods not yet replaced keep counting its requests as proxied.
//!
//! **Upgrade from the previous form** (HMAC(stats token, `namespace/revision`), [`legacy_tag`]).
//! During this release only:
//! - a sidecar accepts its tag ([`crate::queue::settings::THAW_PROXY_TAG`]) and the previous
//!   form's ([`crate::queue::settings::THAW_PROXY_TAG_LEGACY`]) in any of the first
//!   [`CHECKED_ELEMENTS`] elements of a comma-separated `K-Proxy-Request` ([`Accepted`]);
//! - an activator sends the previous form first (under the stats token in force and, within
//!   its grace, the previous one), then the new form (under the tag key in force and, within its
//!   grace, the previous one): at most four elements, the previous form always among the first
//!   two, which is all a previous release's sidecar reads;
//! - the controller writes `THAW_PROXY_TAG_LEGACY` into every template: the previous-form tag the
//!   live Deployment holds (its `THAW_PROXY_TAG` when it was written by a previous release, its
//!   `THAW_PROXY_TAG_LEGACY` otherwise), empty when it holds none. It is never recomputed from
//!   the stats token for an existing Deployment, so a stats-token rotation changes no template.
//!   A Deployment created within [`crate::remote::tag_key::LEGACY_WINDOW`] of the tag key
//!   Secret's creation (the upgrade) gets one computed from the stats token, so a
//!   previous release's activator still running mid-upgrade is counted as proxied by a new
//!   revision's pods; one created later gets none.
//!
//! So no request counts as direct mid-upgrade: an old activator's tag is the previous form,
//! which every pod holds; a new activator's list carries both forms, under both keys when
//! either was just rotated. A stats-token rotation mid-upgrade is followed for its grace only:
//! an old-form pod not replaced within it counts a new activator's requests as direct until it
//! is (templates no longer roll for it).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::{ArcSwap, ArcSwapOption};
use hmac::{Hmac, Mac};
use http::HeaderValue;
use k8s_openapi::jiff::Timestamp;
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// A tag's length: SHA-256 in hex.
pub const TAG_LEN: usize = 64;

/// How many elements of a comma-separated `K-Proxy-Request` a sidecar compares: an activator
/// sends at most this many (both forms, each under the key in force and the previous one).
/// A previous release's sidecar compares the first two.
pub const CHECKED_ELEMENTS: usize = 4;

fn hmac_hex(key: &[u8], parts: &[&str]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            mac.update(b"/");
        }
        mac.update(p.as_bytes());
    }
    let out = mac.finalize().into_bytes();
    out.iter().map(|b| format!("{b:02x}")).collect()
}

/// The tag of revision `namespace/revision` of UID `uid` under the tag key `key`. Names and
/// UIDs hold no `/`, so the message is unambiguous.
pub fn tag(key: &[u8], namespace: &str, revision: &str, uid: &str) -> String {
    hmac_hex(key, &[namespace, revision, uid])
}

/// The previous release's tag of `namespace/revision` under the stats token (no UID). Accepted
/// and sent during this release only, for the upgrade.
pub fn legacy_tag(stats_token: &[u8], namespace: &str, revision: &str) -> String {
    hmac_hex(stats_token, &[namespace, revision])
}

/// A key tags are computed with. Its `Debug` says only its length.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(Arc<[u8]>);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({} bytes)", self.0.len())
    }
}

impl Key {
    /// A key from a Secret's bytes.
    pub fn new(bytes: &[u8]) -> Self {
        Self(Arc::from(bytes))
    }
}

/// What the controller writes into a revision's template, as one settings snapshot holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Keys {
    /// The tag key in force; `None` until its Secret is read (sidecars then get no
    /// `THAW_PROXY_TAG` and honour no new-form tag until it is).
    pub key: Option<Key>,
    /// The stats token in force: the previous form's key, used only for a Deployment created
    /// before `legacy_until`.
    pub stats_token: Option<Key>,
    /// Until when a Deployment created now gets a previous-form tag: the tag key Secret's
    /// creation plus [`crate::remote::tag_key::LEGACY_WINDOW`].
    pub legacy_until: Option<Timestamp>,
}

impl Keys {
    /// The revision's tag (`THAW_PROXY_TAG`), when the tag key is known.
    pub fn tag(&self, namespace: &str, revision: &str, uid: &str) -> Option<String> {
        let k = self.key.as_ref()?;
        Some(tag(&k.0, namespace, revision, uid))
    }

    /// The previous-form tag a Deployment created at `now` carries
    /// (`THAW_PROXY_TAG_LEGACY`): within the upgrade window and with the stats token known.
    pub fn legacy_for_new(
        &self,
        namespace: &str,
        revision: &str,
        now: Timestamp,
    ) -> Option<String> {
        let until = self.legacy_until?;
        let token = self.stats_token.as_ref()?;
        (now < until).then(|| legacy_tag(&token.0, namespace, revision))
    }
}

/// One tag a sidecar accepts (from its environment). Its `Debug` does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct Expected([u8; TAG_LEN]);

impl fmt::Debug for Expected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Expected(..)")
    }
}

impl Expected {
    /// A tag as the controller writes it: 64 lowercase hex digits.
    pub fn parse(s: &str) -> Result<Self, String> {
        let b = s.trim().as_bytes();
        if b.len() != TAG_LEN || !b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(format!(
                "must be {TAG_LEN} lowercase hex digits (HMAC-SHA256), got {} characters",
                b.len()
            ));
        }
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(b);
        Ok(Self(t))
    }
}

/// The tags a sidecar accepts: its revision's and, during this release, the previous form's.
/// Empty: it accepts none (every request is direct).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Accepted {
    tag: Option<Expected>,
    legacy: Option<Expected>,
}

impl Accepted {
    /// `tag` (`THAW_PROXY_TAG`) and `legacy` (`THAW_PROXY_TAG_LEGACY`).
    pub fn new(tag: Option<Expected>, legacy: Option<Expected>) -> Self {
        Self { tag, legacy }
    }

    /// Whether a `K-Proxy-Request` value carries one of these tags: the value, or one of the
    /// first [`CHECKED_ELEMENTS`] elements of a comma-separated list. Every comparison is made
    /// whatever the earlier ones found, each in constant time, so the answer's timing does not
    /// tell how much of a guess was right.
    pub fn accepts(&self, value: &[u8]) -> bool {
        let mut ok = subtle::Choice::from(0);
        for part in value.split(|b| *b == b',').take(CHECKED_ELEMENTS) {
            let part = part.trim_ascii();
            if part.len() != TAG_LEN {
                continue;
            }
            for t in [&self.tag, &self.legacy].into_iter().flatten() {
                ok |= part.ct_eq(&t.0);
            }
        }
        ok.into()
    }
}

/// A key in force and, within its grace, the one it replaced.
type Pair = [Option<Arc<[u8]>>; 2];

/// The keys an activator tags with; `generation` changes whenever one does.
#[derive(Default)]
struct Ring {
    generation: u64,
    /// The tag key in force and the previous one (the new form).
    keys: Pair,
    /// The stats token in force and the previous one (the previous form, this release only).
    stats: Pair,
}

impl fmt::Debug for Ring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = |p: &Pair| p.iter().flatten().count();
        write!(
            f,
            "Ring {{ generation: {}, keys: {}, stats: {} }}",
            self.generation,
            n(&self.keys),
            n(&self.stats)
        )
    }
}

impl Ring {
    /// The previous form's tags first (a previous release's sidecar reads two elements), then
    /// the new form's; `None` when no key is known.
    fn value(&self, namespace: &str, revision: &str, uid: &str) -> Option<HeaderValue> {
        let legacy = self.stats.iter().flatten();
        let legacy = legacy.map(|k| legacy_tag(k, namespace, revision));
        let new = self.keys.iter().flatten();
        let new = new.map(|k| tag(k, namespace, revision, uid));
        let parts: Vec<String> = legacy.chain(new).collect();
        if parts.is_empty() {
            return None;
        }
        let mut v = HeaderValue::from_str(&parts.join(", ")).ok()?;
        v.set_sensitive(true);
        Some(v)
    }
}

fn same(pair: &Pair, given: [Option<&[u8]>; 2]) -> bool {
    pair.iter().map(Option::as_deref).eq(given)
}

/// One revision's value as last computed: the keys' generation and the UID it was computed for.
#[derive(Debug)]
struct Cached {
    generation: u64,
    uid: Option<Arc<str>>,
    value: HeaderValue,
}

/// One revision's `K-Proxy-Request` value, as last computed.
#[derive(Debug, Default)]
pub struct TagCell(ArcSwapOption<Cached>);

/// An activator's tags: computed once per revision, UID and keys ([`TagCell`]), recomputed
/// only when a key rotates or a previous one's grace ends.
#[derive(Debug, Default)]
pub struct Tagger {
    ring: ArcSwap<Ring>,
    generation: AtomicU64,
}

impl Tagger {
    /// A tagger with one tag key, never changed (tests).
    pub fn fixed(key: &[u8]) -> Self {
        let t = Self::default();
        t.set([Some(key), None], [None, None]);
        t
    }

    /// Puts the tag keys (`[current, previous]`) and the stats tokens (the previous form's
    /// keys, likewise) in force, when they differ from those in force: the next request to each
    /// revision recomputes its value.
    pub fn set(&self, keys: [Option<&[u8]>; 2], stats: [Option<&[u8]>; 2]) {
        let ring = self.ring.load();
        if same(&ring.keys, keys) && same(&ring.stats, stats) {
            return;
        }
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let own = |p: [Option<&[u8]>; 2]| p.map(|k| k.map(Arc::from));
        self.ring.store(Arc::new(Ring {
            generation,
            keys: own(keys),
            stats: own(stats),
        }));
    }

    /// The `K-Proxy-Request` value for revision `namespace/revision` of UID `uid`: `cell`'s,
    /// unless the keys or the UID changed since it was computed. `None` before any key is
    /// known.
    pub fn value(
        &self,
        cell: &TagCell,
        namespace: &str,
        revision: &str,
        uid: Option<&Arc<str>>,
    ) -> Option<HeaderValue> {
        let ring = self.ring.load();
        if let Some(c) = &*cell.0.load()
            && c.generation == ring.generation
            && c.uid.as_ref() == uid
        {
            return Some(c.value.clone());
        }
        let v = ring.value(namespace, revision, uid.map_or("", |u| u))?;
        cell.0.store(Some(Arc::new(Cached {
            generation: ring.generation,
            uid: uid.cloned(),
            value: v.clone(),
        })));
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &[u8] = b"tag-key-one-0123456789abcdef";
    const K2: &[u8] = b"tag-key-two-fedcba9876543210";
    const S1: &[u8] = b"stats-token-one-0123456789ab";
    const S2: &[u8] = b"stats-token-two-ba9876543210";

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn mac_ok(key: &[u8], message: &[u8], tag: &str) -> bool {
        let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
        mac.update(message);
        mac.verify_slice(&hex(tag)).is_ok()
    }

    fn expected(s: &str) -> Option<Expected> {
        Some(Expected::parse(s).unwrap())
    }

    #[test]
    fn the_tag_is_hmac_sha256_of_namespace_revision_and_uid_under_the_tag_key() {
        // Checked against the MAC computed over the message as one piece.
        let t = tag(K1, "ns", "rev", "0000-uid");
        assert_eq!(t.len(), TAG_LEN);
        assert!(mac_ok(K1, b"ns/rev/0000-uid", &t));
        // The previous form: the stats token over `namespace/revision`.
        let l = legacy_tag(S1, "ns", "rev");
        assert!(mac_ok(S1, b"ns/rev", &l));
        // Another revision, namespace or key: another tag.
        assert_ne!(t, tag(K1, "ns", "rev2", "0000-uid"));
        assert_ne!(t, tag(K1, "ns2", "rev", "0000-uid"));
        assert_ne!(t, tag(K2, "ns", "rev", "0000-uid"));
    }

    /// The finding: a revision deleted and created again under the same name kept its tag. Its
    /// new UID now gives it another, and its sidecar refuses the old one.
    #[test]
    fn a_revision_created_again_under_its_name_gets_another_tag() {
        let before = tag(K1, "ns", "rev", "uid-before");
        let after = tag(K1, "ns", "rev", "uid-after");
        assert_ne!(before, after);
        let sidecar = Accepted::new(expected(&after), None);
        assert!(sidecar.accepts(after.as_bytes()));
        assert!(!sidecar.accepts(before.as_bytes()));
        // Without the UID (the previous form) the two were the same.
        assert_eq!(legacy_tag(S1, "ns", "rev"), legacy_tag(S1, "ns", "rev"));
    }

    #[test]
    fn a_sidecar_accepts_either_tag_in_the_first_four_elements_only() {
        let mine = tag(K1, "ns", "rev", "u");
        let old = legacy_tag(S1, "ns", "rev");
        let other = tag(K1, "ns", "other", "u");
        let e = Accepted::new(expected(&mine), expected(&old));
        for t in [&mine, &old] {
            assert!(e.accepts(t.as_bytes()));
            assert!(e.accepts(format!("{other}, {t}").as_bytes()));
            assert!(e.accepts(format!("{other},{other}, {other} ,{t}").as_bytes()));
            assert!(!e.accepts(format!("{other}, {other}, {other}, {other}, {t}").as_bytes()));
        }
        assert!(!e.accepts(other.as_bytes()));
        assert!(!e.accepts(b"activator"));
        assert!(!e.accepts(b""));
        assert!(!e.accepts(&mine.as_bytes()[..TAG_LEN - 1]));
        assert!(!e.accepts(mine.to_uppercase().as_bytes()));
        // Only its own: the previous form alone, or nothing.
        let legacy_only = Accepted::new(None, expected(&old));
        assert!(legacy_only.accepts(old.as_bytes()));
        assert!(!legacy_only.accepts(mine.as_bytes()));
        assert!(!Accepted::default().accepts(mine.as_bytes()));
        assert!(Expected::parse("activator").is_err());
        assert!(Expected::parse(&mine.to_uppercase()).is_err());
        assert_eq!(format!("{:?}", expected(&mine).unwrap()), "Expected(..)");
    }

    #[test]
    fn the_tagger_computes_once_per_revision_uid_and_keys() {
        let t = Tagger::fixed(K1);
        let cell = TagCell::default();
        let uid: Arc<str> = Arc::from("uid-1");
        let v = t.value(&cell, "ns", "rev", Some(&uid)).unwrap();
        assert_eq!(v, tag(K1, "ns", "rev", "uid-1").as_str());
        // The cached value is returned as it is (the same bytes, not a new computation).
        let again = t.value(&cell, "ns", "rev", Some(&uid)).unwrap();
        assert_eq!(again.as_bytes().as_ptr(), v.as_bytes().as_ptr());
        // The revision created again (another UID): recomputed.
        let uid2: Arc<str> = Arc::from("uid-2");
        let v2 = t.value(&cell, "ns", "rev", Some(&uid2)).unwrap();
        assert_eq!(v2, tag(K1, "ns", "rev", "uid-2").as_str());
        assert!(
            Tagger::default()
                .value(&TagCell::default(), "ns", "rev", None)
                .is_none()
        );
        // A new key: the next request recomputes, the previous key's tag second.
        t.set([Some(K2), Some(K1)], [None, None]);
        let rotated = t.value(&cell, "ns", "rev", Some(&uid2)).unwrap();
        assert_eq!(
            rotated.to_str().unwrap(),
            format!(
                "{}, {}",
                tag(K2, "ns", "rev", "uid-2"),
                tag(K1, "ns", "rev", "uid-2")
            )
        );
        assert!(rotated.is_sensitive());
    }

    /// A previous release's sidecar (`Expected::accepts` then): its one tag as the value or one
    /// of the first two elements.
    fn previous_release_accepts(tag: &str, value: &str) -> bool {
        value.split(',').take(2).any(|p| p.trim() == tag)
    }

    /// Every value an activator sends during this release, whatever was just rotated, is
    /// counted as proxied by every kind of pod mid-upgrade: an old-form pod (a previous
    /// release's sidecar holding the previous form), and a new-form pod under either tag key,
    /// with or without a previous-form tag. And a previous release's activator (the previous
    /// form alone) is counted by every pod holding the previous form.
    #[test]
    fn mid_upgrade_every_pod_counts_every_activators_requests_as_proxied() {
        let (ns, rev, uid) = ("ns", "rev", "uid");
        let key_sets: [[Option<&[u8]>; 2]; 3] =
            [[None, None], [Some(K1), None], [Some(K2), Some(K1)]];
        let stats_sets: [[Option<&[u8]>; 2]; 2] = [[Some(S1), None], [Some(S2), Some(S1)]];
        for keys in key_sets {
            for stats in stats_sets {
                let t = Tagger::default();
                t.set(keys, stats);
                let v = t
                    .value(&TagCell::default(), ns, rev, Some(&Arc::from(uid)))
                    .unwrap();
                let v = v.to_str().unwrap();
                assert!(v.split(',').count() <= CHECKED_ELEMENTS, "{v}");
                let case = format!(
                    "keys {:?} stats {:?}",
                    keys.map(|k| k.is_some()),
                    stats.map(|k| k.is_some())
                );
                // An old-form pod, written under the stats token in force or the one replaced.
                for s in stats.iter().flatten() {
                    assert!(
                        previous_release_accepts(&legacy_tag(s, ns, rev), v),
                        "{case}"
                    );
                }
                // A new-form pod under each tag key the activator knows, carrying a
                // previous-form tag or not.
                for k in keys.iter().flatten() {
                    let mine = tag(k, ns, rev, uid);
                    for legacy in [None, stats[0].map(|s| legacy_tag(s, ns, rev))] {
                        let pod =
                            Accepted::new(expected(&mine), legacy.as_deref().and_then(expected));
                        assert!(pod.accepts(v.as_bytes()), "{case}");
                    }
                }
                // A new-form pod whose key the activator does not know yet (a key rotated
                // before the activator saw it), counted through its previous-form tag.
                let unknown = tag(b"a-key-not-known-yet-01234567", ns, rev, uid);
                let pod = Accepted::new(
                    expected(&unknown),
                    expected(&legacy_tag(stats[0].unwrap(), ns, rev)),
                );
                assert!(pod.accepts(v.as_bytes()), "{case}");
            }
        }
        // A previous release's activator: the previous form alone, or `new, previous` within a
        // stats-token rotation; a new-form pod carrying the previous form counts it.
        let pod = Accepted::new(
            expected(&tag(K1, ns, rev, uid)),
            expected(&legacy_tag(S1, ns, rev)),
        );
        assert!(pod.accepts(legacy_tag(S1, ns, rev).as_bytes()));
        let rotating = format!("{}, {}", legacy_tag(S2, ns, rev), legacy_tag(S1, ns, rev));
        assert!(pod.accepts(rotating.as_bytes()));
    }

    #[test]
    fn a_deployment_created_within_the_upgrade_window_gets_the_previous_form() {
        let created: Timestamp = "2025-01-01T00:00:00Z".parse().unwrap();
        let keys = Keys {
            key: Some(Key::new(K1)),
            stats_token: Some(Key::new(S1)),
            legacy_until: Some(created + std::time::Duration::from_secs(1800)),
        };
        assert_eq!(keys.tag("ns", "rev", "u"), Some(tag(K1, "ns", "rev", "u")));
        let inside = created + std::time::Duration::from_secs(60);
        let after = created + std::time::Duration::from_secs(1800);
        assert_eq!(
            keys.legacy_for_new("ns", "rev", inside),
            Some(legacy_tag(S1, "ns", "rev"))
        );
        assert_eq!(keys.legacy_for_new("ns", "rev", after), None);
        let no_token = Keys {
            stats_token: None,
            ..keys.clone()
        };
        assert_eq!(no_token.legacy_for_new("ns", "rev", inside), None);
        assert_eq!(Keys::default().tag("ns", "rev", "u"), None);
        assert_eq!(format!("{:?}", Key::new(K1)), "Key(28 bytes)");
    }
}
