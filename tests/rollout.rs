//! Staged rollout of a rule change (`rollout:`) against the real control
//! plane: steps and pauses move exactly the right number of parents, a
//! manual pause holds until promoted, a version whose children never
//! become ready goes back by itself, a restart moves nobody and writes
//! nothing, abort returns everyone, an edit restarts toward the newest.
//!
//! Each test runs `trellis run` in-process on a ConfigMap-volume rules
//! directory, watching its own namespace, which is also the operator's
//! namespace (where the revision ConfigMaps live). A child shows the rule
//! text that rendered it in `data.version`.
//!
//! `trellis rbac --from-cluster` is run here too, the real binary against
//! a rollout held at a manual step, where the older version's child kind
//! is still in use.
mod support;

#[path = "support/configmap_dir.rs"]
mod configmap_dir;
#[path = "support/reloading.rs"]
mod reloading;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use trellis::operator::Options;

use configmap_dir::ConfigMapDir;
use reloading::{children, config_rule, free_local_addr, http_get_json};
use support::TestNamespace;
use support::operator::{Operator, TestKind, WAIT, config_data, install_kind};

/// `trellis run` on `rules`, with `ns` as the operator's namespace too.
struct Running {
    operator: Operator,
    addr: SocketAddr,
}

impl Running {
    fn start(client: &Client, ns: &TestNamespace, rules: &ConfigMapDir) -> Running {
        let dir = rules.path();
        let set = trellis::rules::RuleSet::load(std::slice::from_ref(&dir), Default::default())
            .unwrap_or_else(|d| panic!("rules do not load: {d:?}"));
        let addr = free_local_addr();
        let options = Options {
            reload_debounce: Duration::from_millis(200),
            reload_poll: Duration::from_secs(2),
            instance: "test".into(),
            metrics_addr: Some(addr),
            operator_namespace: ns.name().to_owned(),
            ..Options::new(vec![dir], vec![ns.name().to_owned()])
        };
        Running {
            operator: Operator::spawn(options, set, client),
            addr,
        }
    }

    /// `rules.<rule>.rollout` of `/status` once it satisfies `check`.
    async fn wait_rollout(&self, rule: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        support::eventually(what, WAIT, || async {
            let status = http_get_json(self.addr, "/status").await?;
            let rollout = status["rules"][rule]["rollout"].clone();
            if check(&rollout) {
                Ok(rollout)
            } else {
                Err(format!("rollout {rollout}"))
            }
        })
        .await
    }

    async fn metrics(&self) -> String {
        support::http_get(self.addr, "/metrics")
            .await
            .unwrap_or_else(|e| panic!("GET /metrics: {e}"))
    }
}

/// [`config_rule`] with a `rollout:` block (indented under `spec:`).
fn rollout_rule(kind: &TestKind, rule: &str, version: &str, rollout: &str) -> String {
    format!("{}  rollout:\n{rollout}", config_rule(kind, rule, version))
}

/// Parent name → the version its `-config` child was rendered from.
async fn versions(cms: &Api<ConfigMap>, rule: &str) -> BTreeMap<String, String> {
    children(cms, rule)
        .await
        .iter()
        .filter_map(|cm| {
            let parent = cm.name_any().strip_suffix("-config")?.to_owned();
            Some((parent, config_data(cm, "version")?))
        })
        .collect()
}

fn count(versions: &BTreeMap<String, String>, version: &str) -> usize {
    versions.values().filter(|v| *v == version).count()
}

/// Waits until exactly `n` of `total` parents are on `version` (both children).
async fn wait_on(cms: &Api<ConfigMap>, rule: &str, version: &str, n: usize, total: usize) {
    support::eventually(
        &format!("{n} of {total} parents on {version}"),
        WAIT,
        || async {
            let all: Vec<ConfigMap> = children(cms, rule).await;
            let on = |suffix: &str| {
                all.iter()
                    .filter(|cm| cm.name_any().ends_with(suffix))
                    .filter(|cm| config_data(cm, "version").as_deref() == Some(version))
                    .count()
            };
            let seen = versions(cms, rule).await;
            if seen.len() == total && on("-config") == n && on("-extra") == n {
                Ok(())
            } else {
                Err(seen)
            }
        },
    )
    .await
}

/// Creates `n` parents `p0..`, waits for their children at `version`.
async fn parents(ns: &TestNamespace, kind: &TestKind, rule: &str, n: usize, version: &str) {
    for i in 0..n {
        kind.create(ns, &format!("p{i}"), json!({"greeting": "hi"}), &[])
            .await;
    }
    let cms: Api<ConfigMap> = ns.api();
    wait_on(&cms, rule, version, n, n).await;
}

/// Every parent's and child's resourceVersion.
async fn resource_versions(
    ns: &TestNamespace,
    kind: &TestKind,
    rule: &str,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for p in kind
        .api(ns)
        .list(&ListParams::default())
        .await
        .expect("list parents")
        .items
    {
        out.insert(
            format!("parent {}", p.name_any()),
            p.resource_version().unwrap_or_default(),
        );
    }
    let cms: Api<ConfigMap> = ns.api();
    for c in children(&cms, rule).await {
        out.insert(
            format!("child {}", c.name_any()),
            c.resource_version().unwrap_or_default(),
        );
    }
    out
}

/// `trellis rollout <args> --operator-namespace <ns>`: exit code and stdout.
async fn cli(ns: &TestNamespace, args: &[&str]) -> (Option<i32>, String) {
    let kubeconfig = support::cluster()
        .kubeconfig_path
        .clone()
        .expect("a kubeconfig file");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_trellis"));
    command
        .arg("rollout")
        .args(args)
        .args(["--operator-namespace", ns.name()])
        .env("KUBECONFIG", &kubeconfig);
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("join")
        .expect("run trellis rollout");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "trellis rollout {args:?}: {stderr}");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// `trellis rollout promote|abort RULE`, as a person would.
async fn decide(ns: &TestNamespace, rule: &str, what: &str) {
    let (_, out) = cli(ns, &[what, rule]).await;
    assert!(out.contains("recorded"), "{out}");
}

/// Events of `reason` on parents of `rule`'s kind, by parent name.
async fn events(ns: &TestNamespace, kind: &TestKind, reason: &str) -> Vec<String> {
    let api: Api<Event> = ns.api();
    let mut out: Vec<String> = api
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.involved_object.kind.as_deref() == Some(&kind.kind)
        })
        .filter_map(|e| e.involved_object.name)
        .collect();
    out.sort();
    out.dedup();
    out
}

const MANUAL_THEN_TIMED: &str = "    steps:\n      - percent: 25\n        pause: manual\n      - percent: 50\n        pause: 2s\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_and_pauses_move_exactly_the_right_number_of_parents_and_manual_holds_until_promote()
{
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "App").await;
    let rule = support::unique_name("steps");
    let cms: Api<ConfigMap> = ns.api();
    let mut rules = ConfigMapDir::new(&[(
        "app.yaml",
        &rollout_rule(&app, &rule, "v1", MANUAL_THEN_TIMED),
    )]);
    let running = Running::start(&ns.client, &ns, &rules);
    parents(&ns, &app, &rule, 7, "v1").await;
    running
        .wait_rollout(&rule, "the first version kept", |r| {
            r["state"] == "Complete"
        })
        .await;

    rules.update(&[(
        "app.yaml",
        &rollout_rule(&app, &rule, "v2", MANUAL_THEN_TIMED),
    )]);
    // 25% of 7: ⌈1.75⌉ = 2 parents, then a manual pause.
    let paused = running
        .wait_rollout(&rule, "paused at the first step", |r| {
            r["state"] == "Paused" && r["step"] == 1 && r["to"] != r["from"]
        })
        .await;
    assert_eq!(paused["moved"], 2, "{paused}");
    assert_eq!(paused["total"], 7, "{paused}");
    wait_on(&cms, &rule, "v2", 2, 7).await;
    // A manual pause holds: nothing more moves while nobody promotes.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(count(&versions(&cms, &rule).await, "v2"), 2);
    let held = running.wait_rollout(&rule, "still paused", |_| true).await;
    assert_eq!(
        (held["state"].as_str(), held["step"].as_u64()),
        (Some("Paused"), Some(1)),
        "{held}"
    );

    decide(&ns, &rule, "promote").await;
    // 50% of 7: ⌈3.5⌉ = 4, held 2 s, then everyone.
    running
        .wait_rollout(&rule, "the second step", |r| {
            r["step"] == 2 && r["moved"] == 4
        })
        .await;
    wait_on(&cms, &rule, "v2", 7, 7).await;
    let done = running
        .wait_rollout(&rule, "complete", |r| r["state"] == "Complete")
        .await;
    assert_eq!(done["failed"], 0, "{done}");
    let upgraded = events(&ns, &app, "Upgraded").await;
    assert_eq!(
        upgraded.len(),
        7,
        "an Upgraded Event on each parent: {upgraded:?}"
    );
    let metrics = running.metrics().await;
    let to = done["to"].as_str().unwrap_or_default();
    assert!(
        metrics.contains(&format!(
            "trellis_rollout_parents{{rule=\"{rule}\",revision=\"{to}\"}} 7"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "trellis_rollout_state{{rule=\"{rule}\",state=\"Complete\"}} 1"
        )),
        "{metrics}"
    );
    // The versions are kept in the operator's namespace, labelled as versions, not children.
    let kept: Vec<ConfigMap> = cms
        .list(&ListParams::default().labels(&format!("trellis.dev/revision-of={rule}")))
        .await
        .expect("list revisions")
        .items;
    assert_eq!(
        kept.len(),
        2,
        "{:?}",
        kept.iter().map(|c| c.name_any()).collect::<Vec<_>>()
    );
    assert!(kept.iter().all(|c| {
        !c.labels().contains_key("trellis.dev/rule")
            && c.name_any()
                .starts_with(&format!("trellis-revision-{rule}-"))
    }));
    running.operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_whose_children_never_become_ready_is_rolled_back_by_itself() {
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "App").await;
    let rule = support::unique_name("back");
    let cms: Api<ConfigMap> = ns.api();
    let rollout =
        "    steps:\n      - percent: 50\n        pause: 1m\n    health:\n      timeout: 3s\n";
    let mut rules = ConfigMapDir::new(&[("app.yaml", &rollout_rule(&app, &rule, "v1", rollout))]);
    let running = Running::start(&ns.client, &ns, &rules);
    parents(&ns, &app, &rule, 4, "v1").await;
    running
        .wait_rollout(&rule, "the first version kept", |r| {
            r["state"] == "Complete"
        })
        .await;

    // v2's `extra` child never counts as ready.
    let broken = rollout_rule(&app, &rule, "v2", rollout).replace(
        "          version: \"v2\"\n",
        "          version: \"v2\"\n      readyWhen: \"self.data.ready | default('no') == 'yes'\"\n",
    );
    assert!(broken.contains("readyWhen"), "{broken}");
    rules.update(&[("app.yaml", &broken)]);
    let back = running
        .wait_rollout(&rule, "rolled back", |r| r["state"] == "RolledBack")
        .await;
    assert_eq!(back["moved"], 2, "{back}");
    assert!(back["failed"].as_u64().unwrap_or(0) >= 1, "{back}");
    wait_on(&cms, &rule, "v1", 4, 4).await;
    let rolled = events(&ns, &app, "RolledBack").await;
    assert_eq!(
        rolled.len(),
        2,
        "a RolledBack Event on each moved parent: {rolled:?}"
    );
    let failed = events(&ns, &app, "RolloutFailed").await;
    assert!(!failed.is_empty(), "a Warning on the failed parent");
    // The failed version is not tried again while the text stays.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(count(&versions(&cms, &rule).await, "v1"), 4);
    running.operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_rollout_moves_nobody_and_writes_nothing() {
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "App").await;
    let rule = support::unique_name("restart");
    let cms: Api<ConfigMap> = ns.api();
    let rollout = "    steps:\n      - percent: 40\n        pause: manual\n";
    let mut rules = ConfigMapDir::new(&[("app.yaml", &rollout_rule(&app, &rule, "v1", rollout))]);
    let running = Running::start(&ns.client, &ns, &rules);
    parents(&ns, &app, &rule, 5, "v1").await;
    running
        .wait_rollout(&rule, "the first version kept", |r| {
            r["state"] == "Complete"
        })
        .await;
    rules.update(&[("app.yaml", &rollout_rule(&app, &rule, "v2", rollout))]);
    running
        .wait_rollout(&rule, "paused", |r| {
            r["state"] == "Paused" && r["moved"] == 2
        })
        .await;
    wait_on(&cms, &rule, "v2", 2, 5).await;
    // Let the last status writes land before taking the picture.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = resource_versions(&ns, &app, &rule).await;
    running.operator.stop().await;

    let running = Running::start(&ns.client, &ns, &rules);
    let after_restart = running
        .wait_rollout(&rule, "the rollout read back", |r| r["state"] == "Paused")
        .await;
    assert_eq!(after_restart["moved"], 2, "{after_restart}");
    // Several ticks and a full pass over every parent.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let after = resource_versions(&ns, &app, &rule).await;
    assert_eq!(before, after, "a restart wrote to a parent or child");
    assert_eq!(count(&versions(&cms, &rule).await, "v2"), 2);

    // `trellis diff` diffs each parent against the version it is due to
    // run: nothing to change, though 3 parents are not on the newest text.
    let kubeconfig = support::cluster()
        .kubeconfig_path
        .clone()
        .expect("a kubeconfig file");
    let mut diff = std::process::Command::new(env!("CARGO_BIN_EXE_trellis"));
    diff.args([
        "diff",
        "--all",
        "-n",
        ns.name(),
        "--rule",
        &rule,
        "--operator-namespace",
        ns.name(),
        "--rules",
    ])
    .arg(rules.path())
    .env("KUBECONFIG", &kubeconfig);
    let out = tokio::task::spawn_blocking(move || diff.output())
        .await
        .expect("join")
        .expect("run trellis diff");
    assert_eq!(
        out.status.code(),
        Some(0),
        "diff during the rollout: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // abort returns everyone.
    decide(&ns, &rule, "abort").await;
    running
        .wait_rollout(&rule, "aborted", |r| r["state"] == "RolledBack")
        .await;
    wait_on(&cms, &rule, "v1", 5, 5).await;
    running.operator.stop().await;
}

/// The operator's requests so far by `verb,resource` labels, watches left
/// out: a watch's renewal is what staying up to date costs.
async fn requests_but_watches(running: &Running) -> BTreeMap<String, f64> {
    running
        .metrics()
        .await
        .lines()
        .filter_map(|line| {
            let (labels, value) = line
                .strip_prefix("trellis_api_requests_total{")?
                .rsplit_once("} ")?;
            // Discovery answers a CRD event: the other tests of this binary
            // install and delete CRDs all the time, and every rule then
            // resolves its kinds again. Not the revision ConfigMaps' polling
            // this guards against, and 0 on a cluster whose CRDs rest.
            if labels.contains("verb=\"watch\"") || labels.contains("resource=\"discovery\"") {
                return None;
            }
            Some((labels.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// Fails when the operator sends any request but a watch within `window`,
/// naming what it sent.
async fn assert_no_request_for(running: &Running, window: Duration, what: &str) {
    let before = requests_but_watches(running).await;
    tokio::time::sleep(window).await;
    let after = requests_but_watches(running).await;
    let sent: Vec<String> = after
        .iter()
        .filter_map(|(labels, n)| {
            let more = n - before.get(labels).copied().unwrap_or(0.0);
            (more > 0.0).then(|| format!("{more} x {{{labels}}}"))
        })
        .collect();
    assert!(
        sent.is_empty(),
        "{what}: requests in {window:?} at rest: {sent:?}"
    );
}

/// Waits (at most `WAIT`) until `quiet` passes without a request but a
/// watch: the last status writes and Events of a step have landed.
async fn settled(running: &Running, quiet: Duration) {
    let deadline = std::time::Instant::now() + WAIT;
    while std::time::Instant::now() < deadline {
        let before = requests_but_watches(running).await;
        tokio::time::sleep(quiet).await;
        if requests_but_watches(running).await == before {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_at_rest_sends_no_request_for_many_ticks_but_its_watches() {
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "App").await;
    let rule = support::unique_name("rest");
    let cms: Api<ConfigMap> = ns.api();
    let rollout = "    steps:\n      - percent: 50\n        pause: manual\n";
    let mut rules = ConfigMapDir::new(&[("app.yaml", &rollout_rule(&app, &rule, "v1", rollout))]);
    let running = Running::start(&ns.client, &ns, &rules);
    parents(&ns, &app, &rule, 4, "v1").await;
    let first = running
        .wait_rollout(&rule, "the first version kept", |r| {
            r["state"] == "Complete"
        })
        .await;
    rules.update(&[("app.yaml", &rollout_rule(&app, &rule, "v2", rollout))]);
    running
        .wait_rollout(&rule, "held at the manual pause", |r| {
            r["state"] == "Paused" && r["moved"] == 2 && r["to"] != first["to"]
        })
        .await;
    wait_on(&cms, &rule, "v2", 2, 4).await;
    settled(&running, Duration::from_secs(3)).await;
    // Five ticks on two live versions, the state read back on each.
    assert_no_request_for(&running, TICK_WINDOW, "paused at a manual step").await;

    // The decision reaches the leader through its watch; then the rollout
    // is complete and at rest again.
    decide(&ns, &rule, "promote").await;
    wait_on(&cms, &rule, "v2", 4, 4).await;
    running
        .wait_rollout(&rule, "complete", |r| r["state"] == "Complete")
        .await;
    settled(&running, Duration::from_secs(3)).await;
    assert_no_request_for(&running, TICK_WINDOW, "complete").await;
    let upgraded = events(&ns, &app, "Upgraded").await;
    assert_eq!(
        upgraded.len(),
        4,
        "one Upgraded Event per parent: {upgraded:?}"
    );
    running.operator.stop().await;
}

/// Five of the rollout's 2 s ticks.
const TICK_WINDOW: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_mid_rollout_restarts_toward_the_newest_version() {
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "App").await;
    let rule = support::unique_name("edit");
    let cms: Api<ConfigMap> = ns.api();
    let rollout = "    steps:\n      - percent: 50\n        pause: manual\n";
    let mut rules = ConfigMapDir::new(&[("app.yaml", &rollout_rule(&app, &rule, "v1", rollout))]);
    let running = Running::start(&ns.client, &ns, &rules);
    parents(&ns, &app, &rule, 4, "v1").await;
    let first = running
        .wait_rollout(&rule, "the first version kept", |r| {
            r["state"] == "Complete"
        })
        .await;
    rules.update(&[("app.yaml", &rollout_rule(&app, &rule, "v2", rollout))]);
    let to_v2 = running
        .wait_rollout(&rule, "paused toward v2", |r| {
            r["state"] == "Paused" && r["to"] != first["to"]
        })
        .await;
    wait_on(&cms, &rule, "v2", 2, 4).await;

    rules.update(&[("app.yaml", &rollout_rule(&app, &rule, "v3", rollout))]);
    let to_v3 = running
        .wait_rollout(&rule, "toward v3", |r| {
            r["to"] != to_v2["to"] && r["state"] == "Paused"
        })
        .await;
    assert_eq!(
        to_v3["from"], first["to"],
        "from the version everyone was on: {to_v3}"
    );
    assert_eq!(to_v3["step"], 1, "{to_v3}");
    // The same order: the two parents on v2 were the first two; they move on to v3.
    wait_on(&cms, &rule, "v3", 2, 4).await;
    let seen = versions(&cms, &rule).await;
    assert_eq!(count(&seen, "v1"), 2, "{seen:?}");
    decide(&ns, &rule, "promote").await;
    wait_on(&cms, &rule, "v3", 4, 4).await;
    let done = running
        .wait_rollout(&rule, "complete", |r| r["state"] == "Complete")
        .await;
    // Parents are counted per live version; the interrupted one has no series left.
    let metrics = running.metrics().await;
    let series = |rev: &Value| {
        format!(
            "trellis_rollout_parents{{rule=\"{rule}\",revision=\"{}\"}}",
            rev.as_str().unwrap_or("?")
        )
    };
    assert!(
        metrics.contains(&format!("{} 4", series(&done["to"]))),
        "{metrics}"
    );
    assert!(!metrics.contains(&series(&to_v2["to"])), "{metrics}");
    running.operator.stop().await;
}

/// Names of the revision ConfigMaps of `rule` in the test's namespace.
async fn revisions(cms: &Api<ConfigMap>, rule: &str) -> Vec<String> {
    cms.list(&ListParams::default().labels(&format!("trellis.dev/revision-of={rule}")))
        .await
        .expect("list revisions")
        .items
        .iter()
        .map(|c| c.name_any())
        .collect()
}

async fn wait_revisions(cms: &Api<ConfigMap>, rule: &str, what: &str, n: usize) {
    support::eventually(what, WAIT, || async {
        let names = revisions(cms, rule).await;
        if names.len() == n {
            Ok(())
        } else {
            Err(format!("{names:?}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_revisions_of_a_removed_rule_or_one_without_rollout_any_more_are_deleted() {
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "App").await;
    let (other, _cleanup_other) = install_kind(&ns, "Other").await;
    let (kept, removed) = (support::unique_name("kept"), support::unique_name("gone"));
    let cms: Api<ConfigMap> = ns.api();
    let rollout = "    steps:\n      - percent: 50\n        pause: manual\n";
    let mut rules = ConfigMapDir::new(&[
        ("app.yaml", &rollout_rule(&app, &kept, "v1", rollout)),
        ("other.yaml", &rollout_rule(&other, &removed, "v1", rollout)),
    ]);
    let running = Running::start(&ns.client, &ns, &rules);
    parents(&ns, &app, &kept, 2, "v1").await;
    for rule in [&kept, &removed] {
        running
            .wait_rollout(rule, "the first version kept", |r| r["state"] == "Complete")
            .await;
        wait_revisions(&cms, rule, "one revision kept", 1).await;
    }

    // `rollout:` dropped from one rule, the other rule removed: no version
    // of either is staged any more, and nothing of theirs is left behind.
    rules.update(&[("app.yaml", &config_rule(&app, &kept, "v2"))]);
    wait_revisions(&cms, &removed, "the removed rule's revisions deleted", 0).await;
    wait_revisions(
        &cms,
        &kept,
        "the revisions of the rule without rollout: deleted",
        0,
    )
    .await;
    wait_on(&cms, &kept, "v2", 2, 2).await;

    // `rollout:` back: a fresh start ("the first version kept"), not the
    // stale record of v1 taken up again (which would send the parents back
    // to v1, the version it names as current).
    rules.update(&[("app.yaml", &rollout_rule(&app, &kept, "v3", rollout))]);
    let back = running
        .wait_rollout(&kept, "the first version kept again", |r| {
            r["state"] == "Complete"
        })
        .await;
    assert_eq!(back["from"], back["to"], "{back}");
    wait_on(&cms, &kept, "v3", 2, 2).await;
    wait_revisions(&cms, &kept, "one revision kept", 1).await;

    // And dropped again, back to the very text (v2) cleared before.
    rules.update(&[("app.yaml", &config_rule(&app, &kept, "v2"))]);
    wait_revisions(&cms, &kept, "the revisions deleted again", 0).await;
    wait_on(&cms, &kept, "v2", 2, 2).await;
    running.operator.stop().await;
}

/// Short Lease timings, so a takeover does not wait out a long lease.
const FAST: &[&str] = &[
    "--leader-elect",
    "--leader-elect-lease-duration=4s",
    "--leader-elect-renew-deadline=3s",
    "--leader-elect-retry-period=1s",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_that_takes_over_mid_rollout_continues_where_the_leader_was() {
    use support::process::Replica;
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "App").await;
    let rule = support::unique_name("takeover");
    let cms: Api<ConfigMap> = ns.api();
    let rollout = "    steps:\n      - percent: 50\n        pause: manual\n";
    let dir = tempfile::tempdir().expect("temp dir");
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).expect("rules dir");
    let write = |version: &str| {
        std::fs::write(
            rules.join("app.yaml"),
            rollout_rule(&app, &rule, version, rollout),
        )
        .expect("rule file")
    };
    write("v1");
    // Two replicas of `trellis run`, processes, their namespace the test's.
    let mut a = Replica::start("replica-a", &ns, dir.path(), FAST);
    a.wait_role(true).await;
    let b = Replica::start("replica-b", &ns, dir.path(), FAST);
    b.wait_role(false).await;
    parents(&ns, &app, &rule, 4, "v1").await;
    on(&a, &rule, "Complete").await;

    write("v2");
    let paused = on(&a, &rule, "Paused").await;
    assert_eq!(paused["moved"], 2, "{paused}");
    wait_on(&cms, &rule, "v2", 2, 4).await;
    // The standby reads the rollout back as the leader keeps it.
    let seen = on(&b, &rule, "Paused").await;
    assert_eq!(
        (seen["to"].clone(), seen["moved"].clone()),
        (paused["to"].clone(), json!(2)),
        "{seen}"
    );

    a.signal("-TERM");
    b.wait_role(true).await;
    a.exited(Duration::from_secs(10)).await;
    // The new leader moves nobody by itself.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(count(&versions(&cms, &rule).await, "v2"), 2);
    let taken = on(&b, &rule, "Paused").await;
    assert_eq!(taken["moved"], 2, "{taken}");

    decide(&ns, &rule, "promote").await;
    wait_on(&cms, &rule, "v2", 4, 4).await;
    on(&b, &rule, "Complete").await;
}

/// `rules.<rule>.rollout` of a replica's `/status`, once in `state`.
async fn on(replica: &support::process::Replica, rule: &str, state: &str) -> Value {
    support::eventually(&format!("{state} on a replica"), WAIT, || async {
        let status = replica.status().await?;
        let r = status["rules"][rule]["rollout"].clone();
        if r["state"] == state {
            Ok(r)
        } else {
            Err(r.to_string())
        }
    })
    .await
}

/// A rule whose one child is of `child_kind` (`ConfigMap` or `Secret`),
/// named `<parent>-<suffix>`, with a manual first step at 50%.
fn one_child_rule(kind: &TestKind, rule: &str, child_kind: &str, suffix: &str) -> String {
    let data = match child_kind {
        // The text differs with the kind, so each is a version of its own.
        "Secret" => "type: Opaque\n        data:\n          kind: U2VjcmV0",
        _ => "data:\n          kind: ConfigMap",
    };
    kind.rule(&format!(
        "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: {rule}\nspec:\n  parent:\n    apiVersion: @API_VERSION@\n    kind: @KIND@\n  children:\n    - id: only\n      apiVersion: v1\n      kind: {child_kind}\n      template: |\n        metadata:\n          name: {{{{ parent.metadata.name ~ \"-{suffix}\" }}}}\n        {data}\n  rollout:\n    steps:\n      - percent: 50\n        pause: manual\n"
    ))
}

/// `trellis rbac --rules <rules> --operator-namespace <ns> [extra]`, the
/// binary, on the test cluster: exit code, printed documents, stderr.
async fn rbac_cli(
    ns: &TestNamespace,
    rules: &std::path::Path,
    extra: &[&str],
) -> (Option<i32>, Vec<Value>, String) {
    let kubeconfig = support::cluster()
        .kubeconfig_path
        .clone()
        .expect("a kubeconfig file");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_trellis"));
    command
        .arg("rbac")
        .arg("--rules")
        .arg(rules)
        .args(["--operator-namespace", ns.name()])
        .args(extra)
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("TRELLIS_OPERATOR_NAMESPACE");
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("join")
        .expect("run trellis rbac");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let documents = serde_saphyr::from_multiple::<Value>(&stdout)
        .unwrap_or_else(|e| panic!("trellis rbac {extra:?} printed no YAML: {e}\n{stdout}"))
        .into_iter()
        .filter(|d| !d.is_null())
        .collect();
    (
        out.status.code(),
        documents,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Whether the operator's ClusterRole (the first document) grants `verb`
/// on `resource` of the core group.
fn cluster_role_grants(documents: &[Value], resource: &str, verb: &str) -> bool {
    let role = &documents[0];
    assert_eq!(role["kind"], "ClusterRole", "{role}");
    role["rules"].as_array().into_iter().flatten().any(|r| {
        let has = |field: &str, want: &str| {
            r[field]
                .as_array()
                .is_some_and(|items| items.iter().any(|i| i == want))
        };
        has("apiGroups", "") && has("resources", resource) && has("verbs", verb)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_from_cluster_covers_the_older_version_a_rollout_still_runs() {
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "App").await;
    let rule = support::unique_name("rbac");
    let cms: Api<ConfigMap> = ns.api();
    let secrets: Api<Secret> = ns.api();
    let mut rules = ConfigMapDir::new(&[(
        "app.yaml",
        &one_child_rule(&app, &rule, "ConfigMap", "config"),
    )]);
    let running = Running::start(&ns.client, &ns, &rules);
    for p in ["p0", "p1"] {
        app.create(&ns, p, json!({"greeting": "hi"}), &[]).await;
    }
    let first = running
        .wait_rollout(&rule, "the first version kept", |r| {
            r["state"] == "Complete"
        })
        .await;
    support::eventually("both parents' ConfigMaps", WAIT, || async {
        let n = children(&cms, &rule).await.len();
        if n == 2 { Ok(()) } else { Err(n) }
    })
    .await;

    // The new version writes a Secret instead; one parent of two moves,
    // then the rollout holds: both versions are live.
    rules.update(&[("app.yaml", &one_child_rule(&app, &rule, "Secret", "secret"))]);
    let paused = running
        .wait_rollout(&rule, "paused at the manual step", |r| {
            r["state"] == "Paused" && r["to"] != first["to"] && r["moved"] == 1
        })
        .await;
    let old = paused["from"].as_str().expect("from").to_owned();
    let new = paused["to"].as_str().expect("to").to_owned();
    assert_eq!(old, first["to"], "{paused}");
    support::eventually("a Secret for the moved parent", WAIT, || async {
        let moved: Vec<Secret> = children(&secrets, &rule).await;
        if moved.len() == 1 {
            Ok(())
        } else {
            Err(moved.len())
        }
    })
    .await;
    let staying = children(&cms, &rule).await;
    assert_eq!(
        staying.len(),
        1,
        "one parent still on the ConfigMap version: {:?}",
        staying.iter().map(|c| c.name_any()).collect::<Vec<_>>()
    );

    // With --from-cluster: the old version's kind is granted beside the
    // new one's, and stderr names the revision read back.
    let (code, documents, stderr) = rbac_cli(&ns, &rules.path(), &["--from-cluster"]).await;
    assert_eq!(code, Some(0), "stderr:\n{stderr}");
    for verb in ["get", "list", "watch", "create", "patch", "delete"] {
        assert!(
            cluster_role_grants(&documents, "configmaps", verb),
            "the old version's ConfigMaps ({verb}) not granted:\n{}\nstderr:\n{stderr}",
            documents[0]
        );
        assert!(
            cluster_role_grants(&documents, "secrets", verb),
            "the new version's Secrets ({verb}) not granted:\n{}",
            documents[0]
        );
    }
    let covered = format!(
        "rule {rule}: covers live revision {old} (ConfigMap {}/trellis-revision-{rule}-{old}) beside the version on disk ({new})",
        ns.name()
    );
    assert!(stderr.contains(&covered), "want {covered:?} in:\n{stderr}");
    assert!(!stderr.contains("note:"), "stderr:\n{stderr}");

    // Without it: the rules on disk only (no ConfigMaps in the ClusterRole:
    // the revision ConfigMaps are granted in the Role, not here), and a
    // note naming the rule it cannot vouch for.
    let (code, documents, stderr) = rbac_cli(&ns, &rules.path(), &[]).await;
    assert_eq!(code, Some(0), "stderr:\n{stderr}");
    assert!(
        cluster_role_grants(&documents, "secrets", "create"),
        "{}",
        documents[0]
    );
    assert!(
        !cluster_role_grants(&documents, "configmaps", "get"),
        "the disk's version has no ConfigMap child:\n{}",
        documents[0]
    );
    assert!(
        stderr.contains(&format!("note: rules with rollout: ({rule})"))
            && stderr.contains("--from-cluster"),
        "stderr:\n{stderr}"
    );
    assert!(!stderr.contains(&old), "stderr:\n{stderr}");
    running.operator.stop().await;
}

/// Every `data.version` any of `rule`'s children in `ns` shows from now on,
/// as a watch sees them (so a version written and replaced in between two
/// looks is still seen).
fn versions_ever_seen(
    ns: &TestNamespace,
    rule: &str,
) -> (
    std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
    tokio::task::JoinHandle<()>,
) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let seen = std::sync::Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let cms: Api<ConfigMap> = ns.api();
    let config = watcher::Config::default().labels(&format!("trellis.dev/rule={rule}"));
    let task = tokio::spawn({
        let seen = seen.clone();
        async move {
            let mut events = watcher(cms, config).applied_objects().boxed();
            while let Some(event) = events.next().await {
                if let Ok(cm) = event
                    && let Some(v) = config_data(&cm, "version")
                {
                    seen.lock().unwrap().insert(v);
                }
            }
        }
    });
    (seen, task)
}

/// Issue 36: a rule edit moments after trellis starts was taken as the
/// rule's "first" version, and moved every parent at once, when parents
/// had already run the version trellis started with. Whatever the timing,
/// a parent that ran v1 is moved to v2 only by the rollout's steps (25 %,
/// then a manual pause: at most 2 of 8); parents may all start on v2 only
/// when none ever ran v1. Many rounds, the edit landing at a different
/// moment of the first seconds in each; then a restart with an edit
/// within its first second: staged too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_in_the_first_seconds_after_a_start_is_staged_from_the_version_parents_ran() {
    const PARENTS: usize = 8;
    const MOVED_AT_FIRST_STEP: usize = 2; // ⌈25 % of 8⌉
    let rollout = "    steps:\n      - percent: 25\n        pause: manual\n";
    let first = support::namespace().await;
    let (app, _cleanup) = install_kind(&first, "App").await;
    let mut staged_rounds = 0;
    for (round, edit_after_ms) in [150u64, 400, 700, 1000, 1500, 2200].into_iter().enumerate() {
        let ns = support::namespace().await;
        let rule = support::unique_name("first");
        let cms: Api<ConfigMap> = ns.api();
        for i in 0..PARENTS {
            app.create(&ns, &format!("p{i}"), json!({"greeting": "hi"}), &[])
                .await;
        }
        let (seen, watching) = versions_ever_seen(&ns, &rule);
        let mut rules =
            ConfigMapDir::new(&[("app.yaml", &rollout_rule(&app, &rule, "v1", rollout))]);
        let running = Running::start(&ns.client, &ns, &rules);
        tokio::time::sleep(Duration::from_millis(edit_after_ms)).await;
        rules.update(&[("app.yaml", &rollout_rule(&app, &rule, "v2", rollout))]);
        // Settled: every parent has its children, and the rollout is paused
        // at its manual step with 2 moved (v1 recorded first), or complete
        // with everyone on v2 (v2 first, or every parent moved at once).
        let (state, now) = support::eventually("the rollout settled", WAIT, || async {
            let now = versions(&cms, &rule).await;
            let status = http_get_json(running.addr, "/status").await?;
            let r = status["rules"][rule.as_str()]["rollout"].clone();
            let v2 = count(&now, "v2");
            let paused = r["state"] == "Paused" && r["moved"] == MOVED_AT_FIRST_STEP;
            let complete = r["state"] == "Complete" && v2 == PARENTS;
            if now.len() == PARENTS && (paused && v2 == MOVED_AT_FIRST_STEP || complete) {
                Ok((r, now))
            } else {
                Err(format!("rollout {r}, children {now:?}"))
            }
        })
        .await;
        // Time for any further move to show.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = {
            let later = versions(&cms, &rule).await;
            assert_eq!(
                later, now,
                "round {round}: parents moved after the rollout settled"
            );
            later
        };
        let ran_v1 = seen.lock().unwrap().contains("v1");
        eprintln!(
            "[rollout] round {round}, edit after {edit_after_ms} ms: parents ran v1: {ran_v1}; on v2: {}; rollout {state}",
            count(&now, "v2")
        );
        if ran_v1 {
            staged_rounds += 1;
            assert!(
                count(&now, "v2") <= MOVED_AT_FIRST_STEP,
                "round {round} (edit after {edit_after_ms} ms): parents ran v1, and the edit moved {} of {PARENTS} at once: {now:?}; rollout {state}",
                count(&now, "v2")
            );
        } else {
            assert_eq!(count(&now, "v2"), PARENTS, "round {round}: {now:?}");
        }

        // A restart, and an edit within its first second: staged from the
        // version each parent is on, never everyone at once.
        let on_v3_before = count(&now, "v3");
        running.operator.stop().await;
        let running = Running::start(&ns.client, &ns, &rules);
        tokio::time::sleep(Duration::from_millis(100 + 150 * round as u64)).await;
        rules.update(&[("app.yaml", &rollout_rule(&app, &rule, "v3", rollout))]);
        running
            .wait_rollout(&rule, "the edit after the restart is staged", |r| {
                r["state"] == "Paused" && r["moved"] == MOVED_AT_FIRST_STEP
            })
            .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after = versions(&cms, &rule).await;
        assert_eq!(on_v3_before, 0);
        assert!(
            count(&after, "v3") <= MOVED_AT_FIRST_STEP,
            "round {round}: an edit right after a restart moved {} of {PARENTS} at once: {after:?}",
            count(&after, "v3")
        );
        running.operator.stop().await;
        watching.abort();
    }
    // Not vacuous: some rounds had parents run v1 before the edit.
    assert!(
        staged_rounds > 0,
        "no round had a parent run v1 before the edit: the test proved nothing"
    );
}
