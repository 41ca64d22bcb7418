//! The Gateway API class's TLS (net-gateway-api's design): what an ingress description's TLS
//! blocks become.
//!
//! - **A listener per TLS host on each external Gateway** (config-gateway's
//!   `external-gateways`): named `kni-{uid}-{digest(host)}` after the owner's UID
//!   ([`super::tls_owner`]: no other owner's name can meet it), the host as its `hostname`,
//!   `HTTPS` on 443, `Terminate` with the certificate's Secret in the owner's namespace as
//!   `certificateRefs`, and `allowedRoutes` from the owner's namespace only
//!   (`kubernetes.io/metadata.name`). The Gateway is someone else's: it is changed as JSON
//!   (the fields thaw does not model kept), read then replaced at the version read, only the
//!   owner's listeners touched. A listener of someone else's on 443 for one of the owner's
//!   hosts is left alone and the owner is `IngressReady=False NotOwned`; a Gateway is never
//!   given more than 64 listeners (the Gateway API's most).
//! - **Write, switch, then remove** (never an HTTPS gap): [`program`] adds and updates the
//!   wanted listeners and keeps the owner's others; the HTTPRoutes are then attached to the
//!   new ones; [`prune`] removes the owner's listeners no longer wanted (and those of its
//!   older adler32 names, [`super::tls_owner::Whose::Legacy`]). A deleted owner's are pruned
//!   by its watch's delete event.
//! - **A ReferenceGrant `{owner}-tls`** in the owner's namespace, owned by it, letting the
//!   external Gateways' namespaces refer to those Secrets (a listener's certificate in another
//!   namespace needs one).
//! - **The HTTPRoutes** ([`super::gateway_api::write_http_routes`]): the external HTTPRoute of
//!   a TLS host is attached to its listeners; with `http-protocol: Enabled` also to the http
//!   listener (a parentRef without `sectionName` attaches to both already); with `Redirected`
//!   a second HTTPRoute `{host}-redirect` on the http listener (config-gateway's
//!   `http-listener-name`, else port 80) answers with a `RequestRedirect` to https (301);
//!   with `Disabled` http is not attached at all.
//! - **A 403** on a Gateway (config-gateway naming a namespace deploy/ grants nothing in) is
//!   `IngressReady=False GatewayForbidden` naming the namespace and the verb.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DeleteParams, DynamicObject, PostParams};
use kube::{Resource, ResourceExt};

use super::http_route::{
    AllowedRoutes, Gateway, GatewayTlsConfig, Listener, MatchLabels, ReferenceGrant,
    ReferenceGrantFrom, ReferenceGrantSpec, ReferenceGrantTo, RouteNamespaces,
    SecretObjectReference,
};
use super::ingress::{IngressDesc, Refusal};
use super::tls_owner::{TlsOwner, Whose, forbidden, listener_name, whose};
use crate::config::network::{GATEWAY_NAME, MAX_LISTENERS_PER_GATEWAY};
use crate::controller::{Ctx, Error};
use crate::knative::names::child_name;

/// The name of the owner's ReferenceGrant.
pub fn reference_grant_name(owner: &str) -> String {
    child_name(owner, "-tls")
}

/// The listeners of the description's TLS hosts (none without TLS or when cluster-local).
pub fn listeners(desc: &IngressDesc) -> Vec<Listener> {
    if desc.cluster_local {
        return Vec::new();
    }
    let ns = &desc.namespace;
    desc.tls
        .iter()
        .flat_map(|t| {
            t.hosts.iter().map(|host| Listener {
                name: listener_name(&desc.owner_uid, host),
                hostname: Some(host.clone()),
                port: 443,
                protocol: "HTTPS".into(),
                tls: Some(GatewayTlsConfig {
                    mode: Some("Terminate".into()),
                    certificate_refs: vec![SecretObjectReference {
                        group: Some(String::new()),
                        kind: Some("Secret".into()),
                        name: t.secret_name.clone(),
                        namespace: Some(t.secret_namespace.clone()),
                    }],
                }),
                allowed_routes: Some(AllowedRoutes {
                    namespaces: Some(RouteNamespaces {
                        from: Some("Selector".into()),
                        selector: Some(MatchLabels {
                            match_labels: BTreeMap::from([(
                                "kubernetes.io/metadata.name".to_string(),
                                ns.clone(),
                            )]),
                        }),
                    }),
                }),
            })
        })
        .collect()
}

/// The owner's ReferenceGrant: the external Gateways' namespaces may refer to the TLS
/// blocks' Secrets. `None` without TLS.
pub fn reference_grant(
    desc: &IngressDesc,
    net: &crate::config::network::NetworkConfig,
    meta: &dyn Fn(String) -> ObjectMeta,
) -> Option<ReferenceGrant> {
    if desc.tls.is_empty() || desc.cluster_local {
        return None;
    }
    let mut from: Vec<String> = net
        .gateway
        .external_gateways
        .iter()
        .map(|g| g.gateway.namespace.clone())
        .collect();
    from.sort();
    from.dedup();
    Some(ReferenceGrant {
        metadata: meta(reference_grant_name(&desc.name)),
        spec: ReferenceGrantSpec {
            from: from
                .into_iter()
                .map(|namespace| ReferenceGrantFrom {
                    group: super::http_route::GROUP.into(),
                    kind: "Gateway".into(),
                    namespace,
                })
                .collect(),
            to: desc
                .tls
                .iter()
                .map(|t| ReferenceGrantTo {
                    group: String::new(),
                    kind: "Secret".into(),
                    name: Some(t.secret_name.clone()),
                })
                .collect(),
        },
    })
}

/// Why [`added`] cannot add the owner's listeners to a Gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddRefused {
    /// A listener of someone else's serves one of the owner's hosts on 443: its name and host.
    Taken { listener: String, host: String },
    /// The Gateway would hold more than 64 listeners.
    Full,
}

/// `have` (a Gateway's listeners) with `ours` added, and those of the owner's of the same
/// name replaced in place; every other listener kept, the owner's no longer wanted too (they
/// go in [`pruned`], once nothing refers to them). `None` when that changes nothing. When it
/// would make more than 64, the owner's older (adler32-named) listeners whose hosts `ours`
/// serve are dropped at once; if that is not enough, refused.
pub fn added(
    have: &[serde_json::Value],
    owner: &TlsOwner,
    ours: &[Listener],
) -> Result<Option<Vec<serde_json::Value>>, AddRefused> {
    for l in ours {
        if let Some(t) = have.iter().find(|h| {
            whose(h, owner) == Whose::Theirs
                && h["port"].as_i64() == Some(i64::from(l.port))
                && h["hostname"].as_str() == l.hostname.as_deref()
        }) {
            return Err(AddRefused::Taken {
                listener: t["name"].as_str().unwrap_or_default().into(),
                host: l.hostname.clone().unwrap_or_default(),
            });
        }
    }
    let mut out: Vec<serde_json::Value> = have.to_vec();
    for l in ours {
        let v = serde_json::to_value(l).unwrap_or_default();
        match out.iter_mut().find(|h| h["name"] == v["name"]) {
            Some(h) => *h = v,
            None => out.push(v),
        }
    }
    let max = MAX_LISTENERS_PER_GATEWAY as usize;
    if out.len() > max {
        let replaced = |h: &serde_json::Value| {
            whose(h, owner) == Whose::Legacy
                && ours
                    .iter()
                    .any(|l| h["hostname"].as_str() == l.hostname.as_deref())
        };
        out.retain(|h| !replaced(h));
        if out.len() > max {
            return Err(AddRefused::Full);
        }
    }
    Ok((out != have).then_some(out))
}

/// `have` without the owner's listeners (and its older ones) not named in `keep`; `None`
/// when that changes nothing.
pub fn pruned(
    have: &[serde_json::Value],
    owner: &TlsOwner,
    keep: &[String],
) -> Option<Vec<serde_json::Value>> {
    let out: Vec<serde_json::Value> = have
        .iter()
        .filter(|l| {
            whose(l, owner) == Whose::Theirs
                || keep.iter().any(|k| l["name"].as_str() == Some(k.as_str()))
        })
        .cloned()
        .collect();
    (out.len() != have.len()).then_some(out)
}

/// Changes each external Gateway's listeners with `change` (`None`: nothing to change),
/// replacing it at the version read. `Err(Some(refusal))` when a Gateway is missing while
/// `need` says listeners are wanted, on a 403, or when `change` refuses.
async fn change_gateways(
    ctx: &Ctx,
    net: &crate::config::network::NetworkConfig,
    need: bool,
    change: impl Fn(&[serde_json::Value]) -> Result<Option<Vec<serde_json::Value>>, Refusal>,
) -> Result<Option<Refusal>, Error> {
    let ar = ApiResource::erase::<Gateway>(&());
    for g in &net.gateway.external_gateways {
        let gw_ns = &g.gateway.namespace;
        let what = "gateways.gateway.networking.k8s.io";
        let api = kube::Api::<DynamicObject>::namespaced_with(ctx.client.clone(), gw_ns, &ar);
        let mut gw = match api.get_opt(&g.gateway.name).await {
            Ok(Some(gw)) => gw,
            Ok(None) if !need => continue,
            Ok(None) => {
                return Ok(Some(Refusal::gateway_missing(format!(
                    "the Gateway {} (config-gateway) does not exist: the TLS hosts cannot be \
                     served",
                    g.gateway
                ))));
            }
            Err(e) => return forbidden(e, "get", what, gw_ns, GATEWAY_NAME).map(Some),
        };
        let have: Vec<serde_json::Value> = gw.data["spec"]["listeners"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let next = match change(&have) {
            Ok(n) => n,
            Err(mut r) => {
                r.message = r.message.replace("{gateway}", &g.gateway.to_string());
                return Ok(Some(r));
            }
        };
        if let Some(next) = next {
            gw.data["spec"]["listeners"] = serde_json::Value::from(next);
            // At the version read: a concurrent change is a conflict, retried.
            if let Err(e) = api
                .replace(&gw.name_any(), &PostParams::default(), &gw)
                .await
            {
                return forbidden(e, "update", what, gw_ns, GATEWAY_NAME).map(Some);
            }
        }
    }
    Ok(None)
}

/// Adds (or updates) the owner's listeners `ours` on every external Gateway, keeping its
/// others until [`prune`]. Refused when a Gateway config-gateway names does not exist (and
/// listeners are wanted), when another's listener serves one of the hosts (NotOwned), when a
/// Gateway would hold more than 64 listeners, and on a 403.
pub async fn add_listeners(
    ctx: &Ctx,
    net: &crate::config::network::NetworkConfig,
    owner: &TlsOwner,
    ours: &[Listener],
) -> Result<Option<Refusal>, Error> {
    change_gateways(ctx, net, !ours.is_empty(), |have| {
        added(have, owner, ours).map_err(|r| match r {
            AddRefused::Taken { listener, host } => Refusal::not_owned(format!(
                "There is an existing listener {listener:?} for {host} on the Gateway \
                 {{gateway}} that we do not own."
            )),
            AddRefused::Full => Refusal {
                reason: "GatewayFull",
                message: format!(
                    "The Gateway {{gateway}} would hold more than {MAX_LISTENERS_PER_GATEWAY} \
                     listeners."
                ),
            },
        })
    })
    .await
}

/// Removes the owner's listeners not named in `keep` (and its older ones) from every external
/// Gateway; `keep` empty: all of them (TLS off, or the owner deleted).
pub async fn prune(
    ctx: &Ctx,
    net: &crate::config::network::NetworkConfig,
    owner: &TlsOwner,
    keep: &[String],
) -> Result<Option<Refusal>, Error> {
    change_gateways(ctx, net, false, |have| Ok(pruned(have, owner, keep))).await
}

/// Writes the owner's ReferenceGrant for `desc` (deletes it without TLS) and adds its
/// listeners; the caller attaches the HTTPRoutes, then calls [`prune`] with the names of
/// [`listeners`]`(desc)`. Refused when a ReferenceGrant of that name is someone else's, and as
/// [`add_listeners`].
pub async fn program<P: Resource + Sync>(
    ctx: &Ctx,
    owner: &P,
    tls_owner: &TlsOwner,
    desc: &IngressDesc,
    net: &crate::config::network::NetworkConfig,
    meta: &(dyn Fn(String) -> ObjectMeta + Sync),
) -> Result<Option<Refusal>, Error> {
    let ns = &desc.namespace;
    match reference_grant(desc, net, meta) {
        Some(rg) => {
            if let Some(m) = super::apply_child(ctx, owner, &rg, None, |e: &ReferenceGrant, d| {
                e.spec == d.spec
            })
            .await?
            {
                return Ok(Some(Refusal::not_owned(m)));
            }
        }
        None => match ctx
            .api::<ReferenceGrant>(ns)
            .delete(
                &reference_grant_name(&desc.name),
                &DeleteParams::background(),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        },
    }
    add_listeners(ctx, net, tls_owner, &listeners(desc)).await
}

/// The names of `desc`'s listeners: what [`prune`] keeps.
pub fn listener_names(desc: &IngressDesc) -> Vec<String> {
    listeners(desc).into_iter().map(|l| l.name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::route::tls_owner::legacy_listener_prefix;

    fn owner(name: &str, uid: &str, hosts: &[&str]) -> TlsOwner {
        TlsOwner {
            namespace: "default".into(),
            name: name.into(),
            uid: uid.into(),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            label: ("serving.knative.dev/route", name.into()),
        }
    }

    fn listener(uid: &str, host: &str) -> Listener {
        Listener {
            name: listener_name(uid, host),
            hostname: Some(host.into()),
            port: 443,
            protocol: "HTTPS".into(),
            ..Listener::default()
        }
    }

    #[test]
    fn listeners_are_added_beside_the_others_then_the_old_ones_pruned() {
        let theirs = serde_json::json!({"name": "http", "port": 80, "protocol": "HTTP"});
        let hello = owner("hello", "u-1", &["h", "g"]);
        let old = serde_json::json!({
            "name": format!("{}{:08x}", legacy_listener_prefix("default", "hello"), 1),
            "hostname": "h",
            "port": 443,
        });
        let stale = serde_json::to_value(listener("u-1", "gone")).unwrap();
        let other = serde_json::to_value(listener("u-2", "x")).unwrap();
        let l = listener("u-1", "h");
        let have = [theirs.clone(), old.clone(), stale.clone(), other.clone()];
        let next = added(&have, &hello, std::slice::from_ref(&l))
            .unwrap()
            .unwrap();
        // Nothing removed yet: the HTTPRoutes still name the old ones.
        assert_eq!(next.len(), 5);
        assert_eq!(next[4]["name"], l.name);
        assert_eq!(added(&next, &hello, std::slice::from_ref(&l)), Ok(None));
        // Then the owner's others go; nobody else's.
        let after = pruned(&next, &hello, std::slice::from_ref(&l.name)).unwrap();
        assert_eq!(
            after,
            [theirs, other, serde_json::to_value(&l).unwrap()].to_vec()
        );
        assert_eq!(pruned(&after, &hello, std::slice::from_ref(&l.name)), None);
    }

    #[test]
    fn another_owners_listener_for_a_host_is_not_taken_over() {
        let hello = owner("hello", "u-1", &["h"]);
        let operator = serde_json::json!({"name": "https", "hostname": "h", "port": 443});
        assert_eq!(
            added(
                std::slice::from_ref(&operator),
                &hello,
                &[listener("u-1", "h")]
            ),
            Err(AddRefused::Taken {
                listener: "https".into(),
                host: "h".into()
            })
        );
        // On another port it is no conflict.
        let http = serde_json::json!({"name": "http", "hostname": "h", "port": 80});
        assert!(added(&[http], &hello, &[listener("u-1", "h")]).is_ok());
    }

    #[test]
    fn a_gateway_never_holds_more_than_64_listeners() {
        let hello = owner("hello", "u-1", &["h"]);
        let full: Vec<serde_json::Value> = (0..64)
            .map(|i| serde_json::json!({"name": format!("l{i}"), "port": 443}))
            .collect();
        assert_eq!(
            added(&full, &hello, &[listener("u-1", "h")]),
            Err(AddRefused::Full)
        );
        // The owner's own older listener for the host makes room: replaced at once.
        let mut with_old = full[..63].to_vec();
        with_old.push(serde_json::json!({
            "name": format!("{}{:08x}", legacy_listener_prefix("default", "hello"), 7),
            "hostname": "h",
            "port": 443,
        }));
        let next = added(&with_old, &hello, &[listener("u-1", "h")])
            .unwrap()
            .unwrap();
        assert_eq!(next.len(), 64);
        assert_eq!(next[63]["name"], listener_name("u-1", "h"));
    }
}
