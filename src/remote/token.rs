//! The shared token of the stats push and the decision feed: the `token` key of the Secret
//! `thaw-stats-token` in the system namespace, which only the activators and the autoscaler can
//! read. Senders present it as `Authorization: Bearer <token>`; the autoscaler compares in
//! constant time and answers 401 to anything else.
//!
//! Both roles follow the Secret with a watch by name ([`follow`]), so a rotated token is in
//! force without a restart. The token it replaces stays accepted for [`PREVIOUS_GRACE`], and a
//! sender whose push is refused with the new one tries the previous one, so a rotation refuses
//! no push whichever role sees it first. A deleted Secret keeps the last token in force. The
//! autoscaler leader creates the Secret, with a random token, when it is absent; a Secret
//! someone else wrote is never replaced (an invalid one is logged and ignored).
//!
//! The follower serves any Secret of one shared key ([`SecretSpec`]): the proxy tags' key
//! ([`crate::remote::tag_key`]) is followed the same way, with its own name, creator and grace.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use http::HeaderValue;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_stream};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// The Secret holding the token, in the system namespace.
pub const SECRET_NAME: &str = "thaw-stats-token";
/// The Secret's key.
pub const SECRET_KEY: &str = "token";
/// Shortest token accepted (bytes).
pub const MIN_LEN: usize = 16;

/// A Secret of one shared key in the system namespace, as [`follow_secret`] follows it.
#[derive(Debug)]
pub struct SecretSpec {
    /// The Secret's name (followed by `metadata.name`).
    pub name: &'static str,
    /// The key of its `data` holding the secret.
    pub key: &'static str,
    /// How long the value it replaced is still in force after a change.
    pub grace: Duration,
    /// Which role creates it when absent (for the log of a replica that waits for it).
    pub creator: &'static str,
    /// What it is, in logs.
    pub what: &'static str,
}

/// The stats token's Secret.
pub const STATS_TOKEN: SecretSpec = SecretSpec {
    name: SECRET_NAME,
    key: SECRET_KEY,
    grace: PREVIOUS_GRACE,
    creator: "the autoscaler leader",
    what: "stats token",
};

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
        Self::parse(raw, SECRET_KEY)
    }

    /// [`Token::new`], the error naming the Secret's key `key`.
    fn parse(raw: &[u8], key: &str) -> Result<Self, String> {
        let t = raw.trim_ascii();
        if t.len() < MIN_LEN {
            return Err(format!(
                "{key}: must be at least {MIN_LEN} bytes (got {})",
                t.len()
            ));
        }
        if !t.iter().all(|b| b.is_ascii_graphic()) {
            return Err(format!("{key}: must be visible ASCII (no spaces)"));
        }
        Ok(Self(Arc::from(t)))
    }

    /// The token of a Secret's `token` key (`data`, else `stringData`).
    pub fn from_secret(secret: &Secret) -> Result<Self, String> {
        Self::from_secret_key(secret, SECRET_KEY)
    }

    /// The value of a Secret's key `key` (`data`, else `stringData`).
    pub fn from_secret_key(secret: &Secret, key: &str) -> Result<Self, String> {
        let data = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|b| b.0.clone())
            .or_else(|| {
                secret
                    .string_data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .map(|s| s.clone().into_bytes())
            })
            .ok_or_else(|| format!("no key {key:?}"))?;
        Self::parse(&data, key)
    }

    /// The secret's bytes (a key of the proxy tags, [`crate::knative::proxy_tag`]).
    pub(crate) fn secret(&self) -> &[u8] {
        &self.0
    }

    /// A new random token: 32 bytes from the thread's CSPRNG, hex (64 characters).
    pub fn random() -> Self {
        let bytes: [u8; 32] = rand::random();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Self(Arc::from(hex.as_bytes()))
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

/// How long a token replaced in the Secret is still accepted (and tried by senders).
pub const PREVIOUS_GRACE: Duration = Duration::from_secs(120);

/// The token in force and the one it replaced, while that one is still accepted.
#[derive(Clone, Debug)]
struct Keyring {
    current: Token,
    previous: Option<(Token, Instant)>,
    /// The `creationTimestamp` of the Secret the current token was read from.
    created: Option<k8s_openapi::jiff::Timestamp>,
}

/// The token in force, followed live ([`follow`]), or fixed ([`Tokens::fixed`]). Cheap to
/// clone; every clone sees the same token.
#[derive(Clone, Debug)]
pub struct Tokens(watch::Receiver<Option<Keyring>>);

impl From<Token> for Tokens {
    fn from(t: Token) -> Self {
        Self::fixed(t)
    }
}

impl Tokens {
    /// One token, never rotated (tests, benches).
    pub fn fixed(t: Token) -> Self {
        let (tx, rx) = watch::channel(Some(Keyring {
            current: t,
            previous: None,
            created: None,
        }));
        // The sender is dropped: the value stays as it is.
        drop(tx);
        Self(rx)
    }

    /// The token senders present; `None` until the Secret has been read.
    pub fn current(&self) -> Option<Token> {
        self.0.borrow().as_ref().map(|k| k.current.clone())
    }

    /// The token the current one replaced, while it is still accepted.
    pub fn previous(&self) -> Option<Token> {
        let now = Instant::now();
        self.0
            .borrow()
            .as_ref()
            .and_then(|k| k.previous.as_ref())
            .filter(|(_, until)| now < *until)
            .map(|(t, _)| t.clone())
    }

    /// When the Secret the current token was read from was created (`None` for a fixed token
    /// or before one is read).
    pub fn created(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        self.0.borrow().as_ref().and_then(|k| k.created)
    }

    /// Whether `authorization` presents the current token, or the previous one within its
    /// grace period.
    pub fn accepts(&self, authorization: Option<&HeaderValue>) -> bool {
        let now = Instant::now();
        let ring = self.0.borrow();
        let Some(k) = ring.as_ref() else {
            return false;
        };
        k.current.accepts(authorization)
            || k.previous
                .as_ref()
                .is_some_and(|(t, until)| now < *until && t.accepts(authorization))
    }

    /// Completes when the token in force changes; `false` once the follower ended.
    pub async fn changed(&mut self) -> bool {
        self.0.changed().await.is_ok()
    }

    /// Completes once a token is known (at once when one is); `false` if the follower
    /// ended first.
    pub async fn wait(&self) -> bool {
        let mut rx = self.0.clone();
        rx.wait_for(Option::is_some).await.is_ok()
    }
}

/// Follows the Secret [`SECRET_NAME`] in `namespace` (a watch by name). While `create` says
/// true (the autoscaler's leadership), an absent Secret is created with a random token.
/// Runs until `stop`.
pub fn follow(
    client: kube::Client,
    namespace: &str,
    create: Option<watch::Receiver<bool>>,
    stop: CancellationToken,
) -> Tokens {
    follow_secret(client, namespace, &STATS_TOKEN, create, stop)
}

/// Follows the Secret `spec` names in `namespace` (a watch by name): its value in force, the
/// one it replaced for `spec.grace`. While `create` says true (the creator's leadership), an
/// absent Secret is created with a random value; a Secret someone else wrote is never
/// replaced. Runs until `stop`.
pub fn follow_secret(
    client: kube::Client,
    namespace: &str,
    spec: &'static SecretSpec,
    create: Option<watch::Receiver<bool>>,
    stop: CancellationToken,
) -> Tokens {
    let (tx, rx) = watch::channel(None);
    let span = tracing::info_span!("watch", resource = "secrets", secret = spec.name);
    tokio::spawn(run(client, namespace.to_string(), spec, create, tx, stop).instrument(span));
    Tokens(rx)
}

/// Puts the value of `secret` in force; a different value moves the current one to
/// `previous` for `spec.grace`.
fn take(tx: &watch::Sender<Option<Keyring>>, spec: &SecretSpec, secret: &Secret) {
    let token = match Token::from_secret_key(secret, spec.key) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "secret {}: ignored; keeping the {} in force", spec.name, spec.what);
            return;
        }
    };
    let created = secret.metadata.creation_timestamp.as_ref().map(|t| t.0);
    tx.send_if_modified(|ring| match ring {
        Some(k) if k.current.0 == token.0 => {
            let changed = k.created != created;
            k.created = created;
            changed
        }
        Some(k) => {
            tracing::info!(grace = ?spec.grace, "{} rotated; the previous one stays in force for the grace period", spec.what);
            let old = std::mem::replace(&mut k.current, token.clone());
            k.previous = Some((old, Instant::now() + spec.grace));
            k.created = created;
            true
        }
        None => {
            tracing::info!("{} read", spec.what);
            *ring = Some(Keyring {
                current: token.clone(),
                previous: None,
                created,
            });
            true
        }
    });
}

async fn run(
    client: kube::Client,
    namespace: String,
    spec: &'static SecretSpec,
    mut create: Option<watch::Receiver<bool>>,
    tx: watch::Sender<Option<Keyring>>,
    stop: CancellationToken,
) {
    let api: Api<Secret> = Api::namespaced(client, &namespace);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={}", spec.name));
    let mut events = std::pin::pin!(watch_stream(api.clone(), cfg).default_backoff());
    // None until the first list; then whether the Secret exists.
    let mut present: Option<bool> = None;
    let mut listing: Option<Secret> = None;
    // When a failed create may be tried again.
    let mut retry_at: Option<Instant> = None;
    let mut waiting_logged = false;
    loop {
        let leading = create.as_ref().is_some_and(|c| *c.borrow());
        if present == Some(false) && leading && retry_at.is_none_or(|t| Instant::now() >= t) {
            retry_at = None;
            match create_secret(&api, &namespace, spec).await {
                Ok(()) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "cannot create secret {namespace}/{}; retrying", spec.name);
                    retry_at = Some(Instant::now() + Duration::from_secs(5));
                }
            }
        } else if present == Some(false) && !leading && !waiting_logged && tx.borrow().is_none() {
            waiting_logged = true;
            tracing::warn!(
                "no secret {namespace}/{} yet: waiting for it ({} creates it)",
                spec.name,
                spec.creator
            );
        }
        let retry = async {
            match retry_at {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        let leadership = async {
            match create.as_mut() {
                Some(c) => {
                    if c.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            () = retry => {}
            () = leadership => {}
            ev = events.next() => match ev {
                None => return,
                Some(Err(e)) => tracing::warn!(error = %e, "secret watch error; resuming"),
                Some(Ok(Event::Init)) => listing = None,
                Some(Ok(Event::InitApply(s))) => listing = Some(s),
                Some(Ok(Event::InitDone)) => {
                    present = Some(listing.is_some());
                    if let Some(s) = listing.take() {
                        take(&tx, spec, &s);
                    }
                }
                Some(Ok(Event::Apply(s))) => {
                    present = Some(true);
                    take(&tx, spec, &s);
                }
                Some(Ok(Event::Delete(_))) => {
                    present = Some(false);
                    tracing::warn!("secret {namespace}/{} deleted; keeping the {} in force", spec.name, spec.what);
                }
            },
        }
    }
}

/// Creates the Secret with a random value; one that appeared meanwhile (another replica, an
/// operator) is left as it is.
async fn create_secret(
    api: &Api<Secret>,
    namespace: &str,
    spec: &SecretSpec,
) -> Result<(), kube::Error> {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(spec.name.into()),
            namespace: Some(namespace.into()),
            labels: Some([("app.kubernetes.io/part-of".to_string(), "thaw".to_string())].into()),
            ..ObjectMeta::default()
        },
        data: Some([(spec.key.to_string(), ByteString(Token::random().0.to_vec()))].into()),
        type_: Some("Opaque".into()),
        ..Secret::default()
    };
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            tracing::info!(
                "created secret {namespace}/{} with a random {}",
                spec.name,
                spec.what
            );
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
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

    #[test]
    fn a_random_token_is_64_hex_characters_and_new_each_time() {
        let (a, b) = (Token::random(), Token::random());
        assert_eq!(a.0.len(), 64);
        assert!(a.0.iter().all(u8::is_ascii_hexdigit));
        assert!(Token::new(&a.0).is_ok());
        assert_ne!(a.0, b.0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_rotated_out_token_is_accepted_for_the_grace_period_only() {
        let (tx, rx) = watch::channel(None);
        let tokens = Tokens(rx);
        let secret = |t: &str| Secret {
            data: Some([(SECRET_KEY.to_string(), ByteString(t.as_bytes().to_vec()))].into()),
            ..Secret::default()
        };
        assert!(!tokens.accepts(Some(&HeaderValue::from_static("Bearer 0123456789abcdef"))));
        take(&tx, &STATS_TOKEN, &secret("0123456789abcdef"));
        let old = tokens.current().unwrap();
        assert!(tokens.accepts(Some(&old.header())));
        assert!(tokens.previous().is_none());
        // An invalid token in the Secret is ignored.
        take(&tx, &STATS_TOKEN, &secret("short"));
        assert_eq!(tokens.current().unwrap().0, old.0);
        take(&tx, &STATS_TOKEN, &secret("fedcba9876543210"));
        let new = tokens.current().unwrap();
        assert_ne!(new.0, old.0);
        assert!(tokens.accepts(Some(&new.header())));
        assert!(tokens.accepts(Some(&old.header())));
        assert_eq!(tokens.previous().unwrap().0, old.0);
        tokio::time::advance(PREVIOUS_GRACE).await;
        assert!(!tokens.accepts(Some(&old.header())));
        assert!(tokens.previous().is_none());
        assert!(tokens.accepts(Some(&new.header())));
    }
}
