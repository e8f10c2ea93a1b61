//! The ring of `tests/shards.rs`: replicas of one rule set under one Lease
//! name in one test's namespace, what their `/status` says, and who wrote
//! what according to the API server's audit log.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use crate::support;
use support::TestNamespace;
use support::audit::{self, Write};
use support::operator::{TestKind, install_kind};
use support::process::Replica;
pub use support::process::{FAST, RULE};
use trellis::shard::bucket_of;

/// Replicas settle, and parents converge, within this.
pub const SETTLE: Duration = Duration::from_secs(60);

/// A ring of replicas in one test's namespace, under one Lease name.
pub struct Ring {
    pub ns: TestNamespace,
    pub kind: TestKind,
    dir: tempfile::TempDir,
    pub lease: String,
    args: Vec<String>,
    _cleanup: support::operator::Cleanup,
}

impl Ring {
    pub async fn new(lease: &str, timings: &[&str]) -> Ring {
        Ring::with_rule(lease, timings, RULE).await
    }

    /// A ring running `rule` (`@API_VERSION@`, `@KIND@`: the ring's kind)
    /// instead of [`RULE`].
    pub async fn with_rule(lease: &str, timings: &[&str], rule: &str) -> Ring {
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
        std::fs::write(dir.path().join("rules/app.yaml"), kind.rule(rule)).expect("rule file");
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
    pub fn start(&self, name: &str) -> Replica {
        let kubeconfig = audit::impersonating_kubeconfig(
            &self.dir.path().join(format!("{name}.kubeconfig")),
            &user(name),
        );
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        Replica::start_with_kubeconfig(name, &self.ns, self.dir.path(), &args, Some(&kubeconfig))
    }

    pub async fn create(&self, names: &[String], v: &str) {
        for name in names {
            self.kind.create(&self.ns, name, json!({"v": v}), &[]).await;
        }
    }

    pub async fn edit(&self, names: &[String], v: &str) {
        for name in names {
            self.kind
                .patch(&self.ns, name, json!({"spec": {"v": v}}))
                .await;
        }
    }

    /// Parent name → its bucket, from its uid.
    pub async fn buckets(&self) -> BTreeMap<String, u8> {
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
    pub async fn converged(&self, names: &[String], v: &str) {
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
pub fn user(name: &str) -> String {
    format!("shard-replica-{name}")
}

pub fn parent_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("p{i:03}")).collect()
}

/// A replica's `/status` `shard` section.
#[derive(Debug, Clone, PartialEq)]
pub struct Shard {
    pub member: String,
    pub generation: u64,
    pub buckets: BTreeSet<u8>,
    pub waiting: BTreeSet<u8>,
    pub members: u64,
    pub leader: bool,
}

pub fn numbers(v: &Value) -> BTreeSet<u8> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b.as_u64().map(|b| b as u8))
        .collect()
}

pub async fn shard(r: &Replica) -> Result<Shard, String> {
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

/// The leader's index among `shards`, and the parents (of `names`) in its buckets.
pub fn leader_and_its_parents(
    shards: &[Shard],
    names: &[String],
    buckets: &BTreeMap<String, u8>,
) -> (usize, Vec<String>) {
    let leader = shards.iter().position(|s| s.leader).expect("a leader");
    let parents = names
        .iter()
        .filter(|n| shards[leader].buckets.contains(&buckets[*n]))
        .cloned()
        .collect();
    (leader, parents)
}

/// Waits until `replicas` agree on one generation with every one of them a
/// member, nothing waiting, and buckets disjoint and covering all 256.
pub async fn settled(replicas: &[&Replica]) -> Vec<Shard> {
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
pub fn owners(replicas: &[&Replica], shards: &[Shard]) -> BTreeMap<u8, String> {
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
pub async fn child_writes(r: &Replica) -> u64 {
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
pub fn writes_by_parent(
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
pub async fn settled_writes(offset: audit::Mark, ns: &str) -> Vec<Write> {
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
pub fn assert_one_write_each(
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

pub fn seconds_between(from: SystemTime, to: k8s_openapi::jiff::Timestamp) -> f64 {
    let from = k8s_openapi::jiff::Timestamp::try_from(from).expect("a timestamp");
    (to - from)
        .total(k8s_openapi::jiff::Unit::Second)
        .expect("seconds")
}

/// Each replica's own count of child writes.
pub async fn child_write_counts(replicas: &[&Replica]) -> Vec<u64> {
    let mut out = Vec::new();
    for r in replicas {
        out.push(child_writes(r).await);
    }
    out
}

/// `/status` → `rules.app.parents`: (full, stub).
pub async fn parents_cached(r: &Replica) -> Result<(u64, u64), String> {
    let status = r.status().await?;
    let parents = &status["rules"]["app"]["parents"];
    match (parents["full"].as_u64(), parents["stub"].as_u64()) {
        (Some(full), Some(stub)) => Ok((full, stub)),
        _ => Err(format!("{}: no rules.app.parents: {status}", r.name)),
    }
}

/// Waits until each replica's parent cache holds, in full, exactly the
/// parents (of `buckets`: every parent there is) of the buckets it owns,
/// and no stub; `/status` and `trellis_parents_cached` agree.
pub async fn own_parents_cached(replicas: &[&Replica], buckets: &BTreeMap<String, u8>) {
    support::eventually("each replica caches its own parents only", SETTLE, || async {
        let mut wrong = Vec::new();
        for r in replicas {
            let s = shard(r).await.map_err(|e| vec![e])?;
            let own = buckets.values().filter(|b| s.buckets.contains(b)).count() as u64;
            let (full, stub) = parents_cached(r).await.map_err(|e| vec![e])?;
            let addr = r.addr.to_string();
            let metric = |form: &'static str| {
                let addr = addr.clone();
                async move {
                    let label = format!("form=\"{form}\"");
                    support::faults::metric(&addr, "trellis_parents_cached", &[&label]).await as u64
                }
            };
            let (m_full, m_stub) = (metric("full").await, metric("stub").await);
            if (full, stub, m_full, m_stub) != (own, 0, own, 0) {
                wrong.push(format!(
                    "{}: owns {} buckets, {own} of the {} parents; /status full {full} stub {stub}, metric full {m_full} stub {m_stub}",
                    r.name,
                    s.buckets.len(),
                    buckets.len()
                ));
            }
        }
        if wrong.is_empty() { Ok(()) } else { Err(wrong) }
    })
    .await;
}

/// Writes to the parents themselves (not their status) in the audit log:
/// parent name → the replicas that sent them (the bucket label).
pub fn parent_writes(writes: &[Write], kind: &TestKind) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for w in writes.iter().filter(|w| {
        w.user.starts_with("shard-replica-")
            && w.resource == kind.plural
            && w.subresource.is_empty()
    }) {
        out.entry(w.name.clone())
            .or_default()
            .push(w.user.trim_start_matches("shard-replica-").to_owned());
    }
    out
}
