//! The route's status from the traffic and ingress outcomes.

use super::*;
use crate::controller::route::fixtures::*;
use crate::knative::duck::Status;

const NO_TLS: TlsOutcome = TlsOutcome::NotEnabled {
    cluster_local: false,
};

fn cond<'a>(s: &'a Status, t: &str) -> (ConditionStatus, Option<&'a str>) {
    let c = s.condition(t).unwrap_or_else(|| panic!("no {t}"));
    (c.status, c.reason.as_deref())
}

#[test]
fn all_assigned_and_programmed_is_ready() {
    let net = NetworkConfig::default();
    let r = route("hello").with_revision("hello-00001", 100).build();
    let t = traffic::resolve(
        &r,
        &refs(vec![], vec![revision("hello-00001").ready().build()]),
    );
    let st = compute_status(&r, &t, &Ingress::Programmed, Some(&NO_TLS), &net, &now());
    assert_eq!(st.status.observed_generation, Some(1));
    assert_eq!(cond(&st.status, "Ready"), (ConditionStatus::True, None));
    assert_eq!(
        cond(&st.status, "CertificateProvisioned"),
        (ConditionStatus::True, Some("TLSNotEnabled"))
    );
    assert_eq!(
        st.fields.url.as_deref(),
        Some("http://hello.default.example.com")
    );
    assert_eq!(
        st.fields.traffic[0].revision_name.as_deref(),
        Some("hello-00001")
    );
    assert_eq!(st.fields.traffic[0].percent, Some(100));
}

#[test]
fn a_missing_revision_keeps_the_last_traffic_and_is_not_ready() {
    let net = NetworkConfig::default();
    let before = vec![crate::knative::TrafficTarget {
        revision_name: Some("hello-00001".into()),
        percent: Some(100),
        ..Default::default()
    }];
    let r = route("hello")
        .with_revision("nope-00009", 100)
        .status_traffic(before.clone())
        .build();
    let t = traffic::resolve(&r, &refs(vec![], vec![]));
    let st = compute_status(&r, &t, &Ingress::Unchanged, Some(&NO_TLS), &net, &now());
    assert_eq!(
        cond(&st.status, "AllTrafficAssigned"),
        (ConditionStatus::False, Some("RevisionMissing"))
    );
    assert_eq!(
        cond(&st.status, "IngressReady"),
        (ConditionStatus::Unknown, Some("IngressNotConfigured"))
    );
    assert_eq!(
        cond(&st.status, "Ready"),
        (ConditionStatus::False, Some("RevisionMissing"))
    );
    assert_eq!(st.fields.traffic, before);
}

#[test]
fn not_owned_ingress_is_false_and_times_are_kept() {
    let net = NetworkConfig::default();
    let r = route("hello").with_revision("hello-00001", 100).build();
    let refs = refs(vec![], vec![revision("hello-00001").ready().build()]);
    let t = traffic::resolve(&r, &refs);
    let st = compute_status(
        &r,
        &t,
        &Ingress::NotOwned(
            "There is an existing VirtualService \"hello-ingress\" that we do not own.".into(),
        ),
        Some(&NO_TLS),
        &net,
        &now(),
    );
    assert_eq!(
        cond(&st.status, "IngressReady"),
        (ConditionStatus::False, Some("NotOwned"))
    );
    assert_eq!(cond(&st.status, "Ready").0, ConditionStatus::False);

    // A second computation with the same outcome changes nothing (no status write).
    let mut r2 = r.clone();
    let ok = compute_status(&r, &t, &Ingress::Programmed, Some(&NO_TLS), &net, &now());
    r2.status = Some(ok.clone());
    let later = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now() + std::time::Duration::from_secs(60),
    );
    assert_eq!(
        compute_status(&r2, &t, &Ingress::Programmed, Some(&NO_TLS), &net, &later),
        ok
    );
}

#[test]
fn only_changes_a_route_reads_re_queue_routes() {
    use futures::StreamExt;
    use kube::runtime::watcher::Event;
    let pending = revision("hello-00001").build();
    let mut scaled = pending.clone();
    scaled.status.get_or_insert_default().actual_replicas = Some(3);
    let ready = revision("hello-00001").ready().build();
    let events = vec![
        Ok(Event::Init),
        Ok(Event::InitApply(pending.clone())),
        Ok(Event::InitDone),
        Ok(Event::Apply(scaled)),
        Ok(Event::Apply(ready.clone())),
        Ok(Event::Apply(ready.clone())),
        Ok(Event::Delete(ready)),
    ];
    let passed: Vec<Revision> = futures::executor::block_on(
        relevant_changes(futures::stream::iter(events), revision_relevance)
            .map(Result::unwrap)
            .collect(),
    );
    let ready_of = |r: &Revision| traffic::revision_ready(r);
    assert_eq!(
        passed.iter().map(ready_of).collect::<Vec<_>>(),
        [false, true, true],
        "the first sight, the turn to Ready, the deletion"
    );
}

#[test]
fn an_invalid_route_is_false_invalid_spec() {
    let net = NetworkConfig::default();
    let r = route("hello").with_revision("hello-00001", 90).build();
    let errors = crate::knative::validate::route(&r);
    assert!(!errors.is_empty());
    let e = Err(TargetError::Invalid(crate::knative::validate::render(
        &errors,
    )));
    let st = compute_status(&r, &e, &Ingress::Unchanged, Some(&NO_TLS), &net, &now());
    assert_eq!(
        cond(&st.status, "AllTrafficAssigned"),
        (ConditionStatus::False, Some("InvalidSpec"))
    );
    let ready = st.status.condition("Ready").unwrap();
    assert_eq!(ready.status, ConditionStatus::False);
    assert!(
        ready.message.as_deref().unwrap().contains("spec.traffic"),
        "{ready:?}"
    );
}

#[test]
fn probing_is_unknown_and_a_missing_crd_is_false_naming_it() {
    let net = NetworkConfig::default();
    let r = route("hello").with_revision("hello-00001", 100).build();
    let t = traffic::resolve(
        &r,
        &refs(vec![], vec![revision("hello-00001").ready().build()]),
    );
    let st = compute_status(
        &r,
        &t,
        &Ingress::Probing("pod x".into()),
        Some(&NO_TLS),
        &net,
        &now(),
    );
    assert_eq!(
        cond(&st.status, "IngressReady"),
        (ConditionStatus::Unknown, Some("Uninitialized"))
    );
    assert_eq!(
        st.status
            .condition("IngressReady")
            .unwrap()
            .message
            .as_deref(),
        Some("pod x")
    );
    assert_eq!(cond(&st.status, "Ready").0, ConditionStatus::Unknown);

    let st = compute_status(&r, &t, &Ingress::NotServed, Some(&NO_TLS), &net, &now());
    assert_eq!(
        cond(&st.status, "IngressReady"),
        (ConditionStatus::False, Some(VIRTUAL_SERVICE_NOT_SERVED))
    );
    let msg = st
        .status
        .condition("IngressReady")
        .unwrap()
        .message
        .clone()
        .unwrap();
    assert!(
        msg.contains(VIRTUAL_SERVICE_CRD) && msg.contains(ISTIO_INGRESS_CLASS),
        "{msg}"
    );
    assert_eq!(cond(&st.status, "Ready").0, ConditionStatus::False);
    assert_eq!(
        cond(&st.status, "AllTrafficAssigned").0,
        ConditionStatus::True
    );
}

#[test]
fn a_404_on_the_list_or_watch_is_not_served() {
    let status = |code| {
        Box::new(kube::core::Status {
            code,
            ..kube::core::Status::default()
        })
    };
    assert!(not_served(&watcher::Error::InitialListFailed(
        kube::Error::Api(status(404))
    )));
    assert!(not_served(&watcher::Error::WatchError(status(404))));
    assert!(!not_served(&watcher::Error::InitialListFailed(
        kube::Error::Api(status(500))
    )));
    assert!(!not_served(&watcher::Error::NoResourceVersion));
}

#[test]
fn a_route_probed_before_with_the_same_hash_stays_ready_for_a_new_leader() {
    let net = NetworkConfig::default();
    let r = route("hello").with_revision("hello-00001", 100).build();
    let t = traffic::resolve(
        &r,
        &refs(vec![], vec![revision("hello-00001").ready().build()]),
    );
    assert!(!probed_before(&r, "h1"), "never probed");
    // The prober of one leader saw every gateway pod answer with h1.
    let probed = compute_status(
        &r,
        &t,
        &Ingress::Probed("h1".into()),
        Some(&NO_TLS),
        &net,
        &now(),
    );
    assert_eq!(
        cond(&probed.status, "IngressReady").0,
        ConditionStatus::True
    );
    assert_eq!(probed.status.annotations[PROBED_HASH_ANNOTATION], "h1");
    let mut r2 = r.clone();
    r2.status = Some(probed.clone());
    // The next leader, its prober cold, finds the same hash: nothing to probe, nothing to
    // write.
    assert!(probed_before(&r2, "h1"));
    assert_eq!(
        compute_status(
            &r2,
            &t,
            &Ingress::Probed("h1".into()),
            Some(&NO_TLS),
            &net,
            &now()
        ),
        probed
    );
    // Another hash (the VirtualServices changed) is probed again.
    assert!(!probed_before(&r2, "h2"));
    // A route not Ready at its hash (probing a change) is probed again too.
    let probing = compute_status(
        &r2,
        &t,
        &Ingress::Probing("waiting".into()),
        Some(&NO_TLS),
        &net,
        &now(),
    );
    r2.status = Some(probing);
    assert!(!probed_before(&r2, "h1"));
}
