//! `--manage-crds` refuses a CRD change that would break what the cluster
//! holds, against the real API server: a removed field or a tightened
//! bound leaves the live CRD as it was, naming version and path; adding an
//! optional field applies; `crd: {allowBreaking: true}` applies anyway.
mod support;

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
    let verdict = |text: &str| {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("widget.yaml"), text).expect("write");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_trellis"))
            .args(["crd", "--against-cluster", "--rules"])
            .arg(dir.path())
            .env(
                "KUBECONFIG",
                support::cluster()
                    .kubeconfig_path
                    .clone()
                    .expect("a kubeconfig file"),
            )
            .output()
            .expect("trellis crd");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
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
