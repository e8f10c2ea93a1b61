//! `trellis run --leader-elect` against the real control plane, with two
//! `trellis` processes on the same rules and namespace (what two replicas
//! of the Deployment are): exactly one holds the Lease and writes; the
//! standby writes nothing (children's and parents' resourceVersions, Events
//! and both processes' write counters say so, not the logs); the standby
//! takes over when the leader is killed, paused or terminated, and
//! reconciles what was created meanwhile; a leader whose Lease is taken
//! stops writing at once, not at its next renewal. Without leader election both
//! processes write: measured, for contrast.
//!
//! Processes, not in-process operators: a leader must be killable with
//! SIGKILL, stoppable with SIGSTOP and terminated with SIGTERM.
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::json;

use support::TestNamespace;
use support::operator::{QUIET, TestKind, WAIT, config_data, install_kind, wait_data};
use support::process::{FAST, RULE, Replica};

/// The rules directory, a parent kind, and the cleanup guard.
async fn setup(ns: &TestNamespace) -> (tempfile::TempDir, TestKind, support::operator::Cleanup) {
    let (kind, cleanup) = install_kind(ns, "App").await;
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("rules")).expect("rules dir");
    std::fs::write(dir.path().join("rules/app.yaml"), kind.rule(RULE)).expect("rule file");
    (dir, kind, cleanup)
}

async fn holder(ns: &TestNamespace) -> Option<String> {
    let leases: Api<Lease> = ns.api();
    leases
        .get_opt("trellis")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
}

/// Waits until the Lease names `identity`; how long that took.
async fn wait_holder(ns: &TestNamespace, identity: &str, timeout: Duration) -> Duration {
    let started = Instant::now();
    support::eventually(&format!("Lease held by {identity}"), timeout, || async {
        match holder(ns).await {
            Some(h) if h == identity => Ok(()),
            other => Err(other),
        }
    })
    .await;
    started.elapsed()
}

/// Children and parents by name → resourceVersion: any write moves one.
async fn versions(ns: &TestNamespace, kind: &TestKind) -> BTreeMap<String, String> {
    let cms: Api<ConfigMap> = ns.api();
    let children = cms
        .list(&ListParams::default().labels("trellis.dev/rule=app"))
        .await
        .expect("list children");
    let parents = kind
        .api(ns)
        .list(&ListParams::default())
        .await
        .expect("list parents");
    let child_rvs = children.items.iter().map(|c| {
        (
            format!("ConfigMap/{}", c.name_any()),
            c.resource_version().unwrap_or_default(),
        )
    });
    let parent_rvs = parents.items.iter().map(|p: &DynamicObject| {
        (
            format!("App/{}", p.name_any()),
            p.resource_version().unwrap_or_default(),
        )
    });
    child_rvs.chain(parent_rvs).collect()
}

/// [`versions`] once they hold still for a second: the leader is done.
async fn settled_versions(ns: &TestNamespace, kind: &TestKind) -> BTreeMap<String, String> {
    let started = Instant::now();
    let mut last = versions(ns, kind).await;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = versions(ns, kind).await;
        if now == last {
            return now;
        }
        assert!(started.elapsed() < WAIT, "objects keep changing: {now:?}");
        last = now;
    }
}

async fn event_count(ns: &TestNamespace) -> usize {
    let events: Api<Event> = ns.api();
    events
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .len()
}

/// Creates parents `names` and waits until each has its child with `v`.
async fn create_converged(ns: &TestNamespace, kind: &TestKind, names: &[&str], v: &str) {
    for name in names {
        kind.create(ns, name, json!({"v": v}), &[]).await;
    }
    let cms: Api<ConfigMap> = ns.api();
    for name in names {
        wait_data(&cms, &format!("{name}-config"), "the child", "v", v).await;
    }
    // And their status.
    for name in names {
        support::eventually(&format!("{name} status.v"), WAIT, || async {
            let p = kind.api(ns).get(name).await.map_err(|e| e.to_string())?;
            if p.data["status"]["v"] == v {
                Ok(())
            } else {
                Err(p.data["status"].to_string())
            }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_holds_the_lease_and_the_standby_writes_nothing() {
    let ns = support::namespace().await;
    let (dir, kind, _cleanup) = setup(&ns).await;
    let a = Replica::start("replica-a", &ns, dir.path(), &["--leader-elect"]);
    a.wait_role(true).await;
    let a_id = a.identity().await;
    assert!(
        a_id.starts_with("replica-a_"),
        "identity is the Pod name and a suffix: {a_id}"
    );
    // Parents that exist before the standby starts: without leader election
    // its first pass would write every one of them.
    create_converged(&ns, &kind, &["p1", "p2", "p3"], "one").await;
    let before = settled_versions(&ns, &kind).await;
    let events = event_count(&ns).await;

    let b = Replica::start("replica-b", &ns, dir.path(), &["--leader-elect"]);
    let b_status = b.wait_role(false).await;
    assert_eq!(b_status["leader"]["holder"], a_id.as_str(), "{b_status}");
    assert_eq!(holder(&ns).await.as_deref(), Some(a_id.as_str()));
    let readyz = support::http_get(b.addr, "/readyz")
        .await
        .expect("standby /readyz is 200");
    assert!(
        readyz.contains("standby") && readyz.contains(&a_id),
        "{readyz}"
    );
    let gauge = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("trellis_leader "))
            .map(str::to_owned)
    };
    let a_metrics = support::http_get(a.addr, "/metrics")
        .await
        .expect("metrics");
    let b_metrics = support::http_get(b.addr, "/metrics")
        .await
        .expect("metrics");
    assert_eq!(gauge(&a_metrics).as_deref(), Some("trellis_leader 1"));
    assert_eq!(gauge(&b_metrics).as_deref(), Some("trellis_leader 0"));

    tokio::time::sleep(QUIET).await;
    assert_eq!(
        versions(&ns, &kind).await,
        before,
        "nothing was written while the standby started"
    );
    assert_eq!(event_count(&ns).await, events, "no Event either");

    // Edits and a new parent: the leader writes, the standby still does not.
    let a_writes = a.writes().await;
    kind.patch(&ns, "p1", json!({"spec": {"v": "two"}})).await;
    create_converged(&ns, &kind, &["p4"], "one").await;
    let cms: Api<ConfigMap> = ns.api();
    wait_data(&cms, "p1-config", "the edit applied", "v", "two").await;
    tokio::time::sleep(QUIET).await;
    assert!(a.writes().await > a_writes, "the leader wrote the edits");
    assert_eq!(
        b.writes().await,
        0,
        "the standby never wrote:\n{}",
        b.log_tail()
    );
    // One field manager on the children: trellis's; the standby added none.
    let cm = cms.get("p1-config").await.expect("child");
    let managers: Vec<String> = cm
        .managed_fields()
        .iter()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert_eq!(managers, ["trellis/app"], "{managers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_and_the_successor_reconciles_what_was_created_meanwhile() {
    let ns = support::namespace().await;
    let (dir, kind, _cleanup) = setup(&ns).await;
    // Default timings: 15 s lease, 10 s renew deadline, 2 s retry.
    let mut a = Replica::start("replica-a", &ns, dir.path(), &["--leader-elect"]);
    a.wait_role(true).await;
    let existing = ["p1", "p2", "p3", "p4", "p5"];
    create_converged(&ns, &kind, &existing, "one").await;
    let b = Replica::start("replica-b", &ns, dir.path(), &["--leader-elect"]);
    b.wait_role(false).await;
    let b_id = b.identity().await;
    let before = settled_versions(&ns, &kind).await;
    let cms: Api<ConfigMap> = ns.api();
    let uids = |list: Vec<ConfigMap>| -> BTreeMap<String, Option<String>> {
        list.into_iter().map(|c| (c.name_any(), c.uid())).collect()
    };
    let params = ListParams::default().labels("trellis.dev/rule=app");
    let old_uids = uids(cms.list(&params).await.expect("children").items);

    a.signal("-KILL");
    let killed = Instant::now();
    a.exited(Duration::from_secs(5)).await;
    kind.create(&ns, "fresh", json!({"v": "new"}), &[]).await;
    let lease_gap = wait_holder(&ns, &b_id, Duration::from_secs(30)).await;
    wait_data(
        &cms,
        "fresh-config",
        "the successor to reconcile the new parent",
        "v",
        "new",
    )
    .await;
    let child_gap = killed.elapsed();
    b.wait_role(true).await;
    let after = settled_versions(&ns, &kind).await;
    let b_writes = b.writes().await;
    eprintln!(
        "[leader] after SIGKILL of the leader (15 s lease): Lease taken over in {:.1} s, \
         a parent created meanwhile got its child {:.1} s after the kill; the successor sent \
         {b_writes} writes for {} existing parents and the new one",
        lease_gap.as_secs_f64(),
        child_gap.as_secs_f64(),
        existing.len()
    );
    assert!(
        child_gap < Duration::from_secs(25),
        "takeover took {child_gap:?}"
    );
    assert!(
        lease_gap > Duration::from_secs(5),
        "a killed leader's Lease is only taken once it expires ({lease_gap:?})"
    );
    // What existed is as it was: not re-created, not changed.
    let new_uids = uids(cms.list(&params).await.expect("children").items);
    for (name, uid) in &old_uids {
        assert_eq!(new_uids.get(name), Some(uid), "{name} was re-created");
    }
    for (key, rv) in &before {
        assert_eq!(after.get(key), Some(rv), "{key} changed on takeover");
    }
    // Unchanged resourceVersions would hide no-op applies: the successor's
    // own counters say it sent none. Its only writes are the new parent's
    // child and status.
    let addr = b.addr.to_string();
    let op = |op: &'static str| {
        let addr = addr.clone();
        async move {
            support::faults::metric(
                &addr,
                "trellis_child_operations",
                &[&format!("op=\"{op}\"")],
            )
            .await
        }
    };
    let status_writes = support::faults::metric(&addr, "trellis_status_writes", &[]).await;
    assert_eq!(
        (
            op("create").await,
            op("update").await,
            op("delete").await,
            status_writes
        ),
        (1.0, 0.0, 0.0, 1.0),
        "the successor's (creates, updates, deletes, status writes): only the new parent's \
         child and status\n{}",
        b.log_tail()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_the_lease_and_the_successor_takes_over_at_once() {
    let ns = support::namespace().await;
    let (dir, kind, _cleanup) = setup(&ns).await;
    let mut a = Replica::start("replica-a", &ns, dir.path(), &["--leader-elect"]);
    a.wait_role(true).await;
    let b = Replica::start("replica-b", &ns, dir.path(), &["--leader-elect"]);
    b.wait_role(false).await;
    let b_id = b.identity().await;
    // Let the standby's lease client settle into its wait for expiry.
    tokio::time::sleep(Duration::from_secs(3)).await;

    a.signal("-TERM");
    let termed = Instant::now();
    wait_holder(&ns, &b_id, Duration::from_secs(20)).await;
    let lease_gap = termed.elapsed();
    kind.create(&ns, "p1", json!({"v": "after"}), &[]).await;
    let cms: Api<ConfigMap> = ns.api();
    wait_data(
        &cms,
        "p1-config",
        "the successor to reconcile the new parent",
        "v",
        "after",
    )
    .await;
    let child_gap = termed.elapsed();
    let status = a.exited(Duration::from_secs(10)).await;
    eprintln!(
        "[leader] after SIGTERM of the leader: Lease taken over in {:.2} s, \
         a parent created then got its child {:.2} s after the signal",
        lease_gap.as_secs_f64(),
        child_gap.as_secs_f64()
    );
    assert!(
        status.success(),
        "SIGTERM exits cleanly: {status}\n{}",
        a.log_tail()
    );
    assert!(
        lease_gap < Duration::from_secs(4),
        "a released Lease is taken at once, not after it expires ({lease_gap:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lease_is_taken_stops_writing_at_once_and_resumes_when_it_retakes_it() {
    let ns = support::namespace().await;
    let (dir, kind, _cleanup) = setup(&ns).await;
    let a = Replica::start(
        "replica-a",
        &ns,
        dir.path(),
        &[&["--leader-elect"], FAST].concat(),
    );
    a.wait_role(true).await;
    create_converged(&ns, &kind, &["p1"], "one").await;
    settled_versions(&ns, &kind).await;
    let a_writes = a.writes().await;

    // Someone else takes the Lease (as a replica that saw it expire would).
    let leases: Api<Lease> = ns.api();
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    let theft =
        json!({"spec": {"holderIdentity": "thief", "renewTime": now, "leaseDurationSeconds": 4}});
    leases
        .patch(
            "trellis",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&theft),
        )
        .await
        .expect("take the Lease");
    let taken = Instant::now();
    support::eventually("replica-a to stand by", WAIT, || async {
        let s = a.status().await?;
        if s["leader"]["leader"] == false {
            Ok(())
        } else {
            Err(s.to_string())
        }
    })
    .await;
    let stopped = taken.elapsed();
    eprintln!(
        "[leader] a leader whose Lease was taken stopped writing {:.0} ms later (renew deadline 3 s)",
        stopped.as_secs_f64() * 1000.0
    );
    assert!(stopped < Duration::from_millis(1500), "took {stopped:?}");

    // An edit while the thief holds the Lease is not written...
    kind.patch(&ns, "p1", json!({"spec": {"v": "two"}})).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cms: Api<ConfigMap> = ns.api();
    let cm = cms.get("p1-config").await.expect("child");
    // The thief's lease (4 s from the latest renewal) has not run out yet.
    assert_eq!(holder(&ns).await.as_deref(), Some("thief"));
    assert_eq!(
        config_data(&cm, "v").as_deref(),
        Some("one"),
        "written without the Lease"
    );
    assert_eq!(
        a.writes().await,
        a_writes,
        "wrote without the Lease:\n{}",
        a.log_tail()
    );
    // ...until the thief's lease expires and the replica takes it back.
    wait_data(
        &cms,
        "p1-config",
        "the edit after retaking the Lease",
        "v",
        "two",
    )
    .await;
    assert!(
        holder(&ns)
            .await
            .is_some_and(|h| h.starts_with("replica-a_"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lease_is_made_again_and_the_replica_leads_on() {
    let ns = support::namespace().await;
    let (dir, kind, _cleanup) = setup(&ns).await;
    let a = Replica::start(
        "replica-a",
        &ns,
        dir.path(),
        &[&["--leader-elect"], FAST].concat(),
    );
    a.wait_role(true).await;
    let a_id = a.identity().await;
    let leases: Api<Lease> = ns.api();
    leases
        .delete("trellis", &Default::default())
        .await
        .expect("delete the Lease");
    // It leads again: a second term, on a new Lease.
    wait_holder(&ns, &a_id, WAIT).await;
    support::eventually("a second term", WAIT, || async {
        let s = a.status().await?;
        if s["leader"]["leader"] == true && s["leader"]["terms"] == 2 {
            Ok(())
        } else {
            Err(s.to_string())
        }
    })
    .await;
    create_converged(&ns, &kind, &["p1"], "one").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_that_lost_the_lease_writes_nothing_when_it_resumes() {
    let ns = support::namespace().await;
    let (dir, kind, _cleanup) = setup(&ns).await;
    let a = Replica::start(
        "replica-a",
        &ns,
        dir.path(),
        &[&["--leader-elect"], FAST].concat(),
    );
    a.wait_role(true).await;
    create_converged(&ns, &kind, &["p1"], "one").await;
    let b = Replica::start(
        "replica-b",
        &ns,
        dir.path(),
        &[&["--leader-elect"], FAST].concat(),
    );
    b.wait_role(false).await;
    let b_id = b.identity().await;
    let a_writes = a.writes().await;

    // A stopped process: no renewal, no write, and no chance to notice.
    a.signal("-STOP");
    wait_holder(&ns, &b_id, Duration::from_secs(20)).await;
    kind.patch(&ns, "p1", json!({"spec": {"v": "two"}})).await;
    let cms: Api<ConfigMap> = ns.api();
    wait_data(&cms, "p1-config", "the edit applied", "v", "two").await;
    let before = versions(&ns, &kind).await;
    // It resumes with a parent edit waiting in its watch.
    kind.patch(
        &ns,
        "p1",
        json!({"metadata": {"labels": {"touched": "yes"}}}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before_labels = versions(&ns, &kind).await;
    a.signal("-CONT");
    a.wait_role(false).await;
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        a.writes().await,
        a_writes,
        "the resumed former leader wrote:\n{}",
        a.log_tail()
    );
    let cm = cms.get("p1-config").await.expect("child");
    assert_eq!(config_data(&cm, "v").as_deref(), Some("two"));
    assert_eq!(
        before.get("ConfigMap/p1-config"),
        versions(&ns, &kind).await.get("ConfigMap/p1-config"),
        "the child was not written again"
    );
    assert_eq!(versions(&ns, &kind).await, before_labels);
    assert_eq!(holder(&ns).await.as_deref(), Some(b_id.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_leader_election_both_processes_reconcile_and_every_edit_is_written() {
    let ns = support::namespace().await;
    let (dir, kind, _cleanup) = setup(&ns).await;
    let names: Vec<String> = (0..10).map(|i| format!("p{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let a = Replica::start("replica-a", &ns, dir.path(), &[]);
    support::eventually("a running", WAIT, || async {
        let s = a.status().await?;
        if s["rules"]["app"]["state"] == "Running" {
            Ok(())
        } else {
            Err(s.to_string())
        }
    })
    .await;
    create_converged(&ns, &kind, &names, "one").await;
    let a_start = a.writes().await;
    let b = Replica::start("replica-b", &ns, dir.path(), &[]);
    support::eventually("b running", WAIT, || async {
        let s = b.status().await?;
        if s["rules"]["app"]["state"] == "Running" && s["leader"]["enabled"] == false {
            Ok(())
        } else {
            Err(s.to_string())
        }
    })
    .await;
    tokio::time::sleep(QUIET).await;
    let b_start = b.writes().await;
    for name in &names {
        kind.patch(&ns, name, json!({"spec": {"v": "two"}})).await;
    }
    let cms: Api<ConfigMap> = ns.api();
    for name in &names {
        wait_data(
            &cms,
            &format!("{name}-config"),
            "the edit applied",
            "v",
            "two",
        )
        .await;
    }
    tokio::time::sleep(QUIET).await;
    let (a_edit, b_edit) = (a.writes().await - a_start, b.writes().await - b_start);
    eprintln!(
        "[leader] without --leader-elect, {} parents: the second process wrote {b_start} times \
         on starting; one edit of each parent: {a_edit} writes by the first, {b_edit} by the second",
        names.len()
    );
    // Who writes an edit is a race (whoever sees its own cache stale writes);
    // the measured split is the figure. A second process that finds the
    // children as the first left them writes nothing on starting.
    assert!(
        a_edit + b_edit >= names.len() as u64,
        "the edits were written: {a_edit} + {b_edit}"
    );
}
