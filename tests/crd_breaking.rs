//! `--manage-crds` refuses a CRD change that would break what the cluster
//! holds, against the real API server: a removed field or a tightened
//! bound leaves the live CRD as it was, naming version and path; adding an
//! optional field applies; `crd: {allowBreaking: true}` applies anyway.
//! And the operator holds a rule whose edit is breaking on its last good
//! version, showing `Breaking` in `/status` and `trellis_rule_state`.
mod support;

#[path = "support/configmap_dir.rs"]
mod configmap_dir;
#[path = "support/reloading.rs"]
mod reloading;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use serde_json::Value;

use support::operator::rule_set;

fn rule(group: &str, properties: &str, crd: &str) -> String {
    format!(
        r#"apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: widget
spec:
  parent:
    apiVersion: {group}/v1
    kind: Widget
  crd: {crd}
  schema:
    type: object
    properties:
{properties}
  children: []
"#
    )
}

const FIELDS: &str = "      image: {type: string}\n      replicas: {type: integer, maximum: 10}\n";

fn crd_of(text: &str) -> Value {
    rule_set(&[text]).rules[0].crd.clone().expect("crd:")
}

async fn live_spec(crds: &Api<CustomResourceDefinition>, name: &str) -> Value {
    let live = crds.get(name).await.expect("the CRD");
    serde_json::to_value(&live).expect("json")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        ["properties"]["spec"]
        .clone()
}

/// `trellis ARGS --rules DIR` on the test cluster, DIR holding `rule`:
/// exit code, stdout, stderr.
fn trellis_on(args: &[&str], rule: &str) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("widget.yaml"), rule).expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(args)
        .arg("--rules")
        .arg(dir.path())
        .env(
            "KUBECONFIG",
            support::cluster()
                .kubeconfig_path
                .clone()
                .expect("a kubeconfig file"),
        )
        .output()
        .expect("trellis");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_breaking_crd_change_is_refused_by_version_and_path_unless_allowed() {
    let ns = support::namespace().await;
    let group = format!("{}.trellis.test", support::unique_name("breaking"));
    let name = format!("widgets.{group}");
    let crds: Api<CustomResourceDefinition> = Api::all(ns.client.clone());
    let mut cleanup = support::operator::Cleanup::default();
    cleanup.add::<CustomResourceDefinition>(&name);
    let apply = |text: String| {
        let client = ns.client.clone();
        async move {
            let allow = text.contains("allowBreaking: true");
            trellis::operator::crds::apply_checked(&client, &crd_of(&text), allow).await
        }
    };
    apply(rule(&group, FIELDS, "{}"))
        .await
        .expect("first install");

    // Safe: a new optional field.
    let added = format!("{FIELDS}      note: {{type: string}}\n");
    apply(rule(&group, &added, "{}"))
        .await
        .expect("an optional field is safe");
    assert!(
        live_spec(&crds, &name).await["properties"]
            .get("note")
            .is_some()
    );

    // Breaking: `image` removed and `replicas` capped lower.
    let narrowed = "      replicas: {type: integer, maximum: 3}\n      note: {type: string}\n";
    let err = apply(rule(&group, narrowed, "{}"))
        .await
        .expect_err("a breaking change is refused");
    let text = err.to_string();
    assert!(
        text.contains(&format!(
            "CustomResourceDefinition {name} not applied: the change is breaking"
        )) && text.contains("version v1: spec.image: removed")
            && text.contains("version v1: spec.replicas: maximum tightened from 10 to 3"),
        "{text}"
    );
    let live = live_spec(&crds, &name).await;
    assert!(
        live["properties"].get("image").is_some(),
        "the live CRD is untouched"
    );
    assert_eq!(
        live["properties"]["replicas"]["maximum"].as_f64(),
        Some(10.0)
    );

    // The same verdict from the command line, nothing applied.
    let verdict = |text: &str| trellis_on(&["crd", "--against-cluster"], text);
    let (code, out, err) = verdict(&rule(&group, narrowed, "{}"));
    assert_eq!(code, Some(1), "{out}{err}");
    assert_eq!(
        out,
        format!(
            "rule widget: CustomResourceDefinition {name}: breaking (not applied by --manage-crds)\n  version v1: spec.image: removed\n  version v1: spec.replicas: maximum tightened from 10 to 3\n"
        )
    );
    let (code, out, err) = verdict(&rule(&group, &added, "{}"));
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(
        out,
        format!("rule widget: CustomResourceDefinition {name}: safe to apply\n")
    );
    assert!(
        live_spec(&crds, &name).await["properties"]
            .get("image")
            .is_some(),
        "nothing applied"
    );

    // Allowed: applied as written.
    apply(rule(&group, narrowed, "{allowBreaking: true}"))
        .await
        .expect("allowBreaking applies");
    let live = live_spec(&crds, &name).await;
    assert!(live["properties"].get("image").is_none());
    assert_eq!(
        live["properties"]["replicas"]["maximum"].as_f64(),
        Some(3.0)
    );
}

/// A Widget rule (`crd: CRD`, the schema's `FIELDS`) whose one child
/// ConfigMap stamps `VERSION` and follows `spec.replicas`.
fn held_rule(group: &str, fields: &str, crd: &str, version: &str) -> String {
    format!(
        r#"apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: widget
spec:
  parent:
    apiVersion: {group}/v1
    kind: Widget
  crd: {crd}
  schema:
    type: object
    properties:
{fields}
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{{{ parent.metadata.name ~ "-config" }}}}
        data:
          replicas: {{{{ spec.replicas | string }}}}
          version: "{version}"
"#
    )
}

#[tokio::test]
async fn a_rule_whose_crd_edit_is_breaking_keeps_its_last_good_version_and_says_so() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{DynamicObject, PostParams};
    use support::operator::{config_data, wait_for};

    let ns = support::namespace().await;
    let group = format!("{}.trellis.test", support::unique_name("held"));
    let name = format!("widgets.{group}");
    let crds: Api<CustomResourceDefinition> = Api::all(ns.client.clone());
    let mut cleanup = support::operator::Cleanup::default();
    cleanup.add::<CustomResourceDefinition>(&name);
    let mut rules = configmap_dir::ConfigMapDir::new(&[(
        "widget.yaml",
        &held_rule(&group, FIELDS, "{}", "v1"),
    )]);
    let operator = reloading::Reloading::start_managing_crds(&ns.client, ns.name(), &rules);

    let resource = kube::discovery::ApiResource {
        group: group.clone(),
        version: "v1".into(),
        api_version: format!("{group}/v1"),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    let widgets: Api<DynamicObject> = Api::namespaced_with(ns.client.clone(), ns.name(), &resource);
    let parent: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": format!("{group}/v1"), "kind": "Widget",
        "metadata": {"name": "w"}, "spec": {"image": "web:1", "replicas": 2},
    }))
    .expect("a Widget");
    support::eventually(
        "the Widget created once its CRD is served",
        support::operator::WAIT,
        || async {
            widgets
                .create(&PostParams::default(), &parent)
                .await
                .map(|_| ())
        },
    )
    .await;
    let cms: Api<ConfigMap> = ns.api();
    let child = |replicas: &'static str, version: &'static str| {
        move |cm: &ConfigMap| {
            let got = (config_data(cm, "replicas"), config_data(cm, "version"));
            (got == (Some(replicas.into()), Some(version.into())))
                .then_some(())
                .ok_or(format!("{got:?}"))
        }
    };
    wait_for(&cms, "w-config", "the child at v1", child("2", "v1")).await;

    // Breaking (`image` removed, `replicas` capped lower) together with a
    // new child template: neither the CRD nor the template is put in force.
    let narrowed = "      replicas: {type: integer, maximum: 3}\n";
    rules.update(&[("widget.yaml", &held_rule(&group, narrowed, "{}", "v2"))]);
    let status = operator
        .wait_status("the rule held as breaking", |s| {
            s["rules"]["widget"]["state"] == "Breaking"
        })
        .await;
    let changes = &status["rules"]["widget"]["changes"];
    assert_eq!(
        changes,
        &serde_json::json!([
            "version v1: spec.image: removed",
            "version v1: spec.replicas: maximum tightened from 10 to 3"
        ]),
        "{status}"
    );
    let metrics = operator.metrics().await;
    assert!(
        metrics.contains(r#"trellis_rule_state{rule="widget",state="breaking"} 1"#),
        "{metrics}"
    );
    assert!(
        live_spec(&crds, &name).await["properties"]
            .get("image")
            .is_some(),
        "the live CRD is untouched"
    );
    // The last good version still runs: a parent edit reaches the child,
    // rendered by the v1 template.
    widgets
        .patch(
            "w",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"replicas": 3}})),
        )
        .await
        .expect("patch the Widget");
    wait_for(
        &cms,
        "w-config",
        "the child following at v1",
        child("3", "v1"),
    )
    .await;

    // Allowed: the CRD is applied and the new version runs.
    rules.update(&[(
        "widget.yaml",
        &held_rule(&group, narrowed, "{allowBreaking: true}", "v2"),
    )]);
    operator
        .wait_status("the rule running again", |s| {
            s["rules"]["widget"]["state"] == "Running"
        })
        .await;
    wait_for(&cms, "w-config", "the child at v2", child("3", "v2")).await;
    support::eventually("the CRD applied", support::operator::WAIT, || async {
        let live = live_spec(&crds, &name).await;
        live["properties"]
            .get("image")
            .is_none()
            .then_some(())
            .ok_or(live)
    })
    .await;
    assert!(
        !operator.metrics().await.contains(r#"state="breaking""#),
        "the breaking state is gone"
    );
    operator.stop().await;
}

#[tokio::test]
async fn trellis_diff_shows_the_crd_change_and_whether_it_is_breaking() {
    let ns = support::namespace().await;
    let group = format!("{}.trellis.test", support::unique_name("diffcrd"));
    let name = format!("widgets.{group}");
    let mut cleanup = support::operator::Cleanup::default();
    cleanup.add::<CustomResourceDefinition>(&name);
    let diff = |text: String| trellis_on(&["diff", "--all", "-n", ns.name()], &text);
    let (code, out, err) = diff(rule(&group, FIELDS, "{}"));
    assert!(
        out.contains(&format!(
            "CustomResourceDefinition {name} (rule widget)\n  + (create)\n"
        )),
        "{out}{err}"
    );
    assert_eq!(code, Some(1), "a CRD to create is a change: {out}{err}");
    trellis::operator::crds::apply_checked(&ns.client, &crd_of(&rule(&group, FIELDS, "{}")), false)
        .await
        .expect("install");

    let (code, out, err) = diff(rule(&group, FIELDS, "{}"));
    assert_eq!((code, out.as_str()), (Some(0), "no parents\n"), "{err}");

    let added = format!("{FIELDS}      note: {{type: string}}\n");
    let (code, out, err) = diff(rule(&group, &added, "{}"));
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        out.contains("  ~ the CRD\n")
            && out.contains(".properties.note")
            && out.contains("  safe to apply\n"),
        "{out}"
    );

    let narrowed = "      replicas: {type: integer, maximum: 3}\n";
    let (code, out, err) = diff(rule(&group, narrowed, "{}"));
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(
        out.contains("  breaking: not applied by --manage-crds; the rule keeps its last good version\n    version v1: spec.image: removed\n    version v1: spec.replicas: maximum tightened from 10 to 3\n"),
        "{out}"
    );
    let (code, out, _) = diff(rule(&group, narrowed, "{allowBreaking: true}"));
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("  breaking: applied anyway"), "{out}");
    let live = live_spec(&Api::all(ns.client.clone()), &name).await;
    assert!(
        live["properties"].get("image").is_some(),
        "a diff applies nothing"
    );
}
