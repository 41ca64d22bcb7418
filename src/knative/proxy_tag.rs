//! `K-Proxy-Request`'s per-revision tag: HMAC-SHA256 keyed by the stats token
//! ([`crate::remote::token`]) over `namespace/revision`, in lowercase hex.
//!
//! The queue sidecar counts a request as proxied (through an activator, which the autoscaler
//! subtracts) and believes its `K-Original-Host` only when `K-Proxy-Request` carries its
//! revision's tag. The controller computes the tag into the sidecar's environment
//! ([`crate::queue::settings::THAW_PROXY_TAG`]) and an activator computes it once per revision
//! ([`Tagger`]); the stats token itself stays in the system namespace. A client that sends
//! `K-Proxy-Request` without the tag (the ingress strips it; a client inside the cluster can
//! still reach a pod) is counted as a direct request, and the header, like `K-Original-Host`,
//! never reaches the application.
//!
//! The tag proves that the request was forwarded by a holder of the stats token (an activator,
//! or anything that read the tag) for this revision, nothing more: a tenant who can read its own revision's Deployment sees its own
//! revision's tag, which tags requests to that revision only.
//!
//! A rotated token changes every tag: the controller rolls the revisions' Deployments to the new
//! one, and while the previous token is still accepted ([`crate::remote::token::PREVIOUS_GRACE`]) an
//! activator sends both tags (`new, previous`), either of which a sidecar accepts, so pods not yet
//! replaced keep counting the activator's requests as proxied.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::{ArcSwap, ArcSwapOption};
use hmac::{Hmac, Mac};
use http::HeaderValue;
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// A tag's length: SHA-256 in hex.
pub const TAG_LEN: usize = 64;

/// The tag of revision `namespace/revision` under `key` (the stats token's bytes).
pub fn tag(key: &[u8], namespace: &str, revision: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(namespace.as_bytes());
    mac.update(b"/");
    mac.update(revision.as_bytes());
    let out = mac.finalize().into_bytes();
    out.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key tags are computed with (the stats token's bytes), as the controller holds it. Its
/// `Debug` says only its length.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(Arc<[u8]>);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({} bytes)", self.0.len())
    }
}

impl Key {
    /// A key from the token's bytes.
    pub fn new(bytes: &[u8]) -> Self {
        Self(Arc::from(bytes))
    }

    /// The tag of `namespace/revision` ([`tag`]).
    pub fn tag(&self, namespace: &str, revision: &str) -> String {
        tag(&self.0, namespace, revision)
    }
}

/// The tag a sidecar accepts (from its environment). Its `Debug` does not print it.
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

    /// Whether a `K-Proxy-Request` value carries this tag: the value, or one of the first two
    /// elements of a comma-separated list (an activator's `new, previous` during a rotation).
    /// Each comparison takes the same time however much of a guess is right.
    pub fn accepts(&self, value: &[u8]) -> bool {
        let mut ok = subtle::Choice::from(0);
        for part in value.split(|b| *b == b',').take(2) {
            let part = part.trim_ascii();
            if part.len() == TAG_LEN {
                ok |= part.ct_eq(&self.0);
            }
        }
        ok.into()
    }
}

/// The keys an activator tags with: the token in force and, within its grace, the one it
/// replaced; `generation` changes whenever either does.
#[derive(Default)]
struct Keys {
    generation: u64,
    current: Option<Arc<[u8]>>,
    previous: Option<Arc<[u8]>>,
}

impl fmt::Debug for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Keys {{ generation: {}, current: {}, previous: {} }}",
            self.generation,
            self.current.is_some(),
            self.previous.is_some()
        )
    }
}

impl Keys {
    fn value(&self, namespace: &str, revision: &str) -> Option<HeaderValue> {
        let current = tag(self.current.as_ref()?, namespace, revision);
        let v = match &self.previous {
            Some(p) => format!("{current}, {}", tag(p, namespace, revision)),
            None => current,
        };
        let mut v = HeaderValue::from_str(&v).ok()?;
        v.set_sensitive(true);
        Some(v)
    }
}

/// One revision's tag as last computed, and the generation of the keys it was computed with.
#[derive(Debug, Default)]
pub struct TagCell(ArcSwapOption<(u64, HeaderValue)>);

/// An activator's tags: computed once per revision and token ([`TagCell`]), recomputed only
/// when the token rotates or the previous one's grace ends.
#[derive(Debug, Default)]
pub struct Tagger {
    keys: ArcSwap<Keys>,
    generation: AtomicU64,
}

impl Tagger {
    /// A tagger with one key, never changed (tests).
    pub fn fixed(key: &[u8]) -> Self {
        let t = Self::default();
        t.set(Some(key), None);
        t
    }

    /// Puts `current` and `previous` (a replaced token within its grace) in force, when they
    /// differ from those in force: the next request to each revision recomputes its tag.
    pub fn set(&self, current: Option<&[u8]>, previous: Option<&[u8]>) {
        let keys = self.keys.load();
        if keys.current.as_deref() == current && keys.previous.as_deref() == previous {
            return;
        }
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        self.keys.store(Arc::new(Keys {
            generation,
            current: current.map(Arc::from),
            previous: previous.map(Arc::from),
        }));
    }

    /// The `K-Proxy-Request` value for `namespace/revision`: `cell`'s, unless the keys changed
    /// since it was computed. `None` before a token is known.
    pub fn value(&self, cell: &TagCell, namespace: &str, revision: &str) -> Option<HeaderValue> {
        let keys = self.keys.load();
        if let Some(c) = &*cell.0.load()
            && c.0 == keys.generation
        {
            return Some(c.1.clone());
        }
        let v = keys.value(namespace, revision)?;
        cell.0.store(Some(Arc::new((keys.generation, v.clone()))));
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tag_is_hmac_sha256_of_the_revision_under_the_token() {
        // Checked against the MAC computed over the message as one piece.
        let t = tag(b"0123456789abcdef", "ns", "rev");
        assert_eq!(t.len(), TAG_LEN);
        let mut mac = Hmac::<Sha256>::new_from_slice(b"0123456789abcdef").unwrap();
        mac.update(b"ns/rev");
        mac.verify_slice(&hex(&t)).unwrap();
        // Another revision, namespace or token: another tag.
        assert_ne!(t, tag(b"0123456789abcdef", "ns", "rev2"));
        assert_ne!(t, tag(b"0123456789abcdef", "ns2", "rev"));
        assert_ne!(t, tag(b"0123456789abcdeX", "ns", "rev"));
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn a_sidecar_accepts_its_tag_alone_or_first_or_second_of_two() {
        let k = b"0123456789abcdef".as_slice();
        let mine = tag(k, "ns", "rev");
        let other = tag(k, "ns", "other");
        let e = Expected::parse(&mine).unwrap();
        assert!(e.accepts(mine.as_bytes()));
        assert!(e.accepts(format!("{mine}, {other}").as_bytes()));
        assert!(e.accepts(format!("{other},{mine}").as_bytes()));
        assert!(!e.accepts(format!("{other}, {other}, {mine}").as_bytes()));
        assert!(!e.accepts(other.as_bytes()));
        assert!(!e.accepts(b"activator"));
        assert!(!e.accepts(b""));
        assert!(!e.accepts(&mine.as_bytes()[..TAG_LEN - 1]));
        assert!(!e.accepts(mine.to_uppercase().as_bytes()));
        assert!(Expected::parse("activator").is_err());
        assert!(Expected::parse(&mine.to_uppercase()).is_err());
        assert_eq!(format!("{e:?}"), "Expected(..)");
    }

    #[test]
    fn the_tagger_computes_once_per_revision_and_token() {
        let k = b"0123456789abcdef".as_slice();
        let t = Tagger::fixed(k);
        let cell = TagCell::default();
        let v = t.value(&cell, "ns", "rev").unwrap();
        assert_eq!(v, tag(k, "ns", "rev").as_str());
        // The cached value is returned as it is (the same bytes, not a new computation).
        let again = t.value(&cell, "ns", "rev").unwrap();
        assert_eq!(again.as_bytes().as_ptr(), v.as_bytes().as_ptr());
        let none = Tagger::default();
        assert!(none.value(&TagCell::default(), "ns", "rev").is_none());
        // A new key: the next request recomputes.
        t.set(Some(b"fedcba9876543210"), Some(k));
        let rotated = t.value(&cell, "ns", "rev").unwrap();
        assert_eq!(
            rotated.to_str().unwrap(),
            format!(
                "{}, {}",
                tag(b"fedcba9876543210", "ns", "rev"),
                tag(k, "ns", "rev")
            )
        );
    }

    #[test]
    fn during_a_rotation_both_tags_are_sent_and_either_is_accepted() {
        let (new, old) = (
            b"0123456789abcdef".as_slice(),
            b"fedcba9876543210".as_slice(),
        );
        let keys = Keys {
            generation: 1,
            current: Some(Arc::from(new)),
            previous: Some(Arc::from(old)),
        };
        let v = keys.value("ns", "rev").unwrap();
        for k in [new, old] {
            let e = Expected::parse(&tag(k, "ns", "rev")).unwrap();
            assert!(e.accepts(v.as_bytes()));
        }
        assert!(v.to_str().unwrap().starts_with(&tag(new, "ns", "rev")));
    }
}
