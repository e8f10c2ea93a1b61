use serde_json::{Value, json};

use super::*;
use crate::rules::testing::{load_texts, rule_with_spec};

/// A WebApp whose hub is v2 (`ports: [...]`), served also as v1
/// (`port: N`) and v1beta1 (`image` only, lossy on ports).
const SPEC: &str = r#"  parent: {apiVersion: demo.trellis.dev/v2, kind: WebApp}
  crd: {}
  schema:
    type: object
    properties:
      image: {type: string}
      ports: {type: array, items: {type: integer}}
  versions:
    - name: v1beta1
      deprecated: "WebApp v1beta1 is deprecated; use v2"
      schema:
        type: object
        properties:
          image: {type: string}
      toHub: |
        image: {{ spec.image }}
        ports: [80]
      fromHub: |
        image: {{ spec.image }}
      lossy: [spec.ports]
    - name: v1
      schema:
        type: object
        properties:
          image: {type: string}
          port: {type: integer}
      toHub: |
        image: {{ spec.image }}
        ports: [{{ spec.port }}]
      fromHub: |
        image: {{ spec.image }}
        port: {{ spec.ports[0] }}
  storageVersion: v1
  children: []
"#;

fn object(version: &str, spec: Value) -> Value {
    json!({
        "apiVersion": format!("demo.trellis.dev/{version}"),
        "kind": "WebApp",
        "metadata": {"name": "shop", "namespace": "a", "labels": {"team": "x"}},
        "spec": spec,
        "status": {"ready": true},
    })
}

#[test]
fn a_to_b_goes_through_the_hub_and_keeps_metadata_and_status() {
    let rule = rule_with_spec(SPEC);
    let v1 = object("v1", json!({"image": "nginx", "port": 8080}));
    let v2 = convert(&rule, &v1, "v2").expect("v1 -> v2");
    assert_eq!(v2, object("v2", json!({"image": "nginx", "ports": [8080]})));
    assert_eq!(convert(&rule, &v2, "v1").expect("v2 -> v1"), v1);
    // v1 -> v1beta1 is v1 -> v2 -> v1beta1.
    let beta = convert(&rule, &v1, "v1beta1").expect("v1 -> v1beta1");
    assert_eq!(beta, object("v1beta1", json!({"image": "nginx"})));
    // The same version: as it is.
    assert_eq!(convert(&rule, &v1, "v1").expect("same"), v1);
}

#[test]
fn an_unknown_version_and_a_failing_template_are_errors_naming_rule_and_versions() {
    let rule = rule_with_spec(SPEC);
    let v1 = object("v1", json!({"image": "nginx", "port": 8080}));
    let err = convert(&rule, &v1, "v3").unwrap_err();
    assert_eq!(
        err.to_string(),
        "rule app: WebApp has no version `v3` (versions: v1beta1, v1, v2)"
    );
    // v2 without ports: fromHub of v1 reads spec.ports[0], which is missing.
    let v2 = object("v2", json!({"image": "nginx"}));
    let err = convert(&rule, &v2, "v1").unwrap_err().to_string();
    assert!(
        err.starts_with("rule app: converting WebApp from v2 to v1: fromHub of version v1:"),
        "{err}"
    );
}

#[test]
fn a_round_trip_reports_what_it_loses_unless_it_is_declared_lossy() {
    let rule = rule_with_spec(SPEC);
    let hub = object("v2", json!({"image": "nginx", "ports": [80, 443]}));
    // v1 keeps only the first port.
    assert_eq!(
        round_trip_losses(&rule, &hub, "v1").expect("converts"),
        ["spec.ports"]
    );
    // v1beta1 drops ports, and says so.
    assert_eq!(
        round_trip_losses(&rule, &hub, "v1beta1").expect("converts"),
        Vec::<String>::new()
    );
    let one = object("v2", json!({"image": "nginx", "ports": [80]}));
    assert!(
        round_trip_losses(&rule, &one, "v1")
            .expect("converts")
            .is_empty()
    );
}

#[test]
fn a_review_converts_every_object_or_fails_naming_the_first_that_cannot_be() {
    let set = load_texts(&[(
        "webapp.yaml",
        &format!(
            "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: app\nspec:\n{SPEC}"
        ),
    )]);
    let request = |objects: Vec<Value>| {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "ConversionReview",
            "request": {"uid": "u-1", "desiredAPIVersion": "demo.trellis.dev/v2", "objects": objects},
        })
    };
    let answer = review(
        &set,
        &request(vec![
            object("v1", json!({"image": "a", "port": 1})),
            object("v1beta1", json!({"image": "b"})),
            object("v2", json!({"image": "c", "ports": [3]})),
        ]),
    );
    assert_eq!(answer["kind"], "ConversionReview");
    assert_eq!(answer["response"]["uid"], "u-1");
    assert_eq!(answer["response"]["result"]["status"], "Success");
    let specs: Vec<&Value> = answer["response"]["convertedObjects"]
        .as_array()
        .expect("objects")
        .iter()
        .map(|o| &o["spec"])
        .collect();
    assert_eq!(
        specs,
        [
            &json!({"image": "a", "ports": [1]}),
            &json!({"image": "b", "ports": [80]}),
            &json!({"image": "c", "ports": [3]}),
        ]
    );
    let failed = review(
        &set,
        &request(vec![
            object("v1", json!({"image": "a", "port": 1})),
            json!({"apiVersion": "other.example.com/v1", "kind": "Thing"}),
        ]),
    );
    assert_eq!(failed["response"]["result"]["status"], "Failure");
    assert_eq!(failed["response"]["convertedObjects"], json!([]));
    assert!(
        failed["response"]["result"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("Thing")),
        "{failed}"
    );
}

#[test]
fn the_generated_crd_serves_every_version_with_one_storage_and_a_webhook() {
    let rule = rule_with_spec(SPEC);
    let crd = rule.crd.as_ref().expect("a CRD");
    let versions = crd["spec"]["versions"].as_array().expect("versions");
    let names: Vec<&str> = versions
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["v1beta1", "v1", "v2"]);
    let storage: Vec<&str> = versions
        .iter()
        .filter(|v| v["storage"] == true)
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(storage, ["v1"]);
    assert_eq!(versions[0]["deprecated"], true);
    assert_eq!(
        versions[0]["deprecationWarning"],
        "WebApp v1beta1 is deprecated; use v2"
    );
    assert_eq!(
        versions[1]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["port"]["type"],
        "integer"
    );
    assert_eq!(
        versions[2]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["ports"]["type"],
        "array"
    );
    // Every version shares the hub's status and subresources.
    for v in versions {
        assert_eq!(v["subresources"], versions[2]["subresources"]);
        assert_eq!(
            v["schema"]["openAPIV3Schema"]["properties"]["status"],
            versions[2]["schema"]["openAPIV3Schema"]["properties"]["status"]
        );
    }
    assert_eq!(crd["spec"]["conversion"]["strategy"], "Webhook");
    assert_eq!(
        crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"]["path"],
        "/convert"
    );
}

#[test]
fn a_rule_without_versions_keeps_its_one_version_crd() {
    let rule = rule_with_spec(
        "  parent: {apiVersion: demo.trellis.dev/v1, kind: App}\n  crd: {}\n  children: []\n",
    );
    let crd = rule.crd.as_ref().expect("a CRD");
    assert_eq!(crd["spec"]["versions"].as_array().map(Vec::len), Some(1));
    assert!(crd["spec"].get("conversion").is_none());
}

fn errors(spec: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: app\nspec:\n{spec}"
    );
    std::fs::write(dir.path().join("rule.yaml"), text).unwrap();
    match crate::rules::load_dir(dir.path()) {
        Ok(_) => Vec::new(),
        Err(diags) => diags
            .iter()
            .map(|d| format!("{}: {}", d.field, d.message))
            .collect(),
    }
}

#[test]
fn versions_are_checked_field_by_field() {
    assert_eq!(errors(SPEC), Vec::<String>::new());
    let without_crd = SPEC.replace("  crd: {}\n", "");
    assert_eq!(
        errors(&without_crd),
        ["spec.versions: versions are served by the CRD trellis generates: set `crd:` too"]
    );
    let hub_listed = SPEC.replace("name: v1beta1", "name: v2");
    assert!(
        errors(&hub_listed)
            .iter()
            .any(|e| e.starts_with("spec.versions[0].name: `v2` is the hub")),
        "{:?}",
        errors(&hub_listed)
    );
    let twice = SPEC.replace("name: v1beta1", "name: v1");
    assert!(
        errors(&twice).contains(&"spec.versions[1].name: version `v1` is listed twice".to_owned())
    );
    let bad_name = SPEC.replace("name: v1beta1", "name: V1");
    assert!(errors(&bad_name)[0].starts_with("spec.versions[0].name: `V1` is not a version name"));
    let unknown_storage = SPEC.replace("storageVersion: v1", "storageVersion: v9");
    assert_eq!(
        errors(&unknown_storage),
        ["spec.storageVersion: `v9` is neither the hub (`v2`) nor one of `versions`"]
    );
    let unserved = SPEC.replace("    - name: v1\n", "    - name: v1\n      served: false\n");
    assert_eq!(
        errors(&unserved),
        ["spec.storageVersion: `v1` is not served: objects are stored only in a served version"]
    );
    let reads_children = SPEC.replace(
        "image: {{ spec.image }}\n        ports: [80]",
        "image: {{ children.web }}\n        ports: [80]",
    );
    assert!(
        errors(&reads_children)
            .iter()
            .any(|e| e.starts_with("spec.versions[0].toHub:") && e.contains("children")),
        "{:?}",
        errors(&reads_children)
    );
    let lossy_outside_spec = SPEC.replace("lossy: [spec.ports]", "lossy: [status.x]");
    assert_eq!(
        errors(&lossy_outside_spec),
        ["spec.versions[0].lossy[0]: `status.x` is not under `spec`: only the spec is converted"]
    );
}

#[test]
fn the_operator_s_role_grants_the_webhook_s_secret_only_when_a_rule_has_versions() {
    let versioned = rule_with_spec(SPEC);
    let plain = rule_with_spec(
        "  parent: {apiVersion: demo.trellis.dev/v1, kind: App}\n  crd: {}\n  children: []\n",
    );
    let secrets = |rule: &crate::rules::CompiledRule| -> Vec<Value> {
        crate::rbac::namespaced_role_of(&[rule], "trellis", "ops")["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .filter(|r| r["resources"] == json!(["secrets"]))
            .cloned()
            .collect()
    };
    assert_eq!(
        secrets(&versioned),
        [
            json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "update"]})
        ]
    );
    assert!(secrets(&plain).is_empty());
}

/// [`SPEC`] with vars: `label` reads the parent only, `first` reads it
/// through another var, `web` a related object (no value in a conversion).
fn with_vars(from_hub: &str) -> String {
    SPEC.replace(
        "  storageVersion: v1\n",
        "  storageVersion: v1\n  related:\n    - id: cfg\n      apiVersion: v1\n      kind: ConfigMap\n      name: \"{{ parent.metadata.name }}\"\n  vars:\n    - name: label\n      value: \"metadata.labels.team ~ '-' ~ metadata.name\"\n    - name: first\n      value: \"vars.label ~ '!'\"\n    - name: web\n      value: \"related.cfg | length\"\n",
    )
    .replace(
        "        image: {{ spec.image }}\n        port: {{ spec.ports[0] }}",
        from_hub,
    )
}

#[test]
fn conversion_templates_read_the_vars_that_need_no_pass() {
    let spec = with_vars("        image: {{ vars.first }}\n        port: {{ spec.ports[0] }}");
    assert_eq!(errors(&spec), Vec::<String>::new());
    let rule = rule_with_spec(&spec);
    let v2 = object("v2", json!({"image": "nginx", "ports": [8080]}));
    let v1 = convert(&rule, &v2, "v1").expect("v2 -> v1");
    assert_eq!(v1["spec"], json!({"image": "x-shop!", "port": 8080}));

    // A var that reads a related object has no value outside a pass.
    let refused = with_vars("        image: {{ vars.web }}\n        port: {{ spec.ports[0] }}");
    assert_eq!(
        errors(&refused),
        [
            "spec.versions[1].fromHub: reads `vars.web`, which reads related objects or children: a conversion has neither (only spec, metadata and the parent)"
        ]
    );

    // A var that fails is the conversion's error, naming it.
    let mut unlabelled = v2.clone();
    unlabelled["metadata"]["labels"] = json!({});
    let err = convert(&rule, &unlabelled, "v1").expect_err("the var fails");
    let text = err.to_string();
    assert!(
        text.contains("rule app: converting WebApp from v2 to v1")
            && text.contains("reads var `first`, which reads var `label`"),
        "{text}"
    );
}
