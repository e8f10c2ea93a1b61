//! `trellis run` against the real control plane: children changed under the
//! operator (deleted, edited, made for another parent) and the child
//! policies `createOnly` and `recreate`.
mod support;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

use support::operator::{
    QUIET, WAIT, condition, condition_state, config_data, start_with_new_kind, wait_condition,
    wait_data, wait_event, wait_exists, wait_for, wait_gone, wait_recreated,
};

const DRIFT_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: drift
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
          name: {{ parent.metadata.name }}
        data:
          mode: {{ spec.mode }}
    # No replicas: whoever scales the Deployment owns that field.
    - id: web
      apiVersion: apps/v1
      kind: Deployment
      template: |
        metadata:
          name: {{ parent.metadata.name }}
          annotations:
            demo.trellis.dev/mode: {{ spec.mode }}
        spec:
          selector:
            matchLabels: {app: {{ parent.metadata.name }}}
          template:
            metadata:
              labels: {app: {{ parent.metadata.name }}}
            spec:
              containers:
                - name: web
                  image: registry.example/web:1
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drifted_children_are_restored_and_fields_the_template_omits_are_left_alone() {
    let ns = support::namespace().await;
    let (app, _cleanup, operator) = start_with_new_kind(&ns, "Svc", DRIFT_RULE).await;
    app.create(&ns, "api", json!({"mode": "fast"}), &[]).await;
    let cms: Api<ConfigMap> = ns.api();
    let deployments: Api<Deployment> = ns.api();
    let original = wait_exists(&cms, "api").await;
    wait_exists(&deployments, "api").await;

    // Deleted by someone else: recreated.
    cms.delete("api", &DeleteParams::default())
        .await
        .expect("delete child");
    wait_recreated(
        &cms,
        "api",
        "the deleted ConfigMap to be recreated",
        &original,
    )
    .await;

    // A field the template sets is restored; a label it does not set stays.
    let edit = json!({"metadata": {"labels": {"added-by": "someone"}}, "data": {"mode": "slow"}});
    cms.patch("api", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .expect("edit child");
    let restored = wait_data(&cms, "api", "data.mode to be restored", "mode", "fast").await;
    assert_eq!(
        restored.labels().get("added-by").map(String::as_str),
        Some("someone")
    );

    // Scaled by someone else, with a template field edited in the same write:
    // the annotation is restored, the replicas stay.
    let scale = json!({
        "metadata": {"annotations": {"demo.trellis.dev/mode": "slow"}},
        "spec": {"replicas": 3}
    });
    deployments
        .patch("api", &PatchParams::default(), &Patch::Merge(&scale))
        .await
        .expect("scale");
    let web = wait_for(
        &deployments,
        "api",
        "the Deployment annotation to be restored",
        |d| match d
            .annotations()
            .get("demo.trellis.dev/mode")
            .map(String::as_str)
        {
            Some("fast") => Ok(d.clone()),
            other => Err(format!("annotation is {other:?}")),
        },
    )
    .await;
    assert_eq!(web.spec.as_ref().and_then(|s| s.replicas), Some(3));
    operator.stop().await;
}

/// Every parent renders the same child name: a mistake the operator must
/// not turn into parents taking the object from each other.
const CLASH_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: clash
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
          name: shared
        data:
          owner: {{ parent.metadata.name }}
  status:
    fields:
      - path: owner
        value: "metadata.name"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_belongs_to_another_parent_is_not_taken_over() {
    let ns = support::namespace().await;
    let (app, _cleanup, operator) = start_with_new_kind(&ns, "App", CLASH_RULE).await;
    let first = app.create(&ns, "first", json!({}), &[]).await;
    let cms: Api<ConfigMap> = ns.api();
    wait_exists(&cms, "shared").await;

    app.create(&ns, "second", json!({}), &[]).await;
    let parents = app.api(&ns);
    let second = wait_condition(&parents, "second", "Synced", "False").await;
    let (_, reason) = condition_state(&second, "Synced").expect("Synced");
    let message = condition(&second, "Synced").expect("Synced")["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("belongs to App first"),
        "{reason}: {message}"
    );
    tokio::time::sleep(QUIET).await;
    let cm = cms.get("shared").await.expect("child");
    assert_eq!(config_data(&cm, "owner").as_deref(), Some("first"));
    assert_eq!(
        cm.labels().get("trellis.dev/parent-uid"),
        first.uid().as_ref()
    );
    assert_eq!(
        cm.owner_references().len(),
        1,
        "{:?}",
        cm.owner_references()
    );
    assert_eq!(Some(&cm.owner_references()[0].uid), first.uid().as_ref());
    operator.stop().await;
}

const CREATE_ONLY_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: secret
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: password
      apiVersion: v1
      kind: Secret
      policy: createOnly
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-password" }}
        stringData:
          password: {{ rand_alnum(24) }}
          user: {{ spec.user }}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_only_child_is_created_once_and_never_updated() {
    let ns = support::namespace().await;
    let (app, _cleanup, operator) = start_with_new_kind(&ns, "Db", CREATE_ONLY_RULE).await;
    app.create(&ns, "orders", json!({"user": "alice"}), &[])
        .await;
    let secrets: Api<Secret> = ns.api();
    let created = wait_exists(&secrets, "orders-password").await;
    let value = |s: &Secret, k: &str| {
        s.data
            .as_ref()
            .and_then(|d| d.get(k))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
    };
    let password = value(&created, "password").expect("password");
    assert_eq!(password.len(), 24);

    // Spec changes and reconciles do not touch it (nor re-roll the password).
    app.patch(&ns, "orders", json!({"spec": {"user": "bob"}}))
        .await;
    wait_for(
        &app.api(&ns),
        "orders",
        "the new generation to be observed",
        |p| {
            (p.data["status"].is_null() || p.data["status"]["observedGeneration"] == json!(2))
                .then_some(())
                .ok_or_else(|| "not yet".to_owned())
        },
    )
    .await;
    tokio::time::sleep(QUIET).await;
    let kept = secrets.get("orders-password").await.expect("secret");
    assert_eq!(kept.resource_version(), created.resource_version());
    assert_eq!(value(&kept, "user").as_deref(), Some("alice"));

    // Deleted: created again, from the current spec.
    secrets
        .delete("orders-password", &DeleteParams::default())
        .await
        .expect("delete");
    let again = wait_recreated(
        &secrets,
        "orders-password",
        "the secret to be recreated",
        &created,
    )
    .await;
    assert_eq!(value(&again, "user").as_deref(), Some("bob"));
    assert_ne!(value(&again, "password"), Some(password));
    operator.stop().await;
}

/// A createOnly child made before children carried `trellis.dev/bucket`
/// (an upgrade from an earlier trellis) is never applied again, so it gets
/// the label alone, once, and keeps what it was made with: without the
/// label, a replica under `--shards` would never see it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_only_child_without_its_bucket_label_gets_the_label_alone_once() {
    let ns = support::namespace().await;
    let (app, _cleanup, operator) = start_with_new_kind(&ns, "Db", CREATE_ONLY_RULE).await;
    let parent = app
        .create(&ns, "legacy", json!({"user": "alice"}), &[])
        .await;
    let secrets: Api<Secret> = ns.api();
    let created = wait_exists(&secrets, "legacy-password").await;
    let bucket = trellis::shard::bucket_of(&parent.uid().expect("uid")).to_string();
    assert_eq!(
        created.labels().get("trellis.dev/bucket"),
        Some(&bucket),
        "made with its bucket"
    );
    // As an earlier trellis left it: no bucket label.
    secrets
        .patch(
            "legacy-password",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {"trellis.dev/bucket": null}}})),
        )
        .await
        .expect("remove the label");
    // The label's removal is an event of the child: its pass labels it.
    let labelled = wait_for(&secrets, "legacy-password", "the bucket label back", |s| {
        (s.labels().get("trellis.dev/bucket") == Some(&bucket))
            .then(|| s.clone())
            .ok_or_else(|| format!("labels {:?}", s.labels()))
    })
    .await;
    assert_eq!(labelled.data, created.data, "nothing else written");
    tokio::time::sleep(QUIET).await;
    let after = secrets.get("legacy-password").await.expect("secret");
    assert_eq!(
        after.resource_version(),
        labelled.resource_version(),
        "labelled once, then left alone"
    );
    operator.stop().await;
}

const RECREATE_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: recreate
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      policy: recreate
      template: |
        metadata:
          name: {{ parent.metadata.name }}
        immutable: true
        data:
          version: {{ spec.version }}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreate_child_is_replaced_when_its_rendering_changes() {
    let ns = support::namespace().await;
    let (app, _cleanup, operator) = start_with_new_kind(&ns, "Rel", RECREATE_RULE).await;
    app.create(&ns, "v", json!({"version": "1"}), &[]).await;
    let cms: Api<ConfigMap> = ns.api();
    let first = wait_exists(&cms, "v").await;
    assert!(
        first.annotations().contains_key("trellis.dev/render-hash"),
        "{:?}",
        first.annotations()
    );

    // An immutable ConfigMap cannot be updated: it must be replaced.
    app.patch(&ns, "v", json!({"spec": {"version": "2"}})).await;
    let second = wait_data(&cms, "v", "the ConfigMap to be replaced", "version", "2").await;
    assert_ne!(second.uid(), first.uid());
    assert_ne!(
        second.annotations().get("trellis.dev/render-hash"),
        first.annotations().get("trellis.dev/render-hash")
    );
    operator.stop().await;
}

/// A parent author names an object someone else made: it must never be
/// written, re-labelled or handed to the garbage collector.
const VICTIM_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: grab
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
          name: {{ spec.name }}
        data:
          owner: {{ parent.metadata.name }}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_someone_else_made_is_never_adopted_and_survives_the_parent() {
    let ns = support::namespace().await;
    let cms: Api<ConfigMap> = ns.api();
    let victim: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "victim"},
        "data": {"owner": "payroll"},
    }))
    .expect("configmap");
    let victim = cms
        .create(&kube::api::PostParams::default(), &victim)
        .await
        .expect("create victim");
    let (app, _cleanup, operator) = start_with_new_kind(&ns, "App", VICTIM_RULE).await;
    app.create(&ns, "thief", json!({"name": "victim"}), &[])
        .await;
    let parents = app.api(&ns);
    let message = support::operator::wait_refused(&parents, "thief").await;
    assert!(
        message.contains("victim") && message.contains("not created by trellis"),
        "{message}"
    );
    wait_event(&ns, "an ApplyError Event naming the victim", |e| {
        e.reason.as_deref() == Some("ApplyError")
            && e.note.as_deref().unwrap_or_default().contains("victim")
    })
    .await;
    tokio::time::sleep(QUIET).await;
    let now = cms.get("victim").await.expect("victim");
    assert_eq!(
        now.metadata.resource_version, victim.metadata.resource_version,
        "the victim was written: {now:?}"
    );
    parents
        .delete("thief", &Default::default())
        .await
        .expect("delete parent");
    wait_gone(&parents, "thief", WAIT).await;
    tokio::time::sleep(QUIET).await;
    let now = cms
        .get("victim")
        .await
        .expect("the victim outlives the parent");
    assert_eq!(config_data(&now, "owner").as_deref(), Some("payroll"));
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_with_adopt_takes_over_an_unowned_object() {
    let ns = support::namespace().await;
    let cms: Api<ConfigMap> = ns.api();
    let orphan: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "orphan"},
        "data": {"owner": "nobody"},
    }))
    .expect("configmap");
    cms.create(&kube::api::PostParams::default(), &orphan)
        .await
        .expect("create orphan");
    let rule = VICTIM_RULE.replace(
        "      kind: ConfigMap\n",
        "      kind: ConfigMap\n      adopt: true\n",
    );
    assert!(rule.contains("adopt: true"));
    let (app, _cleanup, operator) = start_with_new_kind(&ns, "App", &rule).await;
    app.create(&ns, "heir", json!({"name": "orphan"}), &[])
        .await;
    let cm = wait_data(&cms, "orphan", "adopted data", "owner", "heir").await;
    assert_eq!(
        cm.labels().get("trellis.dev/rule").map(String::as_str),
        Some("grab")
    );
    assert_eq!(
        cm.owner_references().len(),
        1,
        "{:?}",
        cm.owner_references()
    );
    operator.stop().await;
}
