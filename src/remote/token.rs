//! The shared token of the stats push and the decision feed: the `token` key of the Secret
//! `thaw-stats-token` in the system namespace, which only the activators and the autoscaler can
//! read. Senders present it as `Authorization: Bearer <token>`; the autoscaler compares in
//! constant time and answers 401 to anything else.

use std::fmt;
use std::sync::Arc;

use http::HeaderValue;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

/// The Secret holding the token, in the system namespace.
pub const SECRET_NAME: &str = "thaw-stats-token";
/// The Secret's key.
pub const SECRET_KEY: &str = "token";
/// Shortest token accepted (bytes).
pub const MIN_LEN: usize = 16;

/// A shared secret; never printed (its `Debug` says only its length).
#[derive(Clone)]
pub struct Token(Arc<[u8]>);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({} bytes)", self.0.len())
    }
}

impl Token {
    /// A token from its bytes (surrounding whitespace removed): at least [`MIN_LEN`] bytes of
    /// visible ASCII.
    pub fn new(raw: &[u8]) -> Result<Self, String> {
        let t = raw.trim_ascii();
        if t.len() < MIN_LEN {
            return Err(format!(
                "{SECRET_KEY}: must be at least {MIN_LEN} bytes (got {})",
                t.len()
            ));
        }
        if !t.iter().all(|b| b.is_ascii_graphic()) {
            return Err(format!("{SECRET_KEY}: must be visible ASCII (no spaces)"));
        }
        Ok(Self(Arc::from(t)))
    }

    /// Reads the token from the Secret [`SECRET_NAME`] in `namespace`.
    pub async fn from_secret(client: kube::Client, namespace: &str) -> Result<Self, String> {
        let api: Api<Secret> = Api::namespaced(client, namespace);
        let secret = api
            .get(SECRET_NAME)
            .await
            .map_err(|e| format!("secret {namespace}/{SECRET_NAME}: {e}"))?;
        let data = secret
            .data
            .as_ref()
            .and_then(|d| d.get(SECRET_KEY))
            .map(|b| b.0.clone())
            .or_else(|| {
                secret
                    .string_data
                    .as_ref()
                    .and_then(|d| d.get(SECRET_KEY))
                    .map(|s| s.clone().into_bytes())
            })
            .ok_or_else(|| format!("secret {namespace}/{SECRET_NAME}: no key {SECRET_KEY:?}"))?;
        Self::new(&data).map_err(|e| format!("secret {namespace}/{SECRET_NAME}: {e}"))
    }

    /// The `Authorization` header a sender presents.
    pub fn header(&self) -> HeaderValue {
        let mut v = Vec::with_capacity(7 + self.0.len());
        v.extend_from_slice(b"Bearer ");
        v.extend_from_slice(&self.0);
        let mut h = HeaderValue::from_bytes(&v).expect("visible ASCII is a valid header value");
        h.set_sensitive(true);
        h
    }

    /// Whether `authorization` presents this token. Compares in constant time (for a given
    /// length), so the answer's timing does not leak how much of a guess was right.
    pub fn accepts(&self, authorization: Option<&HeaderValue>) -> bool {
        let Some(given) = authorization.and_then(|v| v.as_bytes().strip_prefix(b"Bearer ")) else {
            return false;
        };
        if given.len() != self.0.len() {
            return false;
        }
        given
            .iter()
            .zip(self.0.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_its_own_bearer_token() {
        let t = Token::new(b"  0123456789abcdef\n").unwrap();
        assert!(t.accepts(Some(&t.header())));
        assert!(t.accepts(Some(&HeaderValue::from_static("Bearer 0123456789abcdef"))));
        for bad in [
            "Bearer 0123456789abcdeF",
            "Bearer 0123456789abcde",
            "bearer 0123456789abcdef",
            "0123456789abcdef",
            "",
        ] {
            assert!(!t.accepts(Some(&HeaderValue::from_static(bad))), "{bad:?}");
        }
        assert!(!t.accepts(None));
        assert!(Token::new(b"short").unwrap_err().contains("at least 16"));
        assert!(Token::new(b"0123456789 abcdef").is_err());
        assert_eq!(format!("{t:?}"), "Token(16 bytes)");
    }
}
