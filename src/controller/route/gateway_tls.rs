//! The Gateway API class's TLS (net-gateway-api's design): what an ingress description's TLS
//! blocks become.
//!
//! - **A listener per TLS host on each external Gateway** (config-gateway's
//!   `external-gateways`): named `kni-{adler32(namespace/owner)}-{adler32(host)}` (the prefix
//!   finds an owner's listeners again), the host as its `hostname`, `HTTPS` on 443, `Terminate`
//!   with the certificate's Secret in the owner's namespace as `certificateRefs`, and
//!   `allowedRoutes` from the owner's namespace only (`kubernetes.io/metadata.name`). The
//!   Gateway is someone else's: it is changed as JSON (the fields thaw does not model kept),
//!   read then replaced at the version read, only the owner's listeners touched; they are
//!   removed when no longer wanted and when a Route is deleted.
//! - **A ReferenceGrant `{owner}-tls`** in the owner's namespace, owned by it, letting the
//!   external Gateways' namespaces refer to those Secrets (a listener's certificate in another
//!   namespace needs one).
//! - **The HTTPRoutes** ([`super::gateway_api::write_http_routes`]): the external HTTPRoute of
//!   a TLS host is attached to its listeners; with `http-protocol: Enabled` also to the http
//!   listener (a parentRef without `sectionName` attaches to both already); with `Redirected`
//!   a second HTTPRoute `{host}-redirect` on the http listener (config-gateway's
//!   `http-listener-name`, else port 80) answers with a `RequestRedirect` to https (301);
//!   with `Disabled` http is not attached at all.

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
use crate::controller::{Ctx, Error};
use crate::knative::names::child_name;

/// The prefix of an owner's listeners.
pub fn listener_prefix(namespace: &str, owner: &str) -> String {
    format!(
        "kni-{:08x}-",
        adler2::adler32_slice(format!("{namespace}/{owner}").as_bytes())
    )
}

/// The listener of `host` for the owner.
pub fn listener_name(namespace: &str, owner: &str, host: &str) -> String {
    format!(
        "{}{:08x}",
        listener_prefix(namespace, owner),
        adler2::adler32_slice(host.as_bytes())
    )
}

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
                name: listener_name(ns, &desc.name, host),
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

/// `listeners` with the owner's (those named with `prefix`) replaced by `ours`; `None` when
/// that changes nothing.
pub fn merged_listeners(
    listeners: &[serde_json::Value],
    prefix: &str,
    ours: &[Listener],
) -> Option<Vec<serde_json::Value>> {
    let mut out: Vec<serde_json::Value> = listeners
        .iter()
        .filter(|l| !l["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
        .cloned()
        .collect();
    out.extend(ours.iter().filter_map(|l| serde_json::to_value(l).ok()));
    (out != listeners).then_some(out)
}

/// Puts the owner's listeners on every external Gateway (removing those no longer wanted).
/// Refused when a Gateway config-gateway names does not exist (and listeners are wanted).
pub async fn set_listeners(
    ctx: &Ctx,
    net: &crate::config::network::NetworkConfig,
    namespace: &str,
    owner: &str,
    ours: &[Listener],
) -> Result<Option<Refusal>, Error> {
    let ar = ApiResource::erase::<Gateway>(&());
    let prefix = listener_prefix(namespace, owner);
    for g in &net.gateway.external_gateways {
        let api = kube::Api::<DynamicObject>::namespaced_with(
            ctx.client.clone(),
            &g.gateway.namespace,
            &ar,
        );
        let Some(mut gw) = api.get_opt(&g.gateway.name).await? else {
            if ours.is_empty() {
                continue;
            }
            return Ok(Some(Refusal::gateway_missing(format!(
                "the Gateway {} (config-gateway) does not exist: the TLS hosts cannot be served",
                g.gateway
            ))));
        };
        let have: Vec<serde_json::Value> = gw.data["spec"]["listeners"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if let Some(next) = merged_listeners(&have, &prefix, ours) {
            gw.data["spec"]["listeners"] = serde_json::Value::from(next);
            // At the version read: a concurrent change is a conflict, retried.
            api.replace(&gw.name_any(), &PostParams::default(), &gw)
                .await?;
        }
    }
    Ok(None)
}

/// Writes the owner's listeners and ReferenceGrant for `desc` (removes them without TLS).
/// Refused when a ReferenceGrant of that name is someone else's, or a Gateway is missing.
pub async fn program<P: Resource + Sync>(
    ctx: &Ctx,
    owner: &P,
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
    set_listeners(ctx, net, ns, &desc.name, &listeners(desc)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_owners_listeners_are_replaced() {
        let theirs = serde_json::json!({"name": "http", "port": 80, "protocol": "HTTP"});
        let prefix = listener_prefix("default", "hello");
        let old = serde_json::json!({"name": format!("{prefix}1"), "port": 443});
        let other = serde_json::json!({"name": format!("{}1", listener_prefix("default", "bye"))});
        let l = Listener {
            name: listener_name("default", "hello", "h"),
            port: 443,
            protocol: "HTTPS".into(),
            ..Listener::default()
        };
        let next = merged_listeners(
            &[theirs.clone(), old, other.clone()],
            &prefix,
            std::slice::from_ref(&l),
        )
        .unwrap();
        assert_eq!(next.len(), 3);
        assert_eq!(next[0], theirs);
        assert_eq!(next[1], other);
        assert_eq!(next[2]["name"], l.name);
        assert_eq!(merged_listeners(&next, &prefix, &[l]), None);
        assert!(listener_name("default", "hello", "h").starts_with(&prefix));
        assert_ne!(
            listener_prefix("default", "hello"),
            listener_prefix("other", "hello")
        );
    }
}
