//! Hot reload against the real control plane: a rule change that fails
//! validation is rejected, visibly, and the rule goes on as before (see
//! `reload.rs` for the setup these tests share; `reload_partial.rs` for a
//! broken rule among good ones).
mod support;

#[path = "support/configmap_dir.rs"]
mod configmap_dir;
#[path = "support/reloading.rs"]
mod reloading;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

use configmap_dir::ConfigMapDir;
use reloading::{Reloading, config_rule, fingerprints, wait_versions};
use support::operator::{QUIET, TestKind, config_data, install_kind, wait_for};

/// A good rule set with two converged parents; then `bad` (files of a new
/// set in which the rule, moved to `v2`, is broken) is swapped in. The
/// change must be rejected, visibly (`/status` names `expect`, for the
/// rule), the rule must keep reconciling as before, and no child may move.
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
    let why = reload["rejected"][&rule][0].as_str().unwrap_or_default();
    assert!(why.contains(expect), "the rule's rejection: {reload}");

    // The previous rules still run: a deleted child comes back as they
    // render it, and a parent edit still reaches its child.
    let old_uid = before["a-config"].0.clone();
    cms.delete("a-config", &DeleteParams::default())
        .await
        .expect("delete a-config");
    wait_for(&cms, "a-config", "a-config re-created at v1", |cm| {
        let fresh = cm.uid() != Some(old_uid.clone());
        let v1 = config_data(cm, "version").as_deref() == Some("v1");
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
        let follows = config_data(cm, "greeting").as_deref() == Some("hello again");
        let v1 = config_data(cm, "version").as_deref() == Some("v1");
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
async fn a_rule_file_broken_as_yaml_keeps_its_rule_and_changes_nothing() {
    rejected_change_changes_nothing(
        |app, rule| {
            // The rule at v2, cut off mid-way: not YAML any more.
            let mut text = config_rule(app, rule, "v2");
            text.push_str("  resync: [oops\n");
            vec![("app.yaml", text)]
        },
        "app.yaml",
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
