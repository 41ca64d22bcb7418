use super::*;
use crate::controller::route::fixtures::*;
use crate::controller::route::traffic::resolve;
use crate::knative::Revision;

fn ready_revs() -> Vec<Revision> {
    vec![
        revision("hello-00001").ready().build(),
        revision("hello-00002").ready().h2c().timeout(900).build(),
    ]
}

fn split_route() -> crate::knative::Route {
    route("hello")
        .with_revision("hello-00001", 50)
        .with_revision("hello-00002", 50)
        .tagged("candidate", "hello-00002", 0)
        .build()
}

#[test]
fn hosts_follow_the_templates_and_the_domain() {
    let net = NetworkConfig::default();
    let r = route("hello").build();
    let h = group_hosts(&r, None, &net);
    assert_eq!(h.name, "hello");
    assert_eq!(h.external.as_deref(), Some("hello.default.example.com"));
    assert_eq!(
        h.local,
        [
            "hello.default",
            "hello.default.svc",
            "hello.default.svc.cluster.local"
        ]
    );
    assert_eq!(url(&r, &net), "http://hello.default.example.com");
    assert_eq!(
        address(&r).url.as_deref(),
        Some("http://hello.default.svc.cluster.local")
    );
    let t = group_hosts(&r, Some("v2"), &net);
    assert_eq!(t.external.as_deref(), Some("v2-hello.default.example.com"));
    assert_eq!(t.local[2], "v2-hello.default.svc.cluster.local");

    // cluster-local by label, by annotation, or by a svc.cluster.local domain.
    for r in [
        route("hello").label(VISIBILITY, CLUSTER_LOCAL).build(),
        route("hello").annotation(VISIBILITY, CLUSTER_LOCAL).build(),
    ] {
        assert!(is_cluster_local(&r, &net));
        assert_eq!(group_hosts(&r, None, &net).external, None);
        assert_eq!(url(&r, &net), "http://hello.default.svc.cluster.local");
    }
    let mut local_domain = NetworkConfig::default();
    local_domain.domain.domains = [("svc.cluster.local".to_string(), Default::default())].into();
    assert!(is_cluster_local(&route("hello").build(), &local_domain));
}

#[test]
fn the_virtual_service_splits_with_headers_on_each_destination() {
    let net = NetworkConfig::default();
    let r = split_route();
    let t = resolve(&r, &refs(vec![], ready_revs())).unwrap();
    let vs = virtual_service(&r, &t, &net, 300);
    assert_eq!(vs.metadata.name.as_deref(), Some("hello-ingress"));
    assert_eq!(vs.metadata.namespace.as_deref(), Some("default"));
    let owner = &vs.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("Route", Some(true))
    );
    assert_eq!(
        vs.metadata.labels.as_ref().unwrap()["serving.knative.dev/route"],
        "hello"
    );
    assert_eq!(
        vs.spec.gateways,
        [
            "knative-serving/knative-ingress-gateway",
            "knative-serving/knative-local-gateway"
        ]
    );
    assert_eq!(
        vs.spec.hosts,
        [
            "candidate-hello.default.example.com",
            "candidate-hello.default",
            "candidate-hello.default.svc",
            "candidate-hello.default.svc.cluster.local",
            "hello.default.example.com",
            "hello.default",
            "hello.default.svc",
            "hello.default.svc.cluster.local",
        ]
    );
    // The probe routes first, then the tag's route, then the default one.
    assert_eq!(vs.spec.http.len(), 4);
    let tag = &vs.spec.http[2];
    let default = &vs.spec.http[3];
    assert_eq!(tag.name.as_deref(), Some("candidate-hello"));
    assert_eq!(tag.route.len(), 1);
    assert_eq!(tag.route[0].weight, Some(100));
    let ext = &default.match_[0];
    assert_eq!(
        ext.authority.as_ref().unwrap().regex.as_deref(),
        Some(r"^hello\.default\.example\.com(?::\d{1,5})?$")
    );
    assert_eq!(ext.gateways, ["knative-serving/knative-ingress-gateway"]);
    assert_eq!(
        default.match_[1].gateways,
        ["knative-serving/knative-local-gateway"]
    );
    assert_eq!(default.match_.len(), 4);

    let dests: Vec<(String, u32, Option<i32>, String)> = default
        .route
        .iter()
        .map(|d| {
            let set = &d.headers.as_ref().unwrap().request.as_ref().unwrap().set;
            assert_eq!(set["Knative-Serving-Namespace"], "default");
            (
                d.destination.host.clone(),
                d.destination.port.as_ref().unwrap().number,
                d.weight,
                set["Knative-Serving-Revision"].clone(),
            )
        })
        .collect();
    assert_eq!(
        dests,
        [
            (
                "hello-00001.default.svc.cluster.local".into(),
                80,
                Some(50),
                "hello-00001".into()
            ),
            (
                "hello-00002.default.svc.cluster.local".into(),
                81,
                Some(50),
                "hello-00002".into()
            ),
        ]
    );
    // The longest revision timeout of the group (900 s beats the 300 s default).
    assert_eq!(default.timeout.as_deref(), Some("900s"));
}

#[test]
fn zero_percent_targets_get_no_destination_and_cluster_local_no_external_gateway() {
    let net = NetworkConfig::default();
    let r = route("hello")
        .label(VISIBILITY, CLUSTER_LOCAL)
        .with_revision("hello-00001", 100)
        .tagged("old", "hello-00002", 0)
        .build();
    let t = resolve(&r, &refs(vec![], ready_revs())).unwrap();
    let vs = virtual_service(&r, &t, &net, 300);
    assert_eq!(vs.spec.gateways, ["knative-serving/knative-local-gateway"]);
    assert!(vs.spec.hosts.iter().all(|h| !h.ends_with("example.com")));
    let default = vs.spec.http.last().unwrap();
    assert_eq!(default.route.len(), 1, "{default:?}");
    assert_eq!(default.route[0].weight, Some(100));
    assert_eq!(default.timeout.as_deref(), Some("300s"));
    assert!(
        vs.spec
            .http
            .iter()
            .flat_map(|h| &h.match_)
            .all(|m| m.gateways == ["knative-serving/knative-local-gateway"])
    );
}

#[test]
fn placeholders_and_status_traffic() {
    let net = NetworkConfig::default();
    let r = split_route();
    let t = resolve(&r, &refs(vec![], ready_revs())).unwrap();
    let svcs = placeholder_services(&r, &t, &net);
    let names: Vec<_> = svcs
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["hello", "candidate-hello"]);
    let spec = svcs[0].spec.as_ref().unwrap();
    assert_eq!(spec.type_.as_deref(), Some("ExternalName"));
    assert_eq!(
        spec.external_name.as_deref(),
        Some("knative-local-gateway.istio-system.svc.cluster.local")
    );
    let port = &spec.ports.as_ref().unwrap()[0];
    assert_eq!((port.name.as_deref(), port.port), (Some("http2"), 80));

    let st = status_traffic(&r, &t, &net);
    assert_eq!(st.len(), 3);
    assert_eq!(st[0].revision_name.as_deref(), Some("hello-00001"));
    assert_eq!(st[0].url, None);
    assert_eq!(st[2].tag.as_deref(), Some("candidate"));
    assert_eq!(
        st[2].url.as_deref(),
        Some("http://candidate-hello.default.example.com")
    );
    assert!(st.iter().all(|t| t.configuration_name.is_none()));

    // A tag whose placeholder name would pass 63 characters gets none.
    let long = "t".repeat(60);
    let r = route("hello").tagged(&long, "hello-00001", 100).build();
    let t = resolve(&r, &refs(vec![], ready_revs())).unwrap();
    assert_eq!(placeholder_services(&r, &t, &net).len(), 1);
}

#[test]
fn probe_routes_set_the_hash_of_the_description_and_keep_the_probers_headers() {
    let net = NetworkConfig::default();
    let r = split_route();
    let t = resolve(&r, &refs(vec![], ready_revs())).unwrap();
    let vss = virtual_services(&r, &t, &net, 300);
    assert_eq!(vss.hash.len(), 64, "hex SHA-256");
    for vs in [&vss.ingress, &vss.mesh] {
        let (probes, routes) = vs.spec.http.split_at(2);
        for (p, r) in probes.iter().zip(routes) {
            assert_eq!(p.name, r.name.as_ref().map(|n| format!("{n}-probe")));
            assert_eq!(p.match_.len(), r.match_.len());
            for (pm, rm) in p.match_.iter().zip(&r.match_) {
                assert_eq!(pm.authority, rm.authority);
                assert_eq!(pm.gateways, rm.gateways);
                assert_eq!(
                    pm.headers["k-network-hash"].exact.as_deref(),
                    Some("override")
                );
            }
            for (pd, rd) in p.route.iter().zip(&r.route) {
                let (pops, rops) = (
                    pd.headers.as_ref().unwrap().request.as_ref().unwrap(),
                    rd.headers.as_ref().unwrap().request.as_ref().unwrap(),
                );
                assert_eq!(pops.set["K-Network-Hash"], vss.hash);
                assert!(!rops.set.contains_key("K-Network-Hash"));
                assert!(rops.remove.iter().any(|h| h == "K-Network-Probe"));
                assert!(rops.remove.iter().any(|h| h == "K-Network-Hash"));
                assert!(!pops.remove.iter().any(|h| h == "K-Network-Probe"));
                assert!(!pops.remove.iter().any(|h| h == "K-Network-Hash"));
                assert!(pops.remove.iter().any(|h| h == "K-Proxy-Request"));
            }
        }
    }
    // The same description hashes the same; any change of it changes the hash.
    assert_eq!(virtual_services(&r, &t, &net, 300).hash, vss.hash);
    let mut other_gateways = NetworkConfig::default();
    other_gateways.istio.local_gateways[0].name = "other-local-gateway".into();
    assert_ne!(
        virtual_services(&r, &t, &other_gateways, 300).hash,
        vss.hash
    );
    let other = route("hello").with_revision("hello-00001", 100).build();
    let t2 = resolve(&other, &refs(vec![], ready_revs())).unwrap();
    assert_ne!(virtual_services(&other, &t2, &net, 300).hash, vss.hash);
}

#[test]
fn the_mesh_virtual_service_is_on_the_mesh_gateway_for_the_local_hosts() {
    let net = NetworkConfig::default();
    let r = split_route();
    let t = resolve(&r, &refs(vec![], ready_revs())).unwrap();
    let vss = virtual_services(&r, &t, &net, 300);
    let mesh = &vss.mesh;
    assert_eq!(mesh.metadata.name.as_deref(), Some("hello-mesh"));
    assert_eq!(
        mesh.metadata.owner_references,
        vss.ingress.metadata.owner_references
    );
    assert_eq!(mesh.spec.gateways, ["mesh"]);
    assert_eq!(
        mesh.spec.hosts,
        [
            "candidate-hello.default.svc.cluster.local",
            "hello.default.svc.cluster.local"
        ]
    );
    assert!(
        mesh.spec
            .http
            .iter()
            .flat_map(|h| &h.match_)
            .all(|m| m.gateways == ["mesh"])
    );
    // The same destinations, weights, headers and timeouts as the ingress.
    for (m, i) in mesh.spec.http.iter().zip(&vss.ingress.spec.http) {
        assert_eq!(
            (&m.name, &m.route, &m.timeout),
            (&i.name, &i.route, &i.timeout)
        );
    }
}
