//! A request's host, one rule for both data ports (the activator routes by it, the queue sidecar
//! forwards it as the one `Host` the application sees):
//!
//! - two or more `Host` fields are ambiguous: 400 (RFC 9112 §3.2);
//! - on HTTP/2 a `host` field that differs from `:authority` (in any case) is 400
//!   (RFC 9113 §8.3.1);
//! - an absolute-form target's authority (h2's `:authority`) is the host, whatever `Host`
//!   says (RFC 9112 §3.2.2);
//! - else the one `Host` field;
//! - an HTTP/1.1 request with neither is 400 (RFC 9112 §3.2); HTTP/1.0 (and h2 without either)
//!   has no host.
//!
//! Pure and allocation-free: the caller counts the `Host` fields and keeps the first in the
//! one pass it makes over the fields anyway.

use http::Version;

/// Where a request's host comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostSource {
    /// The request target's authority (absolute form, or h2's `:authority`).
    Authority,
    /// The one `Host` field.
    Field,
    /// Neither (HTTP/1.0, or h2 without either): the request has no host.
    None,
}

/// Why a request's host is refused: each is a 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("more than one Host header")]
    Duplicate,
    #[error("the host header differs from :authority")]
    Mismatch,
    #[error("an HTTP/1.1 request needs a Host header")]
    Missing,
}

impl HostError {
    /// The reason, as a client may read it.
    pub const fn reason(self) -> &'static str {
        match self {
            HostError::Duplicate => "more than one Host header",
            HostError::Mismatch => "the host header differs from :authority",
            HostError::Missing => "an HTTP/1.1 request needs a Host header",
        }
    }
}

/// The `Host` fields as one pass over a request's fields found them: how many (saturating),
/// and the first one's value.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostFields<'a> {
    pub count: u8,
    pub first: Option<&'a [u8]>,
}

impl<'a> HostFields<'a> {
    /// Counts one more `Host` field, `value`.
    #[inline]
    pub fn saw(&mut self, value: &'a [u8]) {
        self.count = self.count.saturating_add(1);
        self.first.get_or_insert(value);
    }
}

/// The rule (see the module doc): where the host of a request with `fields`, a target whose
/// authority is `authority` and `version` comes from.
#[inline]
pub fn source(
    fields: HostFields<'_>,
    authority: Option<&str>,
    version: Version,
) -> Result<HostSource, HostError> {
    if fields.count > 1 {
        return Err(HostError::Duplicate);
    }
    if version == Version::HTTP_2
        && let (Some(a), Some(h)) = (authority, fields.first)
        && !h.eq_ignore_ascii_case(a.as_bytes())
    {
        return Err(HostError::Mismatch);
    }
    match (authority, fields.first) {
        (Some(_), _) => Ok(HostSource::Authority),
        (None, Some(_)) => Ok(HostSource::Field),
        (None, None) if version == Version::HTTP_11 => Err(HostError::Missing),
        (None, None) => Ok(HostSource::None),
    }
}

/// Whether `value` is one authority as a `Host` field carries it (RFC 9110 §7.2:
/// `uri-host [ ":" port ]`), parsed as the `http` crate parses a request target's authority,
/// and not a list (no `,`), without userinfo (no `@`), with a host and a port of digits that
/// fits 16 bits when there is one. What the queue sidecar requires of a tagged
/// `K-Original-Host` before the application gets it as its `Host`.
pub fn one_authority(value: &[u8]) -> bool {
    if value.is_empty() || value.iter().any(|b| matches!(b, b',' | b'@')) {
        return false;
    }
    let Ok(authority) = http::uri::Authority::try_from(value) else {
        return false;
    };
    let port_ok = match authority.as_str().rsplit_once(':') {
        // An IPv6 literal's colons are inside its brackets.
        Some((_, tail)) if tail.ends_with(']') => true,
        Some((_, port)) => !port.is_empty() && port.parse::<u16>().is_ok(),
        None => true,
    };
    !authority.host().is_empty() && port_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields<'a>(values: &[&'a str]) -> HostFields<'a> {
        let mut f = HostFields::default();
        for v in values {
            f.saw(v.as_bytes());
        }
        f
    }

    #[test]
    fn the_rule() {
        use HostSource::{Authority, Field};
        let v11 = Version::HTTP_11;
        let h2 = Version::HTTP_2;
        assert_eq!(source(fields(&["a"]), None, v11), Ok(Field));
        assert_eq!(
            source(fields(&["a", "b"]), None, v11),
            Err(HostError::Duplicate)
        );
        assert_eq!(
            source(fields(&["a", "a"]), Some("a"), h2),
            Err(HostError::Duplicate)
        );
        assert_eq!(source(fields(&[]), None, v11), Err(HostError::Missing));
        assert_eq!(
            source(fields(&[]), None, Version::HTTP_10),
            Ok(HostSource::None)
        );
        assert_eq!(source(fields(&[]), None, h2), Ok(HostSource::None));
        // Absolute form: the authority wins over a differing Host on HTTP/1.1.
        assert_eq!(
            source(fields(&["wrong"]), Some("right"), v11),
            Ok(Authority)
        );
        assert_eq!(source(fields(&[]), Some("right"), v11), Ok(Authority));
        // h2: `host` must agree with `:authority`, in any case.
        assert_eq!(
            source(fields(&["wrong"]), Some("right"), h2),
            Err(HostError::Mismatch)
        );
        assert_eq!(source(fields(&["RIGHT"]), Some("right"), h2), Ok(Authority));
        assert_eq!(source(fields(&["h"]), None, h2), Ok(Field));
        for e in [
            HostError::Duplicate,
            HostError::Mismatch,
            HostError::Missing,
        ] {
            assert_eq!(e.reason(), e.to_string());
        }
    }

    #[test]
    fn one_authority_is_a_host_and_an_optional_port() {
        for ok in [
            "a.example.com",
            "A.Example.COM:8080",
            "web.ns.svc.cluster.local",
            "10.0.0.1:80",
            "[2001:db8::1]",
            "[2001:db8::1]:443",
            "localhost",
        ] {
            assert!(one_authority(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "",
            "a.com, b.com",
            "a.com,b.com",
            "user@a.com",
            "a.com:port",
            "a.com:99999",
            "a.com:",
            ":80",
            "a com",
            "a.com/path",
            "a.com?q",
            "[::1",
        ] {
            assert!(!one_authority(bad.as_bytes()), "{bad:?}");
        }
    }
}
