//! What the controller's TLS writes into shared places (listeners on the operator's Gateway,
//! Secret copies in the gateway namespace), against the in-process API server: names no tenant
//! can aim (derived from the owner's UID), copies that follow their origin without a Secret
//! watch, each namespace's bound on TLS hosts, and a 403 in a gateway namespace as a
//! condition. The test plays cert-manager (it writes each Certificate's Secret and marks it
//! Ready) and, with the Gateway API, the gateway's implementation. Waits poll with a deadline;
//! no test asserts a speed.

mod controller_support;
mod kube_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Secret, Service as KubeService};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use thaw::config::network::{HttpProtocol, IngressClass};
use thaw::controller::route::certificate::{
    Certificate, CertificateCondition, CertificateStatus, route_certificate_name,
};
use thaw::controller::route::http_route::{Gateway, GatewaySpec, HTTPRoute, Listener};
use thaw::controller::route::istio_tls;
use thaw::controller::route::tls_owner::{legacy_listener_prefix, listener_name};
use thaw::controller::{Ctx, CtxOptions, Settings};
use thaw::knative::duck::{Condition, ConditionStatus};
use thaw::knative::names::labels;
use thaw::knative::{
    ClusterDomainClaim, ClusterDomainClaimSpec, DomainMapping, DomainMappingSpec, KReference,
    Revision, RevisionSpec, Route, RouteSpec, SecretTls, TrafficTarget, condition,
};
use tokio::task::JoinHandle;

use crate::kube_support::TestApi;
use crate::kube_support::relay::Relay;
use controller_support::wait_for;

const GATEWAY_NS: &str = "istio-system";

/// The API server, the gateway pod (config-istio's default gateways and the Gateways `more`),
/// and the controllers the test starts (aborted when dropped).
struct Plane {
    _api: TestApi,
    client: kube::Client,
    relay: Relay,
    tasks: Vec<JoinHandle<()>>,
    _gateway: kube_support::gateway::TestGateway,
}

impl Drop for Plane {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Plane {
    async fn start(more: &[&str]) -> Plane {
        let api = TestApi::start().await;
        let relay = Relay::start(api.addr()).await;
        let client = api.client();
        let gateway = kube_support::gateway::default_gateways_and(&client, more).await;
        Plane {
            _api: api,
            client,
            relay,
            tasks: Vec::new(),
            _gateway: gateway,
        }
    }

    fn api<K>(&self, ns: &str) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), ns)
    }

    /// The Route controller (and the DomainMapping one with `dms`) for namespace `ns`,
    /// talking to the API server through the relay.
    fn controllers(&mut self, ns: &str, settings: Settings, dms: bool) -> Arc<Ctx> {
        let ctx: Arc<Ctx> = Ctx::with_options(
            kube_support::client_at(self.relay.addr()),
            settings,
            CtxOptions {
                namespace: Some(ns.into()),
                ..CtxOptions::default()
            },
        );
        self.tasks
            .push(tokio::spawn(thaw::controller::route::controller(
                ctx.clone(),
            )));
        if dms {
            self.tasks
                .push(tokio::spawn(thaw::controller::domain_mapping::controller(
                    ctx.clone(),
                )));
        }
        ctx
    }
}

fn tls_settings(class: IngressClass, http: HttpProtocol) -> Settings {
    let mut s = Settings::default();
    s.network.templates.ingress_class = class;
    s.network.templates.external_domain_tls = true;
    s.network.templates.http_protocol = http;
    s
}

/// A Ready Revision `name` in `ns` (its configuration the name's prefix).
async fn revision(p: &Plane, ns: &str, name: &str) {
    let cfg = name.rsplit_once('-').map_or(name, |(c, _)| c);
    let rev = Revision {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([
                (labels::CONFIGURATION.to_string(), cfg.to_string()),
                (labels::ROUTING_STATE.to_string(), "pending".to_string()),
            ])),
            ..ObjectMeta::default()
        },
        spec: RevisionSpec::default(),
        status: None,
    };
    let api = p.api::<Revision>(ns);
    api.create(&PostParams::default(), &rev).await.unwrap();
    loop {
        let mut r = api.get_status(name).await.unwrap();
        let mut st = r.status.clone().unwrap_or_default();
        st.status.set(
            Condition::new(condition::READY, ConditionStatus::True),
            &thaw::controller::now(),
        );
        r.status = Some(st);
        match api.replace_status(name, &PostParams::default(), &r).await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => panic!("{name}: {e}"),
        }
    }
}

fn to(rev: &str, percent: i64, tag: Option<&str>) -> TrafficTarget {
    TrafficTarget {
        revision_name: Some(rev.into()),
        percent: Some(percent),
        tag: tag.map(Into::into),
        ..TrafficTarget::default()
    }
}

/// The Route `name` in `ns` sending everything to `{name}-00001`, with `tags` (0% each).
async fn route(p: &Plane, ns: &str, name: &str, tags: &[String]) -> Route {
    let rev = format!("{name}-00001");
    revision(p, ns, &rev).await;
    let mut traffic = vec![to(&rev, 100, None)];
    traffic.extend(tags.iter().map(|t| to(&rev, 0, Some(t))));
    let mut r = Route::new(name, RouteSpec { traffic });
    r.metadata.namespace = Some(ns.into());
    p.api::<Route>(ns)
        .create(&PostParams::default(), &r)
        .await
        .unwrap()
}

fn tls_secret(name: &str, cert: &[u8]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            ("tls.crt".to_string(), ByteString(cert.to_vec())),
            ("tls.key".to_string(), ByteString(b"key".to_vec())),
        ])),
        ..Secret::default()
    }
}

/// Plays cert-manager: the Certificate `name`'s Secret, then `Ready=True`.
async fn issue(p: &Plane, ns: &str, name: &str) {
    let secrets = p.api::<Secret>(ns);
    if secrets.get_opt(name).await.unwrap().is_none() {
        let s = tls_secret(name, format!("cert of {name}").as_bytes());
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    let api = p.api::<Certificate>(ns);
    loop {
        let mut c = api.get(name).await.unwrap();
        c.status = Some(CertificateStatus {
            conditions: vec![CertificateCondition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: Some("Ready".into()),
                observed_generation: c.metadata.generation,
                ..CertificateCondition::default()
            }],
        });
        match api.replace_status(name, &PostParams::default(), &c).await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => panic!("{name}: {e}"),
        }
    }
}

fn cond(r: &Route, t: &str) -> Option<(ConditionStatus, Option<String>, String)> {
    let c = r.status.as_ref()?.status.condition(t)?;
    Some((
        c.status,
        c.reason.clone(),
        c.message.clone().unwrap_or_default(),
    ))
}

async fn route_until(
    p: &Plane,
    ns: &str,
    name: &str,
    what: &str,
    ok: impl Fn(&Route) -> bool,
) -> Route {
    let api = p.api::<Route>(ns);
    wait_for(
        what,
        || async { api.get_opt(name).await.unwrap() },
        |r| r.as_ref().is_some_and(&ok),
    )
    .await
    .unwrap()
}

fn url(r: &Route) -> Option<String> {
    r.status.as_ref().and_then(|s| s.fields.url.clone())
}

/// config-gateway's default external Gateway with the operator's http listener and `more`.
async fn external_gateway(p: &Plane, more: Vec<Listener>) {
    let mut listeners = vec![Listener {
        name: "http".into(),
        port: 80,
        protocol: "HTTP".into(),
        ..Listener::default()
    }];
    listeners.extend(more);
    let mut gw = Gateway::new(
        "knative-gateway",
        GatewaySpec {
            gateway_class_name: "istio".into(),
            listeners,
        },
    );
    gw.metadata.namespace = Some(GATEWAY_NS.into());
    p.api::<Gateway>(GATEWAY_NS)
        .create(&PostParams::default(), &gw)
        .await
        .unwrap();
}

async fn listener_names(p: &Plane) -> Vec<String> {
    let gw = p
        .api::<Gateway>(GATEWAY_NS)
        .get("knative-gateway")
        .await
        .unwrap();
    gw.spec.listeners.into_iter().map(|l| l.name).collect()
}

/// Plays the gateway's implementation: `Accepted` and `ResolvedRefs` on every parent of the
/// HTTPRoute `name`.
async fn accept(p: &Plane, ns: &str, name: &str) {
    let api = p.api::<HTTPRoute>(ns);
    let ok = [
        ("Accepted", "True", "Accepted"),
        ("ResolvedRefs", "True", "ResolvedRefs"),
    ];
    loop {
        let mut hr = api.get(name).await.unwrap();
        hr.status = Some(hr.status_for_every_parent("example.com/gateway-controller", &ok));
        match api.replace_status(name, &PostParams::default(), &hr).await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => panic!("{name}: {e}"),
        }
    }
}

/// Plays the gateway's implementation on every HTTPRoute of `ns` (for its generation now).
async fn accept_all(p: &Plane, ns: &str) {
    for hr in p
        .api::<HTTPRoute>(ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
    {
        accept(p, ns, &hr.name_any()).await;
    }
}

/// The Certificate of `route`'s default host, as the controller writes it, issued: what a
/// cluster holds when thaw is upgraded.
async fn issued_before(p: &Plane, route: &Route, host: &str, settings: &Settings) {
    let ns = route.namespace().unwrap();
    let name = route_certificate_name(&route.uid().unwrap(), None);
    let meta = ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(ns.clone()),
        labels: Some(BTreeMap::from([(
            labels::ROUTE.to_string(),
            route.name_any(),
        )])),
        owner_references: Some(vec![thaw::controller::owner_ref(route)]),
        ..ObjectMeta::default()
    };
    let cert = thaw::controller::route::certificate::certificate(meta, host, &settings.network);
    p.api::<Certificate>(&ns)
        .create(&PostParams::default(), &cert)
        .await
        .unwrap();
    issue(p, &ns, &name).await;
}

/// The istio-ingressgateway Service selects the gateway pods (the TLS Gateways copy it).
async fn select_gateway_pods(p: &Plane, service_ns: &str) {
    p.api::<KubeService>(service_ns)
        .patch(
            "istio-ingressgateway",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"selector": {"istio": "ingressgateway"}}})),
        )
        .await
        .unwrap();
}

async fn claim(p: &Plane, domain: &str, ns: &str) {
    let c = ClusterDomainClaim::new(
        domain,
        ClusterDomainClaimSpec {
            namespace: ns.into(),
        },
    );
    Api::<ClusterDomainClaim>::all(p.client.clone())
        .create(&PostParams::default(), &c)
        .await
        .unwrap();
}

/// A DomainMapping `domain` in `ns` to the Route `route`, served with the Secret `secret`.
async fn domain_mapping(p: &Plane, ns: &str, domain: &str, route: &str, secret: &str) {
    let mut dm = DomainMapping::new(
        domain,
        DomainMappingSpec {
            ref_: KReference {
                api_version: "serving.knative.dev/v1".into(),
                kind: "Route".into(),
                name: route.into(),
                namespace: None,
            },
            tls: Some(SecretTls {
                secret_name: secret.into(),
            }),
        },
    );
    dm.metadata.namespace = Some(ns.into());
    p.api::<DomainMapping>(ns)
        .create(&PostParams::default(), &dm)
        .await
        .unwrap();
}

async fn domain_mapping_until(
    p: &Plane,
    ns: &str,
    domain: &str,
    what: &str,
    ok: impl Fn(&DomainMapping) -> bool,
) -> DomainMapping {
    let api = p.api::<DomainMapping>(ns);
    wait_for(what, || async { api.get(domain).await.unwrap() }, ok).await
}

fn dm_https(d: &DomainMapping) -> bool {
    d.status
        .as_ref()
        .and_then(|s| s.url.as_deref())
        .is_some_and(|u| u.starts_with("https://"))
}

/// The position of the first write whose request line has `line` and whose bytes have every
/// one of `has` and none of `lacks`.
fn first_write(writes: &[(String, Vec<u8>)], line: &str, has: &[&str], lacks: &[&str]) -> usize {
    let contains = |b: &[u8], n: &str| b.windows(n.len()).any(|w| w == n.as_bytes());
    writes
        .iter()
        .position(|(l, b)| {
            l.contains(line)
                && has.iter().all(|n| contains(b, n))
                && !lacks.iter().any(|n| contains(b, n))
        })
        .unwrap_or_else(|| panic!("no write to {line} with {has:?} without {lacks:?}"))
}

// ---------------------------------------------------------------------------------------------
// Nothing a tenant can aim

/// `default/bbbb` and `default/caac` shared one listener prefix (adler32 of `namespace/owner`
/// collides): each removed the other's listener and still reported https. Named after their
/// UIDs, both keep theirs, and both are Ready over https. `bbbb`'s listener of the older name
/// (on the Gateway from before the upgrade) is `bbbb`'s alone — its host is — so `caac`,
/// reconciled first, leaves it, and `bbbb` replaces it without an https gap: the new listener
/// is written beside it, the HTTPRoute's `sectionName` switched to the new one, and only then
/// the old one removed. The control: a deleted route's listener goes, the other's stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_whose_checksums_collide_both_keep_their_listeners() {
    assert_eq!(
        legacy_listener_prefix("default", "bbbb"),
        legacy_listener_prefix("default", "caac")
    );
    let mut p = Plane::start(&[]).await;
    let (b_host, c_host) = ("bbbb.default.example.com", "caac.default.example.com");
    let legacy = format!(
        "{}{:08x}",
        legacy_listener_prefix("default", "bbbb"),
        adler2::adler32_slice(b_host.as_bytes())
    );
    let old = Listener {
        name: legacy.clone(),
        hostname: Some(b_host.into()),
        port: 443,
        protocol: "HTTPS".into(),
        ..Listener::default()
    };
    external_gateway(&p, vec![old]).await;
    // As a controller before the upgrade left it: caac with a Ready Certificate.
    let settings = tls_settings(IngressClass::GatewayApi, HttpProtocol::Redirected);
    let c = route(&p, "default", "caac", &[]).await;
    issued_before(&p, &c, c_host, &settings).await;
    p.controllers("default", settings.clone(), false);
    let c_listener = listener_name(&c.uid().unwrap(), c_host);
    let ready_https = |name: &'static str, host: &'static str| {
        let p = &p;
        async move {
            wait_for(
                "Ready over https",
                || async {
                    accept_all(p, "default").await;
                    p.api::<Route>("default").get(name).await.unwrap()
                },
                |r| {
                    cond(r, "Ready").is_some_and(|c| c.0 == ConditionStatus::True)
                        && url(r) == Some(format!("https://{host}"))
                },
            )
            .await
        }
    };
    ready_https("caac", c_host).await;
    // caac's listeners are written and its older ones pruned: bbbb's, under the same prefix,
    // is not caac's (its host is not).
    assert_eq!(
        listener_names(&p).await,
        ["http".to_string(), legacy.clone(), c_listener.clone()]
    );

    // bbbb, as the upgrade found it (its Certificate Ready), reaches the controller.
    p.relay.hold(&["/routes?", "watch=true"]);
    let b = route(&p, "default", "bbbb", &[]).await;
    issued_before(&p, &b, b_host, &settings).await;
    p.relay.release();
    let b_listener = listener_name(&b.uid().unwrap(), b_host);
    let mut want = vec!["http".to_string(), b_listener.clone(), c_listener.clone()];
    want.sort();
    wait_for(
        "both routes' listeners, the older one gone",
        || async {
            let mut l = listener_names(&p).await;
            l.sort();
            l
        },
        |l| *l == want,
    )
    .await;
    for (name, host) in [("bbbb", b_host), ("caac", c_host)] {
        let r = ready_https(name, host).await;
        assert_eq!(cond(&r, "IngressReady").unwrap().0, ConditionStatus::True);
    }
    // Write, switch, remove: never an HTTPS gap for bbbb's host.
    let writes = p.relay.writes();
    let gw = "/gateways/knative-gateway";
    let added = first_write(&writes, gw, &[&b_listener, &legacy], &[]);
    let switched = first_write(
        &writes,
        &format!("/httproutes/{b_host}?"),
        &[&format!("\"sectionName\":\"{b_listener}\"")],
        &[],
    );
    let removed = first_write(&writes, gw, &[&b_listener], &[&legacy]);
    assert!(
        added < switched && switched < removed,
        "added {added}, switched {switched}, removed {removed}"
    );
    // No write before bbbb's switch took the older listener away.
    assert!(
        !writes[..switched].iter().any(
            |(l, b)| l.contains(gw) && !b.windows(legacy.len()).any(|w| w == legacy.as_bytes())
        ),
        "the older listener was removed before the HTTPRoute left it"
    );

    // The control: bbbb deleted, its listener goes; caac's stays, still https.
    p.api::<Route>("default")
        .delete("bbbb", &Default::default())
        .await
        .unwrap();
    wait_for(
        "bbbb's listener removed",
        || listener_names(&p),
        |l| *l == ["http".to_string(), c_listener.clone()],
    )
    .await;
    let r = p.api::<Route>("default").get("caac").await.unwrap();
    assert_eq!(url(&r), Some(format!("https://{c_host}")));
}

/// Namespace `example`'s DomainMapping serving its Secret `com-tls` was copied as
/// `istio-system/example.com-tls`, force-applied over the operator's Secret of that name.
/// The copy is now named after the DomainMapping's UID: the operator's Secret is untouched and
/// the domain is served over https with the copy. A Secret of someone else's at the very name
/// a copy takes is left as it is, and the Route reports `IngressReady=False NotOwned` naming
/// it; once it is gone the copy is written and the Route is Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_secret_is_never_overwritten_by_a_copy() {
    let ns = "example";
    let g = thaw::config::network::IstioConfig::default().external_gateways[0].clone();
    let hello_gw = format!("{ns}/{}", istio_tls::tls_gateway_name("hello", &g));
    let mut p = Plane::start(&[&hello_gw]).await;
    select_gateway_pods(&p, GATEWAY_NS).await;
    let gw_secrets = p.api::<Secret>(GATEWAY_NS);
    let operators = tls_secret("example.com-tls", b"the operator's");
    gw_secrets
        .create(&PostParams::default(), &operators)
        .await
        .unwrap();
    p.controllers(
        ns,
        tls_settings(IngressClass::Istio, HttpProtocol::Enabled),
        true,
    );
    let hello = route(&p, ns, "hello", &[]).await;
    let hello_uid = hello.uid().unwrap();
    let cert = route_certificate_name(&hello_uid, None);
    // Someone else's Secret at the name the route's copy takes.
    let taken = istio_tls::copy_name(&hello_uid, ns, &cert);
    gw_secrets
        .create(
            &PostParams::default(),
            &tls_secret(&taken, b"someone else's"),
        )
        .await
        .unwrap();

    // The attack: a DomainMapping of namespace `example` served with its Secret `com-tls`.
    let domain = "shop.example.org";
    claim(&p, domain, ns).await;
    p.api::<Secret>(ns)
        .create(
            &PostParams::default(),
            &tls_secret("com-tls", b"the tenant's"),
        )
        .await
        .unwrap();
    domain_mapping(&p, ns, domain, "hello", "com-tls").await;
    let dm = domain_mapping_until(&p, ns, domain, "the domain over https", |d| {
        dm_https(d)
            && d.status
                .as_ref()
                .and_then(|s| s.status.condition("IngressReady"))
                .is_some_and(|c| c.status == ConditionStatus::True)
    })
    .await;
    let copy = gw_secrets
        .get(&istio_tls::copy_name(&dm.uid().unwrap(), ns, "com-tls"))
        .await
        .unwrap();
    assert_eq!(copy.data.unwrap()["tls.crt"].0, b"the tenant's");
    let theirs = gw_secrets.get("example.com-tls").await.unwrap();
    assert_eq!(
        theirs.data, operators.data,
        "the operator's Secret was written"
    );
    assert!(theirs.labels().is_empty());

    // A Secret that is not the copy, at the copy's name: NotOwned, left alone.
    issue(&p, ns, &cert).await;
    let r = route_until(&p, ns, "hello", "NotOwned", |r| {
        cond(r, "IngressReady").is_some_and(|c| c.1.as_deref() == Some("NotOwned"))
    })
    .await;
    let (status, _, message) = cond(&r, "IngressReady").unwrap();
    assert_eq!(status, ConditionStatus::False);
    assert!(message.contains(&taken), "{message}");
    let still = gw_secrets.get(&taken).await.unwrap();
    assert_eq!(still.data.as_ref().unwrap()["tls.crt"].0, b"someone else's");
    assert!(still.labels().is_empty());

    // The control: without it, the copy is written and the route served over https.
    gw_secrets
        .delete(&taken, &Default::default())
        .await
        .unwrap();
    route_until(&p, ns, "hello", "Ready over https", |r| {
        cond(r, "Ready").is_some_and(|c| c.0 == ConditionStatus::True)
            && url(r).is_some_and(|u| u.starts_with("https://"))
    })
    .await;
    let copy = gw_secrets.get(&taken).await.unwrap();
    assert_eq!(
        copy.labels()[istio_tls::OWNER_UID_LABEL],
        hello_uid,
        "the route's copy"
    );
}

// ---------------------------------------------------------------------------------------------
// Copies follow their origin

/// A DomainMapping's own TLS Secret (`spec.tls.secretName`) has no Certificate whose status
/// would re-queue it: its copy kept the old certificate until the resync, hours later. Its
/// origin is now read again on a jittered re-queue (config-istio's
/// `secret-copy-refresh-period`, short here) and copied when its resourceVersion changed, with
/// no Secret watch and no Secret list outside the gateway namespace. A copy of the older name
/// (`{namespace}.{secret}`) is replaced without a gap: the new copy is created, then the TLS
/// Gateway names it, then the older one is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_origin_reaches_its_copy_without_a_secret_watch() {
    let ns = "default";
    let domain = "shop.example.org";
    let mut p = Plane::start(&[]).await;
    select_gateway_pods(&p, GATEWAY_NS).await;
    let gw_secrets = p.api::<Secret>(GATEWAY_NS);
    // The copy as thaw named it before, with its labels.
    let mut older = tls_secret("default.shop-cert", b"v0");
    older.metadata.labels = Some(BTreeMap::from([
        (
            istio_tls::ORIGIN_SECRET_NAMESPACE.to_string(),
            ns.to_string(),
        ),
        (
            istio_tls::ORIGIN_SECRET_NAME.to_string(),
            "shop-cert".to_string(),
        ),
        (
            "serving.knative.dev/domainmapping".to_string(),
            domain.to_string(),
        ),
    ]));
    gw_secrets
        .create(&PostParams::default(), &older)
        .await
        .unwrap();
    let mut settings = Settings::default();
    settings.network.istio.secret_copy_refresh = Duration::from_secs(1);
    p.controllers(ns, settings, true);
    route(&p, ns, "hello", &[]).await;
    claim(&p, domain, ns).await;
    let origins = p.api::<Secret>(ns);
    origins
        .create(&PostParams::default(), &tls_secret("shop-cert", b"v1"))
        .await
        .unwrap();
    domain_mapping(&p, ns, domain, "hello", "shop-cert").await;
    let dm = domain_mapping_until(&p, ns, domain, "the domain over https", dm_https).await;
    let name = istio_tls::copy_name(&dm.uid().unwrap(), ns, "shop-cert");
    let crt = |s: &Option<Secret>| {
        s.as_ref()
            .and_then(|s| s.data.as_ref())
            .map(|d| d["tls.crt"].0.clone())
    };
    wait_for(
        "the copy",
        || async { gw_secrets.get_opt(&name).await.unwrap() },
        |s| crt(s).as_deref() == Some(b"v1"),
    )
    .await;
    wait_for(
        "the older copy deleted",
        || async { gw_secrets.get_opt("default.shop-cert").await.unwrap() },
        Option::is_none,
    )
    .await;

    // The certificate rotates.
    let mut s = origins.get("shop-cert").await.unwrap();
    s.data = tls_secret("shop-cert", b"v2").data;
    origins
        .replace("shop-cert", &PostParams::default(), &s)
        .await
        .unwrap();
    let copy = wait_for(
        "the rotated certificate in the copy",
        || async { gw_secrets.get_opt(&name).await.unwrap() },
        |s| crt(s).as_deref() == Some(b"v2"),
    )
    .await
    .unwrap();
    let rv = origins.get("shop-cert").await.unwrap().resource_version();
    assert_eq!(
        copy.annotations()
            .get(istio_tls::ORIGIN_RESOURCE_VERSION_ANNOTATION),
        rv.as_ref()
    );

    // No Secret watched; Secrets listed in the gateway namespace only.
    assert_eq!(p.relay.watches("/secrets"), Vec::<String>::new());
    let lists: Vec<String> = p
        .relay
        .lists("/secrets?")
        .into_iter()
        .filter(|l| !l.contains(&format!("/namespaces/{GATEWAY_NS}/secrets?")))
        .collect();
    assert!(lists.is_empty(), "{lists:?}");
    // Created, then named by the Gateway, then the older one deleted.
    let lines = p.relay.requests();
    let at = |what: &str, pred: &dyn Fn(&str) -> bool| {
        lines
            .iter()
            .position(|l| pred(l))
            .unwrap_or_else(|| panic!("no {what}: {lines:#?}"))
    };
    let created = at("copy created", &|l| {
        l.starts_with(&format!("POST /api/v1/namespaces/{GATEWAY_NS}/secrets"))
    });
    let named = at("TLS Gateway written", &|l| {
        l.starts_with("PATCH /apis/networking.istio.io/v1/namespaces/default/gateways/")
    });
    let deleted = at("older copy deleted", &|l| {
        l.starts_with(&format!(
            "DELETE /api/v1/namespaces/{GATEWAY_NS}/secrets/default.shop-cert"
        ))
    });
    assert!(
        created < named && named < deleted,
        "created {created}, named {named}, deleted {deleted}"
    );
}

// ---------------------------------------------------------------------------------------------
// Bounds per namespace on shared objects

/// One Route with 70 tags wrote 71 listeners (a Gateway allows 64) and sent 71 Certificates to
/// the cluster's issuer. With config-gateway's `max-tls-hosts-per-namespace` at its default,
/// its namespace gets 8: the default host and the first 7 tags by name get Certificates and
/// listeners; the others are served over http and the route is `CertificateProvisioned=False
/// TLSHostLimitExceeded` naming the bound. The control: another namespace's route still gets
/// its listener. With the bound raised to 64, the route fills the Gateway to 64 listeners and
/// no further, the namespace's first 8 keeping their places.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seventy_tags_get_their_namespaces_places_and_a_gateway_at_most_64_listeners() {
    let mut p = Plane::start(&[]).await;
    external_gateway(&p, Vec::new()).await;
    let settings = tls_settings(IngressClass::GatewayApi, HttpProtocol::Enabled);
    let ctx = p.controllers("default", settings.clone(), false);
    let tags: Vec<String> = (0..70).map(|i| format!("t{i:02}")).collect();
    let r = route(&p, "default", "hello", &tags).await;
    let uid = r.uid().unwrap();
    let certs = p.api::<Certificate>("default");
    let names = |n: usize| {
        let mut v = vec![route_certificate_name(&uid, None)];
        v.extend(
            tags[..n - 1]
                .iter()
                .map(|t| route_certificate_name(&uid, Some(t))),
        );
        v.sort();
        v
    };
    let have = || async {
        let mut v: Vec<String> = certs
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|c| c.name_any())
            .collect();
        v.sort();
        v
    };
    wait_for("the first 8 Certificates", have, |v| *v == names(8)).await;
    let r = route_until(&p, "default", "hello", "TLSHostLimitExceeded", |r| {
        cond(r, "CertificateProvisioned")
            .is_some_and(|c| c.1.as_deref() == Some("TLSHostLimitExceeded"))
    })
    .await;
    let (status, _, message) = cond(&r, "CertificateProvisioned").unwrap();
    assert_eq!(status, ConditionStatus::False);
    assert!(
        message.contains("t07-hello.default.example.com (and 62 more hosts)")
            && message.contains("namespace default has its 8 TLS hosts")
            && message.contains("config-gateway's max-tls-hosts-per-namespace"),
        "{message}"
    );
    for n in names(8) {
        issue(&p, "default", &n).await;
    }
    let r = route_until(&p, "default", "hello", "https for the first 8", |r| {
        let https = r.status.iter().flat_map(|s| {
            s.fields
                .url
                .iter()
                .chain(s.fields.traffic.iter().filter_map(|t| t.url.as_ref()))
        });
        https.filter(|u| u.starts_with("https://")).count() == 8
    })
    .await;
    assert_eq!(
        url(&r).as_deref(),
        Some("https://hello.default.example.com")
    );
    let url_of = |tag: &str| {
        r.status
            .as_ref()
            .unwrap()
            .fields
            .traffic
            .iter()
            .find(|t| t.tag.as_deref() == Some(tag))
            .and_then(|t| t.url.clone())
    };
    assert_eq!(
        url_of("t06").as_deref(),
        Some("https://t06-hello.default.example.com")
    );
    // Beyond the bound, served over http, whatever http-protocol says.
    assert_eq!(
        url_of("t07").as_deref(),
        Some("http://t07-hello.default.example.com")
    );
    wait_for(
        "8 listeners beside http",
        || listener_names(&p),
        |l| l.len() == 9,
    )
    .await;
    assert!(cond(&r, "CertificateProvisioned").unwrap().0 == ConditionStatus::False);

    // The control: another namespace still gets its TLS host.
    p.controllers("team-b", settings.clone(), false);
    let b = route(&p, "team-b", "blog", &[]).await;
    let b_cert = route_certificate_name(&b.uid().unwrap(), None);
    wait_for(
        "team-b's Certificate",
        || async {
            p.api::<Certificate>("team-b")
                .get_opt(&b_cert)
                .await
                .unwrap()
        },
        Option::is_some,
    )
    .await;
    issue(&p, "team-b", &b_cert).await;
    let b_listener = listener_name(&b.uid().unwrap(), "blog.team-b.example.com");
    wait_for(
        "team-b's listener",
        || listener_names(&p),
        |l| l.contains(&b_listener),
    )
    .await;

    // The bound raised to 64: the Gateway fills to 64 listeners (the operator's http and
    // team-b's among them), no further.
    let mut raised = settings;
    raised.network.gateway.max_tls_hosts_per_namespace = 64;
    ctx.set_settings(raised);
    wait_for("62 Certificates", have, |v| v.len() == 62).await;
    for c in certs.list(&Default::default()).await.unwrap().items {
        issue(&p, "default", &c.name_any()).await;
    }
    let r = route_until(&p, "default", "hello", "the Gateway full", |r| {
        cond(r, "CertificateProvisioned").is_some_and(|c| {
            c.2.contains(
                "the Gateway istio-system/knative-gateway has no room for another \
                          listener (64 at most)",
            )
        })
    })
    .await;
    assert!(
        cond(&r, "CertificateProvisioned")
            .unwrap()
            .2
            .contains("(and 8 more hosts)"),
        "{:?}",
        cond(&r, "CertificateProvisioned")
    );
    let l = wait_for("64 listeners", || listener_names(&p), |l| l.len() == 64).await;
    assert!(l.contains(&b_listener) && l.contains(&"http".to_string()));
    for n in names(8) {
        assert!(certs.get_opt(&n).await.unwrap().is_some(), "{n} kept");
    }
}

// ---------------------------------------------------------------------------------------------
// Least privilege

/// config-istio pointed at a gateway Service in a namespace where deploy/ grants the
/// controller nothing: the API server refuses the copy (403), and the Route says so,
/// `IngressReady=False GatewayForbidden` naming the namespace and the verb, instead of failing
/// silently. The control: once allowed, the copy is written there and the Route is Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_403_in_a_gateway_namespace_is_ingress_ready_false_naming_it() {
    let gw_ns = "gw-elsewhere";
    let g = thaw::config::network::Gateway {
        service: format!("istio-ingressgateway.{gw_ns}.svc.cluster.local"),
        ..thaw::config::network::IstioConfig::default().external_gateways[0].clone()
    };
    let tls_gw = format!("default/{}", istio_tls::tls_gateway_name("hello", &g));
    let mut p = Plane::start(&[&tls_gw]).await;
    kube_support::gateway::publish(&p.client, &g.service, &[p._gateway.addr()]).await;
    select_gateway_pods(&p, gw_ns).await;
    let create = format!("POST /api/v1/namespaces/{gw_ns}/secrets");
    p.relay.refuse(&create, 403);
    let mut settings = tls_settings(IngressClass::Istio, HttpProtocol::Enabled);
    settings.network.istio.external_gateways = vec![g.clone()];
    p.controllers("default", settings, false);
    let r = route(&p, "default", "hello", &[]).await;
    let cert = route_certificate_name(&r.uid().unwrap(), None);
    wait_for(
        "the Certificate",
        || async {
            p.api::<Certificate>("default")
                .get_opt(&cert)
                .await
                .unwrap()
        },
        Option::is_some,
    )
    .await;
    issue(&p, "default", &cert).await;
    let r = route_until(&p, "default", "hello", "GatewayForbidden", |r| {
        cond(r, "IngressReady").is_some_and(|c| c.1.as_deref() == Some("GatewayForbidden"))
    })
    .await;
    let (status, _, message) = cond(&r, "IngressReady").unwrap();
    assert_eq!(status, ConditionStatus::False);
    assert!(
        message.contains("may not create Secrets in the namespace gw-elsewhere"),
        "{message}"
    );
    assert!(p.relay.answered_here(&create) > 0);

    // The control: granted, the copy is written there and the route served over https.
    p.relay.forward(&create);
    route_until(&p, "default", "hello", "Ready over https", |r| {
        cond(r, "Ready").is_some_and(|c| c.0 == ConditionStatus::True)
            && url(r).is_some_and(|u| u.starts_with("https://"))
    })
    .await;
    let copy = istio_tls::copy_name(&r.uid().unwrap(), "default", &cert);
    assert!(
        p.api::<Secret>(gw_ns)
            .get_opt(&copy)
            .await
            .unwrap()
            .is_some()
    );
}

/// An invalid `max-tls-hosts-per-namespace` (config-gateway) or `secret-copy-refresh-period`
/// (config-istio) is rejected naming the key, and the last good value keeps serving.
#[tokio::test]
async fn a_bad_tls_bound_keeps_the_last_good_one() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use thaw::config::live::{LiveConfig, SYSTEM_NAMESPACE, watch_configmaps};
    use thaw::config::reload::Outcome;
    let api = TestApi::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), SYSTEM_NAMESPACE);
    let cm = |name: &str, k: &str, v: &str| ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(k.to_string(), v.to_string())])),
        ..ConfigMap::default()
    };
    let live = LiveConfig::default();
    let stop = tokio_util::sync::CancellationToken::new();
    let rx = watch_configmaps(
        api.client(),
        SYSTEM_NAMESPACE,
        live.clone(),
        thaw::telemetry::config::ConfigMetrics::default(),
        stop.clone(),
    );
    // One change at a time: the channel holds the latest event only.
    let mut seen = 0;
    let mut outcome = async |name: &str| {
        let mut rx = rx.clone();
        let after = seen;
        let e = tokio::time::timeout(
            controller_support::DEADLINE,
            rx.wait_for(|e| e.generation > after && e.name == name),
        )
        .await
        .expect("an event")
        .unwrap()
        .clone();
        seen = e.generation;
        e.outcome.unwrap()
    };
    for (name, key, good) in [
        ("config-gateway", "max-tls-hosts-per-namespace", "4"),
        ("config-istio", "secret-copy-refresh-period", "10s"),
    ] {
        cms.create(&PostParams::default(), &cm(name, key, good))
            .await
            .unwrap();
        assert_eq!(outcome(name).await, Outcome::Applied);
    }
    assert_eq!(live.gateway.load().max_tls_hosts_per_namespace, 4);
    assert_eq!(
        live.istio.load().secret_copy_refresh,
        Duration::from_secs(10)
    );
    for (name, key, bad, why) in [
        (
            "config-gateway",
            "max-tls-hosts-per-namespace",
            "100",
            "must be in [1, 64]",
        ),
        (
            "config-istio",
            "secret-copy-refresh-period",
            "2m",
            "must be in [1s, 60s]",
        ),
    ] {
        let mut c = cms.get(name).await.unwrap();
        c.data = cm(name, key, bad).data;
        cms.replace(name, &PostParams::default(), &c).await.unwrap();
        let o = outcome(name).await;
        let Outcome::Rejected(problems) = o else {
            panic!("{name}: an invalid {key} was applied: {o:?}");
        };
        assert_eq!(problems.0[0].key, key);
        assert!(problems.0[0].reason.contains(why), "{:?}", problems.0[0]);
    }
    assert_eq!(live.gateway.load().max_tls_hosts_per_namespace, 4);
    assert_eq!(
        live.istio.load().secret_copy_refresh,
        Duration::from_secs(10)
    );
    stop.cancel();
}
