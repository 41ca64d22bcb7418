//! The proxy tags' key ([`crate::knative::proxy_tag`]): the `key` of the Secret
//! `thaw-proxy-tag-key` in the system namespace, which only the controller and the activators
//! can read. It is apart from the stats token ([`crate::remote::token`]) so that rotating that
//! token (which guards the stats push) changes no tag and rolls no pod.
//!
//! Every reader follows it by name ([`follow`], the stats token's follower), so a rotation is in
//! force without a restart. The controller leader creates it with a random key when it is
//! absent; one someone else wrote is never replaced (an invalid one is logged and ignored). A
//! deleted Secret keeps the key in force until the leader has created another, which is then a
//! rotation.
//!
//! A rotation (rare and deliberate: edit `key`, or delete the Secret) changes every revision's
//! tag: the controller rolls each Deployment to its new tag, and for [`PREVIOUS_GRACE`] an
//! activator also sends the tag under the key it replaced, so the pods not yet replaced keep
//! counting its requests as proxied. Sending the previous tag longer costs nothing in trust: a
//! sidecar accepts only the tag in its own environment, and a rolled pod holds the new one.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::token::{SecretSpec, Token, Tokens, follow_secret};
use crate::knative::proxy_tag::{Key, Keys, Tagger};

/// The Secret holding the key, in the system namespace.
pub const SECRET_NAME: &str = "thaw-proxy-tag-key";
/// The Secret's key.
pub const SECRET_KEY: &str = "key";
/// How long an activator still sends the tag under a replaced key: long enough for the
/// controller to roll every warm revision of a large cluster (each Deployment rolls on its
/// own, within its pods' start time). A pod still on the old tag after that counts the
/// activators' requests as direct until it is replaced.
pub const PREVIOUS_GRACE: Duration = Duration::from_secs(3600);
/// How long after the key's Secret was created (the upgrade to the tagged-by-UID form) a newly
/// created Deployment also gets the previous form's tag, so a previous release's activator
/// still running mid-upgrade is counted as proxied by new revisions' pods.
pub const LEGACY_WINDOW: Duration = Duration::from_secs(30 * 60);

/// The key's Secret.
pub const TAG_KEY: SecretSpec = SecretSpec {
    name: SECRET_NAME,
    key: SECRET_KEY,
    grace: PREVIOUS_GRACE,
    creator: "the controller leader",
    what: "proxy tag key",
};

/// How often [`tagger`]'s follower looks whether a previous key's grace has ended.
const GRACE_CHECK: Duration = Duration::from_secs(5);

/// Follows the Secret [`SECRET_NAME`] in `namespace` (a watch by name); while `create` says
/// true (the controller's leadership) an absent one is created with a random key. Runs until
/// `stop`.
pub fn follow(
    client: kube::Client,
    namespace: &str,
    create: Option<watch::Receiver<bool>>,
    stop: CancellationToken,
) -> Tokens {
    follow_secret(client, namespace, &TAG_KEY, create, stop)
}

/// What the controller writes tags with now: the tag key in force, and the stats token with the
/// upgrade window (the key Secret's creation plus [`LEGACY_WINDOW`]) for Deployments created
/// within it.
pub fn controller_keys(tag_keys: &Tokens, stats: &Tokens) -> Keys {
    Keys {
        key: tag_keys.current().map(|t| Key::new(t.secret())),
        stats_token: stats.current().map(|t| Key::new(t.secret())),
        legacy_until: tag_keys.created().map(|c| c + LEGACY_WINDOW),
    }
}

/// An activator's proxy tagger ([`Tagger`]): keyed by the tag key in force and, within its
/// grace, the previous one, and (the previous form, this release only) by the stats token in
/// force and, within its grace, the previous one. Follows them until `stop`.
pub fn tagger(tag_keys: &Tokens, stats: &Tokens, stop: CancellationToken) -> Arc<Tagger> {
    let tagger = Arc::new(Tagger::default());
    set(&tagger, tag_keys, stats);
    let weak = Arc::downgrade(&tagger);
    let (mut keys, mut stats) = (tag_keys.clone(), stats.clone());
    tokio::spawn(
        async move {
            // A follower that ended is not waited on again (its value stays as it was).
            let (mut keys_live, mut stats_live) = (true, true);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    c = keys.changed(), if keys_live => keys_live = c,
                    c = stats.changed(), if stats_live => stats_live = c,
                    _ = tokio::time::sleep(GRACE_CHECK) => {}
                }
                let Some(t) = weak.upgrade() else { return };
                set(&t, &keys, &stats);
            }
        }
        .instrument(tracing::debug_span!("proxy-tags")),
    );
    tagger
}

fn set(tagger: &Tagger, keys: &Tokens, stats: &Tokens) {
    let (k, kp) = (keys.current(), keys.previous());
    let (s, sp) = (stats.current(), stats.previous());
    tagger.set(
        [
            k.as_ref().map(Token::secret),
            kp.as_ref().map(Token::secret),
        ],
        [
            s.as_ref().map(Token::secret),
            sp.as_ref().map(Token::secret),
        ],
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::knative::proxy_tag::{TagCell, legacy_tag, tag};

    #[tokio::test(start_paused = true)]
    async fn the_tagger_sends_both_forms_under_the_keys_in_force() {
        let keys = Tokens::fixed(Token::new(b"tag-key-0123456789abcdef").unwrap());
        let stats = Tokens::fixed(Token::new(b"stats-token-0123456789ab").unwrap());
        let t = tagger(&keys, &stats, CancellationToken::new());
        let uid: Arc<str> = Arc::from("uid");
        let v = t
            .value(&TagCell::default(), "ns", "rev", Some(&uid))
            .unwrap();
        assert_eq!(
            v.to_str().unwrap(),
            format!(
                "{}, {}",
                legacy_tag(b"stats-token-0123456789ab", "ns", "rev"),
                tag(b"tag-key-0123456789abcdef", "ns", "rev", "uid")
            )
        );
        let k = controller_keys(&keys, &stats);
        assert_eq!(
            k.tag("ns", "rev", "uid"),
            Some(tag(b"tag-key-0123456789abcdef", "ns", "rev", "uid"))
        );
        // A fixed key has no Secret, so no upgrade window.
        assert_eq!(k.legacy_until, None);
    }
}
