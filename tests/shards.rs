//! `trellis run --leader-elect --shards` against the real control plane, with
//! three (then four) `trellis` processes on the same rules and namespace:
//! the replicas' buckets are disjoint and cover all 256; an edit of every
//! parent costs one child write and one status write per parent, each sent
//! by the replica that owns the parent's bucket; a SIGKILLed replica's
//! buckets are taken over once its member Lease has expired; a joining
//! replica takes its share with no parent written twice; SIGTERM hands a
//! replica's buckets over in seconds.
//!
//! Who wrote what is read from the API server's audit log, not from the
//! replicas: each replica runs with a kubeconfig impersonating a user of its
//! own, so every write is attributed by the server (and cross-checked with
//! each process's `trellis_child_operations_total`). Processes, not
//! in-process operators: SIGKILL and SIGTERM need them.
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use support::TestNamespace;
use support::audit::{self, Write};
use support::operator::{QUIET, TestKind, install_kind};
use support::process::Replica;
use trellis::shard::bucket_of;

/// One ConfigMap per parent, carrying the parent's `spec.v`; status mirrors it.
const RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: app
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-config" }}
        data:
          v: {{ spec.v }}
  status:
    fields:
      - path: v
        value: "spec.v"
"#;

/// Short timings for tests that wait for a member Lease to expire.
const FAST: &[&str] = &[
    "--leader-elect-lease-duration=4s",
    "--leader-elect-renew-deadline=3s",
    "--leader-elect-retry-period=1s",
];

/// Replicas settle, and parents converge, within this.
const SETTLE: Duration = Duration::from_secs(60);

/// A ring of replicas in one test's namespace, under one Lease name.
struct Ring {
    ns: TestNamespace,
    kind: TestKind,
    dir: tempfile::TempDir,
    lease: String,
    args: Vec<String>,
    _cleanup: support::operator::Cleanup,
}

impl Ring {
    async fn new(lease: &str, timings: &[&str]) -> Ring {
        let ns = support::namespace().await;
        let (kind, cleanup) = install_kind(&ns, "App").await;
        let mut dir = tempfile::tempdir().expect("temp dir");
        // Debugging a failure: keep the replicas' logs with the namespace.
        if std::env::var("TRELLIS_TEST_KEEP_NAMESPACES").as_deref() == Ok("1") {
            dir.disable_cleanup(true);
            eprintln!(
                "[shards] keeping the replicas' logs in {}",
                dir.path().display()
            );
        }
        std::fs::create_dir(dir.path().join("rules")).expect("rules dir");
        std::fs::write(dir.path().join("rules/app.yaml"), kind.rule(RULE)).expect("rule file");
        let mut args = vec![
            "--leader-elect".to_owned(),
            "--shards".to_owned(),
            format!("--leader-elect-lease-name={lease}"),
        ];
        args.extend(timings.iter().map(|t| t.to_string()));
        Ring {
            ns,
            kind,
            dir,
            lease: lease.to_owned(),
            args,
            _cleanup: cleanup,
        }
    }

    /// Starts replica `name`, writing as the user [`user`]`(name)`.
    fn start(&self, name: &str) -> Replica {
        let kubeconfig = audit::impersonating_kubeconfig(
            &self.dir.path().join(format!("{name}.kubeconfig")),
            &user(name),
        );
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        Replica::start_with_kubeconfig(name, &self.ns, self.dir.path(), &args, Some(&kubeconfig))
    }

    async fn create(&self, names: &[String], v: &str) {
        for name in names {
            self.kind.create(&self.ns, name, json!({"v": v}), &[]).await;
        }
    }

    async fn edit(&self, names: &[String], v: &str) {
        for name in names {
            self.kind
                .patch(&self.ns, name, json!({"spec": {"v": v}}))
                .await;
        }
    }

    /// Parent name → its bucket, from its uid.
    async fn buckets(&self) -> BTreeMap<String, u8> {
        let parents = self.kind.api(&self.ns).list(&ListParams::default()).await;
        parents
            .expect("list parents")
            .items
            .iter()
            .map(|p| (p.name_any(), bucket_of(&p.uid().expect("a uid")).0))
            .collect()
    }

    /// Waits until every parent in `names` has its child with `v`, labelled
    /// with the parent's bucket, and `status.v == v`.
    async fn converged(&self, names: &[String], v: &str) {
        let cms: Api<ConfigMap> = self.ns.api();
        support::eventually(&format!("{} parents at v={v}", names.len()), SETTLE, || async {
            let buckets = self.buckets().await;
            let children = cms
                .list(&ListParams::default().labels("trellis.dev/rule=app"))
                .await
                .map_err(|e| vec![e.to_string()])?;
            let parents = self.kind.api(&self.ns).list(&ListParams::default()).await;
            let parents = parents.map_err(|e| vec![e.to_string()])?;
            let mut behind = Vec::new();
            for name in names {
                let child = children
                    .items
                    .iter()
                    .find(|c| c.name_any() == format!("{name}-config"));
                let data = child.and_then(|c| c.data.as_ref()?.get("v").cloned());
                let label = child.and_then(|c| c.labels().get("trellis.dev/bucket").cloned());
                let status = parents
                    .items
                    .iter()
                    .find(|p| p.name_any() == *name)
                    .map(|p| p.data["status"]["v"].clone());
                let want_label = buckets.get(name).map(u8::to_string);
                if data.as_deref() != Some(v) || status != Some(json!(v)) || label != want_label {
                    behind.push(format!("{name}: child {data:?} bucket {label:?} (want {want_label:?}), status {status:?}"));
                }
            }
            if behind.is_empty() { Ok(()) } else { Err(behind) }
        })
        .await;
    }
}

/// The user replica `name` writes as.
fn user(name: &str) -> String {
    format!("shard-replica-{name}")
}

fn parent_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("p{i:03}")).collect()
}

/// A replica's `/status` `shard` section.
#[derive(Debug, Clone, PartialEq)]
struct Shard {
    member: String,
    generation: u64,
    buckets: BTreeSet<u8>,
    waiting: BTreeSet<u8>,
    members: u64,
    leader: bool,
}

fn numbers(v: &Value) -> BTreeSet<u8> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b.as_u64().map(|b| b as u8))
        .collect()
}

async fn shard(r: &Replica) -> Result<Shard, String> {
    let status = r.status().await?;
    let s = &status["shard"];
    if !s.is_object() {
        return Err(format!("{}: no shard section: {status}", r.name));
    }
    Ok(Shard {
        member: s["member"].as_str().unwrap_or_default().to_owned(),
        generation: s["generation"].as_u64().unwrap_or(0),
        buckets: numbers(&s["buckets"]),
        waiting: numbers(&s["waiting"]),
        members: s["members"].as_u64().unwrap_or(0),
        leader: status["leader"]["leader"] == true,
    })
}

/// Waits until `replicas` agree on one generation with every one of them a
/// member, nothing waiting, and buckets disjoint and covering all 256.
async fn settled(replicas: &[&Replica]) -> Vec<Shard> {
    support::eventually(
        &format!("{} replicas settled", replicas.len()),
        SETTLE,
        || async {
            let mut shards = Vec::new();
            for r in replicas {
                shards.push(shard(r).await?);
            }
            let generations: BTreeSet<u64> = shards.iter().map(|s| s.generation).collect();
            let owned: usize = shards.iter().map(|s| s.buckets.len()).sum();
            let union: BTreeSet<u8> = shards.iter().flat_map(|s| s.buckets.clone()).collect();
            let settled = generations.len() == 1
                && shards
                    .iter()
                    .all(|s| s.members == replicas.len() as u64 && s.waiting.is_empty())
                && shards.iter().filter(|s| s.leader).count() == 1
                && owned == 256
                && union.len() == 256;
            if settled {
                Ok(shards)
            } else {
                Err(format!("{shards:?}"))
            }
        },
    )
    .await
}

/// Bucket → the name of the replica that owns it.
fn owners(replicas: &[&Replica], shards: &[Shard]) -> BTreeMap<u8, String> {
    let mut owners = BTreeMap::new();
    for (r, s) in replicas.iter().zip(shards) {
        for b in &s.buckets {
            assert!(
                owners.insert(*b, r.name.clone()).is_none(),
                "bucket {b} owned twice: {shards:?}"
            );
        }
    }
    owners
}

/// Child creates, updates and deletes the process counted itself.
async fn child_writes(r: &Replica) -> u64 {
    let addr = r.addr.to_string();
    let mut total = 0.0;
    for op in ["create", "update", "delete"] {
        let label = format!("op=\"{op}\"");
        total += support::faults::metric(&addr, "trellis_child_operations", &[&label]).await;
    }
    total as u64
}

/// The audit log's writes of the children (ConfigMaps) and parent statuses
/// in the ring's namespace, by replica: (parent name, "child" | "status") → writers.
fn writes_by_parent(
    writes: &[Write],
    kind: &TestKind,
) -> BTreeMap<(String, &'static str), Vec<String>> {
    let mut out: BTreeMap<(String, &'static str), Vec<String>> = BTreeMap::new();
    for w in writes
        .iter()
        .filter(|w| w.user.starts_with("shard-replica-"))
    {
        let replica = w.user.trim_start_matches("shard-replica-").to_owned();
        // Children only: the leader also writes ConfigMaps of its own here
        // (rule revisions in the operator's namespace).
        if w.resource == "configmaps" && w.name.ends_with("-config") {
            let parent = w.name.trim_end_matches("-config").to_owned();
            out.entry((parent, "child")).or_default().push(replica);
        } else if w.resource == kind.plural && w.subresource == "status" {
            out.entry((w.name.clone(), "status"))
                .or_default()
                .push(replica);
        }
    }
    out
}

/// Audit events land in batches: the writes after `offset` once their count
/// (Lease renewals aside: they never stop) holds still for a second.
async fn settled_writes(offset: u64, ns: &str) -> Vec<Write> {
    let count = |writes: &[Write]| writes.iter().filter(|w| w.resource != "leases").count();
    let started = Instant::now();
    let mut last = count(&audit::writes_since(offset, ns));
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = audit::writes_since(offset, ns);
        if count(&now) == last {
            return now;
        }
        assert!(started.elapsed() < SETTLE, "writes keep coming: {now:?}");
        last = count(&now);
    }
}

/// Asserts that each parent in `names` had exactly one child write and one
/// status write, and (with `owners`) that its bucket's owner sent both.
fn assert_one_write_each(
    raw: &[Write],
    kind: &TestKind,
    names: &[String],
    buckets: &BTreeMap<String, u8>,
    owners: Option<&BTreeMap<u8, String>>,
) {
    let writes = writes_by_parent(raw, kind);
    let mut wrong = Vec::new();
    for name in names {
        for what in ["child", "status"] {
            let writers = writes
                .get(&(name.clone(), what))
                .cloned()
                .unwrap_or_default();
            let owner = owners.map(|o| o[&buckets[name]].clone());
            let ok = writers.len() == 1 && owner.as_ref().is_none_or(|o| writers[0] == *o);
            if !ok {
                wrong.push(format!(
                    "{name} (bucket {}) {what}: written by {writers:?}, owner {owner:?}",
                    buckets[name]
                ));
                let object = if what == "child" {
                    format!("{name}-config")
                } else {
                    name.clone()
                };
                for w in raw
                    .iter()
                    .filter(|w| w.name == object && w.resource != "events")
                {
                    wrong.push(format!(
                        "    {} {} {}/{} {} at {}",
                        w.user, w.verb, w.resource, w.subresource, w.code, w.received
                    ));
                }
            }
        }
    }
    let others: Vec<_> = writes.keys().filter(|(n, _)| !names.contains(n)).collect();
    assert!(
        wrong.is_empty() && others.is_empty(),
        "not one write per parent by its owner:\n{}\nother objects written: {others:?}",
        wrong.join("\n")
    );
}

fn lease_duration_gap(from: SystemTime, to: k8s_openapi::jiff::Timestamp) -> f64 {
    let from = k8s_openapi::jiff::Timestamp::try_from(from).expect("a timestamp");
    (to - from)
        .total(k8s_openapi::jiff::Unit::Second)
        .expect("seconds")
}

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
    let before: Vec<u64> = futures_counts(&replicas).await;

    let edited = audit::offset();
    let started = Instant::now();
    ring.edit(&names, "two").await;
    ring.converged(&names, "two").await;
    let took = started.elapsed();
    tokio::time::sleep(QUIET).await;
    let writes = settled_writes(edited, ring.ns.name()).await;
    assert_one_write_each(&writes, &ring.kind, &names, &buckets, Some(&owners));

    // Each process's own counter: exactly its share.
    let after = futures_counts(&replicas).await;
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

async fn futures_counts(replicas: &[&Replica]) -> Vec<u64> {
    let mut out = Vec::new();
    for r in replicas {
        out.push(child_writes(r).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_buckets_are_taken_over_once_its_lease_expires() {
    let ring = Ring::new("ring-kill", FAST).await;
    let mut all = vec![ring.start("a"), ring.start("b"), ring.start("c")];
    let shards = settled(&all.iter().collect::<Vec<_>>()).await;
    let names = parent_names(30);
    ring.create(&names, "one").await;
    ring.converged(&names, "one").await;
    let buckets = ring.buckets().await;
    // The leader is the hardest to lose: the assignment itself must move too.
    let victim = shards.iter().position(|s| s.leader).expect("a leader");
    let lost = shards[victim].buckets.clone();
    let orphans: Vec<String> = names
        .iter()
        .filter(|n| lost.contains(&buckets[*n]))
        .cloned()
        .collect();
    assert!(
        !orphans.is_empty(),
        "the victim owns some of the 30 parents"
    );
    let mut killed = all.remove(victim);
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
        .map(|w| lease_duration_gap(at, w.received))
        .fold(f64::MAX, f64::min);
    eprintln!(
        "[shards] SIGKILL of the leader (4 s leases): its {} parents' edits written from {first_orphan_write:.1} s \
         after the kill, every parent converged in {:.1} s; survivors at generation {} with {:?} buckets",
        orphans.len(),
        took.as_secs_f64(),
        after[0].generation,
        after.iter().map(|s| s.buckets.len()).collect::<Vec<_>>()
    );
    // Its member Lease was renewed at most a retry period (1 s) before the
    // kill; nobody may write its buckets before that Lease has expired.
    assert!(
        first_orphan_write >= 3.0,
        "a killed replica's parent written {first_orphan_write:.1} s after the kill"
    );
    assert!(took < Duration::from_secs(30), "takeover took {took:?}");
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

    // The fourth joins while every parent is being edited.
    let offset = audit::offset();
    let d = ring.start("d");
    ring.edit(&names, "two").await;
    ring.converged(&names, "two").await;
    let replicas = [&a, &b, &c, &d];
    let four = settled(&replicas).await;
    let writes = settled_writes(offset, ring.ns.name()).await;
    assert_one_write_each(&writes, &ring.kind, &names, &buckets, None);
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
    let before = futures_counts(&replicas).await;
    let offset = audit::offset();
    ring.edit(&names, "three").await;
    ring.converged(&names, "three").await;
    tokio::time::sleep(QUIET).await;
    let writes = settled_writes(offset, ring.ns.name()).await;
    let owners = owners(&replicas, &four);
    assert_one_write_each(&writes, &ring.kind, &names, &buckets, Some(&owners));
    let after = futures_counts(&replicas).await;
    let d_share = names.iter().filter(|n| owners[&buckets[*n]] == "d").count() as u64;
    assert_eq!(after[3] - before[3], d_share, "d wrote its share");
    eprintln!(
        "[shards] a fourth replica joined mid-edit: {:?} buckets after, {d_share} of 40 parents now d's",
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
    let victim = shards.iter().position(|s| s.leader).expect("a leader");
    let lost = shards[victim].buckets.clone();
    let orphans: Vec<String> = names
        .iter()
        .filter(|n| lost.contains(&buckets[*n]))
        .cloned()
        .collect();
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
    // Its member Lease is released.
    let leases: Api<Lease> = ring.ns.api();
    let member = format!(
        "{}-member-{}",
        ring.lease,
        shards[victim].member.to_lowercase().replace('_', "-")
    );
    let lease = leases.get(&member).await.expect("the member Lease");
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert!(holder.is_empty(), "{member} still held by {holder:?}");
}
