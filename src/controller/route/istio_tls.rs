//! The Istio class's TLS (net-istio's per-ingress Gateways and Secret copies): what an
//! ingress description's TLS blocks become.
//!
//! Istio resolves a server's `credentialName` in the namespace of the gateway pods, not of the
//! Gateway object, while cert-manager writes each Certificate's Secret beside it, in the
//! owner's namespace. So, as net-istio does:
//! - **Secret copies**: each TLS block's Secret is copied into the namespace of every external
//!   gateway's Service (config-istio's `service` host, `{name}.{namespace}.svc...`), named
//!   `{uid}-{digest(namespace/secret)}` after the owner's UID ([`super::tls_owner`]: no
//!   tenant can choose a name that meets the operator's Secrets or another owner's copies),
//!   type `kubernetes.io/tls`, labelled `networking.internal.knative.dev/originSecretName` /
//!   `originSecretNamespace`, with the owner's label (`serving.knative.dev/route` or
//!   `serving.knative.dev/domainmapping`) and [`OWNER_UID_LABEL`], annotated with the hosts it
//!   serves ([`HOSTS_ANNOTATION`]) and the origin's resourceVersion
//!   ([`ORIGIN_RESOURCE_VERSION_ANNOTATION`]). A Secret of that name that is not this copy is
//!   left untouched and the owner is `IngressReady=False NotOwned`; a copy is created (never
//!   force-applied over what exists) and updated only when it is ours.
//! - **Copies follow their origin** without a Secret watch: every reconcile of an owner with
//!   copies reads each origin with `get` and copies it again when its resourceVersion differs
//!   from the copy's; such an owner is re-queued after config-istio's
//!   `secret-copy-refresh-period` (60 s at most, jittered), so a rotated certificate reaches
//!   the gateway within it.
//! - **A Gateway per owner and external gateway** (`{owner}-{adler32(service host)}`, in the
//!   owner's namespace, owned by it): the gateway Service's pod selector; one `HTTPS` server
//!   on 443 per TLS block (`credentialName` the copy, mode `SIMPLE`); and, unless
//!   `http-protocol` is `Disabled`, one `HTTP` server on 80 for the TLS hosts, with
//!   `httpsRedirect` when it is `Redirected`.
//! - **Write, switch, then remove** (never an HTTPS gap): the copies are written first, then
//!   the Gateway names them, then the owner's copies no longer named (those of its older
//!   `{namespace}.{secret}` names included) are deleted. They cannot be owned across
//!   namespaces: a deleted owner's copies are deleted by its watch's delete event.
//! - **The VirtualService**: the external match of a host that has TLS is bound to these
//!   Gateways instead of config-istio's external gateways (whose port-80 server would serve it
//!   over plain http whatever `http-protocol` says).
//! - **A 403** on Secrets in the gateway namespace (config-istio naming a namespace deploy/
//!   grants nothing in) is `IngressReady=False GatewayForbidden` naming the namespace and the
//!   verb.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Secret, Service as KubeService};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;

use super::ingress::{IngressDesc, Refusal, Tls};
use super::tls_owner::{TlsOwner, digest, forbidden};
use super::virtual_service::{Gateway, GatewaySpec, Server, ServerPort, ServerTlsSettings};
use crate::config::network::{
    Gateway as IstioGatewayConfig, HttpProtocol, ISTIO_NAME, NetworkConfig,
};
use crate::controller::{Ctx, Error, FIELD_MANAGER};
use crate::knative::names::{child_name, labels};

/// net-istio's label on a Secret copy: the origin's name (mapped as every name label is,
/// [`labels::value`]).
pub const ORIGIN_SECRET_NAME: &str = "networking.internal.knative.dev/originSecretName";
/// net-istio's label on a Secret copy: the origin's namespace.
pub const ORIGIN_SECRET_NAMESPACE: &str = "networking.internal.knative.dev/originSecretNamespace";
/// thaw's label on a Secret copy: the owner's UID (whose copy it is).
pub const OWNER_UID_LABEL: &str = "controller.thaw.dev/owner-uid";
/// thaw's annotation on a Secret copy: the hosts it serves, comma-separated (what the
/// namespace's bound counts, [`super::tls_limit`]).
pub const HOSTS_ANNOTATION: &str = "controller.thaw.dev/hosts";
/// thaw's annotation on a Secret copy: the origin's resourceVersion when it was copied.
pub const ORIGIN_RESOURCE_VERSION_ANNOTATION: &str = "controller.thaw.dev/origin-resource-version";

/// The name of the owner's TLS Gateway for the external gateway `g`.
pub fn tls_gateway_name(owner: &str, g: &IstioGatewayConfig) -> String {
    child_name(
        owner,
        &format!("-{}", adler2::adler32_slice(g.service.as_bytes())),
    )
}

/// `namespace/name` of the owner's TLS Gateways, as a VirtualService binds them: none when
/// the description has no TLS.
pub fn tls_gateway_refs(desc: &IngressDesc, net: &NetworkConfig) -> Vec<String> {
    if desc.tls.is_empty() || desc.cluster_local {
        return Vec::new();
    }
    net.istio
        .external_gateways
        .iter()
        .map(|g| format!("{}/{}", desc.namespace, tls_gateway_name(&desc.name, g)))
        .collect()
}

/// The hosts of the description's TLS blocks.
pub fn tls_hosts(desc: &IngressDesc) -> Vec<&str> {
    desc.tls
        .iter()
        .flat_map(|t| t.hosts.iter().map(String::as_str))
        .collect()
}

/// The name of the owner's copy of `namespace`'s Secret `secret` (53 characters).
pub fn copy_name(owner_uid: &str, namespace: &str, secret: &str) -> String {
    format!("{owner_uid}-{}", digest(&format!("{namespace}/{secret}")))
}

/// The owner's copy of the TLS block `t`'s Secret.
pub fn copy_of(owner_uid: &str, t: &Tls) -> String {
    copy_name(owner_uid, &t.secret_namespace, &t.secret_name)
}

/// The hosts a copy says it serves ([`HOSTS_ANNOTATION`]; none on an older copy).
pub fn copy_hosts(meta: &ObjectMeta) -> Vec<String> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(HOSTS_ANNOTATION))
        .map(|h| {
            h.split(',')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a copy in a gateway namespace is the owner's: its UID label, or, on a copy from
/// before the UID label (`{namespace}.{secret}`), the owner's label and namespace.
pub fn is_owners_copy(meta: &ObjectMeta, owner: &TlsOwner) -> bool {
    let l = meta.labels.clone().unwrap_or_default();
    match l.get(OWNER_UID_LABEL) {
        Some(uid) => *uid == owner.uid,
        None => {
            l.get(ORIGIN_SECRET_NAMESPACE) == Some(&owner.namespace)
                && l.get(owner.label.0) == Some(&owner.label.1)
        }
    }
}

/// Whether the Secret `have` is the owner's copy of `origin` (its labels say so).
fn is_copy_of(have: &Secret, origin: &Secret, owner: &TlsOwner) -> bool {
    let l = have.labels();
    l.get(OWNER_UID_LABEL) == Some(&owner.uid)
        && l.get(ORIGIN_SECRET_NAMESPACE) == origin.namespace().as_ref()
        && l.get(ORIGIN_SECRET_NAME) == Some(&labels::value(&origin.name_any()))
}

/// The Service `{name}.{namespace}.svc...` of a gateway's host.
pub fn service_of(host: &str) -> Option<(&str, &str)> {
    let mut parts = host.split('.');
    match (parts.next(), parts.next()) {
        (Some(name), Some(ns)) if !name.is_empty() && !ns.is_empty() => Some((name, ns)),
        _ => None,
    }
}

/// The owner's TLS Gateway for the external gateway `g`, whose pods `selector` selects.
pub fn tls_gateway(
    desc: &IngressDesc,
    net: &NetworkConfig,
    g: &IstioGatewayConfig,
    selector: BTreeMap<String, String>,
    meta: &dyn Fn(String) -> ObjectMeta,
) -> Gateway {
    let mut servers: Vec<Server> = desc
        .tls
        .iter()
        .enumerate()
        .map(|(i, t)| Server {
            port: ServerPort {
                number: 443,
                protocol: "HTTPS".into(),
                name: format!("https-{i}"),
            },
            hosts: t.hosts.clone(),
            tls: Some(ServerTlsSettings {
                mode: Some("SIMPLE".into()),
                credential_name: Some(copy_of(&desc.owner_uid, t)),
                https_redirect: None,
            }),
        })
        .collect();
    let http = net.templates.http_protocol;
    if http != HttpProtocol::Disabled {
        servers.push(Server {
            port: ServerPort {
                number: 80,
                protocol: "HTTP".into(),
                name: "http".into(),
            },
            hosts: tls_hosts(desc).into_iter().map(String::from).collect(),
            tls: (http == HttpProtocol::Redirected).then(|| ServerTlsSettings {
                https_redirect: Some(true),
                ..ServerTlsSettings::default()
            }),
        });
    }
    Gateway {
        metadata: meta(tls_gateway_name(&desc.name, g)),
        spec: GatewaySpec { selector, servers },
    }
}

/// Writes the owner's Secret copies and TLS Gateways for `desc` (none when it has no TLS), in
/// that order, then deletes the copies no longer named (the module doc). Refused when a
/// Gateway or a Secret of a copy's name is someone else's (NotOwned), a gateway Service does
/// not exist (or selects no pods), or on a 403 in a gateway namespace.
pub async fn program<P: kube::Resource + Sync>(
    ctx: &Ctx,
    owner: &P,
    tls_owner: &TlsOwner,
    desc: &IngressDesc,
    net: &NetworkConfig,
    meta: &(dyn Fn(String) -> ObjectMeta + Sync),
) -> Result<Option<Refusal>, Error> {
    let ns = &desc.namespace;
    let with_tls = !desc.tls.is_empty() && !desc.cluster_local;
    for g in &net.istio.external_gateways {
        let Some((svc, svc_ns)) = service_of(&g.service) else {
            continue;
        };
        if !with_tls {
            let name = tls_gateway_name(&desc.name, g);
            match ctx
                .api::<Gateway>(ns)
                .delete(&name, &DeleteParams::background())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
            if let Some(r) = delete_copies(ctx, svc_ns, tls_owner, &[]).await? {
                return Ok(Some(r));
            }
            continue;
        }
        let Some(selector) = ctx
            .api::<KubeService>(svc_ns)
            .get_opt(svc)
            .await?
            .and_then(|s| s.spec)
            .and_then(|s| s.selector)
        else {
            return Ok(Some(Refusal::gateway_missing(format!(
                "the gateway Service {svc_ns}/{svc} (config-istio) is missing or selects no \
                 pods: the TLS hosts cannot be served"
            ))));
        };
        // The copies first: the Gateway names them.
        let mut wanted = Vec::new();
        for t in &desc.tls {
            let Some(origin) = ctx
                .api::<Secret>(&t.secret_namespace)
                .get_opt(&t.secret_name)
                .await?
            else {
                return Err(Error::Other(format!(
                    "the Secret {}/{} of a TLS host is missing",
                    t.secret_namespace, t.secret_name
                )));
            };
            let name = copy_of(&tls_owner.uid, t);
            if let Some(r) = copy_secret(ctx, &origin, svc_ns, &name, tls_owner, &t.hosts).await? {
                return Ok(Some(r));
            }
            wanted.push(name);
        }
        let gw = tls_gateway(desc, net, g, selector, meta);
        if let Some(m) =
            super::apply_child(ctx, owner, &gw, None, |e: &Gateway, d| e.spec == d.spec).await?
        {
            return Ok(Some(Refusal::not_owned(m)));
        }
        if let Some(r) = delete_copies(ctx, svc_ns, tls_owner, &wanted).await? {
            return Ok(Some(r));
        }
    }
    Ok(None)
}

/// Writes the owner's copy `name` of `origin` in `ns`, serving `hosts`: created when absent,
/// replaced when the origin's resourceVersion (or what the copy says) changed, left alone when
/// it is someone else's (the NotOwned refusal).
async fn copy_secret(
    ctx: &Ctx,
    origin: &Secret,
    ns: &str,
    name: &str,
    owner: &TlsOwner,
    hosts: &[String],
) -> Result<Option<Refusal>, Error> {
    let labels = BTreeMap::from([
        (
            ORIGIN_SECRET_NAME.to_string(),
            labels::value(&origin.name_any()),
        ),
        (
            ORIGIN_SECRET_NAMESPACE.to_string(),
            origin.namespace().unwrap_or_default(),
        ),
        (owner.label.0.to_string(), owner.label.1.clone()),
        (OWNER_UID_LABEL.to_string(), owner.uid.clone()),
    ]);
    let annotations = BTreeMap::from([
        (HOSTS_ANNOTATION.to_string(), hosts.join(",")),
        (
            ORIGIN_RESOURCE_VERSION_ANNOTATION.to_string(),
            origin.resource_version().unwrap_or_default(),
        ),
    ]);
    let api = ctx.api::<Secret>(ns);
    let have = match api.get_opt(name).await {
        Ok(h) => h,
        Err(e) => return forbidden(e, "get", "Secrets", ns, ISTIO_NAME).map(Some),
    };
    if let Some(have) = &have {
        if !is_copy_of(have, origin, owner) {
            return Ok(Some(Refusal::not_owned(format!(
                "There is an existing Secret \"{ns}/{name}\" that we do not own."
            ))));
        }
        if labels.iter().all(|(k, v)| have.labels().get(k) == Some(v))
            && annotations
                .iter()
                .all(|(k, v)| have.annotations().get(k) == Some(v))
        {
            return Ok(None);
        }
    }
    let copy = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(origin.data.clone().unwrap_or_default()),
        ..Secret::default()
    };
    if have.is_none() {
        // Created, never applied over: a Secret made since the read is a conflict, retried
        // (and then found not ours).
        return match api.create(&PostParams::default(), &copy).await {
            Ok(_) => Ok(None),
            Err(e) => forbidden(e, "create", "Secrets", ns, ISTIO_NAME).map(Some),
        };
    }
    let mut body = serde_json::to_value(&copy).map_err(|e| Error::Other(e.to_string()))?;
    body["apiVersion"] = "v1".into();
    body["kind"] = "Secret".into();
    match api
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
    {
        Ok(_) => Ok(None),
        Err(e) => forbidden(e, "patch", "Secrets", ns, ISTIO_NAME).map(Some),
    }
}

/// The copies in `gateway_ns` of `owner_ns`'s Secrets (metadata only).
pub async fn list_copies(
    ctx: &Ctx,
    gateway_ns: &str,
    owner_ns: &str,
) -> Result<Vec<PartialObjectMeta<Secret>>, kube::Error> {
    let selector = format!("{ORIGIN_SECRET_NAMESPACE}={owner_ns}");
    Ok(ctx
        .api::<Secret>(gateway_ns)
        .list_metadata(&ListParams::default().labels(&selector))
        .await?
        .items)
}

/// Deletes the owner's copies in `gateway_ns` ([`is_owners_copy`]) but `keep`.
pub async fn delete_copies(
    ctx: &Ctx,
    gateway_ns: &str,
    owner: &TlsOwner,
    keep: &[String],
) -> Result<Option<Refusal>, Error> {
    let copies = match list_copies(ctx, gateway_ns, &owner.namespace).await {
        Ok(c) => c,
        Err(e) => return forbidden(e, "list", "Secrets", gateway_ns, ISTIO_NAME).map(Some),
    };
    let api = ctx.api::<Secret>(gateway_ns);
    for c in copies {
        let name = c.name_any();
        if keep.contains(&name) || !is_owners_copy(&c.metadata, owner) {
            continue;
        }
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return forbidden(e, "delete", "Secrets", gateway_ns, ISTIO_NAME).map(Some),
        }
    }
    Ok(None)
}

/// Deletes a deleted owner's copies in every external gateway's namespace. A failure is
/// logged.
pub async fn forget(ctx: &Ctx, net: &NetworkConfig, owner: &TlsOwner) {
    for g in &net.istio.external_gateways {
        let Some((_, gw_ns)) = service_of(&g.service) else {
            continue;
        };
        match delete_copies(ctx, gw_ns, owner, &[]).await {
            Ok(None) => {}
            Ok(Some(r)) => tracing::warn!(namespace = %owner.namespace, owner = %owner.name,
                reason = r.reason, "could not delete a deleted owner's Secret copies: {}", r.message),
            Err(e) => tracing::warn!(namespace = %owner.namespace, owner = %owner.name,
                error = %e, "could not delete a deleted owner's Secret copies"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::route::fixtures::*;
    use crate::controller::route::ingress::{Tls, describe};
    use crate::controller::route::traffic::resolve;

    fn desc(net: &NetworkConfig) -> IngressDesc {
        let revs = vec![revision("hello-00001").ready().build()];
        let r = route("hello").with_revision("hello-00001", 100).build();
        let t = resolve(&r, &refs(vec![], revs)).unwrap();
        let mut d = describe(&r, &t, net, 300);
        d.owner_uid = "u-1".into();
        d.tls = vec![Tls {
            hosts: vec!["hello.default.example.com".into()],
            secret_namespace: "default".into(),
            secret_name: "route-u".into(),
        }];
        d
    }

    #[test]
    fn a_tls_gateway_serves_https_with_the_copy_and_http_as_http_protocol_says() {
        let mut net = NetworkConfig::default();
        let g = net.istio.external_gateways[0].clone();
        let meta = |n: String| ObjectMeta {
            name: Some(n),
            ..ObjectMeta::default()
        };
        let sel = BTreeMap::from([("istio".to_string(), "ingressgateway".to_string())]);
        let gw = tls_gateway(&desc(&net), &net, &g, sel.clone(), &meta);
        assert_eq!(gw.spec.selector, sel);
        assert_eq!(gw.spec.servers.len(), 2);
        let https = &gw.spec.servers[0];
        assert_eq!(
            (https.port.number, https.port.protocol.as_str()),
            (443, "HTTPS")
        );
        assert_eq!(
            https.tls.as_ref().unwrap().credential_name.as_deref(),
            Some(copy_name("u-1", "default", "route-u").as_str())
        );
        assert_eq!(gw.spec.servers[1].tls, None);
        net.templates.http_protocol = HttpProtocol::Redirected;
        let gw = tls_gateway(&desc(&net), &net, &g, sel.clone(), &meta);
        assert_eq!(
            gw.spec.servers[1].tls.as_ref().unwrap().https_redirect,
            Some(true)
        );
        net.templates.http_protocol = HttpProtocol::Disabled;
        let gw = tls_gateway(&desc(&net), &net, &g, sel, &meta);
        assert_eq!(gw.spec.servers.len(), 1);
        assert_eq!(
            service_of(&g.service),
            Some(("istio-ingressgateway", "istio-system"))
        );
    }

    #[test]
    fn copies_are_named_by_the_owner_and_older_ones_found_by_its_label() {
        // The finding: namespace `example`'s `com-tls` was copied as `example.com-tls`.
        let name = copy_name("0d2f7c2e-1111-2222-3333-444455556666", "example", "com-tls");
        assert_ne!(name, "example.com-tls");
        assert!(name.starts_with("0d2f7c2e-1111-2222-3333-444455556666-"));
        assert_eq!(name.len(), 53);
        assert_ne!(
            name,
            copy_name("0d2f7c2e-1111-2222-3333-444455556666", "example", "other")
        );
        let owner = TlsOwner {
            namespace: "example".into(),
            name: "hello".into(),
            uid: "u-1".into(),
            hosts: vec![],
            label: ("serving.knative.dev/route", "hello".into()),
        };
        let meta = |pairs: &[(&str, &str)]| ObjectMeta {
            labels: Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        };
        assert!(is_owners_copy(&meta(&[(OWNER_UID_LABEL, "u-1")]), &owner));
        assert!(!is_owners_copy(&meta(&[(OWNER_UID_LABEL, "u-2")]), &owner));
        let legacy = [
            (ORIGIN_SECRET_NAMESPACE, "example"),
            ("serving.knative.dev/route", "hello"),
        ];
        assert!(is_owners_copy(&meta(&legacy), &owner));
        // Another owner's new copy with the same labels is not ours.
        let mut theirs = legacy.to_vec();
        theirs.push((OWNER_UID_LABEL, "u-9"));
        assert!(!is_owners_copy(&meta(&theirs), &owner));
        assert!(!is_owners_copy(&meta(&[]), &owner));
    }
}
