//! Hot reload against the real control plane: one broken rule never blocks
//! the others. A reload that breaks one rule and changes another takes up
//! the change, keeps the broken rule at its last good version (still
//! reconciling), and says so per rule on `/status` and in the metrics.
mod support;

#[path = "support/configmap_dir.rs"]
mod configmap_dir;
#[path = "support/reloading.rs"]
mod reloading;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use serde_json::json;

use configmap_dir::ConfigMapDir;
use reloading::{Reloading, config_rule, fingerprints, wait_versions};
use support::operator::{QUIET, TestKind, config_data, install_kind, wait_for};

/// [`config_rule`] with a name outside the evaluation context: an error.
fn broken_rule(kind: &TestKind, rule: &str, version: &str) -> String {
    config_rule(kind, rule, version).replace(
        r#"parent.metadata.name ~ "-extra""#,
        r#"parnet.metadata.name ~ "-extra""#,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_rule_keeps_its_last_good_version_while_the_other_rule_updates() {
    let ns = support::namespace().await;
    let (app, _app_cleanup) = install_kind(&ns, "App").await;
    let (web, _web_cleanup) = install_kind(&ns, "Web").await;
    let kept = support::unique_name("kept");
    let moved = support::unique_name("moved");
    let mut rules = ConfigMapDir::new(&[
        ("kept.yaml", &config_rule(&app, &kept, "v1")),
        ("moved.yaml", &config_rule(&web, &moved, "v1")),
    ]);
    let operator = Reloading::start(&ns.client, ns.name(), &rules);
    app.create(&ns, "a", json!({"greeting": "hi"}), &[]).await;
    web.create(&ns, "w", json!({"greeting": "hi"}), &[]).await;
    let cms: Api<ConfigMap> = ns.api();
    wait_versions(&cms, &kept, &["a-config", "a-extra"], "v1").await;
    wait_versions(&cms, &moved, &["w-config", "w-extra"], "v1").await;
    let before = fingerprints(&cms, &kept).await;

    // One edit: `kept` breaks (at v2), `moved` goes to v2.
    rules.update(&[
        ("kept.yaml", &broken_rule(&app, &kept, "v2")),
        ("moved.yaml", &config_rule(&web, &moved, "v2")),
    ]);
    wait_versions(&cms, &moved, &["w-config", "w-extra"], "v2").await;
    let status = operator
        .wait_status("the broken rule reported", |s| s["reload"]["failures"] == 1)
        .await;
    let reload = &status["reload"];
    assert_eq!(reload["ok"], false, "{status}");
    assert_eq!(reload["rules"], 2, "both rules in force: {status}");
    let rejected = reload["rejected"].as_object().expect("reload.rejected");
    assert_eq!(
        rejected.keys().collect::<Vec<_>>(),
        [&kept],
        "only the broken rule is rejected: {status}"
    );
    let why = status["rules"][&kept]["rejected"][0]
        .as_str()
        .unwrap_or_default();
    assert!(
        why.contains("kept.yaml:") && why.contains("`parnet` is not in the evaluation context"),
        "the rule's error names file:line and the problem: {why:?}"
    );
    assert_eq!(status["rules"][&kept]["state"], "Running", "{status}");
    assert!(
        status["rules"][&moved].get("rejected").is_none(),
        "{status}"
    );
    let metrics = operator.metrics().await;
    assert!(
        metrics.contains(&format!("trellis_rule_rejected{{rule=\"{kept}\"}} 1")),
        "{metrics}"
    );
    assert!(
        !metrics.contains(&format!("trellis_rule_rejected{{rule=\"{moved}\"}}")),
        "{metrics}"
    );

    // The broken rule's children are untouched...
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        fingerprints(&cms, &kept).await,
        before,
        "the broken rule's children moved"
    );
    // ...and still reconciled by its last good version.
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
    app.patch(&ns, "a", json!({"spec": {"greeting": "hello again"}}))
        .await;
    wait_for(
        &cms,
        "a-config",
        "a-config following its parent at v1",
        |cm| {
            let follows = config_data(cm, "greeting").as_deref() == Some("hello again");
            let v1 = config_data(cm, "version").as_deref() == Some("v1");
            (follows && v1)
                .then_some(())
                .ok_or(format!("{:?}", cm.data))
        },
    )
    .await;

    // Fixed: taken up, and the rejection is gone everywhere.
    rules.update(&[
        ("kept.yaml", &config_rule(&app, &kept, "v3")),
        ("moved.yaml", &config_rule(&web, &moved, "v2")),
    ]);
    wait_versions(&cms, &kept, &["a-config", "a-extra"], "v3").await;
    let status = operator
        .wait_status("the fixed set loaded", |s| s["reload"]["successes"] == 1)
        .await;
    assert_eq!(status["reload"]["ok"], true, "{status}");
    assert_eq!(status["reload"]["rejected"], json!({}), "{status}");
    assert!(status["rules"][&kept].get("rejected").is_none(), "{status}");
    let metrics = operator.metrics().await;
    assert!(!metrics.contains("trellis_rule_rejected{"), "{metrics}");
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partly_broken_set_starts_its_good_rules_and_reports_the_broken_one() {
    let ns = support::namespace().await;
    let (app, _app_cleanup) = install_kind(&ns, "App").await;
    let (web, _web_cleanup) = install_kind(&ns, "Web").await;
    let good = support::unique_name("good");
    let bad = support::unique_name("bad");
    let rules = ConfigMapDir::new(&[
        ("good.yaml", &config_rule(&app, &good, "v1")),
        ("bad.yaml", &broken_rule(&web, &bad, "v1")),
    ]);
    let operator = Reloading::start_partial(&ns.client, ns.name(), &rules);
    app.create(&ns, "a", json!({"greeting": "hi"}), &[]).await;
    web.create(&ns, "w", json!({"greeting": "hi"}), &[]).await;
    let cms: Api<ConfigMap> = ns.api();
    wait_versions(&cms, &good, &["a-config", "a-extra"], "v1").await;
    let status = operator
        .wait_status("the broken rule reported", |s| {
            s["rules"][&bad]["state"] == "Rejected"
        })
        .await;
    assert!(
        status["rules"][&bad]["rejected"][0]
            .as_str()
            .is_some_and(|e| e.contains("bad.yaml:")),
        "{status}"
    );
    assert_eq!(status["rules"][&good]["state"], "Running", "{status}");
    tokio::time::sleep(QUIET).await;
    assert!(
        reloading::children(&cms, &bad).await.is_empty(),
        "the broken rule never started"
    );
    operator.stop().await;
}
