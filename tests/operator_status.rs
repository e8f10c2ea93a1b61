//! `trellis run` against the real control plane: when a parent's status is
//! written, and when not (nothing changed; no `/status` subresource), and
//! status fields that are no longer produced.
mod support;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use support::operator::{
    Cleanup, Operator, QUIET, TestKind, WAIT, condition, start_with_new_kind, wait_condition,
    wait_data, wait_for, wait_gone, wait_ready_and_synced,
};

/// One ConfigMap per parent, and status fields from the spec and the child.
const STATUS_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: status
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
  status:
    fields:
      - path: greeting
        value: "spec.greeting"
      - path: config.name
        from: config
        jsonPath: $.metadata.name
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchanged_status_is_not_written_again() {
    let ns = support::namespace().await;
    let rule = STATUS_RULE.replace("  status:\n", "  resync: 1s\n  status:\n");
    let (app, _cleanup, operator) = start_with_new_kind(&ns, "App", &rule).await;
    app.create(&ns, "shop", json!({"greeting": "hi"}), &[])
        .await;
    let parents = app.api(&ns);
    wait_ready_and_synced(&parents, "shop").await;
    // Let the reconciles that the status write itself triggered settle.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let before = parents.get("shop").await.expect("parent");

    // A reconcile that happens (it restores the child) but changes no status.
    let cms: Api<ConfigMap> = ns.api();
    let edit = json!({"data": {"greeting": "edited"}});
    cms.patch("shop-config", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .expect("edit child");
    wait_data(
        &cms,
        "shop-config",
        "the child to be restored",
        "greeting",
        "hi",
    )
    .await;
    // And resyncs every second.
    tokio::time::sleep(QUIET).await;
    let after = parents.get("shop").await.expect("parent");
    assert_eq!(
        after.resource_version(),
        before.resource_version(),
        "the parent was written: status before {} after {}",
        before.data["status"],
        after.data["status"]
    );
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_a_kind_without_status_subresource_is_written_once_and_settles() {
    let ns = support::namespace().await;
    let app = TestKind::new("App");
    let _cleanup = Cleanup::crds(&[&app]);
    support::apply_crd(&ns.client, &app.crd_without_status_subresource()).await;
    let operator = Operator::start(&ns.client, ns.name(), &[&app.rule(STATUS_RULE)]);
    app.create(&ns, "shop", json!({"greeting": "hi"}), &[])
        .await;
    let parents = app.api(&ns);
    wait_condition(&parents, "shop", "Ready", "True").await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let before = parents.get("shop").await.expect("parent");
    assert_eq!(before.data["status"]["greeting"], "hi");
    tokio::time::sleep(QUIET).await;
    let after = parents.get("shop").await.expect("parent");
    assert_eq!(
        (after.resource_version(), after.metadata.generation),
        (before.resource_version(), before.metadata.generation),
        "the parent keeps being written: status {}",
        after.data["status"]
    );
    // The status claims the generation its own write produced.
    let generation = after.metadata.generation.expect("generation");
    assert_eq!(
        after.data["status"]["observedGeneration"],
        json!(generation)
    );
    let ready = condition(&after, "Ready").expect("Ready");
    assert_eq!(ready["observedGeneration"], json!(generation), "{ready}");
    operator.stop().await;
}

const STALE_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: stale
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: extra
      apiVersion: v1
      kind: ConfigMap
      includeWhen: "spec.extra"
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-extra" }}
  status:
    fields:
      - path: extra.name
        from: extra
        jsonPath: $.metadata.name
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_field_whose_source_child_is_pruned_is_removed() {
    let ns = support::namespace().await;
    let (app, _cleanup, operator) = start_with_new_kind(&ns, "App", STALE_RULE).await;
    app.create(&ns, "shop", json!({"extra": true}), &[]).await;
    let parents = app.api(&ns);
    wait_for(&parents, "shop", "status.extra.name", |p| {
        match &p.data["status"]["extra"]["name"] {
            serde_json::Value::String(s) if s == "shop-extra" => Ok(()),
            other => Err(format!("{other}")),
        }
    })
    .await;
    app.patch(&ns, "shop", json!({"spec": {"extra": false}}))
        .await;
    let cms: Api<ConfigMap> = ns.api();
    wait_gone(&cms, "shop-extra", WAIT).await;
    wait_for(&parents, "shop", "status.extra.name to go", |p| {
        let status = &p.data["status"];
        if status["observedGeneration"] == json!(2) && status["extra"]["name"].is_null() {
            Ok(())
        } else {
            Err(format!("status {status}"))
        }
    })
    .await;
    operator.stop().await;
}
