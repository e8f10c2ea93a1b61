//! `trellis run --leader-elect --shards` against the real control plane, with
//! three (then four) `trellis` processes on the same rules and namespace:
//! the replicas' buckets are disjoint and cover all 256; an edit of every
//! parent costs one child write and one status write per parent, each sent
//! by the replica that owns the parent's bucket; a SIGKILLed replica's
//! buckets are taken over once its member Lease has expired; a joining
//! replica takes its share with no parent written twice; SIGTERM hands a
//! replica's buckets over in seconds. Each replica lists only its own
//! buckets' parents (by the `trellis.dev/bucket` label the leader writes
//! once on each parent), through every one of those changes.
//!
//! Who wrote what is read from the API server's audit log, not from the
//! replicas: each replica runs with a kubeconfig impersonating a user of its
//! own, so every write is attributed by the server (and cross-checked with
//! each process's `trellis_child_operations_total`). Processes, not
//! in-process operators: SIGKILL and SIGTERM need them.
mod support;

#[path = "shards/ring.rs"]
mod ring;

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::Value;

use ring::*;
use support::audit;
use support::operator::QUIET;
use support::process::Replica;

#[test]
fn shards_without_leader_election_is_a_usage_error_naming_both_flags() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(["run", "--rules"])
        .arg(dir.path())
        .arg("--shards")
        .env("KUBECONFIG", dir.path().join("no-such-kubeconfig"))
        .output()
        .expect("run trellis");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "a usage error: {stderr}");
    assert!(
        stderr.contains("--shards") && stderr.contains("--leader-elect"),
        "the error names both flags: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_own_disjoint_buckets_that_cover_all_256() {
    let ring = Ring::new("ring-cover", &[]).await;
    let (a, b, c) = (ring.start("a"), ring.start("b"), ring.start("c"));
    let replicas = [&a, &b, &c];
    let shards = settled(&replicas).await;
    eprintln!(
        "[shards] 3 replicas settled at generation {}: {:?} buckets",
        shards[0].generation,
        shards.iter().map(|s| s.buckets.len()).collect::<Vec<_>>()
    );
    let generation = shards[0].generation;
    for (r, s) in replicas.iter().zip(&shards) {
        // Rendezvous hashing spreads 256 buckets evenly enough: none starves.
        assert!(
            s.buckets.len() >= 40,
            "{}: only {} buckets",
            r.name,
            s.buckets.len()
        );
        assert_eq!(
            s.member,
            r.identity().await,
            "{}: member is the identity",
            r.name
        );
        let addr = r.addr.to_string();
        let gauge = |name: &'static str| {
            let addr = addr.clone();
            async move { support::faults::metric(&addr, name, &[]).await as u64 }
        };
        assert_eq!(
            gauge("trellis_shard_buckets").await,
            s.buckets.len() as u64,
            "{}",
            r.name
        );
        assert_eq!(gauge("trellis_shard_members").await, 3, "{}", r.name);
        assert_eq!(
            gauge("trellis_shard_generation").await,
            generation,
            "{}",
            r.name
        );
    }
    // The member Leases and the published assignment say the same.
    let leases: Api<Lease> = ring.ns.api();
    let members = leases
        .list(&ListParams::default().labels(&format!("trellis.dev/ring={}", ring.lease)))
        .await
        .expect("member Leases");
    let mut identities = BTreeSet::new();
    for lease in &members.items {
        let holder = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default();
        let want = format!(
            "{}-member-{}",
            ring.lease,
            holder.to_lowercase().replace('_', "-")
        );
        assert_eq!(lease.name_any(), want, "member Lease name");
        assert_eq!(
            lease
                .annotations()
                .get("trellis.dev/shard-ack")
                .map(String::as_str),
            Some(generation.to_string().as_str()),
            "{} acknowledged the generation",
            lease.name_any()
        );
        identities.insert(holder);
    }
    let want: BTreeSet<String> = shards.iter().map(|s| s.member.clone()).collect();
    assert_eq!(identities, want, "one member Lease per replica");
    let leader = leases.get(&ring.lease).await.expect("the leader's Lease");
    let assignment: Value = serde_json::from_str(
        leader
            .annotations()
            .get("trellis.dev/shard-assignment")
            .expect("the assignment on the leader's Lease"),
    )
    .expect("the assignment is JSON");
    assert_eq!(assignment["generation"], generation);
    let published: BTreeSet<String> = assignment["members"]
        .as_array()
        .expect("members")
        .iter()
        .filter_map(|m| Some(m.as_str()?.to_owned()))
        .collect();
    assert_eq!(published, want, "the published members");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_of_every_parent_costs_one_child_write_each_sent_by_its_buckets_owner() {
    let ring = Ring::new("ring-edit", &[]).await;
    let (a, b, c) = (ring.start("a"), ring.start("b"), ring.start("c"));
    let replicas = [&a, &b, &c];
    let shards = settled(&replicas).await;
    let owners = owners(&replicas, &shards);
    let names = parent_names(60);
    let created = audit::offset();
    ring.create(&names, "one").await;
    ring.converged(&names, "one").await;
    let buckets = ring.buckets().await;
    let creates = writes_by_parent(&settled_writes(created, ring.ns.name()).await, &ring.kind);
    // Creation: each child and status written by its owner (a status may be
    // written twice: Ready then ready-and-synced; a child only once).
    for name in &names {
        let owner = &owners[&buckets[name]];
        for what in ["child", "status"] {
            let writers = &creates[&(name.clone(), what)];
            assert!(
                writers.iter().all(|w| w == owner),
                "{name} {what}: {writers:?}, owner {owner}"
            );
        }
        assert_eq!(
            creates[&(name.clone(), "child")].len(),
            1,
            "{name}'s child created once"
        );
    }
    tokio::time::sleep(QUIET).await;
    let before: Vec<u64> = child_write_counts(&replicas).await;

    let edited = audit::offset();
    let started = Instant::now();
    ring.edit(&names, "two").await;
    ring.converged(&names, "two").await;
    let took = started.elapsed();
    tokio::time::sleep(QUIET).await;
    let writes = settled_writes(edited, ring.ns.name()).await;
    assert_one_write_each(&writes, &ring.kind, &names, &buckets, Some(&owners));

    // Each process's own counter: exactly its share.
    let after = child_write_counts(&replicas).await;
    let mut split = Vec::new();
    for (i, r) in replicas.iter().enumerate() {
        let share = names
            .iter()
            .filter(|n| owners[&buckets[*n]] == r.name)
            .count() as u64;
        let wrote = after[i] - before[i];
        split.push(format!("{}: {wrote} of {share}", r.name));
        assert_eq!(
            wrote, share,
            "{} counted {wrote} child writes, owns {share} parents",
            r.name
        );
    }
    assert_eq!(
        after.iter().sum::<u64>() - before.iter().sum::<u64>(),
        names.len() as u64
    );
    eprintln!(
        "[shards] edit of {} parents over 3 replicas converged in {:.2} s; child writes per replica {split:?}",
        names.len(),
        took.as_secs_f64()
    );
    // Nothing moved meanwhile.
    assert_eq!(
        settled(&replicas).await,
        shards,
        "the assignment changed during the test"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_replica_caches_only_its_buckets_parents_which_the_leader_labels_once() {
    let ring = Ring::new("ring-own", &[]).await;
    let (a, b, c) = (ring.start("a"), ring.start("b"), ring.start("c"));
    let replicas = [&a, &b, &c];
    let shards = settled(&replicas).await;
    let leader = &shards[shards.iter().position(|s| s.leader).expect("a leader")];
    let leader_name = replicas[shards.iter().position(|s| s.leader).unwrap()]
        .name
        .clone();
    let mut names = parent_names(60);
    let offset = audit::offset();
    ring.create(&names, "one").await;
    // A copied manifest: a bucket label that is some other uid's (unless,
    // one time in 256, it happens to be right).
    let copied = "copied".to_owned();
    let mut obj = kube::api::DynamicObject::new(&copied, &ring.kind.resource)
        .within(ring.ns.name())
        .data(serde_json::json!({"spec": {"v": "one"}}));
    obj.metadata.labels = Some([("trellis.dev/bucket".to_owned(), "7".to_owned())].into());
    ring.kind
        .api(&ring.ns)
        .create(&Default::default(), &obj)
        .await
        .expect("create the copied parent");
    names.push(copied.clone());
    ring.converged(&names, "one").await;
    let buckets = ring.buckets().await;

    // Every parent carries its uid's bucket, and each replica holds
    // exactly its buckets' parents.
    let listed = ring
        .kind
        .api(&ring.ns)
        .list(&ListParams::default())
        .await
        .expect("list parents");
    for p in &listed.items {
        assert_eq!(
            p.labels().get("trellis.dev/bucket"),
            Some(&buckets[&p.name_any()].to_string()),
            "{} labelled with its bucket",
            p.name_any()
        );
    }
    own_parents_cached(&replicas, &buckets).await;

    // One label write per parent: the leader's for the unlabelled ones, the
    // copied one's by the replica its wrong label sent it to; one child
    // write each, by the owner.
    tokio::time::sleep(QUIET).await;
    let writes = settled_writes(offset, ring.ns.name()).await;
    let labels = parent_writes(&writes, &ring.kind);
    let owners = owners(&replicas, &shards);
    let children = writes_by_parent(&writes, &ring.kind);
    for name in &names {
        let writers = labels.get(name).cloned().unwrap_or_default();
        if *name == copied {
            assert!(writers.len() <= 1, "{name} relabelled {writers:?}");
        } else {
            assert_eq!(writers, vec![leader_name.clone()], "{name}: label writes");
        }
        assert_eq!(
            children.get(&(name.clone(), "child")),
            Some(&vec![owners[&buckets[name]].clone()]),
            "{name}: child written once, by its owner"
        );
    }
    eprintln!(
        "[shards] 61 parents labelled (leader {}: {} buckets), cached per replica: {:?}",
        leader.member,
        leader.buckets.len(),
        shards
            .iter()
            .map(|s| buckets.values().filter(|b| s.buckets.contains(b)).count())
            .collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_buckets_are_taken_over_once_its_lease_expires() {
    // The leader is the hardest to lose: the assignment itself must move too.
    let (first_orphan_write, took) = kill_and_take_over("ring-kill", FAST, Victim::Leader).await;
    // Its member Lease was renewed at most a retry period (1 s) before the
    // kill; nobody may write its buckets before that Lease has expired.
    assert!(
        first_orphan_write >= 3.0,
        "a killed replica's parent written {first_orphan_write:.1} s after the kill"
    );
    assert!(took < Duration::from_secs(30), "takeover took {took:?}");
}

/// With the default timings a member Lease is shorter than the leader's
/// (6 s / 4 s against 15 s / 10 s, same 2 s renewals): a killed replica
/// that is not the leader has its buckets moved after about two member
/// lease durations, and still not before its Lease has expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_default_timings_a_killed_members_buckets_move_once_its_shorter_member_lease_expires()
{
    let (first_orphan_write, took) =
        kill_and_take_over("ring-kill-default", &[], Victim::Member).await;
    // Renewed at most a retry period (2 s) before the kill, a 6 s Lease.
    assert!(
        first_orphan_write >= 4.0,
        "a killed replica's parent written {first_orphan_write:.1} s after the kill"
    );
    // Well inside the leader Lease's own two durations (30 s), which a
    // member Lease with the leader's timings would take.
    assert!(took < Duration::from_secs(25), "takeover took {took:?}");
}

enum Victim {
    Leader,
    Member,
}

/// Three replicas on 30 parents; `victim` is SIGKILLed and every parent
/// edited: each edit written once, by the survivors. Returns when the first
/// of the victim's parents was written after the kill (by the audit log,
/// seconds) and how long until every parent converged.
async fn kill_and_take_over(lease: &str, timings: &[&str], victim: Victim) -> (f64, Duration) {
    let ring = Ring::new(lease, timings).await;
    let mut all = vec![ring.start("a"), ring.start("b"), ring.start("c")];
    let shards = settled(&all.iter().collect::<Vec<_>>()).await;
    let names = parent_names(30);
    ring.create(&names, "one").await;
    ring.converged(&names, "one").await;
    let buckets = ring.buckets().await;
    let (leader, _) = leader_and_its_parents(&shards, &names, &buckets);
    let index = match victim {
        Victim::Leader => leader,
        Victim::Member => (leader + 1) % shards.len(),
    };
    let orphans: Vec<String> = names
        .iter()
        .filter(|n| shards[index].buckets.contains(&buckets[*n]))
        .cloned()
        .collect();
    assert!(
        !orphans.is_empty(),
        "the victim owns some of the 30 parents"
    );
    let mut killed = all.remove(index);
    tokio::time::sleep(QUIET).await;

    let offset = audit::offset();
    killed.signal("-KILL");
    let at = SystemTime::now();
    let started = Instant::now();
    killed.exited(Duration::from_secs(5)).await;
    ring.edit(&names, "two").await;
    ring.converged(&names, "two").await;
    let took = started.elapsed();
    let survivors: Vec<&Replica> = all.iter().collect();
    let after = settled(&survivors).await;
    own_parents_cached(&survivors, &buckets).await;
    let writes = settled_writes(offset, ring.ns.name()).await;
    assert_one_write_each(
        &writes,
        &ring.kind,
        &names,
        &buckets,
        Some(&owners(&survivors, &after)),
    );
    let first_orphan_write = writes
        .iter()
        .filter(|w| {
            w.resource == "configmaps"
                && orphans.contains(&w.name.trim_end_matches("-config").to_owned())
        })
        .map(|w| seconds_between(at, w.received))
        .fold(f64::MAX, f64::min);
    eprintln!(
        "[shards] SIGKILL of the {} (timings {timings:?}): its {} parents' edits written from {first_orphan_write:.1} s \
         after the kill, every parent converged in {:.1} s; survivors at generation {} with {:?} buckets",
        if index == leader { "leader" } else { "member" },
        orphans.len(),
        took.as_secs_f64(),
        after[0].generation,
        after.iter().map(|s| s.buckets.len()).collect::<Vec<_>>()
    );
    (first_orphan_write, took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_replica_takes_its_share_and_no_parent_is_written_twice() {
    let ring = Ring::new("ring-join", &[]).await;
    let (a, b, c) = (ring.start("a"), ring.start("b"), ring.start("c"));
    let three = settled(&[&a, &b, &c]).await;
    let names = parent_names(40);
    ring.create(&names, "one").await;
    ring.converged(&names, "one").await;
    let buckets = ring.buckets().await;
    tokio::time::sleep(QUIET).await;

    // The fourth joins while every parent is being edited, and new parents
    // are made (unlabelled) while buckets move.
    let offset = audit::offset();
    let d = ring.start("d");
    let fresh: Vec<String> = (0..20).map(|i| format!("n{i:03}")).collect();
    ring.edit(&names, "two").await;
    ring.create(&fresh, "one").await;
    ring.converged(&names, "two").await;
    ring.converged(&fresh, "one").await;
    let replicas = [&a, &b, &c, &d];
    let four = settled(&replicas).await;
    let writes = settled_writes(offset, ring.ns.name()).await;
    let is_fresh = |w: &support::audit::Write| fresh.iter().any(|f| w.name.starts_with(f.as_str()));
    let old: Vec<_> = writes.iter().filter(|w| !is_fresh(w)).cloned().collect();
    assert_one_write_each(&old, &ring.kind, &names, &buckets, None);
    // Each new parent: labelled once, its child written once, its status
    // by that same replica only: reconciled by one replica, once.
    let by_parent = writes_by_parent(&writes, &ring.kind);
    let labels = parent_writes(&writes, &ring.kind);
    for name in &fresh {
        let child = by_parent
            .get(&(name.clone(), "child"))
            .cloned()
            .unwrap_or_default();
        let status = by_parent
            .get(&(name.clone(), "status"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(child.len(), 1, "{name}: child written by {child:?}");
        assert!(
            !status.is_empty() && status.iter().all(|w| *w == child[0]),
            "{name}: child by {child:?}, status by {status:?}"
        );
        assert_eq!(
            labels.get(name).map(Vec::len),
            Some(1),
            "{name}: label writes {labels:?}"
        );
    }
    let mut buckets = buckets;
    buckets.extend(ring.buckets().await);
    own_parents_cached(&replicas, &buckets).await;
    // Rendezvous hashing: a joining member takes buckets, the others gain none.
    for (old, new) in three.iter().zip(&four) {
        assert!(
            new.buckets.is_subset(&old.buckets),
            "{} gained buckets: {:?} -> {:?}",
            old.member,
            old.buckets,
            new.buckets
        );
    }
    assert!(
        four[3].buckets.len() >= 30,
        "d took {} buckets",
        four[3].buckets.len()
    );

    // Settled: the next edit is written by the four owners, d its share.
    let before = child_write_counts(&replicas).await;
    let offset = audit::offset();
    let names: Vec<String> = names.into_iter().chain(fresh).collect();
    ring.edit(&names, "three").await;
    ring.converged(&names, "three").await;
    tokio::time::sleep(QUIET).await;
    let writes = settled_writes(offset, ring.ns.name()).await;
    let owners = owners(&replicas, &four);
    assert_one_write_each(&writes, &ring.kind, &names, &buckets, Some(&owners));
    let after = child_write_counts(&replicas).await;
    let d_share = names.iter().filter(|n| owners[&buckets[*n]] == "d").count() as u64;
    assert_eq!(after[3] - before[3], d_share, "d wrote its share");
    eprintln!(
        "[shards] a fourth replica joined mid-edit: {:?} buckets after, {d_share} of 60 parents now d's",
        four.iter().map(|s| s.buckets.len()).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_a_replicas_buckets_over_in_seconds() {
    // Default timings: a 15 s lease, which a handover must not wait for.
    let ring = Ring::new("ring-term", &[]).await;
    let mut all = vec![ring.start("a"), ring.start("b"), ring.start("c")];
    let shards = settled(&all.iter().collect::<Vec<_>>()).await;
    let names = parent_names(30);
    ring.create(&names, "one").await;
    ring.converged(&names, "one").await;
    let buckets = ring.buckets().await;
    let (victim, orphans) = leader_and_its_parents(&shards, &names, &buckets);
    let mut leaving = all.remove(victim);
    // Let the others settle into waiting on the leader's Lease.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let offset = audit::offset();
    leaving.signal("-TERM");
    let started = Instant::now();
    ring.edit(&orphans, "two").await;
    ring.converged(&orphans, "two").await;
    let took = started.elapsed();
    let status = leaving.exited(Duration::from_secs(10)).await;
    let survivors: Vec<&Replica> = all.iter().collect();
    settled(&survivors).await;
    own_parents_cached(&survivors, &buckets).await;
    let writes = settled_writes(offset, ring.ns.name()).await;
    // One write each; by a survivor, or by the leaving replica if the edit
    // reached it before it stopped.
    assert_one_write_each(&writes, &ring.kind, &orphans, &buckets, None);
    eprintln!(
        "[shards] SIGTERM of the leader (15 s leases): its {} parents' edits converged {:.2} s after the signal",
        orphans.len(),
        took.as_secs_f64()
    );
    assert!(
        status.success(),
        "SIGTERM exits cleanly: {status}\n{}",
        leaving.log_tail()
    );
    assert!(
        took < Duration::from_secs(6),
        "SIGTERM handover took {took:?} (lease: 15 s)"
    );
    let log = leaving.log_text();
    assert!(
        log.contains("shards: acknowledged generation"),
        "no acknowledgement logged:\n{}",
        leaving.log_tail()
    );
    assert!(
        survivors.iter().any(|r| r.log_text().contains("shards: generation") && r.log_text().contains("opened")),
        "no survivor logged opening buckets"
    );
    // Its member Lease is released (or already deleted by the leader).
    let leases: Api<Lease> = ring.ns.api();
    let member = format!(
        "{}-member-{}",
        ring.lease,
        shards[victim].member.to_lowercase().replace('_', "-")
    );
    let lease = leases.get_opt(&member).await.expect("get the member Lease");
    let holder = lease
        .and_then(|l| l.spec?.holder_identity)
        .unwrap_or_default();
    assert!(holder.is_empty(), "{member} still held by {holder:?}");
}
