//! Children without the parent's controller ownerReference (cluster-scoped
//! children of a namespaced parent): their watch events still reach their
//! parent, through the `trellis.dev/parent-uid` label.
mod support;

use std::time::Duration;

use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use serde_json::json;

use support::operator::{Operator, install_kind, wait_for};

const ROLE_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: unowned
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: role
      apiVersion: rbac.authorization.k8s.io/v1
      kind: ClusterRole
      allowCrossNamespace: true
      template: |
        metadata:
          name: {{ spec.roleName }}
        rules:
          - apiGroups: [""]
            resources: [configmaps]
            verbs: [get]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_cluster_scoped_child_is_made_again_by_its_parent() {
    let ns = support::namespace().await;
    let (app, mut cleanup) = install_kind(&ns, "Crew").await;
    let role_name = support::unique_name("trellis-test-crew");
    cleanup.add::<ClusterRole>(&role_name);
    let operator = Operator::start(&ns.client, ns.name(), &[&app.rule(ROLE_RULE)]);
    let parent = app
        .create(&ns, "red", json!({"roleName": role_name}), &[])
        .await;
    let roles: Api<ClusterRole> = Api::all(ns.client.clone());
    let first = wait_for(&roles, &role_name, "the ClusterRole", |r| {
        Ok(r.uid().unwrap_or_default())
    })
    .await;
    let role = roles.get(&role_name).await.expect("get the ClusterRole");
    assert!(role.owner_references().is_empty(), "{role:?}");
    assert_eq!(
        role.labels().get("trellis.dev/parent-uid"),
        parent.uid().as_ref()
    );

    roles
        .delete(&role_name, &DeleteParams::default())
        .await
        .expect("delete the ClusterRole");
    // No resync in this rule and nothing else changes: only the child's
    // deletion event, mapped to its parent by uid, can bring it back.
    let started = std::time::Instant::now();
    wait_for(
        &roles,
        &role_name,
        "the ClusterRole made again",
        |r| match r.uid() {
            Some(uid) if uid != first => Ok(()),
            _ => Err("still the first one".to_owned()),
        },
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "made again after {:?}",
        started.elapsed()
    );
    operator.stop().await;
}
