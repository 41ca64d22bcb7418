//! The webhook's certificates as data: a CA and a serving certificate it signs ([`Pair`]), the
//! Secret's keys that hold them, the CA bundle every client is given, and the one decision of
//! rotation ([`plan`]). Pure: no API calls, the clock is a parameter.
//!
//! # The Secret (`thaw-webhook-certs` in the system namespace)
//! - `ca-cert.pem`, `server-cert.pem`, `server-key.pem`: what every replica serves now
//!   (knative.dev/pkg's key names).
//! - `next-ca-cert.pem`, `next-server-cert.pem`, `next-server-key.pem`: a pair staged for
//!   rotation, trusted (in the bundle) but not yet served.
//! - `ca-bundle.pem`: every CA a client must trust: the current one, the staged one, and
//!   earlier ones until they expire. This is what the webhook configurations' `caBundle` carry.
//!
//! # Rotation without a failed call
//! A certificate near its end (`rotate_before` left) is replaced in two steps: first a new
//! pair is **staged** and its CA added to the bundle (the configurations are brought to the
//! bundle); only once every configuration carries it, and `publish_delay` has passed (the API
//! server's informers catching up), is it **promoted** to be served. The old CA stays in the
//! bundle until it expires, so a client holding either bundle trusts whichever certificate a
//! replica serves during the change. The CA key is never stored: each rotation makes a new CA.
//!
//! # A Secret deleted (or emptied) while replicas serve
//! An operator forces a rotation by deleting the Secret. The replicas keep serving the pair they
//! loaded and the configurations still trust its CA, so the new pair goes through the same two
//! steps: staged (the Secret then holds no current pair, which every replica skips) beside the
//! CAs the configurations trust, promoted once published. Only when nothing is served or
//! trusted yet (a first install) is a new pair served at once.

use std::collections::BTreeMap;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use time::OffsetDateTime;

/// Current pair.
pub const CA_CERT: &str = "ca-cert.pem";
pub const SERVER_CERT: &str = "server-cert.pem";
pub const SERVER_KEY: &str = "server-key.pem";
/// Staged pair.
pub const NEXT_CA_CERT: &str = "next-ca-cert.pem";
pub const NEXT_SERVER_CERT: &str = "next-server-cert.pem";
pub const NEXT_SERVER_KEY: &str = "next-server-key.pem";
/// Every trusted CA (PEM, concatenated).
pub const CA_BUNDLE: &str = "ca-bundle.pem";
/// When the staged pair was staged (RFC 3339), a Secret annotation.
pub const STAGED_AT_ANNOTATION: &str = "webhook.thaw.dev/staged-at";

/// Most CAs a bundle keeps (current, staged, and earlier ones still valid): a bound even if
/// rotations come faster than certificates expire.
pub const MAX_BUNDLE: usize = 4;

/// Certificates' validity and when to rotate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetimes {
    /// How long a new CA and serving certificate are valid.
    pub validity: time::Duration,
    /// Rotate when less than this is left (must be shorter than `validity`).
    pub rotate_before: time::Duration,
    /// How long a staged CA stays in the configurations' bundle before its certificate is
    /// served.
    pub publish_delay: time::Duration,
}

impl Lifetimes {
    /// Knative's choice: a year's validity, rotated within the last week; thaw waits a minute
    /// between publishing a CA and serving its certificate.
    pub const DEFAULT: Self = Self {
        validity: time::Duration::days(365),
        rotate_before: time::Duration::days(7),
        publish_delay: time::Duration::minutes(1),
    };

    /// The lifetimes, checked.
    pub fn validate(&self) -> Result<(), String> {
        if self.validity <= time::Duration::ZERO {
            return Err("the certificate validity must be positive".into());
        }
        if self.rotate_before <= time::Duration::ZERO || self.rotate_before >= self.validity {
            return Err(format!(
                "rotate-before ({}) must be positive and shorter than the validity ({})",
                self.rotate_before, self.validity
            ));
        }
        if self.publish_delay < time::Duration::ZERO
            || self.publish_delay >= self.validity - self.rotate_before
        {
            return Err(format!(
                "publish-delay ({}) must be shorter than validity minus rotate-before",
                self.publish_delay
            ));
        }
        Ok(())
    }
}

/// A CA and the serving certificate it signed, PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct Pair {
    pub ca_cert: String,
    pub server_cert: String,
    pub server_key: String,
}

impl std::fmt::Debug for Pair {
    /// Never prints the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pair").finish_non_exhaustive()
    }
}

/// Makes a new CA and a serving certificate for `dns_names` (the Service's names), both valid
/// from a minute before `now` (clock skew) for `validity`.
pub fn generate(
    dns_names: &[String],
    now: OffsetDateTime,
    validity: time::Duration,
) -> Result<Pair, String> {
    let e = |what: &str, err: rcgen::Error| format!("cannot make the webhook's {what}: {err}");
    let not_before = now - time::Duration::minutes(1);
    let not_after = now + validity;
    let ca_key = KeyPair::generate().map_err(|err| e("CA key", err))?;
    let mut ca = CertificateParams::default();
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.distinguished_name = DistinguishedName::new();
    ca.distinguished_name.push(
        DnType::CommonName,
        format!("thaw-webhook-ca {}", now.unix_timestamp()),
    );
    ca.distinguished_name.push(DnType::OrganizationName, "thaw");
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca_cert = ca.self_signed(&ca_key).map_err(|err| e("CA", err))?;

    let key = KeyPair::generate().map_err(|err| e("serving key", err))?;
    let mut leaf =
        CertificateParams::new(dns_names.to_vec()).map_err(|err| e("serving names", err))?;
    leaf.distinguished_name = DistinguishedName::new();
    leaf.distinguished_name.push(
        DnType::CommonName,
        dns_names.first().cloned().unwrap_or_default(),
    );
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = not_before;
    leaf.not_after = not_after;
    let server_cert = leaf
        .signed_by(&key, &ca_cert, &ca_key)
        .map_err(|err| e("serving certificate", err))?;
    Ok(Pair {
        ca_cert: ca_cert.pem(),
        server_cert: server_cert.pem(),
        server_key: key.serialize_pem(),
    })
}

/// When a PEM certificate stops being valid; `None` when it does not parse.
pub fn not_after(pem: &str) -> Option<OffsetDateTime> {
    CertificateParams::from_ca_cert_pem(pem)
        .ok()
        .map(|p| p.not_after)
}

/// The certificates of a PEM bundle, each as its own PEM block, in order; what does not
/// parse is left out.
pub fn split_bundle(bundle: &str) -> Vec<String> {
    pem::parse_many(bundle)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.tag() == "CERTIFICATE")
        .map(|p| {
            pem::encode_config(
                &p,
                pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
            )
        })
        .collect()
}

/// The certificates of `bundle` as DER, for a TLS client's roots.
pub fn bundle_ders(bundle: &[u8]) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(bundle)
        .filter_map(Result::ok)
        .collect()
}

/// Whether `bundle` holds the certificate `cert` (both PEM; compared as DER).
pub fn bundle_contains(bundle: &[u8], cert: &str) -> bool {
    let Some(want) = CertificateDer::pem_slice_iter(cert.as_bytes()).find_map(Result::ok) else {
        return false;
    };
    bundle_ders(bundle).iter().any(|c| c == &want)
}

/// `cas` without duplicates and expired ones (at `now`), newest last, at most [`MAX_BUNDLE`]
/// (the oldest go first), joined as one PEM bundle.
pub fn make_bundle(cas: &[String], now: OffsetDateTime) -> String {
    let mut seen: Vec<CertificateDer<'static>> = Vec::new();
    let mut kept: Vec<String> = Vec::new();
    for pem in cas.iter().flat_map(|c| split_bundle(c)) {
        let Some(der) = CertificateDer::pem_slice_iter(pem.as_bytes()).find_map(Result::ok) else {
            continue;
        };
        if seen.contains(&der) || not_after(&pem).is_none_or(|t| t <= now) {
            continue;
        }
        seen.push(der);
        kept.push(pem);
    }
    let skip = kept.len().saturating_sub(MAX_BUNDLE);
    kept.into_iter().skip(skip).collect()
}

/// What the Secret's data holds, as read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stored {
    pub current: Option<Pair>,
    pub next: Option<Pair>,
    pub bundle: String,
    /// When `next` was staged.
    pub staged_at: Option<OffsetDateTime>,
}

fn pair(data: &BTreeMap<String, String>, ca: &str, cert: &str, key: &str) -> Option<Pair> {
    Some(Pair {
        ca_cert: data.get(ca)?.clone(),
        server_cert: data.get(cert)?.clone(),
        server_key: data.get(key)?.clone(),
    })
}

impl Stored {
    /// Reads the Secret's data (strings) and its staged-at annotation.
    pub fn from_data(data: &BTreeMap<String, String>, staged_at: Option<&str>) -> Self {
        Self {
            current: pair(data, CA_CERT, SERVER_CERT, SERVER_KEY),
            next: pair(data, NEXT_CA_CERT, NEXT_SERVER_CERT, NEXT_SERVER_KEY),
            bundle: data.get(CA_BUNDLE).cloned().unwrap_or_default(),
            staged_at: staged_at.and_then(|s| {
                OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()
            }),
        }
    }

    /// The Secret's data for this state.
    pub fn to_data(&self) -> BTreeMap<String, String> {
        let mut d = BTreeMap::new();
        if let Some(p) = &self.current {
            d.insert(CA_CERT.into(), p.ca_cert.clone());
            d.insert(SERVER_CERT.into(), p.server_cert.clone());
            d.insert(SERVER_KEY.into(), p.server_key.clone());
        }
        if let Some(p) = &self.next {
            d.insert(NEXT_CA_CERT.into(), p.ca_cert.clone());
            d.insert(NEXT_SERVER_CERT.into(), p.server_cert.clone());
            d.insert(NEXT_SERVER_KEY.into(), p.server_key.clone());
        }
        d.insert(CA_BUNDLE.into(), self.bundle.clone());
        d
    }

    /// The staged-at annotation's value.
    pub fn staged_at_text(&self) -> Option<String> {
        self.staged_at.and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
    }
}

/// What the writer does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Nothing to change.
    Keep,
    /// Write this state (why: for the log and the metric).
    Write(Box<Stored>, &'static str),
}

/// The one rotation decision. `published`: every webhook configuration's `caBundle` holds
/// the staged CA. `trusted`: the configurations' `caBundle`s as they are (PEM). `serving`:
/// the writer's replica serves a pair it loaded earlier. `fresh` makes a new pair when one is
/// needed.
pub fn plan(
    stored: Option<&Stored>,
    now: OffsetDateTime,
    life: &Lifetimes,
    published: bool,
    trusted: &[String],
    serving: bool,
    fresh: &mut dyn FnMut() -> Result<Pair, String>,
) -> Result<Step, String> {
    let usable = |p: &Pair| {
        not_after(&p.server_cert).is_some_and(|t| t > now) && not_after(&p.ca_cert).is_some()
    };
    let Some(s) = stored.filter(|s| s.current.as_ref().is_some_and(usable)) else {
        let absent = stored.is_none_or(|s| s.current.is_none());
        let trusted = make_bundle(trusted, now);
        if absent && serving && !trusted.is_empty() {
            // The Secret lost its pair (deleted or emptied) while the replicas serve the pair
            // they loaded and clients trust its CA: a rotation, not a start. Swapping at once
            // would serve a certificate no configuration trusts yet.
            return restage(stored, now, life, published, &trusted, &usable, fresh);
        }
        // No Secret, or nothing servable in it, and nothing served and trusted: start over
        // (a client cannot trust anything yet, so there is nothing to keep working).
        let p = fresh()?;
        let bundle = make_bundle(std::slice::from_ref(&p.ca_cert), now);
        return Ok(Step::Write(
            Box::new(Stored {
                current: Some(p),
                next: None,
                bundle,
                staged_at: None,
            }),
            "created",
        ));
    };
    let current = s.current.as_ref().expect("filtered above");
    let cas = |extra: &[&Pair]| {
        let mut v = vec![s.bundle.clone(), current.ca_cert.clone()];
        v.extend(extra.iter().map(|p| p.ca_cert.clone()));
        make_bundle(&v, now)
    };
    match &s.next {
        Some(next) if usable(next) => {
            let since = s.staged_at.unwrap_or(now);
            if published && now - since >= life.publish_delay {
                let bundle = cas(&[next]);
                return Ok(Step::Write(
                    Box::new(Stored {
                        current: Some(next.clone()),
                        next: None,
                        bundle,
                        staged_at: None,
                    }),
                    "promoted",
                ));
            }
            let bundle = cas(&[next]);
            if bundle != s.bundle {
                let mut w = s.clone();
                w.bundle = bundle;
                return Ok(Step::Write(Box::new(w), "bundle"));
            }
            Ok(Step::Keep)
        }
        _ => {
            let ends = not_after(&current.server_cert).expect("usable");
            if ends - now <= life.rotate_before || s.next.is_some() {
                let next = fresh()?;
                let bundle = cas(&[&next]);
                return Ok(Step::Write(
                    Box::new(Stored {
                        current: Some(current.clone()),
                        next: Some(next),
                        bundle,
                        staged_at: Some(now),
                    }),
                    "staged",
                ));
            }
            let bundle = cas(&[]);
            if bundle != s.bundle {
                let mut w = s.clone();
                w.bundle = bundle;
                return Ok(Step::Write(Box::new(w), "bundle"));
            }
            Ok(Step::Keep)
        }
    }
}

/// [`plan`] for a Secret without a current pair while the replicas serve one and the
/// configurations trust `trusted`: a new pair staged beside what is trusted, promoted once
/// published and `publish_delay` has passed, as in a rotation near expiry.
fn restage(
    stored: Option<&Stored>,
    now: OffsetDateTime,
    life: &Lifetimes,
    published: bool,
    trusted: &str,
    usable: &dyn Fn(&Pair) -> bool,
    fresh: &mut dyn FnMut() -> Result<Pair, String>,
) -> Result<Step, String> {
    let s = stored.cloned().unwrap_or_default();
    let with = |next: &Pair| {
        make_bundle(
            &[trusted.to_string(), s.bundle.clone(), next.ca_cert.clone()],
            now,
        )
    };
    let Some(next) = s.next.as_ref().filter(|p| usable(p)) else {
        let next = fresh()?;
        let bundle = with(&next);
        return Ok(Step::Write(
            Box::new(Stored {
                current: None,
                next: Some(next),
                bundle,
                staged_at: Some(now),
            }),
            "staged",
        ));
    };
    let bundle = with(next);
    let since = s.staged_at.unwrap_or(now);
    if published && now - since >= life.publish_delay {
        return Ok(Step::Write(
            Box::new(Stored {
                current: Some(next.clone()),
                next: None,
                bundle,
                staged_at: None,
            }),
            "promoted",
        ));
    }
    if bundle != s.bundle {
        return Ok(Step::Write(Box::new(Stored { bundle, ..s }), "bundle"));
    }
    Ok(Step::Keep)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["thaw-webhook.thaw-system.svc".into()]
    }

    fn life(validity: i64, before: i64, delay: i64) -> Lifetimes {
        Lifetimes {
            validity: time::Duration::seconds(validity),
            rotate_before: time::Duration::seconds(before),
            publish_delay: time::Duration::seconds(delay),
        }
    }

    fn step(s: Option<&Stored>, now: OffsetDateTime, l: &Lifetimes, published: bool) -> Step {
        let mut fresh = || generate(&names(), now, l.validity);
        plan(s, now, l, published, &[], false, &mut fresh).unwrap()
    }

    /// [`step`] seeing the configurations trust `trusted` and the writer serving.
    fn step_serving(
        s: Option<&Stored>,
        now: OffsetDateTime,
        l: &Lifetimes,
        published: bool,
        trusted: &str,
    ) -> Step {
        let mut fresh = || generate(&names(), now, l.validity);
        plan(
            s,
            now,
            l,
            published,
            &[trusted.to_string()],
            true,
            &mut fresh,
        )
        .unwrap()
    }

    fn written(s: Step) -> Stored {
        match s {
            Step::Write(s, _) => *s,
            Step::Keep => panic!("expected a write"),
        }
    }

    #[test]
    fn a_generated_pair_parses_back_and_the_bundle_holds_its_ca() {
        let now = OffsetDateTime::now_utc();
        let p = generate(&names(), now, time::Duration::hours(1)).unwrap();
        let end = not_after(&p.server_cert).unwrap();
        assert!(end > now && end <= now + time::Duration::hours(1) + time::Duration::seconds(1));
        let b = make_bundle(std::slice::from_ref(&p.ca_cert), now);
        assert!(bundle_contains(b.as_bytes(), &p.ca_cert));
        assert!(!bundle_contains(b.as_bytes(), &p.server_cert));
        assert_eq!(split_bundle(&b).len(), 1);
        // The PEM we write for a bundle entry is the certificate rcgen wrote.
        assert_eq!(split_bundle(&p.ca_cert)[0].trim(), p.ca_cert.trim());
        assert!(format!("{p:?}").find("PRIVATE").is_none());
    }

    #[test]
    fn rotation_stages_then_promotes_only_once_published_and_keeps_the_old_ca() {
        let l = life(100, 40, 5);
        let t0 = OffsetDateTime::now_utc();
        let s0 = written(step(None, t0, &l, false));
        let old_ca = s0.current.clone().unwrap().ca_cert;
        // Far from the end: nothing.
        assert_eq!(
            step(Some(&s0), t0 + time::Duration::seconds(10), &l, true),
            Step::Keep
        );
        // Within rotate_before: a new pair is staged, the current one still served, both CAs
        // trusted.
        let t1 = t0 + time::Duration::seconds(61);
        let s1 = written(step(Some(&s0), t1, &l, false));
        assert_eq!(s1.current, s0.current);
        let next = s1.next.clone().unwrap();
        assert!(bundle_contains(s1.bundle.as_bytes(), &old_ca));
        assert!(bundle_contains(s1.bundle.as_bytes(), &next.ca_cert));
        // Not published: kept staged however long.
        assert_eq!(
            step(Some(&s1), t1 + time::Duration::seconds(30), &l, false),
            Step::Keep
        );
        // Published but within the delay: kept.
        assert_eq!(
            step(Some(&s1), t1 + time::Duration::seconds(2), &l, true),
            Step::Keep
        );
        // Published and past the delay: promoted, the old CA still trusted.
        let s2 = written(step(Some(&s1), t1 + time::Duration::seconds(6), &l, true));
        assert_eq!(s2.current.as_ref(), Some(&next));
        assert!(s2.next.is_none());
        assert!(bundle_contains(s2.bundle.as_bytes(), &old_ca));
        // Once the old CA has expired it leaves the bundle.
        let s3 = written(step(Some(&s2), t0 + time::Duration::seconds(101), &l, true));
        assert!(!bundle_contains(s3.bundle.as_bytes(), &old_ca));
        assert!(bundle_contains(s3.bundle.as_bytes(), &next.ca_cert));
    }

    #[test]
    fn an_expired_or_garbled_secret_starts_over_and_bundles_stay_bounded() {
        let l = life(100, 40, 0);
        let t0 = OffsetDateTime::now_utc();
        let s0 = written(step(None, t0, &l, false));
        let s = written(step(
            Some(&s0),
            t0 + time::Duration::seconds(200),
            &l,
            false,
        ));
        assert_ne!(s.current, s0.current);
        let mut garbled = s0.clone();
        garbled.current.as_mut().unwrap().server_cert = "junk".into();
        assert_ne!(
            written(step(Some(&garbled), t0, &l, false)).current,
            s0.current
        );
        let cas: Vec<String> = (0..6)
            .map(|_| generate(&names(), t0, l.validity).unwrap().ca_cert)
            .collect();
        assert_eq!(split_bundle(&make_bundle(&cas, t0)).len(), MAX_BUNDLE);
    }

    #[test]
    fn a_deleted_secret_is_restaged_while_the_old_pair_is_served_and_trusted() {
        let l = life(100, 40, 5);
        let t0 = OffsetDateTime::now_utc();
        let s0 = written(step(None, t0, &l, false));
        let old_ca = s0.current.clone().unwrap().ca_cert;
        // The Secret deleted: a new pair staged, none current (the replicas keep theirs), the
        // old CA still in the bundle beside the new one.
        let t1 = t0 + time::Duration::seconds(10);
        let s1 = written(step_serving(None, t1, &l, false, &s0.bundle));
        assert!(s1.current.is_none());
        let next = s1.next.clone().unwrap();
        assert!(bundle_contains(s1.bundle.as_bytes(), &old_ca));
        assert!(bundle_contains(s1.bundle.as_bytes(), &next.ca_cert));
        assert_eq!(s1.staged_at, Some(t1));
        // Not published, or within the delay: kept.
        let published = s1.bundle.clone();
        let later = t1 + time::Duration::seconds(30);
        assert_eq!(
            step_serving(Some(&s1), later, &l, false, &published),
            Step::Keep
        );
        let soon = t1 + time::Duration::seconds(2);
        assert_eq!(
            step_serving(Some(&s1), soon, &l, true, &published),
            Step::Keep
        );
        // Published and past the delay: served, the old CA still trusted.
        let t2 = t1 + time::Duration::seconds(6);
        let s2 = written(step_serving(Some(&s1), t2, &l, true, &published));
        assert_eq!(s2.current.as_ref(), Some(&next));
        assert!(s2.next.is_none());
        assert!(bundle_contains(s2.bundle.as_bytes(), &old_ca));
        // A Secret emptied (no current pair) is the same.
        let emptied = Stored {
            bundle: s0.bundle.clone(),
            ..Stored::default()
        };
        let s = written(step_serving(Some(&emptied), t1, &l, false, &s0.bundle));
        assert!(s.current.is_none() && s.next.is_some());
    }

    #[test]
    fn a_deleted_secret_starts_over_when_nothing_is_served_or_trusted() {
        let l = life(100, 40, 5);
        let t0 = OffsetDateTime::now_utc();
        let s0 = written(step(None, t0, &l, false));
        // Nothing trusted yet (a first install): served at once.
        let s = written(step_serving(None, t0, &l, false, ""));
        assert!(s.current.is_some() && s.next.is_none());
        // Trusted, but this replica serves nothing (every replica restarted): at once too.
        let mut fresh = || generate(&names(), t0, l.validity);
        let s = written(
            plan(
                None,
                t0,
                &l,
                false,
                std::slice::from_ref(&s0.bundle),
                false,
                &mut fresh,
            )
            .unwrap(),
        );
        assert!(s.current.is_some());
        // An expired current pair is replaced at once: no client trusts it any longer.
        let late = t0 + time::Duration::seconds(200);
        let s = written(step_serving(Some(&s0), late, &l, false, &s0.bundle));
        assert!(s.current.is_some() && s.current != s0.current);
    }

    #[test]
    fn lifetimes_are_checked() {
        assert!(Lifetimes::DEFAULT.validate().is_ok());
        assert!(life(10, 10, 0).validate().is_err());
        assert!(life(10, 5, 5).validate().is_err());
        assert!(life(10, 5, 1).validate().is_ok());
    }
}
