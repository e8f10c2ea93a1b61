//! Hot reload against the real control plane (issue "Hot reload").
//!
//! Each test runs `trellis run` in-process on a rules directory laid out as
//! the kubelet lays out a ConfigMap volume ([`ConfigMapDir`]), watching only
//! the test's namespace, with parent kinds in an API group of the test's own.
//! Rule changes are made as the kubelet makes them: a new timestamped
//! directory swapped in by renaming `..data`. The operator's `/status`
//! endpoint says what the last reload did.
mod support;

#[path = "support/configmap_dir.rs"]
mod configmap_dir;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use trellis::operator::{FINALIZER, Options};
use trellis::rules::RuleSet;

use configmap_dir::ConfigMapDir;
use support::TestNamespace;
use support::operator::{Cleanup, QUIET, TestKind, WAIT, wait_exists, wait_for, wait_gone};

/// Two ConfigMaps per parent. `@VERSION@` is written into each child's
/// `data.version`, so a child shows which rule text rendered it.
const CONFIG_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: @RULE@
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
          greeting: {{ spec.greeting }}
          version: "@VERSION@"
    - id: extra
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-extra" }}
        data:
          version: "@VERSION@"
"#;

/// A child of another kind, appended to [`CONFIG_RULE`]'s children.
const SECRET_CHILD: &str = r#"    - id: secret
      apiVersion: v1
      kind: Secret
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-secret" }}
        data:
          token: {{ "token" | b64encode }}
"#;

/// [`CONFIG_RULE`] for `kind`, named `rule`, stamping `version`.
fn config_rule(kind: &TestKind, rule: &str, version: &str) -> String {
    kind.rule(CONFIG_RULE)
        .replace("@RULE@", rule)
        .replace("@VERSION@", version)
}

/// [`config_rule`] behind trellis's finalizer, with `onRuleRemoved: policy`.
fn finalized_rule(kind: &TestKind, rule: &str, policy: &str) -> String {
    format!(
        "{}  deletion:\n    order: reverse\n  onRuleRemoved: {policy}\n",
        config_rule(kind, rule, "v1")
    )
}

/// `trellis run` in a task of the test's runtime, reloading `rules`.
struct Reloading {
    cancel: CancellationToken,
    task: Option<JoinHandle<anyhow::Result<()>>>,
    /// Where `/status` is served.
    addr: SocketAddr,
}

impl Reloading {
    /// Starts the operator on `rules` with a short debounce and poll,
    /// watching only `namespace`.
    fn start(client: &Client, namespace: &str, rules: &ConfigMapDir) -> Reloading {
        let dir = rules.path();
        let set =
            RuleSet::load(std::slice::from_ref(&dir), Default::default()).unwrap_or_else(|diags| {
                let text: Vec<String> = diags.iter().map(|d| d.to_string()).collect();
                panic!("test rules do not load:\n{}", text.join("\n"))
            });
        let addr = free_local_addr();
        let options = Options {
            reload_debounce: Duration::from_millis(200),
            reload_poll: Duration::from_secs(2),
            instance: "test".into(),
            metrics_addr: Some(addr),
            ..Options::new(vec![dir], vec![namespace.to_owned()])
        };
        let cancel = CancellationToken::new();
        let task = tokio::spawn(trellis::operator::run_with(
            options,
            set,
            client.clone(),
            cancel.clone(),
        ));
        Reloading {
            cancel,
            task: Some(task),
            addr,
        }
    }

    /// Polls `/status` until its `reload` part satisfies `check`; returns it.
    async fn wait_reload(&self, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        support::eventually(what, WAIT, || async {
            let status = http_get_json(self.addr, "/status").await?;
            let reload = status["reload"].clone();
            if check(&reload) {
                Ok(reload)
            } else {
                Err(format!("reload status {reload}"))
            }
        })
        .await
    }

    /// Cancels the operator and asserts that it exits, cleanly and promptly.
    async fn stop(mut self) {
        self.cancel.cancel();
        let task = self.task.take().expect("operator task");
        match tokio::time::timeout(WAIT, task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => panic!("the operator failed: {e:#}"),
            Ok(Err(e)) => panic!("the operator task panicked: {e}"),
            Err(_) => panic!("the operator did not stop within {WAIT:?} of being cancelled"),
        }
    }
}

impl Drop for Reloading {
    fn drop(&mut self) {
        // A test that panicked never called `stop`.
        self.cancel.cancel();
    }
}

/// A loopback address nothing listens on (yet).
fn free_local_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}

/// `GET path` over plain HTTP/1.0, body parsed as JSON.
async fn http_get_json(addr: SocketAddr, path: &str) -> Result<Value, String> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .await
        .map_err(|e| e.to_string())?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("not an HTTP response: {response}"))?;
    if !head.starts_with("HTTP/1.") || !head.contains(" 200 ") {
        return Err(format!("GET {path}: {head}"));
    }
    serde_json::from_str(body).map_err(|e| format!("GET {path}: {e}: {body}"))
}

/// A fresh parent kind, its CRD installed and removed at the end.
async fn install_kind(ns: &TestNamespace, kind: &str) -> (TestKind, Cleanup) {
    let test_kind = TestKind::new(kind);
    let cleanup = Cleanup::crds(&[&test_kind]);
    test_kind.install(&ns.client).await;
    (test_kind, cleanup)
}

fn data(cm: &ConfigMap, key: &str) -> Option<String> {
    cm.data.as_ref().and_then(|d| d.get(key)).cloned()
}

/// The children of `rule` in `api`'s namespace.
async fn children<K>(api: &Api<K>, rule: &str) -> Vec<K>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&ListParams::default().labels(&format!("trellis.dev/rule={rule}")))
        .await
        .expect("list children")
        .items
}

/// Child name → (uid, resourceVersion): what any change or re-creation moves.
async fn fingerprints(cms: &Api<ConfigMap>, rule: &str) -> BTreeMap<String, (String, String)> {
    children(cms, rule)
        .await
        .iter()
        .map(|cm| {
            (
                cm.name_any(),
                (
                    cm.uid().unwrap_or_default(),
                    cm.resource_version().unwrap_or_default(),
                ),
            )
        })
        .collect()
}

/// Waits until `names` all exist as children of `rule` carrying `version`.
async fn wait_versions(cms: &Api<ConfigMap>, rule: &str, names: &[&str], version: &str) {
    support::eventually(&format!("{names:?} at {version}"), WAIT, || async {
        let found: BTreeMap<String, Option<String>> = children(cms, rule)
            .await
            .iter()
            .map(|cm| (cm.name_any(), data(cm, "version")))
            .collect();
        let all = names
            .iter()
            .all(|n| found.get(*n).is_some_and(|v| v.as_deref() == Some(version)));
        if all { Ok(()) } else { Err(found) }
    })
    .await
}

fn has_finalizer(obj: &DynamicObject) -> bool {
    obj.finalizers().iter().any(|f| f == FINALIZER)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_edit_reaches_existing_children() {
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "App").await;
    let rule = support::unique_name("edit");
    let mut rules = ConfigMapDir::new(&[("app.yaml", &config_rule(&app, &rule, "v1"))]);
    let operator = Reloading::start(&ns.client, ns.name(), &rules);
    app.create(&ns, "shop", json!({"greeting": "hi"}), &[])
        .await;
    let cms: Api<ConfigMap> = ns.api();
    wait_versions(&cms, &rule, &["shop-config", "shop-extra"], "v1").await;

    let swapped = rules.update(&[("app.yaml", &config_rule(&app, &rule, "v2"))]);
    let latency = loop {
        let cm = cms.get("shop-config").await.expect("GET shop-config");
        if data(&cm, "version").as_deref() == Some("v2") {
            break swapped.elapsed();
        }
        assert!(
            swapped.elapsed() < Duration::from_secs(5),
            "the edit did not reach the child within 5 s: {:?}",
            cm.data
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("reload latency (..data swap to child showing the new template): {latency:?}");
    wait_versions(&cms, &rule, &["shop-config", "shop-extra"], "v2").await;
    let cm = cms.get("shop-config").await.expect("GET shop-config");
    assert_eq!(data(&cm, "greeting").as_deref(), Some("hi"));
    let reload = operator
        .wait_reload("one successful reload", |r| r["successes"] == 1)
        .await;
    assert_eq!(reload["ok"], true, "{reload}");
    assert_eq!(reload["failures"], 0, "{reload}");
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_rule_file_starts_managing_its_kind() {
    let ns = support::namespace().await;
    let (app, _app_cleanup) = install_kind(&ns, "App").await;
    let (db, _db_cleanup) = install_kind(&ns, "Db").await;
    let app_rule = support::unique_name("app");
    let db_rule = support::unique_name("db");
    let app_text = config_rule(&app, &app_rule, "v1");
    let mut rules = ConfigMapDir::new(&[("app.yaml", &app_text)]);
    let operator = Reloading::start(&ns.client, ns.name(), &rules);
    app.create(&ns, "shop", json!({"greeting": "hi"}), &[])
        .await;
    db.create(&ns, "orders", json!({"greeting": "rows"}), &[])
        .await;
    let cms: Api<ConfigMap> = ns.api();
    wait_versions(&cms, &app_rule, &["shop-config", "shop-extra"], "v1").await;
    assert!(
        children(&cms, &db_rule).await.is_empty(),
        "no rule manages Db yet"
    );
    let app_children = fingerprints(&cms, &app_rule).await;

    rules.update(&[
        ("app.yaml", &app_text),
        ("db.yaml", &config_rule(&db, &db_rule, "v1")),
    ]);
    wait_versions(&cms, &db_rule, &["orders-config", "orders-extra"], "v1").await;
    let cm = cms.get("orders-config").await.expect("GET orders-config");
    assert_eq!(data(&cm, "greeting").as_deref(), Some("rows"));
    let owner = &cm.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Db", "orders"));
    let reload = operator
        .wait_reload("the new rule loaded", |r| r["successes"] == 1)
        .await;
    assert_eq!(reload["rules"], 2, "{reload}");
    assert_eq!(
        fingerprints(&cms, &app_rule).await,
        app_children,
        "the unchanged rule's children were not touched"
    );
    operator.stop().await;
}

/// Parents `a` and `b` of a rule behind trellis's finalizer, converged; then
/// the rule file is removed. Returns what the test needs to look at.
async fn remove_finalized_rule(
    ns: &TestNamespace,
    app: &TestKind,
    policy: &str,
) -> (Reloading, String, BTreeMap<String, (String, String)>) {
    let rule = support::unique_name(policy);
    let mut rules = ConfigMapDir::new(&[("app.yaml", &finalized_rule(app, &rule, policy))]);
    let operator = Reloading::start(&ns.client, ns.name(), &rules);
    for name in ["a", "b"] {
        app.create(ns, name, json!({"greeting": "hi"}), &[]).await;
    }
    let cms: Api<ConfigMap> = ns.api();
    wait_versions(
        &cms,
        &rule,
        &["a-config", "a-extra", "b-config", "b-extra"],
        "v1",
    )
    .await;
    for name in ["a", "b"] {
        wait_for(&app.api(ns), name, "trellis's finalizer", |p| {
            has_finalizer(p)
                .then_some(())
                .ok_or_else(|| "no finalizer yet".to_owned())
        })
        .await;
    }
    let before = fingerprints(&cms, &rule).await;

    rules.update(&[]);
    let reload = operator
        .wait_reload("the rule's removal", |r| r["successes"] == 1)
        .await;
    assert_eq!(reload["rules"], 0, "{reload}");
    (operator, rule, before)
}

/// Waits until no parent carries trellis's finalizer.
async fn wait_finalizers_released(ns: &TestNamespace, app: &TestKind) {
    let parents = app.api(ns);
    for name in ["a", "b"] {
        wait_for(&parents, name, "the finalizer released", |p| {
            (!has_finalizer(p))
                .then_some(())
                .ok_or(format!("finalizers {:?}", p.finalizers()))
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_orphan_rule_leaves_children_and_releases_finalizers() {
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "App").await;
    let (operator, rule, before) = remove_finalized_rule(&ns, &app, "orphan").await;
    wait_finalizers_released(&ns, &app).await;
    let cms: Api<ConfigMap> = ns.api();
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        fingerprints(&cms, &rule).await,
        before,
        "orphaned children stay as they were"
    );
    // The rule is gone: nothing restores a deleted child.
    cms.delete("a-config", &DeleteParams::default())
        .await
        .expect("delete a-config");
    tokio::time::sleep(QUIET).await;
    assert!(
        cms.get_opt("a-config").await.expect("GET").is_none(),
        "a removed rule re-created a child"
    );
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_delete_rule_deletes_children_and_releases_finalizers() {
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "App").await;
    let (operator, rule, _) = remove_finalized_rule(&ns, &app, "delete").await;
    let cms: Api<ConfigMap> = ns.api();
    support::eventually("every child deleted", WAIT, || async {
        let left: Vec<String> = children(&cms, &rule)
            .await
            .iter()
            .map(|c| c.name_any())
            .collect();
        if left.is_empty() { Ok(()) } else { Err(left) }
    })
    .await;
    wait_finalizers_released(&ns, &app).await;
    // Parents can be deleted now that nothing holds them.
    for name in ["a", "b"] {
        app.api(&ns)
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete parent");
        wait_gone(&app.api(&ns), name, WAIT).await;
    }
    operator.stop().await;
}

/// A good rule set with two converged parents; then `bad` (files of a new,
/// broken set, in which the good rule moved to `v2`) is swapped in. The
/// change must be rejected whole, visibly (`/status` names `expect`), the
/// running rules must keep reconciling as before, and no child may move.
async fn rejected_change_changes_nothing(
    bad: impl FnOnce(&TestKind, &str) -> Vec<(&'static str, String)>,
    expect: &str,
) {
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "App").await;
    let rule = support::unique_name("app");
    let mut rules = ConfigMapDir::new(&[("app.yaml", &config_rule(&app, &rule, "v1"))]);
    let operator = Reloading::start(&ns.client, ns.name(), &rules);
    for name in ["a", "b"] {
        app.create(&ns, name, json!({"greeting": "hi"}), &[]).await;
    }
    let cms: Api<ConfigMap> = ns.api();
    let all = ["a-config", "a-extra", "b-config", "b-extra"];
    wait_versions(&cms, &rule, &all, "v1").await;
    let before = fingerprints(&cms, &rule).await;

    let files = bad(&app, &rule);
    let files: Vec<(&str, &str)> = files.iter().map(|(k, v)| (*k, v.as_str())).collect();
    rules.update(&files);
    let reload = operator
        .wait_reload("the broken set rejected", |r| r["failures"] == 1)
        .await;
    assert_eq!(reload["ok"], false, "{reload}");
    assert_eq!(reload["successes"], 0, "{reload}");
    assert_eq!(reload["rules"], 1, "the previous set is in force: {reload}");
    let error = reload["error"].as_str().unwrap_or_default();
    assert!(error.contains(expect), "{expect:?} not in {error:?}");

    // The previous rules still run: a deleted child comes back as they
    // render it, and a parent edit still reaches its child.
    let old_uid = before["a-config"].0.clone();
    cms.delete("a-config", &DeleteParams::default())
        .await
        .expect("delete a-config");
    wait_for(&cms, "a-config", "a-config re-created at v1", |cm| {
        let fresh = cm.uid() != Some(old_uid.clone());
        let v1 = data(cm, "version").as_deref() == Some("v1");
        (fresh && v1).then_some(()).ok_or(format!("{:?}", cm.data))
    })
    .await;
    app.api(&ns)
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"greeting": "hello again"}})),
        )
        .await
        .expect("patch parent a");
    wait_for(&cms, "a-config", "a-config following the parent", |cm| {
        let follows = data(cm, "greeting").as_deref() == Some("hello again");
        let v1 = data(cm, "version").as_deref() == Some("v1");
        (follows && v1)
            .then_some(())
            .ok_or(format!("{:?}", cm.data))
    })
    .await;

    // Nothing else moved, also after a while.
    tokio::time::sleep(QUIET).await;
    let mut after = fingerprints(&cms, &rule).await;
    let mut before = before;
    assert!(after.remove("a-config").is_some(), "a-config is gone");
    before.remove("a-config");
    assert_eq!(after, before, "a rejected rule set moved children");

    // A good change after the rejected one is taken up.
    rules.update(&[("app.yaml", &config_rule(&app, &rule, "v2"))]);
    wait_versions(&cms, &rule, &all, "v2").await;
    let reload = operator
        .wait_reload("the fixed set loaded", |r| r["successes"] == 1)
        .await;
    assert_eq!(reload["ok"], true, "{reload}");
    assert_eq!(reload["error"], Value::Null, "{reload}");
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_with_broken_yaml_is_rejected_and_changes_nothing() {
    rejected_change_changes_nothing(
        |app, rule| {
            vec![
                ("app.yaml", config_rule(app, rule, "v2")),
                (
                    "broken.yaml",
                    "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata: {name: [oops\n"
                        .to_owned(),
                ),
            ]
        },
        "broken.yaml",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_with_a_dependency_cycle_is_rejected_and_changes_nothing() {
    rejected_change_changes_nothing(
        |app, rule| {
            let cyclic = config_rule(app, rule, "v2")
                .replace(
                    "    - id: config\n",
                    "    - id: config\n      dependsOn: [extra]\n",
                )
                .replace(
                    "    - id: extra\n",
                    "    - id: extra\n      dependsOn: [config]\n",
                );
            vec![("app.yaml", cyclic)]
        },
        "dependency cycle",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_with_a_name_outside_the_evaluation_context_is_rejected_and_changes_nothing() {
    rejected_change_changes_nothing(
        |app, rule| {
            let typo = config_rule(app, rule, "v2").replace(
                r#"parent.metadata.name ~ "-extra""#,
                r#"parnet.metadata.name ~ "-extra""#,
            );
            vec![("app.yaml", typo)]
        },
        "`parnet` is not in the evaluation context",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_dropped_from_a_rule_are_deleted() {
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "App").await;
    let rule = support::unique_name("drop");
    let with_secret = format!("{}{SECRET_CHILD}", config_rule(&app, &rule, "v1"));
    let mut rules = ConfigMapDir::new(&[("app.yaml", &with_secret)]);
    let operator = Reloading::start(&ns.client, ns.name(), &rules);
    app.create(&ns, "shop", json!({"greeting": "hi"}), &[])
        .await;
    let cms: Api<ConfigMap> = ns.api();
    let secrets: Api<Secret> = ns.api();
    wait_versions(&cms, &rule, &["shop-config", "shop-extra"], "v1").await;
    wait_exists(&secrets, "shop-secret").await;

    // Only `config` stays: `extra` shares its kind with it (same watches),
    // `secret` was the rule's only Secret (its watch goes away).
    let only_config = config_rule(&app, &rule, "v1")
        .split("    - id: extra\n")
        .next()
        .expect("rule text")
        .to_owned();
    rules.update(&[("app.yaml", &only_config)]);
    wait_gone(&cms, "shop-extra", WAIT).await;
    wait_gone(&secrets, "shop-secret", WAIT).await;
    assert!(cms.get_opt("shop-config").await.expect("GET").is_some());
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_rule_cleans_up_only_in_the_operators_namespaces() {
    let ns = support::namespace().await;
    // Another namespace, with a parent of the same kind that another trellis
    // instance (same rule name) manages: its child and its finalizer.
    let other = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "App").await;
    let rule = support::unique_name("scoped");
    let foreign = app.create(&other, "theirs", json!({}), &[]).await;
    app.api(&other)
        .patch(
            "theirs",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": [FINALIZER]}})),
        )
        .await
        .expect("add the other instance's finalizer");
    let foreign_child: ConfigMap = serde_json::from_value(json!({
        "metadata": {
            "name": "theirs-config",
            "labels": {
                "app.kubernetes.io/managed-by": "trellis",
                "trellis.dev/rule": rule,
                "trellis.dev/child": "config",
                "trellis.dev/parent-uid": foreign.uid().unwrap_or_default(),
            },
        },
        "data": {"version": "theirs"},
    }))
    .expect("ConfigMap");
    let other_cms: Api<ConfigMap> = other.api();
    other_cms
        .create(&Default::default(), &foreign_child)
        .await
        .expect("create the other instance's child");

    let mut rules = ConfigMapDir::new(&[("app.yaml", &finalized_rule(&app, &rule, "delete"))]);
    let operator = Reloading::start(&ns.client, ns.name(), &rules);
    app.create(&ns, "mine", json!({"greeting": "hi"}), &[])
        .await;
    let cms: Api<ConfigMap> = ns.api();
    wait_versions(&cms, &rule, &["mine-config", "mine-extra"], "v1").await;
    rules.update(&[]);
    operator
        .wait_reload("the rule's removal", |r| r["successes"] == 1)
        .await;
    wait_gone(&cms, "mine-config", WAIT).await;
    wait_for(&app.api(&ns), "mine", "the finalizer released", |p| {
        (!has_finalizer(p))
            .then_some(())
            .ok_or_else(|| "finalizer still set".to_owned())
    })
    .await;
    tokio::time::sleep(QUIET).await;
    let child_left = other_cms.get_opt("theirs-config").await.expect("GET");
    let parent_after = app.api(&other).get("theirs").await.expect("GET theirs");
    // Let the namespace go whatever the outcome.
    app.api(&other)
        .patch(
            "theirs",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("release the other instance's finalizer");
    operator.stop().await;
    assert!(
        child_left.is_some(),
        "a child in a namespace the operator does not watch was deleted"
    );
    assert!(
        has_finalizer(&parent_after),
        "a finalizer in a namespace the operator does not watch was released"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_moved_to_another_parent_kind_lets_go_of_the_old_kinds_parents() {
    let ns = support::namespace().await;
    let (app, _app_cleanup) = install_kind(&ns, "App").await;
    let (site, _site_cleanup) = install_kind(&ns, "Site").await;
    let rule = support::unique_name("moved");
    let mut rules = ConfigMapDir::new(&[("app.yaml", &finalized_rule(&app, &rule, "delete"))]);
    let operator = Reloading::start(&ns.client, ns.name(), &rules);
    app.create(&ns, "old", json!({"greeting": "hi"}), &[]).await;
    site.create(&ns, "new", json!({"greeting": "hi"}), &[])
        .await;
    let cms: Api<ConfigMap> = ns.api();
    wait_versions(&cms, &rule, &["old-config", "old-extra"], "v1").await;
    wait_for(&app.api(&ns), "old", "trellis's finalizer", |p| {
        has_finalizer(p)
            .then_some(())
            .ok_or_else(|| "no finalizer yet".to_owned())
    })
    .await;

    rules.update(&[("app.yaml", &finalized_rule(&site, &rule, "delete"))]);
    wait_versions(&cms, &rule, &["new-config", "new-extra"], "v1").await;
    wait_gone(&cms, "old-config", WAIT).await;
    wait_gone(&cms, "old-extra", WAIT).await;
    wait_for(&app.api(&ns), "old", "the finalizer released", |p| {
        (!has_finalizer(p))
            .then_some(())
            .ok_or_else(|| "finalizer still set".to_owned())
    })
    .await;
    operator.stop().await;
}
