//! `patches:` and `deletionPolicy: retain` in `trellis run` against the real
//! control plane: contributions to objects the rule does not own, one field
//! manager per parent, never a create, never a forced field unless asked,
//! released exactly; and retained children that outlive their parent with
//! nothing of trellis's left on them.
mod support;

#[path = "support/configmap_dir.rs"]
mod configmap_dir;
#[path = "support/reloading.rs"]
mod reloading;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

use configmap_dir::ConfigMapDir;
use reloading::Reloading;
use support::operator::{Operator, WAIT, condition_state, install_kind, wait_for, wait_gone};

/// Each parent labels the test's Namespace with its own key, and annotates
/// it with a shared key.
const TEAM_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: @RULE@
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  patches:
    - id: team
      apiVersion: v1
      kind: Namespace
      allowCrossNamespace: true
      includeWhen: "spec.label | default(true)"
      template: |
        metadata:
          name: {{ parent.metadata.namespace }}
          labels:
            {{ 'example.com/' ~ parent.metadata.name }}: {{ spec.value }}
          annotations:
            example.com/shared: "yes"
  onRuleRemoved: @POLICY@
"#;

fn team_rule(kind: &support::operator::TestKind, rule: &str, policy: &str) -> String {
    kind.rule(TEAM_RULE)
        .replace("@RULE@", rule)
        .replace("@POLICY@", policy)
}

/// The managers of an object and the label/annotation keys each one owns.
fn owners(obj: &Value) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for m in obj
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let mut keys = Vec::new();
        for map in ["f:labels", "f:annotations"] {
            if let Some(fields) = m
                .pointer(&format!("/fieldsV1/f:metadata/{map}"))
                .and_then(Value::as_object)
            {
                keys.extend(
                    fields
                        .keys()
                        .filter_map(|k| k.strip_prefix("f:"))
                        .map(str::to_owned),
                );
            }
        }
        keys.sort();
        out.push((m["manager"].as_str().unwrap_or_default().to_owned(), keys));
    }
    out
}

async fn namespace_json(client: &kube::Client, name: &str) -> Value {
    let nss: Api<Namespace> = Api::all(client.clone());
    serde_json::to_value(nss.get(name).await.expect("get the Namespace")).unwrap()
}

/// Deletes a parent and waits until it is gone: its rule's finalizer is
/// released by the running operator (a parent left with it would hold its
/// CRD's and its namespace's deletion after the test).
async fn delete_parent(api: &Api<kube::api::DynamicObject>, name: &str) {
    api.delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete {name}: {e}"));
    wait_gone(api, name, WAIT).await;
}

fn label<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.pointer("/metadata/labels")
        .and_then(|l| l.get(key))
        .and_then(Value::as_str)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_parents_contribute_to_one_namespace_each_owning_only_its_fields_and_releasing_exactly_them()
 {
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "Tenant").await;
    let rule = support::unique_name("team");
    let operator = Operator::start(&ns.client, ns.name(), &[&team_rule(&app, &rule, "orphan")]);
    let a = app.create(&ns, "alpha", json!({"value": "one"}), &[]).await;
    let b = app.create(&ns, "beta", json!({"value": "two"}), &[]).await;
    let nss: Api<Namespace> = Api::all(ns.client.clone());
    wait_for(&nss, ns.name(), "both contributions", |n| {
        let labels = n.labels();
        match (
            labels.get("example.com/alpha"),
            labels.get("example.com/beta"),
        ) {
            (Some(x), Some(y)) if x == "one" && y == "two" => Ok(()),
            other => Err(format!("labels {other:?}")),
        }
    })
    .await;
    let live = namespace_json(&ns.client, ns.name()).await;
    let manager = |p: &kube::api::DynamicObject| format!("trellis/{rule}/{}", p.uid().unwrap());
    let owners = owners(&live);
    let of = |m: &str| owners.iter().find(|(n, _)| n == m).map(|(_, k)| k.clone());
    assert_eq!(
        of(&manager(&a)),
        Some(vec![
            "example.com/alpha".to_owned(),
            "example.com/shared".to_owned()
        ]),
        "{owners:?}"
    );
    assert_eq!(
        of(&manager(&b)),
        Some(vec![
            "example.com/beta".to_owned(),
            "example.com/shared".to_owned()
        ]),
        "{owners:?}"
    );
    assert!(
        live.pointer("/metadata/ownerReferences").is_none(),
        "never owned: {live}"
    );
    let labels = live["metadata"]["labels"].as_object().unwrap();
    assert!(
        labels
            .keys()
            .all(|k| !k.starts_with("trellis.dev/") || k == support::TEST_LABEL)
            && label(&live, "app.kubernetes.io/managed-by").is_none(),
        "no trellis label: {labels:?}"
    );
    wait_for(
        &app.api(&ns),
        "alpha",
        "alpha Ready",
        |p| match condition_state(p, "Ready")? {
            (s, _) if s == "True" => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;

    // Someone removes beta's label: it comes back.
    nss.patch(
        ns.name(),
        &PatchParams::default(),
        &Patch::Json::<()>(
            serde_json::from_value(json!([
                {"op": "remove", "path": "/metadata/labels/example.com~1beta"}
            ]))
            .unwrap(),
        ),
    )
    .await
    .expect("remove beta's label");
    wait_for(&nss, ns.name(), "beta's label restored", |n| {
        match n.labels().get("example.com/beta").map(String::as_str) {
            Some("two") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // Beta's parent changes its contribution: the label follows.
    app.patch(&ns, "beta", json!({"spec": {"value": "three"}}))
        .await;
    wait_for(&nss, ns.name(), "beta's changed contribution", |n| match n
        .labels()
        .get("example.com/beta")
        .map(String::as_str)
    {
        Some("three") => Ok(()),
        other => Err(format!("{other:?}")),
    })
    .await;

    // Alpha goes: exactly its fields go; the Namespace, beta's label and
    // the annotation beta also sets stay.
    app.api(&ns)
        .delete("alpha", &DeleteParams::default())
        .await
        .expect("delete alpha");
    wait_gone(&app.api(&ns), "alpha", WAIT).await;
    let live = namespace_json(&ns.client, ns.name()).await;
    assert_eq!(label(&live, "example.com/alpha"), None, "{live}");
    assert_eq!(label(&live, "example.com/beta"), Some("three"));
    assert_eq!(
        live.pointer("/metadata/annotations/example.com~1shared"),
        Some(&json!("yes")),
        "beta still sets it"
    );
    let owners_now = self::owners(&live);
    assert!(
        owners_now.iter().all(|(m, _)| m != &manager(&a)),
        "alpha's manager is gone: {owners_now:?}"
    );

    // includeWhen false: beta's contribution is released too.
    app.patch(&ns, "beta", json!({"spec": {"label": false}}))
        .await;
    wait_for(&nss, ns.name(), "beta's release", |n| {
        let gone = !n.labels().contains_key("example.com/beta")
            && !n.annotations().contains_key("example.com/shared");
        gone.then_some(()).ok_or(format!("{:?}", n.labels()))
    })
    .await;
    let live = namespace_json(&ns.client, ns.name()).await;
    assert!(
        self::owners(&live)
            .iter()
            .all(|(m, _)| !m.starts_with("trellis")),
        "{live}"
    );
    delete_parent(&app.api(&ns), "beta").await;
    operator.stop().await;
}

const TARGET_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: tagger
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  patches:
    - id: polite
      apiVersion: v1
      kind: ConfigMap
      includeWhen: "not (spec.force | default(false))"
      template: |
        metadata:
          name: {{ spec.target }}
          labels: {owner: {{ parent.metadata.name }}}
    - id: forced
      apiVersion: v1
      kind: ConfigMap
      force: true
      includeWhen: "spec.force | default(false)"
      template: |
        metadata:
          name: {{ spec.target }}
          labels: {owner: {{ parent.metadata.name }}}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_target_is_never_created_and_another_managers_field_is_taken_only_by_force() {
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "Tagger").await;
    let operator = Operator::start(&ns.client, ns.name(), &[&app.rule(TARGET_RULE)]);
    let cms: Api<ConfigMap> = ns.api();
    app.create(&ns, "tag", json!({"target": "shared"}), &[])
        .await;
    wait_for(
        &app.api(&ns),
        "tag",
        "TargetNotFound",
        |p| match condition_state(p, "Ready")? {
            (s, r) if s == "False" && r == "TargetNotFound" => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    assert!(
        cms.get_opt("shared").await.unwrap().is_none(),
        "a patch never creates its target"
    );

    // The target appears, with the label owned by someone else.
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "shared", "labels": {"owner": "platform"}},
        "data": {"k": "v"},
    }))
    .unwrap();
    cms.patch(
        "shared",
        &PatchParams::apply("platform-team"),
        &Patch::Apply(&cm),
    )
    .await
    .expect("the platform team makes the ConfigMap");
    let parent = wait_for(
        &app.api(&ns),
        "tag",
        "PatchConflict",
        |p| match condition_state(p, "Synced")? {
            (s, r) if s == "False" && r == "PatchConflict" => Ok(p.clone()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    let message = support::operator::condition(&parent, "Synced").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("platform-team") && message.contains(".metadata.labels.owner"),
        "names the manager and the field: {message}"
    );
    let live = cms.get("shared").await.unwrap();
    assert_eq!(
        live.labels().get("owner").map(String::as_str),
        Some("platform"),
        "the target is untouched"
    );
    assert!(
        live.managed_fields().iter().all(|m| !m
            .manager
            .as_deref()
            .unwrap_or_default()
            .starts_with("trellis")),
        "{:?}",
        live.managed_fields()
    );

    // `force: true` takes it.
    app.patch(&ns, "tag", json!({"spec": {"force": true}}))
        .await;
    wait_for(&cms, "shared", "the forced label", |c| {
        match c.labels().get("owner").map(String::as_str) {
            Some("tag") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    wait_for(
        &app.api(&ns),
        "tag",
        "Ready after force",
        |p| match condition_state(p, "Ready")? {
            (s, _) if s == "True" => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    delete_parent(&app.api(&ns), "tag").await;
    operator.stop().await;
}

const RETAIN_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: keeper
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: data
      apiVersion: v1
      kind: ConfigMap
      deletionPolicy: retain
      forEach: "spec.volumes"
      template: |
        metadata:
          name: {{ parent.metadata.name ~ '-' ~ item }}
          labels: {app: keeper}
        data: {volume: {{ item }}}
    - id: scratch
      apiVersion: v1
      kind: ConfigMap
      dependsOn: [data]
      template: |
        metadata:
          name: {{ parent.metadata.name ~ '-scratch' }}
        data: {k: v}
  deletion:
    order: reverse
"#;

/// Nothing of trellis's on an object: no ownerReference, no trellis label
/// or annotation, no field manager named `trellis…`.
fn nothing_of_trellis(cm: &ConfigMap) -> Result<(), String> {
    if !cm.owner_references().is_empty() {
        return Err(format!("ownerReferences {:?}", cm.owner_references()));
    }
    let marks: Vec<&String> = cm
        .labels()
        .keys()
        .chain(cm.annotations().keys())
        .filter(|k| k.starts_with("trellis.dev/") || *k == "app.kubernetes.io/managed-by")
        .collect();
    if !marks.is_empty() {
        return Err(format!("marks {marks:?}"));
    }
    let managers: Vec<&str> = cm
        .managed_fields()
        .iter()
        .filter_map(|m| m.manager.as_deref())
        .filter(|m| m.starts_with("trellis"))
        .collect();
    if !managers.is_empty() {
        return Err(format!("managers {managers:?}"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retained_child_outlives_its_parent_with_nothing_of_trellis_left() {
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "Keeper").await;
    let operator = Operator::start(&ns.client, ns.name(), &[&app.rule(RETAIN_RULE)]);
    let cms: Api<ConfigMap> = ns.api();
    app.create(&ns, "k", json!({"volumes": ["a", "b"]}), &[])
        .await;
    for name in ["k-a", "k-b", "k-scratch"] {
        support::operator::wait_exists(&cms, name).await;
    }
    // An item gone: released, not deleted.
    app.patch(&ns, "k", json!({"spec": {"volumes": ["a"]}}))
        .await;
    let released = wait_for(&cms, "k-b", "k-b released", |cm| {
        nothing_of_trellis(cm).map(|()| cm.clone())
    })
    .await;
    assert_eq!(config(&released, "volume"), Some("b"), "its values stay");
    assert_eq!(
        released.labels().get("app").map(String::as_str),
        Some("keeper")
    );

    // The parent goes: the other child is deleted, the retained one stays.
    app.api(&ns)
        .delete("k", &DeleteParams::default())
        .await
        .expect("delete the parent");
    wait_gone(&app.api(&ns), "k", WAIT).await;
    wait_gone(&cms, "k-scratch", WAIT).await;
    let kept = cms.get("k-a").await.expect("k-a outlives its parent");
    nothing_of_trellis(&kept).unwrap();
    assert_eq!(config(&kept, "volume"), Some("a"));
    // The garbage collector has had its chance: still there.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(cms.get_opt("k-a").await.unwrap().is_some());
    assert!(cms.get_opt("k-b").await.unwrap().is_some());
    operator.stop().await;
}

fn config<'a>(cm: &'a ConfigMap, key: &str) -> Option<&'a str> {
    cm.data.as_ref()?.get(key).map(String::as_str)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_removed_with_on_rule_removed_delete_releases_its_contributions() {
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "Leaver").await;
    let rule = support::unique_name("leaver");
    let mut rules = ConfigMapDir::new(&[("r.yaml", &team_rule(&app, &rule, "delete"))]);
    let operator = Reloading::start(&ns.client, ns.name(), &rules);
    app.create(&ns, "gamma", json!({"value": "g"}), &[]).await;
    let nss: Api<Namespace> = Api::all(ns.client.clone());
    wait_for(&nss, ns.name(), "gamma's contribution", |n| {
        n.labels()
            .contains_key("example.com/gamma")
            .then_some(())
            .ok_or("not yet".to_owned())
    })
    .await;
    // Someone else also sets the shared annotation: it stays.
    let other = json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": ns.name(), "annotations": {"example.com/shared": "yes"}}});
    nss.patch(
        ns.name(),
        &PatchParams::apply("someone-else"),
        &Patch::Apply(&other),
    )
    .await
    .expect("someone else sets the annotation");

    rules.update(&[]);
    wait_for(&nss, ns.name(), "gamma's release", |n| {
        (!n.labels().contains_key("example.com/gamma"))
            .then_some(())
            .ok_or("still labelled".to_owned())
    })
    .await;
    let live = namespace_json(&ns.client, ns.name()).await;
    assert_eq!(
        live.pointer("/metadata/annotations/example.com~1shared"),
        Some(&json!("yes")),
        "a field another manager also set stays: {live}"
    );
    assert!(
        self::owners(&live)
            .iter()
            .all(|(m, _)| !m.starts_with("trellis")),
        "{live}"
    );
    let parent = app.api(&ns).get("gamma").await.expect("the parent stays");
    assert!(parent.finalizers().is_empty(), "{:?}", parent.finalizers());
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_edit_that_stops_patching_a_kind_releases_its_contributions() {
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "Editor").await;
    let rule = support::unique_name("editor");
    let mut rules = ConfigMapDir::new(&[("r.yaml", &team_rule(&app, &rule, "orphan"))]);
    let operator = Reloading::start(&ns.client, ns.name(), &rules);
    app.create(&ns, "delta", json!({"value": "d"}), &[]).await;
    let nss: Api<Namespace> = Api::all(ns.client.clone());
    wait_for(&nss, ns.name(), "delta's contribution", |n| {
        n.labels()
            .contains_key("example.com/delta")
            .then_some(())
            .ok_or("not yet".to_owned())
    })
    .await;
    // The rule keeps its parent but now only makes a ConfigMap: Namespaces
    // are no longer watched, and what was contributed to them is released.
    let text = team_rule(&app, &rule, "orphan");
    let cut = text.find("  patches:").unwrap();
    let edited = format!(
        "{}  children:\n    - id: note\n      apiVersion: v1\n      kind: ConfigMap\n      template: '{{metadata: {{name: note}}}}'\n",
        &text[..cut]
    );
    rules.update(&[("r.yaml", &edited)]);
    wait_for(&nss, ns.name(), "delta's release", |n| {
        (!n.labels().contains_key("example.com/delta")
            && !n.annotations().contains_key("example.com/shared"))
        .then_some(())
        .ok_or(format!("{:?}", n.labels()))
    })
    .await;
    support::operator::wait_exists(&ns.api::<ConfigMap>(), "note").await;
    delete_parent(&app.api(&ns), "delta").await;
    operator.stop().await;
}

/// The shipped example `rules/team.yaml`, as shipped: a Team labels and
/// annotates the Namespace it lives in for cost reporting, keeps its quota
/// and shared volume there, and when it goes its Namespace fields go and
/// its volume stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_team_example_labels_its_namespace_and_keeps_its_volume() {
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, ResourceQuota};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};

    let ns = support::namespace().await;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("rules/team.yaml");
    let rule = std::fs::read_to_string(&path).expect("rules/team.yaml");
    let set = support::operator::rule_set(&[&rule]);
    let crd: CustomResourceDefinition =
        serde_json::from_value(set.rules[0].crd.clone().expect("the example sets crd:")).unwrap();
    support::apply_crd(&ns.client, &crd).await;
    let operator = Operator::start(&ns.client, ns.name(), &[&rule]);
    let teams: Api<DynamicObject> = Api::namespaced_with(
        ns.client.clone(),
        ns.name(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("demo.trellis.dev", "v1", "Team"),
            "teams",
        ),
    );
    let team: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "demo.trellis.dev/v1", "kind": "Team",
        "metadata": {"name": "payments"},
        "spec": {"costCenter": "PAY-042", "owner": "payments-leads@example.com",
                 "quota": {"cpu": "16"}, "sharedData": {"size": "1Gi"}},
    }))
    .unwrap();
    teams
        .create(&PostParams::default(), &team)
        .await
        .expect("create the Team");
    let nss: Api<Namespace> = Api::all(ns.client.clone());
    wait_for(
        &nss,
        ns.name(),
        "the Namespace labelled for cost reports",
        |n| {
            let ok = n
                .labels()
                .get("example.com/cost-center")
                .map(String::as_str)
                == Some("PAY-042")
                && n.labels().get("example.com/team").map(String::as_str) == Some("payments")
                && n.annotations()
                    .get("example.com/quota-cpu")
                    .map(String::as_str)
                    == Some("16");
            ok.then_some(()).ok_or(format!("{:?}", n.labels()))
        },
    )
    .await;
    let quota: Api<ResourceQuota> = ns.api();
    support::operator::wait_exists(&quota, "team-quota").await;
    let claims: Api<PersistentVolumeClaim> = ns.api();
    support::operator::wait_exists(&claims, "payments-shared-data").await;
    wait_for(
        &teams,
        "payments",
        "CostReported",
        |t| match condition_state(t, "CostReported")? {
            (s, _) if s == "True" => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;

    teams
        .delete("payments", &DeleteParams::default())
        .await
        .expect("delete the Team");
    wait_gone(&teams, "payments", WAIT).await;
    let live = namespace_json(&ns.client, ns.name()).await;
    for key in ["example.com/team", "example.com/cost-center"] {
        assert_eq!(label(&live, key), None, "{live}");
    }
    assert!(
        live.pointer("/metadata/annotations/example.com~1owner")
            .is_none(),
        "{live}"
    );
    let claim = claims
        .get("payments-shared-data")
        .await
        .expect("the shared volume outlives its Team");
    assert!(claim.owner_references().is_empty(), "{claim:?}");
    assert!(
        claim
            .labels()
            .keys()
            .all(|k| !k.starts_with("trellis.dev/")),
        "{claim:?}"
    );
    assert!(
        claim.managed_fields().iter().all(|m| !m
            .manager
            .as_deref()
            .unwrap_or_default()
            .starts_with("trellis")),
        "{:?}",
        claim.managed_fields()
    );
    operator.stop().await;
}

/// `trellis diff` shows a patch: nothing once it is in place; the field a
/// pass would put back once someone removed it; and it writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_shows_what_a_patch_would_put_back_and_writes_nothing() {
    use trellis::diff::ChildChange;
    use trellis::diff::live::{Target, diff};

    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "Differ").await;
    let rule = support::unique_name("differ");
    let text = team_rule(&app, &rule, "orphan");
    let operator = Operator::start(&ns.client, ns.name(), &[&text]);
    app.create(&ns, "eps", json!({"value": "e"}), &[]).await;
    wait_for(
        &app.api(&ns),
        "eps",
        "eps Ready",
        |p| match condition_state(p, "Ready")? {
            (s, _) if s == "True" => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    operator.stop().await;
    let set = support::operator::rule_set(&[&text]);
    let manifest = json!({"apiVersion": app.api_version(), "kind": app.kind,
                          "metadata": {"name": "eps", "namespace": ns.name()}});
    let change = |report: &trellis::diff::live::Report| {
        report.diffs[0]
            .children
            .iter()
            .find(|c| c.id == "team")
            .map(|c| c.change.clone())
            .unwrap_or_else(|| panic!("{}", trellis::diff::print(&report.diffs)))
    };
    let report = diff(&ns.client, &set, &Target::Parent(&manifest))
        .await
        .expect("diff");
    assert_eq!(
        change(&report),
        ChildChange::Unchanged,
        "{}",
        trellis::diff::print(&report.diffs)
    );

    let nss: Api<Namespace> = Api::all(ns.client.clone());
    nss.patch(
        ns.name(),
        &PatchParams::default(),
        &Patch::Json::<()>(
            serde_json::from_value(json!([
                {"op": "remove", "path": "/metadata/labels/example.com~1eps"}
            ]))
            .unwrap(),
        ),
    )
    .await
    .expect("remove eps's label");
    let before = nss.get(ns.name()).await.unwrap().resource_version();
    let report = diff(&ns.client, &set, &Target::Parent(&manifest))
        .await
        .expect("diff");
    let ChildChange::Update { fields } = change(&report) else {
        panic!("{}", trellis::diff::print(&report.diffs));
    };
    assert!(
        fields
            .iter()
            .any(|f| f.path.contains("example.com/eps") && f.after == Some(json!("e"))),
        "{fields:?}"
    );
    assert_eq!(
        nss.get(ns.name()).await.unwrap().resource_version(),
        before,
        "diff wrote to the Namespace"
    );
    let operator = Operator::start(&ns.client, ns.name(), &[&text]);
    delete_parent(&app.api(&ns), "eps").await;
    operator.stop().await;
}

/// A pass that finds its contribution in place sends nothing: the parent
/// re-reconciled (an annotation edit) after the Namespace holds its label
/// makes no new apply of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contribution_in_place_is_not_sent_again() {
    let logs = support::logs::Logs::get().expect("the only global subscriber of this binary");
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "Quiet").await;
    let rule = support::unique_name("quiet");
    let operator = Operator::start(&ns.client, ns.name(), &[&team_rule(&app, &rule, "orphan")]);
    let parent = app.create(&ns, "zeta", json!({"value": "z"}), &[]).await;
    let uid = parent.uid().unwrap();
    wait_for(
        &app.api(&ns),
        "zeta",
        "zeta Ready",
        |p| match condition_state(p, "Ready")? {
            (s, _) if s == "True" => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    let count = |what: &str| {
        logs.lines()
            .iter()
            .filter(|l| l.contains(what) && l.contains(&uid))
            .count()
    };
    let passes = |logs: &support::logs::Logs| {
        let field = format!("parent={}/zeta ", ns.name());
        logs.lines()
            .iter()
            .filter(|l| l.contains("planned") && l.contains(&field))
            .count()
    };
    let sent = count("contributed");
    assert_eq!(sent, 1, "one apply made the contribution");
    let before = passes(logs);
    app.patch(
        &ns,
        "zeta",
        json!({"metadata": {"annotations": {"poke": "1"}}}),
    )
    .await;
    support::eventually("another pass of zeta", WAIT, || async {
        (passes(logs) > before).then_some(()).ok_or("no pass yet")
    })
    .await;
    assert_eq!(
        count("contributed"),
        sent,
        "the pass sent the contribution again"
    );
    delete_parent(&app.api(&ns), "zeta").await;
    operator.stop().await;
}

/// A rule removed from the set releases its retained children, whatever
/// `onRuleRemoved` says: with `orphan` they would otherwise keep an
/// ownerReference to a parent whose deletion would take them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_rule_releases_its_retained_children() {
    let ns = support::namespace().await;
    let (app, _cleanup) = install_kind(&ns, "Holder").await;
    let text = app
        .rule(RETAIN_RULE)
        .replace("name: keeper", "name: holder");
    let mut rules = ConfigMapDir::new(&[("r.yaml", &text)]);
    let operator = Reloading::start(&ns.client, ns.name(), &rules);
    app.create(&ns, "h", json!({"volumes": ["a"]}), &[]).await;
    let cms: Api<ConfigMap> = ns.api();
    support::operator::wait_exists(&cms, "h-a").await;
    support::operator::wait_exists(&cms, "h-scratch").await;
    rules.update(&[]);
    wait_for(&cms, "h-a", "h-a released", nothing_of_trellis).await;
    // The plain child is orphaned as it was: still owned by its parent.
    let scratch = cms.get("h-scratch").await.expect("h-scratch stays");
    assert!(!scratch.owner_references().is_empty());
    // The parent goes: the garbage collector takes the owned child, not the
    // released one.
    app.api(&ns)
        .delete("h", &DeleteParams::default())
        .await
        .expect("delete the parent");
    wait_gone(&app.api(&ns), "h", WAIT).await;
    wait_gone(&cms, "h-scratch", WAIT).await;
    assert!(
        cms.get_opt("h-a").await.unwrap().is_some(),
        "the retained child stays"
    );
    operator.stop().await;
}
