//! Hot reload against the real control plane (issue "Hot reload"): edits,
//! new, removed and reshaped rules. Rejected rule sets are in
//! `reload_rejected.rs`.
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
#[path = "support/reloading.rs"]
mod reloading;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use trellis::operator::FINALIZER;

use configmap_dir::ConfigMapDir;
use reloading::{Reloading, children, config_rule, fingerprints, wait_versions};
use support::TestNamespace;
use support::operator::{
    QUIET, TestKind, WAIT, config_data, has_finalizer, install_kind, wait_exists, wait_finalizer,
    wait_finalizer_released, wait_gone,
};

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

/// [`config_rule`] behind trellis's finalizer, with `onRuleRemoved: policy`.
fn finalized_rule(kind: &TestKind, rule: &str, policy: &str) -> String {
    format!(
        "{}  deletion:\n    order: reverse\n  onRuleRemoved: {policy}\n",
        config_rule(kind, rule, "v1")
    )
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
        if config_data(&cm, "version").as_deref() == Some("v2") {
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
    assert_eq!(config_data(&cm, "greeting").as_deref(), Some("hi"));
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
    assert_eq!(config_data(&cm, "greeting").as_deref(), Some("rows"));
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
        wait_finalizer(&app.api(ns), name).await;
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
        wait_finalizer_released(&parents, name).await;
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
    wait_finalizer_released(&app.api(&ns), "mine").await;
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
    wait_finalizer(&app.api(&ns), "old").await;

    rules.update(&[("app.yaml", &finalized_rule(&site, &rule, "delete"))]);
    wait_versions(&cms, &rule, &["new-config", "new-extra"], "v1").await;
    wait_gone(&cms, "old-config", WAIT).await;
    wait_gone(&cms, "old-extra", WAIT).await;
    wait_finalizer_released(&app.api(&ns), "old").await;
    operator.stop().await;
}

#[test]
fn the_rules_directory_is_updated_as_the_kubelet_updates_a_configmap_volume() {
    let mut dir = ConfigMapDir::new(&[("a.yaml", "1"), ("b.yaml", "1")]);
    let root = dir.path();
    assert_eq!(fs::read_to_string(root.join("a.yaml")).unwrap(), "1");
    dir.update(&[("a.yaml", "2"), ("c.yaml", "2")]);
    assert_eq!(fs::read_to_string(root.join("a.yaml")).unwrap(), "2");
    assert_eq!(fs::read_to_string(root.join("c.yaml")).unwrap(), "2");
    assert!(fs::symlink_metadata(root.join("b.yaml")).is_err());
    assert_eq!(
        fs::read_link(root.join("a.yaml")).unwrap(),
        Path::new("..data/a.yaml")
    );
    assert_eq!(
        fs::read_link(root.join("..data")).unwrap(),
        Path::new("..2026_11_29_09_00_00.2")
    );
    let mut entries: Vec<String> = fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    assert_eq!(
        entries,
        ["..2026_11_29_09_00_00.2", "..data", "a.yaml", "c.yaml"]
    );
}
