use super::*;

/// A Route with one default group over `hosts` splitting `split`, routing those revisions.
fn route(ns: &str, name: &str, hosts: &[&str], split: &[(&str, u32)]) -> RouteInput {
    RouteInput {
        namespace: ns.into(),
        name: name.into(),
        groups: vec![GroupInput {
            tag: None,
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            split: split.iter().map(|(r, p)| (r.to_string(), *p)).collect(),
        }],
        revisions: split.iter().map(|(r, _)| r.to_string()).collect(),
    }
}

/// `route`, plus a tag group `tag` over `hosts` routing `rev`.
fn with_tag(mut r: RouteInput, tag: &str, hosts: &[&str], rev: &str) -> RouteInput {
    r.groups.push(GroupInput {
        tag: Some(tag.into()),
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        split: vec![(rev.into(), 100)],
    });
    if !r.revisions.iter().any(|x| x == rev) {
        r.revisions.push(rev.into());
    }
    r
}

const GRACE: Duration = Duration::from_secs(60);

/// What `host` draws with `roll`, as `namespace/name`.
fn picked(book: &RouteBook, host: &str, roll: u32) -> Option<String> {
    book.pick(
        host,
        |total| roll.min(total - 1),
        |ns, n| format!("{ns}/{n}"),
    )
}

#[test]
fn a_host_reaches_only_its_routes_revisions_in_its_namespace() {
    let book = RouteBook::default();
    let t0 = Instant::now();
    book.set(
        route(
            "team-a",
            "web",
            &["web.team-a.example.com", "web.team-a"],
            &[("web-1", 100)],
        ),
        t0,
        GRACE,
    );
    book.set(
        route("team-b", "db", &["db.team-b.example.com"], &[("db-1", 100)]),
        t0,
        GRACE,
    );
    let at = || (t0, GRACE);
    let a = RevisionKey::new("team-a", "web-1");
    let b = RevisionKey::new("team-b", "db-1");
    assert!(book.allows("web.team-a.example.com", &a, at));
    assert!(book.allows("WEB.team-a.example.com:80", &a, at));
    assert!(book.allows("web.team-a", &a, at));
    assert!(!book.allows("web.team-a.example.com", &b, at));
    assert!(!book.allows(
        "web.team-a.example.com",
        &RevisionKey::new("team-a", "other"),
        at
    ));
    assert!(!book.allows("nobody.example.com", &a, at));
}

#[test]
fn an_unrouted_revision_is_served_within_the_grace_then_dropped() {
    let book = RouteBook::default();
    let t0 = Instant::now();
    book.set(route("ns", "r", &["r.ns"], &[("r-1", 100)]), t0, GRACE);
    book.set(route("ns", "r", &["r.ns"], &[("r-2", 100)]), t0, GRACE);
    let old = RevisionKey::new("ns", "r-1");
    let within = t0 + GRACE - Duration::from_millis(1);
    assert!(book.allows("r.ns", &old, || (within, GRACE)));
    assert!(!book.allows("r.ns", &old, || (t0 + GRACE, GRACE)));
    // The grace is read at each request: a shorter one applies at once.
    assert!(!book.allows("r.ns", &old, || (
        t0 + Duration::from_secs(2),
        Duration::from_secs(1)
    )));
    // The host draws from the Route's split now, never a revision in its grace.
    assert_eq!(picked(&book, "r.ns", 0).as_deref(), Some("ns/r-2"));
    book.prune(t0 + GRACE, GRACE);
    let table = book.table.load();
    assert_eq!(
        &*table.get("r.ns").unwrap().entry.revisions,
        &[("r-2".into(), None)]
    );
    drop(table);
    // A deleted route keeps its revisions and split for the grace, then leaves the book.
    book.delete("ns", "r", t0 + GRACE, GRACE);
    let new = RevisionKey::new("ns", "r-2");
    assert!(book.allows("r.ns", &new, || (t0 + GRACE, GRACE)));
    assert_eq!(picked(&book, "r.ns", 0).as_deref(), Some("ns/r-2"));
    book.prune(t0 + GRACE * 2, GRACE);
    assert!(book.is_empty());
    assert!(book.table.load().is_empty());
    assert_eq!(picked(&book, "r.ns", 0), None);
}

#[test]
fn a_relist_deletes_what_it_no_longer_lists_and_hosts_follow_their_route() {
    let book = RouteBook::default();
    let t0 = Instant::now();
    book.set(
        route("ns", "a", &["a.ns", "old.ns"], &[("a-1", 100)]),
        t0,
        GRACE,
    );
    book.set(route("ns", "b", &["b.ns"], &[("b-1", 100)]), t0, GRACE);
    book.replace_all(
        vec![route("ns", "a", &["a.ns"], &[("a-1", 100)])],
        t0,
        GRACE,
    );
    let table = book.table.load();
    assert!(table.get("old.ns").is_none(), "a host the route dropped");
    assert!(table.get("b.ns").is_some(), "a deleted route in its grace");
    drop(table);
    book.prune(t0 + GRACE, GRACE);
    assert!(book.table.load().get("b.ns").is_none());
    assert_eq!(book.len(), 1);
}

/// A host routes by its group: the default host draws from the split by percent (each
/// revision its share of the rolls), a tag's host gets its tag's revision.
#[test]
fn hosts_draw_from_their_groups_split() {
    let book = RouteBook::default();
    let t0 = Instant::now();
    let r = with_tag(
        route(
            "ns",
            "web",
            &["web.ns.example.com", "web.ns"],
            &[("web-1", 20), ("web-2", 80), ("web-3", 0)],
        ),
        "old",
        &["old-web.ns.example.com"],
        "web-1",
    );
    book.set(r, t0, GRACE);
    let rolls: Vec<String> = (0..100)
        .map(|roll| picked(&book, "web.ns", roll).unwrap())
        .collect();
    assert_eq!(rolls.iter().filter(|r| *r == "ns/web-1").count(), 20);
    assert_eq!(rolls.iter().filter(|r| *r == "ns/web-2").count(), 80);
    // A tag's host, whatever the roll (and no roll is drawn for one target).
    let tagged = book.pick(
        "OLD-web.ns.example.com:8080",
        |_| unreachable!(),
        |ns, n| format!("{ns}/{n}"),
    );
    assert_eq!(tagged.as_deref(), Some("ns/web-1"));
    // A 0 % target is routed (its tag or a gateway may name it) but never drawn.
    assert!(book.allows("web.ns", &RevisionKey::new("ns", "web-3"), || (t0, GRACE)));
    assert_eq!(picked(&book, "nobody.ns", 0), None);
}

/// Two Routes claiming one host: a tag's claim first, then the Route first by namespace and
/// name, whichever was set last; the other claim takes over when the first goes.
#[test]
fn a_tag_host_comes_first_and_claims_do_not_depend_on_order() {
    let t0 = Instant::now();
    let tagged = with_tag(
        route("ns", "web", &["web.ns"], &[("web-2", 100)]),
        "old",
        &["old-web.ns"],
        "web-1",
    );
    let plain = route("ns", "old-web", &["old-web.ns"], &[("other-1", 100)]);
    for order in [[&tagged, &plain], [&plain, &tagged]] {
        let book = RouteBook::default();
        for r in order {
            book.set(r.clone(), t0, GRACE);
        }
        assert_eq!(picked(&book, "old-web.ns", 0).as_deref(), Some("ns/web-1"));
        book.delete("ns", "web", t0, GRACE);
        book.prune(t0 + GRACE, GRACE);
        assert_eq!(
            picked(&book, "old-web.ns", 0).as_deref(),
            Some("ns/other-1")
        );
    }
    // Two default claims across namespaces: the first by namespace, in either order.
    let a = route("team-a", "web", &["web.example.com"], &[("a-1", 100)]);
    let b = route("team-b", "web", &["web.example.com"], &[("b-1", 100)]);
    for order in [[&a, &b], [&b, &a]] {
        let book = RouteBook::default();
        for r in order {
            book.set(r.clone(), t0, GRACE);
        }
        assert_eq!(
            picked(&book, "web.example.com", 0).as_deref(),
            Some("team-a/a-1")
        );
        assert!(!book.allows(
            "web.example.com",
            &RevisionKey::new("team-b", "b-1"),
            || (t0, GRACE)
        ));
    }
}

#[tokio::test(start_paused = true)]
async fn subscribers_see_each_change() {
    let book = Arc::new(RouteBook::default());
    let mut rx = book.subscribe();
    let writer = book.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        writer.set(
            route("ns", "r", &["r.ns"], &[("r-2", 100)]),
            Instant::now(),
            GRACE,
        );
    });
    rx.changed().await.unwrap();
    assert!(book.allows("r.ns", &RevisionKey::new("ns", "r-2"), || {
        (Instant::now(), GRACE)
    }));
}

#[test]
fn gateway_peers_are_matched_canonically() {
    let g = GatewayPeers::default();
    assert!(!g.contains("10.0.0.1".parse().unwrap()));
    g.set(["10.0.0.2".parse().unwrap(), "10.0.0.1".parse().unwrap()]);
    assert!(g.contains("10.0.0.1".parse().unwrap()));
    assert!(g.contains("::ffff:10.0.0.2".parse().unwrap()));
    assert!(!g.contains("10.0.0.3".parse().unwrap()));
}
