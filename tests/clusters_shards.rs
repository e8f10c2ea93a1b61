//! Children in a spoke under `trellis run --leader-elect --shards`: three
//! `trellis` processes on one rule placing one ConfigMap at home and one in
//! a spoke (a private control plane registered by a Secret). Spoke writes
//! are fenced like local ones: each spoke child is written exactly once, by
//! the spoke's own audit log, also when a replica is SIGKILLed mid-edit and
//! the survivors take its buckets over; spoke children carry the parent's
//! bucket label, and each replica's spoke cache holds only its own
//! buckets' children (`/status` → `clusters.<name>.objects`), as its child
//! caches at home do. Deleting the parents deletes each spoke child once
//! (one DELETE each, no second one answered 404).
//!
//! Processes, not in-process operators: SIGKILL needs them. Each replica
//! writes to the hub as a user of its own (see `tests/shards.rs`); in the
//! spoke all use the Secret's credentials, so the spoke's audit log counts
//! writes per object, not per replica.
mod support;

#[path = "shards/ring.rs"]
#[allow(dead_code)]
mod ring;
#[path = "spoke/mod.rs"]
mod spoke;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use ring::{FAST, Ring, SETTLE, leader_and_its_parents, parent_names, settled, settled_writes};
use spoke::SPOKE;
use support::audit::Write;
use support::faults::PrivateCluster;
use support::operator::QUIET;
use support::process::Replica;

/// One ConfigMap at home, one in the spoke; the status maps the spoke's.
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
    - id: home
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-home" }}
        data:
          v: {{ spec.v }}
    - id: remote
      apiVersion: v1
      kind: ConfigMap
      cluster: "'spoke-1'"
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-remote" }}
        data:
          v: {{ spec.v }}
  status:
    fields:
      - path: v
        from: remote
        jsonPath: $.data.v
"#;

struct Fleet {
    ring: Ring,
    spoke: PrivateCluster,
    spoke_client: Client,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        support::operator::release_parents(self.ring.ns.name(), &self.ring.kind.resource);
    }
}

impl Fleet {
    async fn new(lease: &str) -> Fleet {
        support::faults::logs();
        let ring = Ring::with_rule(lease, FAST, RULE).await;
        let (spoke, spoke_client) = spoke::start("clusters-shards", ring.ns.name()).await;
        // The replicas' namespace is their operator namespace (POD_NAMESPACE).
        spoke::register(&ring.ns.client, ring.ns.name(), &spoke.kubeconfig).await;
        Fleet {
            ring,
            spoke,
            spoke_client,
        }
    }

    fn spoke_configmaps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.spoke_client.clone(), self.ring.ns.name())
    }

    /// Waits until every parent in `names` has its home child and its spoke
    /// child with `v`, both labelled with the parent's bucket, and
    /// `status.v == v` (mapped back from the spoke).
    async fn converged(&self, names: &[String], v: &str) {
        let home: Api<ConfigMap> = self.ring.ns.api();
        let what = format!("{} parents at v={v} at home and in the spoke", names.len());
        support::eventually(&what, SETTLE, || async {
            let buckets = self.ring.buckets().await;
            let list = ListParams::default().labels("trellis.dev/rule=app");
            let at_home = home.list(&list).await.map_err(|e| vec![e.to_string()])?;
            let there = self.spoke_configmaps().list(&list).await;
            let there = there.map_err(|e| vec![e.to_string()])?;
            let api = self.ring.kind.api(&self.ring.ns);
            let parents = api.list(&ListParams::default()).await;
            let parents = parents.map_err(|e| vec![e.to_string()])?;
            let mut behind = Vec::new();
            for name in names {
                let want_bucket = buckets.get(name).map(u8::to_string);
                let child = |items: &[ConfigMap], suffix: &str| {
                    let c = items.iter().find(|c| c.name_any() == format!("{name}{suffix}"));
                    (
                        c.and_then(|c| c.data.as_ref()?.get("v").cloned()),
                        c.and_then(|c| c.labels().get("trellis.dev/bucket").cloned()),
                    )
                };
                let home = child(&at_home.items, "-home");
                let remote = child(&there.items, "-remote");
                let status = parents
                    .items
                    .iter()
                    .find(|p| p.name_any() == *name)
                    .map(|p| p.data["status"]["v"].clone());
                let fine = |(data, bucket): &(Option<String>, Option<String>)| {
                    data.as_deref() == Some(v) && *bucket == want_bucket
                };
                if !fine(&home) || !fine(&remote) || status != Some(json!(v)) {
                    behind.push(format!(
                        "{name} (bucket {want_bucket:?}): home {home:?}, spoke {remote:?}, status {status:?}"
                    ));
                }
            }
            if behind.is_empty() { Ok(()) } else { Err(behind) }
        })
        .await;
    }

    /// The spoke's writes after `mark`, once their count holds still for a
    /// second (the API server writes its audit log in batches).
    async fn spoke_writes(&self, mark: support::audit::Mark) -> Vec<Write> {
        let ns = self.ring.ns.name();
        let mut last = spoke::writes_since(&self.spoke, mark, ns).len();
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = spoke::writes_since(&self.spoke, mark, ns);
            if now.len() == last {
                return now;
            }
            last = now.len();
        }
    }
}

/// Each of `names`' children with `suffix`, among `writes`: exactly one
/// accepted write of `verbs`; the wrong ones described.
fn one_write_each(writes: &[Write], names: &[String], suffix: &str, verbs: &[&str]) -> Vec<String> {
    let mut accepted: BTreeMap<String, Vec<&Write>> = BTreeMap::new();
    let mut refused = Vec::new();
    for w in writes.iter().filter(|w| {
        w.resource == "configmaps" && w.name.ends_with(suffix) && verbs.contains(&w.verb.as_str())
    }) {
        if w.code < 300 {
            accepted.entry(w.name.clone()).or_default().push(w);
        } else {
            refused.push(format!("{} {} {} by {}", w.verb, w.name, w.code, w.user));
        }
    }
    let mut wrong = Vec::new();
    for name in names {
        let object = format!("{name}{suffix}");
        let got = accepted.get(&object).map(Vec::len).unwrap_or(0);
        if got != 1 {
            wrong.push(format!("{object}: {got} accepted {verbs:?} writes"));
        }
    }
    let others: Vec<&String> = accepted
        .keys()
        .filter(|o| !names.iter().any(|n| format!("{n}{suffix}") == **o))
        .collect();
    if !others.is_empty() {
        wrong.push(format!("other objects written: {others:?}"));
    }
    if !wrong.is_empty() && !refused.is_empty() {
        wrong.push(format!("refused: {refused:?}"));
    }
    wrong
}

/// Waits until each replica's spoke cache holds exactly the spoke children
/// of its own buckets' parents (`/status` → `clusters.spoke-1.objects`).
async fn own_spoke_children_cached(replicas: &[&Replica], buckets: &BTreeMap<String, u8>) {
    support::eventually(
        "each replica caches its own spoke children only",
        SETTLE,
        || async {
            let mut wrong = Vec::new();
            for r in replicas {
                let s = ring::shard(r).await.map_err(|e| vec![e])?;
                let own = buckets.values().filter(|b| s.buckets.contains(b)).count() as u64;
                let status = r.status().await.map_err(|e| vec![e])?;
                let objects = &status["clusters"][SPOKE]["objects"];
                if objects.as_u64() != Some(own) {
                    wrong.push(format!(
                    "{}: owns {} buckets, {own} of the {} parents; caches {objects} spoke objects",
                    r.name,
                    s.buckets.len(),
                    buckets.len()
                ));
                }
            }
            if wrong.is_empty() { Ok(()) } else { Err(wrong) }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoke_children_are_written_once_by_their_buckets_owner_through_a_sigkill() {
    let fleet = Fleet::new("fleet-ring").await;
    let ring = &fleet.ring;
    let mut all = vec![ring.start("a"), ring.start("b"), ring.start("c")];
    let shards = settled(&all.iter().collect::<Vec<_>>()).await;
    let names = parent_names(40);

    // Made: one create of each spoke child, labelled with its bucket.
    let spoke_mark = spoke::audit_mark(&fleet.spoke);
    let hub_mark = support::audit::offset();
    ring.create(&names, "one").await;
    fleet.converged(&names, "one").await;
    let buckets = ring.buckets().await;
    tokio::time::sleep(QUIET).await;
    let made = fleet.spoke_writes(spoke_mark).await;
    let writes = ["create", "patch", "update"];
    let wrong = one_write_each(&made, &names, "-remote", &writes);
    assert!(
        wrong.is_empty(),
        "spoke children made:\n{}",
        wrong.join("\n")
    );
    let hub = settled_writes(hub_mark, ring.ns.name()).await;
    let wrong = one_write_each(&hub, &names, "-home", &writes);
    assert!(
        wrong.is_empty(),
        "home children made:\n{}",
        wrong.join("\n")
    );
    own_spoke_children_cached(&all.iter().collect::<Vec<_>>(), &buckets).await;

    // The leader SIGKILLed while every parent is being edited: the
    // survivors write the killed replica's parents once its member Lease
    // has expired, and no spoke child twice (a write the killed replica
    // had in flight either landed, and is not sent again, or did not).
    let (victim, orphans) = leader_and_its_parents(&shards, &names, &buckets);
    assert!(!orphans.is_empty(), "the victim owns some of the parents");
    let mut killed = all.remove(victim);
    let spoke_mark = spoke::audit_mark(&fleet.spoke);
    let hub_mark = support::audit::offset();
    let (edited_first, kill) = names.split_at(names.len() / 2);
    ring.edit(edited_first, "two").await;
    let killing = async {
        killed.signal("-KILL");
    };
    tokio::join!(ring.edit(kill, "two"), killing);
    killed.exited(Duration::from_secs(5)).await;
    fleet.converged(&names, "two").await;
    let survivors: Vec<&Replica> = all.iter().collect();
    let after = settled(&survivors).await;
    tokio::time::sleep(QUIET).await;
    let edited = fleet.spoke_writes(spoke_mark).await;
    let wrong = one_write_each(&edited, &names, "-remote", &writes);
    assert!(
        wrong.is_empty(),
        "spoke children edited:\n{}",
        wrong.join("\n")
    );
    let hub = settled_writes(hub_mark, ring.ns.name()).await;
    let wrong = one_write_each(&hub, &names, "-home", &writes);
    assert!(
        wrong.is_empty(),
        "home children edited:\n{}",
        wrong.join("\n")
    );
    own_spoke_children_cached(&survivors, &buckets).await;
    eprintln!(
        "[clusters-shards] SIGKILL of the leader: its {} parents' spoke children edited once each; survivors at generation {} with {:?} buckets",
        orphans.len(),
        after[0].generation,
        after.iter().map(|s| s.buckets.len()).collect::<Vec<_>>()
    );

    // Deleted: each spoke child deleted once, then the parents go.
    let spoke_mark = spoke::audit_mark(&fleet.spoke);
    ring.kind
        .api(&ring.ns)
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .expect("delete the parents");
    support::eventually("parents and spoke children gone", SETTLE, || async {
        let parents = ring.kind.api(&ring.ns).list(&ListParams::default()).await;
        let parents = parents.map_err(|e| e.to_string())?.items.len();
        let list = ListParams::default().labels("trellis.dev/rule=app");
        let children = fleet.spoke_configmaps().list(&list).await;
        let children = children.map_err(|e| e.to_string())?.items.len();
        if parents == 0 && children == 0 {
            Ok(())
        } else {
            Err(format!("{parents} parents, {children} spoke children"))
        }
    })
    .await;
    let deleted = fleet.spoke_writes(spoke_mark).await;
    let wrong = one_write_each(&deleted, &names, "-remote", &["delete"]);
    assert!(
        wrong.is_empty(),
        "spoke children deleted:\n{}",
        wrong.join("\n")
    );
    // Once each, not once plus a 404: a finalizer round (or pass) woken by
    // another child's event while the spoke's watch still showed the child
    // deleted it again.
    let again: Vec<String> = deleted
        .iter()
        .filter(|w| w.verb == "delete" && w.name.ends_with("-remote") && w.code >= 300)
        .map(|w| format!("{} {}", w.name, w.code))
        .collect();
    assert!(
        again.is_empty(),
        "spoke children deleted more than once: {again:?}"
    );
    let status: Value = all[0].status().await.unwrap_or_default();
    assert_eq!(status["clusters"][SPOKE]["objects"], 0, "{status}");
}
