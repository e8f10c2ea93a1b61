//! A staged rollout (`rollout:`) with trellis deployed from examples/deploy:
//! two replicas, the rules ConfigMap edited as a user edits it, the leader
//! Pod deleted twice mid-rollout (in a manual pause, then in a timed one).
//! Each new leader continues where the last one was: exactly the right
//! number of parents per step, nobody moved by a takeover, nobody moved
//! twice, and the rollout completes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::support;
use super::{
    DEPLOY, NS, WAIT, committed_rules, deploy, leader, set_rules, status_of, wait_ready_replicas,
    webapps,
};

const PARENTS: usize = 6;

/// The committed webapp rule with a `rollout:` block and a config child
/// that shows `stage` (so each parent's version can be read off its child).
fn staged_webapp(committed: &str, stage: &str) -> String {
    let spec = "\nspec:\n";
    let greeting = "          greeting: {{ spec.greeting }}\n";
    assert!(
        committed.contains(spec) && committed.contains(greeting),
        "the webapp rule's layout changed; adapt the test"
    );
    let rollout = "  rollout:\n    steps:\n      - {percent: 25, pause: manual}\n      - {percent: 50, pause: 20s}\n    health: {timeout: 3m}\n";
    committed
        .replacen(spec, &format!("{spec}{rollout}"), 1)
        .replace(
            greeting,
            &format!("{greeting}          stage: \"{stage}\"\n"),
        )
}

fn with_webapp(rules: &BTreeMap<String, String>, text: String) -> BTreeMap<String, String> {
    let mut out = rules.clone();
    out.insert("webapp.yaml".into(), text);
    out
}

/// Parent name → the `stage` its config child shows (empty: none yet).
async fn stages(client: &Client, ns: &str) -> BTreeMap<String, String> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let mut out = BTreeMap::new();
    for cm in cms.list(&ListParams::default()).await.unwrap() {
        if let Some(parent) = cm.name_any().strip_suffix("-config") {
            let stage = cm
                .data
                .as_ref()
                .and_then(|d| d.get("stage").cloned())
                .unwrap_or_default();
            out.insert(parent.to_owned(), stage);
        }
    }
    out
}

/// Every look at the parents: a parent seen on the new stage must never be
/// seen back on the old one (nobody moves twice).
#[derive(Default)]
struct Moves {
    on_new: BTreeSet<String>,
}

impl Moves {
    fn look(&mut self, seen: &BTreeMap<String, String>, new: &str) -> usize {
        for (parent, stage) in seen {
            if stage == new {
                self.on_new.insert(parent.clone());
            } else {
                assert!(
                    !self.on_new.contains(parent),
                    "{parent} was on {new} and is on {stage:?} again: {seen:?}"
                );
            }
        }
        seen.values().filter(|s| *s == new).count()
    }

    /// Waits until exactly `n` parents are on `new` (the rest on `old`).
    async fn wait(&mut self, client: &Client, ns: &str, new: &str, old: &str, n: usize) {
        let started = Instant::now();
        loop {
            let seen = stages(client, ns).await;
            let on_new = self.look(&seen, new);
            let on_old = seen.values().filter(|s| *s == old).count();
            if seen.len() == PARENTS && on_new == n && on_old == PARENTS - n {
                return;
            }
            assert!(
                on_new <= n,
                "more than {n} parents on {new} (a step went too far): {seen:?}"
            );
            assert!(
                started.elapsed() < WAIT,
                "{n} of {PARENTS} parents on {new}: {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Holds for `hold`: the count on `new` stays `n`.
    async fn hold(&mut self, client: &Client, ns: &str, new: &str, n: usize, hold: Duration) {
        let started = Instant::now();
        while started.elapsed() < hold {
            let seen = stages(client, ns).await;
            assert_eq!(
                self.look(&seen, new),
                n,
                "a parent moved by itself: {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// `rules.webapp.rollout` of the leader's `/status`, once `check` holds.
async fn rollout_on_leader(client: &Client, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    support::eventually(what, WAIT, || async {
        let (_, pod) = leader(client).await?;
        let status = status_of(client, &pod).await?;
        let rollout = status["rules"]["webapp"]["rollout"].clone();
        if check(&rollout) {
            Ok(rollout)
        } else {
            Err(format!("{pod}: {rollout}"))
        }
    })
    .await
}

/// Deletes the leader Pod (SIGTERM) and waits for another Pod to lead.
async fn delete_leader(client: &Client) -> String {
    let (holder, pod) = support::eventually("a Lease holder", WAIT, || leader(client)).await;
    Api::<Pod>::namespaced(client.clone(), NS)
        .delete(&pod, &DeleteParams::default())
        .await
        .unwrap();
    let (_, next) = support::eventually("a new Lease holder", WAIT, || async {
        match leader(client).await {
            Ok((h, p)) if h != holder && p != pod => Ok((h, p)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    println!("[deploy] leader {pod} deleted mid-rollout: {next} leads");
    next
}

/// `trellis rollout ARGS --operator-namespace trellis-system`, as a person
/// runs it against the cluster.
fn rollout_cli(args: &[&str]) -> String {
    let kubeconfig = support::node::node()
        .kubeconfig_path
        .clone()
        .expect("a kubeconfig file");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_trellis"))
        .arg("rollout")
        .args(args)
        .args(["--operator-namespace", NS])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .expect("run trellis rollout");
    assert!(
        out.status.success(),
        "trellis rollout {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// WebApps in every namespace (the deployed trellis serves them all).
async fn all_webapps(client: &Client) -> Vec<DynamicObject> {
    let gvk = GroupVersionKind::gvk("demo.trellis.dev", "v1", "WebApp");
    Api::<DynamicObject>::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

/// Upgraded and RolledBack Events on the test's parents that name
/// `revision`, summed per parent (an Event repeated counts its repeats).
async fn moves_by_event(
    client: &Client,
    ns: &str,
    reason: &str,
    revision: &str,
) -> BTreeMap<String, i32> {
    let mut out = BTreeMap::new();
    for e in Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        if e.reason.as_deref() == Some(reason)
            && e.involved_object.kind.as_deref() == Some("WebApp")
            && e.message.as_deref().unwrap_or_default().contains(revision)
        {
            let name = e.involved_object.name.clone().unwrap_or_default();
            let count = e
                .series
                .as_ref()
                .and_then(|s| s.count)
                .or(e.count)
                .unwrap_or(1);
            *out.entry(name).or_default() += count;
        }
    }
    out
}

#[tokio::test]
async fn a_staged_rollout_survives_two_leader_pod_deletions_and_completes() {
    let _turn = DEPLOY.lock().await;
    let client = support::client().await;
    deploy(&client).await;
    let committed = committed_rules();
    // An earlier test may have left an edit in force: wait until both Pods
    // run the committed webapp rule (no `rollout:`), and the leader has
    // deleted the revisions of any earlier rollout (else this test's first
    // edit would be a rollout from that one's last version).
    set_rules(&client, &committed).await;
    for pod in wait_ready_replicas(&client, 2).await {
        support::eventually(&format!("{pod} without a webapp rollout"), WAIT, || async {
            let status = status_of(&client, &pod).await?;
            match status["rules"]["webapp"].get("rollout") {
                None if status["reload"]["ok"] == json!(true) => Ok(()),
                other => Err(format!("{other:?} {}", status["reload"])),
            }
        })
        .await;
    }
    let revisions: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    support::eventually("no revision ConfigMap of webapp left", WAIT, || async {
        let left = revisions
            .list(&ListParams::default().labels("trellis.dev/revision-of=webapp"))
            .await
            .map_err(|e| e.to_string())?;
        if left.items.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{:?}",
                left.items.iter().map(|c| c.name_any()).collect::<Vec<_>>()
            ))
        }
    })
    .await;
    let ns = support::namespace().await;
    for i in 0..PARENTS {
        let parent: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "demo.trellis.dev/v1", "kind": "WebApp",
            "metadata": {"name": format!("app{i}")},
            // No Pods: a Deployment of 0 replicas is ready at once.
            "spec": {"image": support::node::APP_IMAGE, "replicas": 0}
        }))
        .unwrap();
        webapps(&client, ns.name())
            .patch(
                &format!("app{i}"),
                &PatchParams::apply("trellis-tests"),
                &Patch::Apply(&parent),
            )
            .await
            .unwrap();
    }
    // The step arithmetic counts every WebApp the deployment serves: wait
    // until those of earlier tests (namespaces being deleted) are gone.
    support::eventually("only this test's WebApps", WAIT, || async {
        let all = all_webapps(&client).await;
        if all.len() == PARENTS {
            Ok(())
        } else {
            Err(format!(
                "{:?}",
                all.iter()
                    .map(|w| format!("{}/{}", w.namespace().unwrap_or_default(), w.name_any()))
                    .collect::<Vec<_>>()
            ))
        }
    })
    .await;
    let mut moves = Moves::default();
    moves.wait(&client, ns.name(), "-", "", 0).await;

    // The first version with `rollout:` is kept as it is: everyone on it.
    let token = support::unique_name("s");
    let (old, new) = (format!("{token}-a"), format!("{token}-b"));
    let rules_old = with_webapp(&committed, staged_webapp(&committed["webapp.yaml"], &old));
    set_rules(&client, &rules_old).await;
    let kept = rollout_on_leader(&client, "the first version kept", |r| {
        r["state"] == "Complete" && r["from"] == r["to"]
    })
    .await;
    moves.wait(&client, ns.name(), &old, "", PARENTS).await;

    // A template edit: staged. 25% of 6 is ⌈1.5⌉ = 2 parents, then a manual pause.
    let started = Instant::now();
    let mut moves = Moves::default();
    set_rules(
        &client,
        &with_webapp(&committed, staged_webapp(&committed["webapp.yaml"], &new)),
    )
    .await;
    let paused = rollout_on_leader(&client, "paused at the first step", |r| {
        r["state"] == "Paused" && r["step"] == 1 && r["from"] == kept["to"] && r["to"] != kept["to"]
    })
    .await;
    let revision = paused["to"].as_str().unwrap().to_owned();
    assert_eq!(
        (paused["moved"].as_u64(), paused["total"].as_u64()),
        (Some(2), Some(6)),
        "{paused}"
    );
    moves.wait(&client, ns.name(), &new, &old, 2).await;
    println!(
        "[deploy] rollout edit -> first step (2 of 6) after {:?}",
        started.elapsed()
    );

    // The leader Pod goes away in the manual pause: the standby takes over
    // and moves nobody by itself.
    delete_leader(&client).await;
    let taken = rollout_on_leader(&client, "the new leader paused at the first step", |r| {
        r["state"] == "Paused" && r["step"] == 1 && r["to"] == revision.as_str()
    })
    .await;
    assert_eq!(taken["moved"], 2, "{taken}");
    moves
        .hold(&client, ns.name(), &new, 2, Duration::from_secs(6))
        .await;
    let table = rollout_cli(&["status", "webapp"]);
    assert!(table.contains("Paused") && table.contains("2/6"), "{table}");

    // Promoted: 50% is 3 parents, held 20 s; the leader Pod goes away in
    // that pause too (its replacement, the standby now, takes over).
    wait_ready_replicas(&client, 2).await;
    assert!(rollout_cli(&["promote", "webapp"]).contains("recorded"));
    moves.wait(&client, ns.name(), &new, &old, 3).await;
    let second = rollout_on_leader(&client, "the second step", |r| r["step"] == 2).await;
    assert_eq!(second["moved"], 3, "{second}");
    delete_leader(&client).await;
    moves.wait(&client, ns.name(), &new, &old, PARENTS).await;
    let done = rollout_on_leader(&client, "complete", |r| r["state"] == "Complete").await;
    assert_eq!(
        (
            done["to"].as_str(),
            done["moved"].as_u64(),
            done["failed"].as_u64()
        ),
        (Some(revision.as_str()), Some(6), Some(0)),
        "{done}"
    );
    println!(
        "[deploy] staged rollout with two leader deletions complete after {:?}",
        started.elapsed()
    );

    // One Upgraded Event per parent for this revision, none rolled back.
    let upgraded = moves_by_event(&client, ns.name(), "Upgraded", &revision).await;
    let once: BTreeMap<String, i32> = (0..PARENTS).map(|i| (format!("app{i}"), 1)).collect();
    assert_eq!(upgraded, once, "each parent moved exactly once");
    assert!(
        moves_by_event(&client, ns.name(), "RolledBack", &revision)
            .await
            .is_empty()
    );

    // Back to the committed rules (the next test waits until they are in force).
    set_rules(&client, &committed).await;
}
