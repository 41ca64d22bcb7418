//! The Istio class's TLS (net-istio's per-ingress Gateways and Secret copies): what an
//! ingress description's TLS blocks become.
//!
//! Istio resolves a server's `credentialName` in the namespace of the gateway pods, not of the
//! Gateway object, while cert-manager writes each Certificate's Secret beside it, in the
//! owner's namespace. So, as net-istio does:
//! - **Secret copies**: each TLS block's Secret is copied into the namespace of every external
//!   gateway's Service (config-istio's `service` host, `{name}.{namespace}.svc...`), named
//!   `{namespace}.{secret}` (unique: namespaces have no dots), type `kubernetes.io/tls`,
//!   labelled `networking.internal.knative.dev/originSecretName` / `originSecretNamespace`
//!   and with the owner's label (`serving.knative.dev/route` or
//!   `serving.knative.dev/domainmapping`). They cannot be owned across namespaces: the
//!   owner's reconcile deletes its copies that are no longer wanted, and a Route's deletion
//!   deletes its copies.
//! - **A Gateway per owner and external gateway** (`{owner}-{adler32(service host)}`, in the
//!   owner's namespace, owned by it): the gateway Service's pod selector; one `HTTPS` server
//!   on 443 per TLS block (`credentialName` the copy, mode `SIMPLE`); and, unless
//!   `http-protocol` is `Disabled`, one `HTTP` server on 80 for the TLS hosts, with
//!   `httpsRedirect` when it is `Redirected`.
//! - **The VirtualService**: the external match of a host that has TLS is bound to these
//!   Gateways instead of config-istio's external gateways (whose port-80 server would serve it
//!   over plain http whatever `http-protocol` says).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Secret, Service as KubeService};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};

use super::ingress::{IngressDesc, Refusal};
use super::virtual_service::{Gateway, GatewaySpec, Server, ServerPort, ServerTlsSettings};
use crate::config::network::{Gateway as IstioGatewayConfig, HttpProtocol, NetworkConfig};
use crate::controller::{Ctx, Error, FIELD_MANAGER};
use crate::knative::names::child_name;

/// net-istio's label on a Secret copy: the origin's name.
pub const ORIGIN_SECRET_NAME: &str = "networking.internal.knative.dev/originSecretName";
/// net-istio's label on a Secret copy: the origin's namespace.
pub const ORIGIN_SECRET_NAMESPACE: &str = "networking.internal.knative.dev/originSecretNamespace";

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

/// The name of the copy of `namespace`'s Secret `secret`.
pub fn copy_name(namespace: &str, secret: &str) -> String {
    format!("{namespace}.{secret}")
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
                credential_name: Some(copy_name(&t.secret_namespace, &t.secret_name)),
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

/// Writes the owner's TLS Gateways and Secret copies for `desc` (none when it has no TLS),
/// and deletes those no longer wanted. `owner_label` is the owner's label (key and value) on
/// the copies. Refused when a Gateway of that name is someone else's, or a gateway Service
/// does not exist (or selects no pods).
pub async fn program<P: kube::Resource + Sync>(
    ctx: &Ctx,
    owner: &P,
    desc: &IngressDesc,
    net: &NetworkConfig,
    owner_label: (&str, &str),
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
            delete_copies(ctx, svc_ns, ns, owner_label, &[]).await?;
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
        let gw = tls_gateway(desc, net, g, selector, meta);
        if let Some(m) =
            super::apply_child(ctx, owner, &gw, None, |e: &Gateway, d| e.spec == d.spec).await?
        {
            return Ok(Some(Refusal::not_owned(m)));
        }
        let mut wanted = Vec::new();
        for t in &desc.tls {
            let Some(origin) = ctx
                .api::<Secret>(&t.secret_namespace)
                .get_opt(&t.secret_name)
                .await?
            else {
                return Err(Error::Other(format!(
                    "the Secret {}/{} of a ready Certificate is missing",
                    t.secret_namespace, t.secret_name
                )));
            };
            let name = copy_name(&t.secret_namespace, &t.secret_name);
            copy_secret(ctx, &origin, svc_ns, &name, owner_label).await?;
            wanted.push(name);
        }
        delete_copies(ctx, svc_ns, ns, owner_label, &wanted).await?;
    }
    Ok(None)
}

async fn copy_secret(
    ctx: &Ctx,
    origin: &Secret,
    ns: &str,
    name: &str,
    owner_label: (&str, &str),
) -> Result<(), Error> {
    let labels = BTreeMap::from([
        (ORIGIN_SECRET_NAME.to_string(), origin.name_any()),
        (
            ORIGIN_SECRET_NAMESPACE.to_string(),
            origin.namespace().unwrap_or_default(),
        ),
        (owner_label.0.to_string(), owner_label.1.to_string()),
    ]);
    let data: BTreeMap<String, ByteString> = origin.data.clone().unwrap_or_default();
    let api = ctx.api::<Secret>(ns);
    if let Some(have) = api.get_opt(name).await?
        && have.data.as_ref() == Some(&data)
        && labels.iter().all(|(k, v)| have.labels().get(k) == Some(v))
    {
        return Ok(());
    }
    let copy = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Secret::default()
    };
    let mut body = serde_json::to_value(&copy).map_err(|e| Error::Other(e.to_string()))?;
    body["apiVersion"] = "v1".into();
    body["kind"] = "Secret".into();
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

/// Deletes the copies in `gateway_ns` of the owner's Secrets (from `owner_ns`) but `keep`.
pub async fn delete_copies(
    ctx: &Ctx,
    gateway_ns: &str,
    owner_ns: &str,
    owner_label: (&str, &str),
    keep: &[String],
) -> Result<(), Error> {
    let api = ctx.api::<Secret>(gateway_ns);
    let selector = format!(
        "{ORIGIN_SECRET_NAMESPACE}={owner_ns},{}={}",
        owner_label.0, owner_label.1
    );
    let copies = api
        .list_metadata(&ListParams::default().labels(&selector))
        .await?;
    for c in copies.items {
        let name = c.name_any();
        if keep.contains(&name) {
            continue;
        }
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
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
            Some("default.route-u")
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
}
