use std::sync::Arc;

use super::*;
use crate::config::network::IngressClass;
use crate::controller::route::fixtures::*;
use crate::controller::route::ingress::describe;
use crate::controller::route::traffic::resolve;

fn net() -> NetworkConfig {
    let mut n = NetworkConfig::default();
    n.templates.ingress_class = IngressClass::GatewayApi;
    n
}

fn split_routes() -> Vec<HTTPRoute> {
    let revs = vec![
        revision("hello-00001").ready().build(),
        revision("hello-00002").ready().h2c().timeout(900).build(),
    ];
    let r = route("hello")
        .with_revision("hello-00001", 70)
        .with_revision("hello-00002", 30)
        .tagged("candidate", "hello-00002", 0)
        .build();
    let t = resolve(&r, &refs(vec![], revs)).unwrap();
    http_routes(&r, &describe(&r, &t, &net(), 300), &net())
}

fn filter_of(f: &[HttpRouteFilter]) -> &HttpHeaderFilter {
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].type_, REQUEST_HEADER_MODIFIER);
    f[0].request_header_modifier.as_ref().unwrap()
}

#[test]
fn one_http_route_per_group_and_visibility_on_config_gateways_gateways() {
    let routes = split_routes();
    let names: Vec<String> = routes.iter().map(|r| r.name_any()).collect();
    assert_eq!(
        names,
        [
            "candidate-hello.default.example.com",
            "candidate-hello.default.svc.cluster.local",
            "hello.default.example.com",
            "hello.default.svc.cluster.local",
        ]
    );
    let ext = &routes[2];
    assert_eq!(ext.spec.hostnames, ["hello.default.example.com"]);
    assert_eq!(ext.spec.parent_refs.len(), 1);
    let p = &ext.spec.parent_refs[0];
    assert_eq!(
        (
            p.group.as_deref(),
            p.kind.as_deref(),
            p.namespace.as_deref(),
            p.name.as_str()
        ),
        (
            Some("gateway.networking.k8s.io"),
            Some("Gateway"),
            Some("istio-system"),
            "knative-gateway"
        )
    );
    assert!(!ext.labels().contains_key(VISIBILITY));
    assert_eq!(ext.labels()["serving.knative.dev/route"], "hello");
    assert_eq!(
        ext.metadata.owner_references.as_ref().unwrap()[0].kind,
        "Route"
    );
    let local = &routes[3];
    assert_eq!(
        local.spec.hostnames,
        [
            "hello.default",
            "hello.default.svc",
            "hello.default.svc.cluster.local"
        ]
    );
    assert_eq!(local.spec.parent_refs[0].name, "knative-local-gateway");
    assert_eq!(local.labels()[VISIBILITY], CLUSTER_LOCAL);
}

#[test]
fn weighted_backends_set_the_revision_headers_and_the_rule_removes_the_internal_ones() {
    let routes = split_routes();
    let rule = &routes[2].spec.rules[0];
    let path = rule.matches[0].path.as_ref().unwrap();
    assert_eq!(
        (path.type_.as_deref(), path.value.as_deref()),
        (Some("PathPrefix"), Some("/"))
    );
    let removed = &filter_of(&rule.filters).remove;
    for h in crate::knative::headers::INTERNAL {
        let set_by_backend = *h == "Knative-Serving-Namespace" || *h == "Knative-Serving-Revision";
        assert_eq!(removed.iter().any(|r| r == h), !set_by_backend, "{h}");
    }
    let backends: Vec<(&str, Option<i32>, Option<i32>)> = rule
        .backend_refs
        .iter()
        .map(|b| (b.name.as_str(), b.port, b.weight))
        .collect();
    assert_eq!(
        backends,
        [
            ("hello-00001", Some(80), Some(70)),
            ("hello-00002", Some(81), Some(30))
        ]
    );
    for b in &rule.backend_refs {
        assert_eq!(
            (b.group.as_deref(), b.kind.as_deref()),
            (Some(""), Some("Service"))
        );
        let set = &filter_of(&b.filters).set;
        assert_eq!(
            set.iter()
                .map(|h| (h.name.as_str(), h.value.as_str()))
                .collect::<Vec<_>>(),
            [
                ("Knative-Serving-Namespace", "default"),
                ("Knative-Serving-Revision", b.name.as_str())
            ]
        );
    }
    // The longest revision timeout, as the default gateways list HTTPRouteRequestTimeout.
    assert_eq!(
        rule.timeouts.as_ref().unwrap().request.as_deref(),
        Some("900s")
    );
    // The tag's group: its revision alone.
    let tag = &routes[0].spec.rules[0].backend_refs;
    assert_eq!(
        tag.iter()
            .map(|b| (b.name.as_str(), b.weight))
            .collect::<Vec<_>>(),
        [("hello-00002", Some(100))]
    );
}

#[test]
fn no_timeout_without_the_feature_a_listener_as_section_and_cluster_local_routes_stay_local() {
    let mut n = net();
    n.gateway.external_gateways[0].supported_features.clear();
    n.gateway.external_gateways[0].http_listener_name = Some("http".into());
    let revs = vec![revision("hello-00001").ready().build()];
    let r = route("hello").with_revision("hello-00001", 100).build();
    let t = resolve(&r, &refs(vec![], revs.clone())).unwrap();
    let routes = http_routes(&r, &describe(&r, &t, &n, 300), &n);
    assert_eq!(routes[0].spec.rules[0].timeouts, None);
    assert_eq!(
        routes[0].spec.parent_refs[0].section_name.as_deref(),
        Some("http")
    );
    assert_eq!(
        routes[1].spec.rules[0]
            .timeouts
            .as_ref()
            .unwrap()
            .request
            .as_deref(),
        Some("300s")
    );
    let local = route("hello")
        .with_revision("hello-00001", 100)
        .label(VISIBILITY, CLUSTER_LOCAL)
        .build();
    let t = resolve(&local, &refs(vec![], revs)).unwrap();
    let routes = http_routes(&local, &describe(&local, &t, &n, 300), &n);
    assert_eq!(routes.len(), 1);
    assert_eq!(routes[0].name_any(), "hello.default.svc.cluster.local");
}

fn reported(hr: &HTTPRoute, conditions: &[(&str, &str, &str)]) -> Arc<HTTPRoute> {
    let mut hr = hr.clone();
    hr.status = Some(hr.status_for_every_parent("example.com/gateway", conditions));
    Arc::new(hr)
}

#[test]
fn readiness_comes_from_accepted_and_resolved_refs_per_parent() {
    let routes = split_routes();
    let all = |conds: &'static [(&str, &str, &str)]| {
        let routes = routes.clone();
        move |name: &str| {
            routes
                .iter()
                .find(|r| r.name_any() == name)
                .map(|r| reported(r, conds))
        }
    };
    // Nothing read back yet, then read back without status: pending, naming what.
    match readiness(&routes, |_| None) {
        Readiness::Pending(m) => assert!(m.contains("not yet seen") && m.contains("more"), "{m}"),
        other => panic!("{other:?}"),
    }
    match readiness(&routes, all(&[])) {
        Readiness::Pending(m) => assert!(m.contains("has not reported"), "{m}"),
        other => panic!("{other:?}"),
    }
    // Accepted alone is not enough.
    assert!(matches!(
        readiness(&routes, all(&[("Accepted", "True", "Accepted")])),
        Readiness::Pending(_)
    ));
    assert_eq!(
        readiness(
            &routes,
            all(&[
                ("Accepted", "True", "Accepted"),
                ("ResolvedRefs", "True", "ResolvedRefs")
            ])
        ),
        Readiness::Ready
    );
    match readiness(
        &routes,
        all(&[
            ("Accepted", "False", "NotAllowedByListeners"),
            ("ResolvedRefs", "True", ""),
        ]),
    ) {
        Readiness::Refused { reason, message } => {
            assert_eq!(reason, "NotAllowedByListeners");
            assert!(message.contains("istio-system/") && message.contains("Accepted=False"));
        }
        other => panic!("{other:?}"),
    }
    // A status for an older spec does not count.
    let old = |name: &str| {
        routes.iter().find(|r| r.name_any() == name).map(|r| {
            let mut r =
                (*reported(r, &[("Accepted", "True", ""), ("ResolvedRefs", "True", "")])).clone();
            r.spec.hostnames.push("old.example.com".into());
            Arc::new(r)
        })
    };
    assert!(matches!(readiness(&routes, old), Readiness::Pending(_)));
}
