use std::collections::BTreeMap;

use super::*;

fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    data(pairs)
}

#[test]
fn defaults_are_knatives() {
    let n = NetworkConfig::default();
    assert_eq!(n.domain.domain_for(&BTreeMap::new()), "example.com");
    assert_eq!(
        n.templates.domain_template.as_str(),
        "{{.Name}}.{{.Namespace}}.{{.Domain}}"
    );
    assert_eq!(n.templates.tag_template.as_str(), "{{.Tag}}-{{.Name}}");
    assert_eq!(
        n.istio.external_gateways[0].reference(),
        "knative-serving/knative-ingress-gateway"
    );
    assert_eq!(
        n.istio.local_gateways[0].reference(),
        "knative-serving/knative-local-gateway"
    );
    // An empty ConfigMap parses to the defaults.
    assert_eq!(
        DomainConfig::parse(&data(&[("_example", "x")]))
            .unwrap()
            .config,
        n.domain
    );
    assert_eq!(
        TemplateConfig::parse(&data(&[])).unwrap().config,
        n.templates
    );
    assert_eq!(IstioConfig::parse(&data(&[])).unwrap().config, n.istio);
}

#[test]
fn domain_selection_is_knatives() {
    let d = DomainConfig::parse(&data(&[
        ("prod.example.org", ""),
        ("internal.example.org", "selector:\n  app: secret\n"),
        (
            "very.example.org",
            "selector:\n  app: secret\n  tier: gold\n",
        ),
        ("a.example.org", "selector:\n  app: secret\n"),
    ]))
    .unwrap()
    .config;
    // A default is given, so example.com is not added.
    assert!(!d.domains.contains_key("example.com"));
    assert_eq!(d.domain_for(&labels(&[])), "prod.example.org");
    assert_eq!(
        d.domain_for(&labels(&[("app", "other")])),
        "prod.example.org"
    );
    // Ties go to the alphabetically first domain.
    assert_eq!(d.domain_for(&labels(&[("app", "secret")])), "a.example.org");
    // The most specific selector wins.
    assert_eq!(
        d.domain_for(&labels(&[("app", "secret"), ("tier", "gold")])),
        "very.example.org"
    );
    // Only selectors: example.com stays the default.
    let d = DomainConfig::parse(&data(&[("x.org", "selector:\n  a: b\n")]))
        .unwrap()
        .config;
    assert_eq!(d.domain_for(&labels(&[])), "example.com");
    assert_eq!(d.domain_for(&labels(&[("a", "b")])), "x.org");
}

#[test]
fn bad_domains_name_the_key() {
    let e = DomainConfig::parse(&data(&[
        ("not a domain", ""),
        ("ok.org", "selector: [1, 2]"),
        ("fine.org", ""),
    ]))
    .unwrap_err();
    assert_eq!(e.0.len(), 2, "{e}");
    assert!(
        e.0.iter()
            .any(|p| p.key == "not a domain" && p.reason.contains("DNS"))
    );
    assert!(
        e.0.iter()
            .any(|p| p.key == "ok.org" && p.reason.contains("selector"))
    );
}

#[test]
fn templates_render_and_bad_ones_are_rejected() {
    let t = TemplateConfig::parse(&data(&[
        ("domain-template", "{{ .Name }}-{{.Namespace}}.{{.Domain}}"),
        ("tag-template", "{{.Name}}-{{.Tag}}"),
    ]))
    .unwrap()
    .config;
    let v = TemplateValues {
        name: "hello",
        namespace: "default",
        domain: "example.com",
        tag: "v2",
    };
    assert_eq!(t.domain_template.render(&v), "hello-default.example.com");
    assert_eq!(t.tag_template.render(&v), "hello-v2");

    for (key, value, why) in [
        ("domain-template", "{{.Namespace}}.{{.Domain}}", "{{.Name}}"),
        (
            "domain-template",
            "{{.Name}}.{{.Annotations.x}}",
            "unsupported",
        ),
        ("domain-template", "{{.Name}}.{{.Tag}}.x", "not available"),
        (
            "domain-template",
            "{{.Name}}/path.{{.Domain}}",
            "not a host name",
        ),
        ("domain-template", "{{.Name", "not closed"),
        ("tag-template", "{{.Tag}}", "both"),
        (
            "mesh-compatibility-mode",
            "strict",
            "one of auto, enabled, disabled",
        ),
        ("tag-template", "{{.Tag}}.{{.Name}}", "one DNS label"),
        (
            "tag-template",
            "{{.Tag}}-{{.Name}}-{{.Domain}}",
            "not available",
        ),
    ] {
        let e = TemplateConfig::parse(&data(&[(key, value)])).unwrap_err();
        assert_eq!(e.0[0].key, key, "{value}");
        assert!(e.0[0].reason.contains(why), "{value}: {e}");
    }
    // Other Knative keys are accepted with a warning.
    let w = TemplateConfig::warnings(&data(&[("certificate-class", "x"), ("nope", "y")]));
    assert_eq!(w.len(), 2);
    assert!(w[0].contains("no effect"), "{w:?}");
}

#[test]
fn gateways_parse_net_istio_lists() {
    let c = IstioConfig::parse(&data(&[(
        "external-gateways",
        "- name: gw\n  namespace: ingress\n  service: gw.ingress.svc.cluster.local\n- name: gw2\n  namespace: ingress\n  service: gw2.ingress.svc.cluster.local\n",
    )]))
    .unwrap()
    .config;
    assert_eq!(
        c.external_gateways
            .iter()
            .map(Gateway::reference)
            .collect::<Vec<_>>(),
        ["ingress/gw", "ingress/gw2"]
    );
    assert_eq!(c.local_gateways, IstioConfig::default().local_gateways);
    for (value, why) in [
        ("[]", "at least one"),
        ("- name: gw\n  namespace: x\n", "YAML list"),
        (
            "- name: Bad_Name\n  namespace: x\n  service: s.x\n",
            "DNS label",
        ),
        ("name: gw", "YAML list"),
    ] {
        let e = IstioConfig::parse(&data(&[("local-gateways", value)])).unwrap_err();
        assert_eq!(e.0[0].key, "local-gateways");
        assert!(e.0[0].reason.contains(why), "{value}: {e}");
    }
    // The older per-gateway keys are read as net-istio reads them (istio_legacy has the
    // details), and are no warning.
    let old = data(&[
        (
            "gateway.knative-serving.knative-ingress-gateway",
            "istio-ingressgateway.istio-system.svc.cluster.local",
        ),
        (
            "local-gateway.edge.private",
            "private.edge.svc.cluster.local",
        ),
    ]);
    assert!(IstioConfig::warnings(&old).is_empty());
    let p = IstioConfig::parse(&old).unwrap();
    assert_eq!(
        p.config.external_gateways,
        IstioConfig::default().external_gateways,
        "the older key for the default gateway reads as the default"
    );
    assert_eq!(p.config.local_gateways[0].reference(), "edge/private");
    assert_eq!(
        p.config.local_gateways[0].service,
        "private.edge.svc.cluster.local"
    );
    assert!(
        p.given.contains("local-gateway.edge.private"),
        "{:?}",
        p.given
    );
    // Only the local one given: the external keeps its default.
    let p = IstioConfig::parse(&data(&[("local-gateway.edge.private", "p.edge")])).unwrap();
    assert_eq!(
        p.config.external_gateways,
        IstioConfig::default().external_gateways
    );
    // Both forms: refused as net-istio refuses it, naming the older key and the newer one.
    let mut both = old.clone();
    both.insert(
        "local-gateways".into(),
        "- name: gw\n  namespace: x\n  service: s.x\n".into(),
    );
    let e = IstioConfig::parse(&both).unwrap_err();
    assert_eq!(e.0.len(), 1, "{e}");
    assert_eq!(
        e.0[0].key,
        "gateway.knative-serving.knative-ingress-gateway"
    );
    assert!(e.0[0].reason.contains("local-gateways"), "{e}");
    // A bad older value is refused with its key, beside the other keys' problems.
    let e = IstioConfig::parse(&data(&[
        ("gateway.a.b", "not a host"),
        (TLS_HOSTS_KEY, "0"),
    ]))
    .unwrap_err();
    let keys: Vec<&str> = e.0.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(keys, [TLS_HOSTS_KEY, "gateway.a.b"], "{e}");
}

#[test]
fn ingress_class_is_knatives_key_and_names_a_class_thaw_writes() {
    assert_eq!(
        TemplateConfig::default().ingress_class.as_str(),
        "istio.ingress.networking.knative.dev"
    );
    let c = TemplateConfig::parse(&data(&[(
        "ingress-class",
        "gateway-api.ingress.networking.knative.dev",
    )]))
    .unwrap()
    .config;
    assert_eq!(c.ingress_class, IngressClass::GatewayApi);
    assert!(!TemplateConfig::default().autocreate_cluster_domain_claims);
    let c = TemplateConfig::parse(&data(&[("autocreate-cluster-domain-claims", "true")]))
        .unwrap()
        .config;
    assert!(c.autocreate_cluster_domain_claims);
    let e =
        TemplateConfig::parse(&data(&[("autocreate-cluster-domain-claims", "yes")])).unwrap_err();
    assert_eq!(e.0[0].key, "autocreate-cluster-domain-claims");
    let e = TemplateConfig::parse(&data(&[(
        "ingress-class",
        "kourier.ingress.networking.knative.dev",
    )]))
    .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("ingress-class") && text.contains("kourier"),
        "{text}"
    );
}

#[test]
fn config_gateway_is_net_gateway_apis_format() {
    let d = GatewayConfig::default();
    assert_eq!(GatewayConfig::parse(&data(&[])).unwrap().config, d);
    assert_eq!(
        d.external_gateways[0].gateway.to_string(),
        "istio-system/knative-gateway"
    );
    assert_eq!(
        d.local_gateways[0].service_host().as_deref(),
        Some("knative-local-gateway.istio-system.svc.cluster.local")
    );
    assert!(d.local_gateways[0].supports(REQUEST_TIMEOUT_FEATURE));
    let c = GatewayConfig::parse(&data(&[(
        "external-gateways",
        "- class: eg\n  gateway: gw/public\n  service: gw/envoy\n  http-listener-name: http\n",
    )]))
    .unwrap()
    .config;
    let g = &c.external_gateways[0];
    assert_eq!(
        (
            g.class.as_str(),
            g.gateway.to_string(),
            g.http_listener_name.as_deref()
        ),
        ("eg", "gw/public".to_string(), Some("http"))
    );
    assert!(!g.supports(REQUEST_TIMEOUT_FEATURE));
    assert_eq!(c.local_gateways, d.local_gateways);
    for (key, value, says) in [
        ("external-gateways", "- gateway: nope\n", "namespace/name"),
        ("external-gateways", "[]", "at least one"),
        (
            "local-gateways",
            "- gateway: a/b\n  colour: red\n",
            "YAML list",
        ),
        ("local-gateways", "- gateway: a/b\n", "needs a service"),
    ] {
        let e = GatewayConfig::parse(&data(&[(key, value)])).unwrap_err();
        let text = e.to_string();
        assert!(text.contains(key) && text.contains(says), "{text}");
    }
}

#[test]
fn tls_keys_and_their_older_spellings() {
    let d = TemplateConfig::parse(&data(&[])).unwrap().config;
    assert!(!d.external_domain_tls);
    assert_eq!(d.http_protocol, HttpProtocol::Enabled);
    let c = TemplateConfig::parse(&data(&[
        ("external-domain-tls", "Enabled"),
        ("http-protocol", "redirected"),
    ]))
    .unwrap()
    .config;
    assert!(c.external_domain_tls);
    assert_eq!(c.http_protocol, HttpProtocol::Redirected);
    // The older spellings are read; the newer ones win when both are given.
    let c = TemplateConfig::parse(&data(&[("auto-tls", "Enabled")]))
        .unwrap()
        .config;
    assert!(c.external_domain_tls);
    let c = TemplateConfig::parse(&data(&[
        ("auto-tls", "Enabled"),
        ("external-domain-tls", "Disabled"),
    ]))
    .unwrap()
    .config;
    assert!(!c.external_domain_tls);
    let c = TemplateConfig::parse(&data(&[(
        "ingress.class",
        "gateway-api.ingress.networking.knative.dev",
    )]))
    .unwrap()
    .config;
    assert_eq!(c.ingress_class, IngressClass::GatewayApi);
    let c = TemplateConfig::parse(&data(&[
        (
            "ingress.class",
            "gateway-api.ingress.networking.knative.dev",
        ),
        ("ingress-class", "istio.ingress.networking.knative.dev"),
    ]))
    .unwrap()
    .config;
    assert_eq!(c.ingress_class, IngressClass::Istio);
    for (key, value) in [
        ("external-domain-tls", "yes"),
        ("auto-tls", "on"),
        ("http-protocol", "Sometimes"),
    ] {
        let text = TemplateConfig::parse(&data(&[(key, value)]))
            .unwrap_err()
            .to_string();
        assert!(text.contains(key), "{text}");
    }
}

#[test]
fn config_certmanager_issuer_ref() {
    let d = CertManagerConfig::parse(&data(&[])).unwrap().config;
    assert_eq!(d.issuer_ref.kind, "ClusterIssuer");
    assert_eq!(d.issuer_ref.name, "knative-selfsigned-issuer");
    let p = CertManagerConfig::parse(&data(&[
        ("issuerRef", "kind: Issuer\nname: letsencrypt\n"),
        ("clusterLocalIssuerRef", "kind: ClusterIssuer\nname: x\n"),
    ]))
    .unwrap();
    assert_eq!(p.config.issuer_ref.kind, "Issuer");
    assert_eq!(p.config.issuer_ref.name, "letsencrypt");
    assert!(
        p.warnings
            .iter()
            .any(|w| w.contains("clusterLocalIssuerRef")),
        "{:?}",
        p.warnings
    );
    let external = CertManagerConfig::parse(&data(&[(
        "issuerRef",
        "kind: AWSPCAClusterIssuer\nname: pca\ngroup: awspca.cert-manager.io\n",
    )]))
    .unwrap();
    assert_eq!(
        external.config.issuer_ref.group.as_deref(),
        Some("awspca.cert-manager.io")
    );
    for (value, says) in [
        ("kind: Issuer\n", "kind and name"),
        ("kind: Nope\nname: a\n", "not Issuer or ClusterIssuer"),
        ("kind: Issuer\nname: Not_A_Name\n", "DNS subdomain"),
        ("kind: Issuer\nname: a\ncolour: red\n", "kind and name"),
        ("[]", "kind and name"),
    ] {
        let text = CertManagerConfig::parse(&data(&[("issuerRef", value)]))
            .unwrap_err()
            .to_string();
        assert!(
            text.contains("issuerRef") && text.contains(says),
            "{value}: {text}"
        );
    }
}

/// `max-tls-hosts-per-namespace` (both ConfigMaps) and `secret-copy-refresh-period`
/// (config-istio): defaults, the bound in force following the ingress class, and bad values
/// refused naming the key and the reason (the live reload then keeps the last good config, as
/// for every key).
#[test]
fn tls_bounds_per_namespace_and_the_copy_refresh() {
    let n = NetworkConfig::default();
    assert_eq!(n.istio.max_tls_hosts_per_namespace, 8);
    assert_eq!(n.gateway.max_tls_hosts_per_namespace, 8);
    assert_eq!(
        n.istio.secret_copy_refresh,
        std::time::Duration::from_secs(60)
    );
    assert_eq!(
        n.tls_host_limit(),
        TlsHostLimit {
            per_namespace: 8,
            config_map: "config-istio"
        }
    );
    let g = GatewayConfig::parse(&data(&[("max-tls-hosts-per-namespace", "64")]))
        .unwrap()
        .config;
    assert_eq!(g.max_tls_hosts_per_namespace, 64);
    let i = IstioConfig::parse(&data(&[
        ("max-tls-hosts-per-namespace", "2"),
        ("secret-copy-refresh-period", "5s"),
    ]))
    .unwrap()
    .config;
    assert_eq!(i.max_tls_hosts_per_namespace, 2);
    assert_eq!(i.secret_copy_refresh, std::time::Duration::from_secs(5));
    let mut net = NetworkConfig {
        gateway: g,
        istio: i,
        ..NetworkConfig::default()
    };
    assert_eq!(net.tls_host_limit().per_namespace, 2);
    net.templates.ingress_class = IngressClass::GatewayApi;
    assert_eq!(
        net.tls_host_limit(),
        TlsHostLimit {
            per_namespace: 64,
            config_map: "config-gateway"
        }
    );
    for (key, value, why) in [
        ("max-tls-hosts-per-namespace", "0", "must be in [1, 64]"),
        ("max-tls-hosts-per-namespace", "65", "must be in [1, 64]"),
        ("max-tls-hosts-per-namespace", "eight", ""),
        ("secret-copy-refresh-period", "2m", "must be in [1s, 60s]"),
        ("secret-copy-refresh-period", "0s", "must be in [1s, 60s]"),
    ] {
        let e = IstioConfig::parse(&data(&[(key, value)])).unwrap_err();
        assert_eq!(e.0[0].key, key, "{value}");
        assert!(
            e.0[0].reason.contains(why),
            "{key}={value}: {}",
            e.0[0].reason
        );
    }
    let e = GatewayConfig::parse(&data(&[("max-tls-hosts-per-namespace", "100")])).unwrap_err();
    assert_eq!(e.0[0].key, "max-tls-hosts-per-namespace");
    assert!(
        e.0[0]
            .reason
            .contains("a Gateway holds at most 64 listeners")
    );
}
