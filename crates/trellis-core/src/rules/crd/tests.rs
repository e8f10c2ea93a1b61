//! Tests of [`generate`] (the CRD of a rule). The schema conversion's tests
//! are in `schema/tests.rs`, the offline CRDs' in `crate::crd::offline`, the
//! RBAC that `--manage-crds` grants on generated CRDs in `crate::rbac`.

use serde_json::json;

use super::generate;
use crate::rules::model::Rule;

fn rule(spec: &str) -> Rule {
    let text = format!(
        "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: app\nspec:\n{spec}"
    );
    let value = crate::yaml::parse_value(&text, &crate::yaml::Limits::FILES).unwrap();
    serde_json::from_value(value).unwrap()
}

const PARENT: &str = "  parent: {apiVersion: demo.example.com/v1, kind: Policy}\n";

#[test]
fn generates_names_scope_subresource_and_default_columns() {
    let r = rule(&format!(
        "{PARENT}  crd: {{scope: Cluster, shortNames: [po], categories: [demo]}}\n"
    ));
    let (crd, findings) = generate(&r);
    assert!(findings.is_empty(), "{findings:#?}");
    let crd = crd.unwrap();
    assert_eq!(crd["metadata"]["name"], "policies.demo.example.com");
    assert_eq!(crd["spec"]["scope"], "Cluster");
    assert_eq!(
        crd["spec"]["names"],
        json!({"kind": "Policy", "listKind": "PolicyList", "plural": "policies", "singular": "policy", "shortNames": ["po"], "categories": ["demo"]})
    );
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"], "v1");
    assert_eq!(version["subresources"], json!({"status": {}}));
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(columns, ["Ready", "Synced", "Age"]);
    // No schema: the spec keeps anything.
    assert_eq!(
        version["schema"]["openAPIV3Schema"]["properties"]["spec"],
        json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
    );
}

#[test]
fn plural_can_be_set_and_rules_without_crd_get_none() {
    let r = rule(&format!("{PARENT}  crd: {{plural: policys}}\n"));
    assert_eq!(
        generate(&r).0.unwrap()["metadata"]["name"],
        "policys.demo.example.com"
    );
    assert_eq!(generate(&rule(PARENT)).0, None);
}

#[test]
fn printer_columns_mix_built_ins_and_own() {
    let r = rule(&format!(
        "{PARENT}  crd:
    printerColumns:
      - name: Ready
      - {{name: URL, jsonPath: .status.url}}
      - {{name: Replicas, type: integer, jsonPath: .status.replicas, priority: 1}}
      - name: Age
"
    ));
    let crd = generate(&r).0.unwrap();
    assert_eq!(
        crd["spec"]["versions"][0]["additionalPrinterColumns"],
        json!([
            {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
            {"name": "URL", "type": "string", "jsonPath": ".status.url"},
            {"name": "Replicas", "type": "integer", "priority": 1, "jsonPath": ".status.replicas"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ])
    );
    let bad = rule(&format!(
        "{PARENT}  crd:\n    printerColumns: [{{name: URL}}, {{name: X, jsonPath: status.x}}]\n"
    ));
    let (crd, findings) = generate(&bad);
    assert!(crd.is_none());
    let fields: Vec<&str> = findings.iter().map(|f| f.field.as_str()).collect();
    assert_eq!(
        fields,
        ["spec.crd.printerColumns[0]", "spec.crd.printerColumns[1]"]
    );
}

#[test]
fn status_holds_conditions_observed_generation_and_each_field() {
    let r = rule(&format!(
        "{PARENT}  crd:
    statusSchema:
      type: object
      properties:
        replicas:
          type: object
          properties:
            ready: {{type: integer}}
  status:
    fields:
      - {{path: replicas.ready, value: '1'}}
      - {{path: replicas.desired, value: '1'}}
      - {{path: url, value: \"'x'\"}}
"
    ));
    let (crd, findings) = generate(&r);
    assert!(findings.is_empty(), "{findings:#?}");
    let status = &crd.unwrap()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
        ["properties"];
    assert_eq!(
        status["observedGeneration"],
        json!({"type": "integer", "format": "int64"})
    );
    assert_eq!(
        status["conditions"]["items"]["properties"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        [
            "type",
            "status",
            "reason",
            "message",
            "lastTransitionTime",
            "observedGeneration"
        ]
    );
    assert_eq!(
        status["url"],
        json!({"x-kubernetes-preserve-unknown-fields": true})
    );
    assert_eq!(
        status["replicas"],
        json!({"type": "object", "properties": {
            "ready": {"type": "integer"},
            "desired": {"x-kubernetes-preserve-unknown-fields": true},
        }})
    );
}

#[test]
fn root_validations_and_required_spec() {
    let r = rule(&format!(
        "{PARENT}  schema: {{type: object, required: [image], properties: {{image: {{type: string}}}}}}
  crd:
    validations:
      - {{rule: \"self.metadata.name.size() < 20\", message: short names only}}
"
    ));
    let crd = generate(&r).0.unwrap();
    let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    assert_eq!(
        root["x-kubernetes-validations"],
        json!([{"rule": "self.metadata.name.size() < 20", "message": "short names only"}])
    );
    assert_eq!(root["required"], json!(["spec"]));
}

#[test]
fn refuses_builtin_groups_conflicting_hints_and_bad_names() {
    let findings = |spec: &str| {
        let (crd, f) = generate(&rule(spec));
        assert!(crd.is_none());
        f.into_iter().map(|f| f.field).collect::<Vec<_>>()
    };
    assert_eq!(
        findings("  parent: {apiVersion: apps/v1, kind: Deployment}\n  crd: {}\n"),
        ["spec.crd"]
    );
    assert_eq!(
        findings(
            "  parent: {apiVersion: a.example.com/v1, kind: A, scope: Namespaced}\n  crd: {scope: Cluster}\n"
        ),
        ["spec.crd.scope"]
    );
    assert_eq!(
        findings(&format!("{PARENT}  crd: {{shortNames: [Po]}}\n")),
        ["spec.crd.shortNames[0]"]
    );
    assert_eq!(
        findings(&format!(
            "{PARENT}  schema: {{type: string}}\n  crd: {{}}\n"
        )),
        ["spec.schema.type"]
    );
}

#[test]
fn check_names_the_refused_keyword_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let text = "apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: app
spec:
  parent: {apiVersion: demo.example.com/v1, kind: App}
  crd: {}
  schema:
    type: object
    properties:
      a:
        if: {required: [x]}
";
    std::fs::write(dir.path().join("rule.yaml"), text).unwrap();
    let diags = crate::rules::load_dir(dir.path()).unwrap_err();
    let messages: Vec<String> = diags.iter().map(|d| d.to_string()).collect();
    assert!(
        messages.iter().any(|m| m
            .contains("rule.yaml:12: error: spec.schema.properties.a.if: `if` has no equivalent")),
        "{messages:#?}"
    );
}
