//! The revision's two Services (Knative's ServerlessService pair):
//!
//! - **private** `<revision>-private`: selects the revision's pods; Kubernetes' endpoints
//!   controller writes its EndpointSlices, which the activator and the autoscaler watch by the
//!   labels `serving.knative.dev/revision` and `networking.internal.knative.dev/serviceType:
//!   Private`. Ports: `http` 80 → the sidecar's 8012; for an h2c revision also `http2` 81 →
//!   8012 with appProtocol `kubernetes.io/h2c` (the sidecar's data port serves both); and
//!   [`crate::stats::POD_STATS_PORT_NAME`] 9091 → the sidecar's admin port, where the
//!   autoscaler pulls each pod's stats.
//! - **public** `<revision>`: no selector. Its EndpointSlices are the autoscaler's (the
//!   activators or the pods: the serving-mode swap); the controller never writes them. One
//!   port by protocol, as Knative's: `http` 80, or `http2` 81 with appProtocol
//!   `kubernetes.io/h2c` — the names the swap copies onto the slices and matches against the
//!   activator Service's ports.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::meta::{child_annotations, child_labels, owner_ref, selector};
use super::resolve::Resolved;
use crate::knative::Revision;
use crate::knative::names::{PRIVATE_SERVICE_SUFFIX, child_name, labels};
use crate::platform::kubernetes::{APP_PROTOCOL_H2C, PORT_NAME_HTTP, PORT_NAME_HTTP2};
use crate::queue::settings::{DEFAULT_ADMIN_PORT, DEFAULT_DATA_PORT};
use crate::revision::Protocol;
use crate::stats::POD_STATS_PORT_NAME;

/// The HTTP/1 port of both Services (Knative's `ServiceHTTPPort`).
pub const HTTP_PORT: i32 = 80;
/// The h2c port of both Services (Knative's `ServiceHTTP2Port`).
pub const HTTP2_PORT: i32 = 81;

/// `<revision>-private`, within 63 characters.
pub fn private_name(revision: &str) -> String {
    child_name(revision, PRIVATE_SERVICE_SUFFIX)
}

/// `<revision>` (hashed to 63 characters only for a longer revision name).
pub fn public_name(revision: &str) -> String {
    child_name(revision, "")
}

fn port(name: &str, port: i32, target: u16, app: Option<&str>) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port,
        target_port: Some(IntOrString::Int(i32::from(target))),
        protocol: Some("TCP".into()),
        app_protocol: app.map(Into::into),
        ..ServicePort::default()
    }
}

fn meta(rev: &Revision, name: String, r: &Resolved, service_type: &str) -> ObjectMeta {
    let mut l = child_labels(rev);
    l.insert(labels::SERVICE_TYPE.into(), service_type.into());
    let a = child_annotations(rev);
    ObjectMeta {
        name: Some(name),
        namespace: Some(r.namespace.clone()),
        labels: Some(l),
        annotations: (!a.is_empty()).then_some(a),
        owner_references: Some(vec![owner_ref(rev)]),
        ..ObjectMeta::default()
    }
}

/// The private Service: the revision's pods behind the sidecar's ports.
pub fn private_service(rev: &Revision, r: &Resolved) -> Service {
    let mut ports = vec![port(PORT_NAME_HTTP, HTTP_PORT, DEFAULT_DATA_PORT, None)];
    if r.protocol == Protocol::H2c {
        ports.push(port(
            PORT_NAME_HTTP2,
            HTTP2_PORT,
            DEFAULT_DATA_PORT,
            Some(APP_PROTOCOL_H2C),
        ));
    }
    ports.push(port(
        POD_STATS_PORT_NAME,
        i32::from(DEFAULT_ADMIN_PORT),
        DEFAULT_ADMIN_PORT,
        None,
    ));
    Service {
        metadata: meta(rev, private_name(&r.name), r, labels::SERVICE_TYPE_PRIVATE),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(selector(rev)),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// The public Service: no selector; the autoscaler writes its endpoints.
pub fn public_service(rev: &Revision, r: &Resolved) -> Service {
    let port = match r.protocol {
        Protocol::Http1 => port(PORT_NAME_HTTP, HTTP_PORT, DEFAULT_DATA_PORT, None),
        Protocol::H2c => port(
            PORT_NAME_HTTP2,
            HTTP2_PORT,
            DEFAULT_DATA_PORT,
            Some(APP_PROTOCOL_H2C),
        ),
    };
    Service {
        metadata: meta(rev, public_name(&r.name), r, labels::SERVICE_TYPE_PUBLIC),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            ports: Some(vec![port]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AutoscalerConfig, DefaultsConfig, DeploymentConfig};
    use crate::controller::revision::fixtures::RevisionFixture;
    use crate::controller::revision::resolve::resolve;

    fn build(rev: &Revision) -> (Service, Service) {
        let r = resolve(
            rev,
            &DefaultsConfig::default(),
            &AutoscalerConfig::default(),
            &DeploymentConfig::default(),
        )
        .unwrap();
        (private_service(rev, &r), public_service(rev, &r))
    }

    fn ports(s: &Service) -> Vec<(String, i32, i32, Option<String>)> {
        s.spec
            .as_ref()
            .unwrap()
            .ports
            .iter()
            .flatten()
            .map(|p| {
                let IntOrString::Int(t) = p.target_port.clone().unwrap() else {
                    panic!("numeric target ports")
                };
                (p.name.clone().unwrap(), p.port, t, p.app_protocol.clone())
            })
            .collect()
    }

    #[test]
    fn http1_services() {
        let rev = RevisionFixture::new("hello-00001").build();
        let (private, public) = build(&rev);
        assert_eq!(
            private.metadata.name.as_deref(),
            Some("hello-00001-private")
        );
        assert_eq!(public.metadata.name.as_deref(), Some("hello-00001"));
        let pl = private.metadata.labels.as_ref().unwrap();
        assert_eq!(pl[labels::SERVICE_TYPE], "Private");
        assert_eq!(pl[labels::REVISION], "hello-00001");
        let ul = public.metadata.labels.as_ref().unwrap();
        assert_eq!(ul[labels::SERVICE_TYPE], "Public");
        assert_eq!(ul[labels::REVISION], "hello-00001");
        assert_eq!(
            private.spec.as_ref().unwrap().selector.as_ref().unwrap()[labels::REVISION_UID],
            "uid-hello-00001"
        );
        assert_eq!(public.spec.as_ref().unwrap().selector, None);
        assert_eq!(
            ports(&private),
            [
                ("http".to_string(), 80, 8012, None),
                ("http-autometric".to_string(), 9091, 9091, None)
            ]
        );
        assert_eq!(ports(&public), [("http".to_string(), 80, 8012, None)]);
        for s in [&private, &public] {
            let o = &s.metadata.owner_references.as_ref().unwrap()[0];
            assert_eq!(
                (o.kind.as_str(), o.uid.as_str()),
                ("Revision", "uid-hello-00001")
            );
        }
    }

    #[test]
    fn h2c_services() {
        let rev = RevisionFixture::new("grpc-00001")
            .port(Some("h2c"), 8080)
            .build();
        let (private, public) = build(&rev);
        let h2c = Some("kubernetes.io/h2c".to_string());
        assert_eq!(
            ports(&private),
            [
                ("http".to_string(), 80, 8012, None),
                ("http2".to_string(), 81, 8012, h2c.clone()),
                ("http-autometric".to_string(), 9091, 9091, None)
            ]
        );
        assert_eq!(ports(&public), [("http2".to_string(), 81, 8012, h2c)]);
    }
}
