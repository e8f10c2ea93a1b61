//! `check` of what a rule shares: `propagate` keys, cartesian `forEach`
//! names, per-item condition types, inventory paths and `crd.scale` paths,
//! each error with its file, line and field; and the CRD they generate.

use std::fs;

use serde_json::json;

use super::*;

const HEAD: &str = "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: app\nspec:\n  parent:\n    apiVersion: demo.trellis.dev/v1\n    kind: App\n";

const CHILD: &str = "  children:\n    - id: config\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata: {name: x}\n";

fn load(body: &str) -> Result<RuleSet, Vec<String>> {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("rule.yaml"), format!("{HEAD}{body}")).unwrap();
    load_dir(dir.path()).map_err(|d| d.iter().map(ToString::to_string).collect())
}

fn errors(body: &str) -> Vec<String> {
    match load(body) {
        Ok(_) => panic!("rule accepted:\n{body}"),
        Err(d) => d.into_iter().filter(|m| m.contains("error")).collect(),
    }
}

fn has(diags: &[String], line: u32, field: &str, text: &str) {
    let want = format!("rule.yaml:{line}: error: {field}: ");
    assert!(
        diags.iter().any(|m| m.contains(&want) && m.contains(text)),
        "no `{want}…{text}` in {diags:#?}"
    );
}

#[test]
fn propagate_keys_must_be_keys_or_prefixes() {
    let d = errors(&format!(
        "  propagate:\n    labels: [team, 'a*b']\n    annotations: ['x/y/z']\n{CHILD}"
    ));
    has(&d, 10, "spec.propagate.labels[1]", "`*` only at its end");
    has(&d, 11, "spec.propagate.annotations[0]", "more than one `/`");
    let ok = load(&format!(
        "  propagate:\n    labels: [team, example.com/*]\n    annotations: ['*']\n{CHILD}"
    ));
    assert!(ok.is_ok(), "{ok:?}");
    let many: Vec<String> = (0..=MAX_PROPAGATE_KEYS).map(|i| format!("k{i}")).collect();
    let d = errors(&format!(
        "  propagate:\n    labels: [{}]\n{CHILD}",
        many.join(", ")
    ));
    has(&d, 10, "spec.propagate.labels", "more than the limit of 64");
}

#[test]
fn a_trellis_key_in_propagate_is_a_warning() {
    let set = load(&format!(
        "  propagate:\n    labels: ['trellis.dev/*']\n{CHILD}"
    ))
    .unwrap();
    assert!(
        set.warnings[0]
            .to_string()
            .contains("matches only keys trellis writes itself"),
        "{:?}",
        set.warnings
    );
}

#[test]
fn cartesian_for_each_names_are_identifiers_and_its_expressions_checked() {
    let d = errors(
        "  children:\n    - id: cell\n      apiVersion: v1\n      kind: ConfigMap\n      forEach:\n        region: spec.regions\n        my-tier: spec.tiers\n        zone: parnet.x\n      template: |\n        metadata: {name: \"{{ item.region }}\"}\n",
    );
    has(
        &d,
        15,
        "spec.children[0].forEach.my-tier",
        "not a valid name",
    );
    has(&d, 16, "spec.children[0].forEach.zone", "`parnet`");
    let d = errors(
        "  children:\n    - id: cell\n      apiVersion: v1\n      kind: ConfigMap\n      forEach: {}\n      template: |\n        metadata: {name: x}\n",
    );
    assert!(!d.is_empty());
}

#[test]
fn a_templated_type_needs_for_each_and_per_item_conditions_see_item() {
    let d = errors(&format!(
        "{CHILD}  status:\n    conditions:\n      - type: \"{{{{ spec.x }}}}Ready\"\n        when: \"true\"\n        reason: Up\n"
    ));
    has(&d, 17, "spec.status.conditions[0].type", "needs `forEach`");
    let d = errors(&format!(
        "{CHILD}  status:\n    conditions:\n      - type: \"{{{{ item }}}}Ready\"\n        when: \"item.ok\"\n        message: \"{{{{ itme }}}}\"\n        reason: Up\n"
    ));
    has(
        &d,
        18,
        "spec.status.conditions[0].when",
        "`item` is not available here",
    );
    has(&d, 19, "spec.status.conditions[0].message", "`itme`");
    let ok = load(&format!(
        "{CHILD}  status:\n    conditions:\n      - type: \"{{{{ item | title }}}}Ready\"\n        forEach: spec.dbs\n        when: \"index >= 0\"\n        message: \"{{{{ item }}}}\"\n        reason: Up\n"
    ));
    assert!(ok.is_ok(), "{ok:?}");
    let fixed = load(&format!(
        "{CHILD}  status:\n    conditions:\n      - type: SameReady\n        forEach: spec.dbs\n        when: \"true\"\n        reason: Up\n"
    ))
    .unwrap();
    assert!(
        fixed.warnings[0]
            .to_string()
            .contains("the same for every item"),
        "{:?}",
        fixed.warnings
    );
}

#[test]
fn inventory_owns_children_in_status() {
    let d = errors(&format!(
        "{CHILD}  status:\n    inventory: true\n    fields:\n      - path: children.count\n        value: \"1\"\n"
    ));
    has(
        &d,
        18,
        "spec.status.fields[0].path",
        "status.inventory is on",
    );
}

const SCHEMA: &str = "  schema:\n    type: object\n    properties:\n      replicas: {type: integer}\n      name: {type: string}\n";
const FIELDS: &str = "  status:\n    fields:\n      - {path: replicas.ready, value: \"1\"}\n      - {path: selector, value: \"'app=x'\"}\n";

#[test]
fn scale_paths_must_be_held_by_the_schema_or_the_status_fields() {
    let ok = load(&format!(
        "{SCHEMA}  crd:\n    scale: {{specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas.ready, labelSelectorPath: .status.selector}}\n{CHILD}{FIELDS}"
    ))
    .unwrap();
    let crd = ok.rules[0].crd.as_ref().unwrap();
    assert_eq!(
        crd["spec"]["versions"][0]["subresources"],
        json!({"status": {}, "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas.ready",
            "labelSelectorPath": ".status.selector"}})
    );
    let d = errors(&format!(
        "{SCHEMA}  crd:\n    scale:\n      specReplicasPath: .spec.count\n      statusReplicasPath: .status.ready\n      labelSelectorPath: .metadata.x\n{CHILD}{FIELDS}"
    ));
    has(
        &d,
        16,
        "spec.crd.scale.specReplicasPath",
        "not declared by spec.schema",
    );
    has(
        &d,
        17,
        "spec.crd.scale.statusReplicasPath",
        "not a status field",
    );
    has(
        &d,
        18,
        "spec.crd.scale.labelSelectorPath",
        "must start with `.spec.` or `.status.`",
    );
    let d = errors(&format!(
        "{SCHEMA}  crd:\n    scale: {{specReplicasPath: .spec.name, statusReplicasPath: .spec.replicas}}\n{CHILD}{FIELDS}"
    ));
    has(
        &d,
        15,
        "spec.crd.scale.specReplicasPath",
        "of type string, not integer",
    );
    has(
        &d,
        15,
        "spec.crd.scale.statusReplicasPath",
        "must start with `.status.`",
    );
}

#[test]
fn a_rule_without_the_new_fields_generates_todays_crd() {
    let set = load(&format!("{SCHEMA}  crd: {{}}\n{CHILD}{FIELDS}")).unwrap();
    let crd = set.rules[0].crd.as_ref().unwrap();
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["subresources"], json!({"status": {}}));
    let status = &version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
    assert!(status.get("children").is_none() && status.get("childrenTruncated").is_none());
}

#[test]
fn inventory_is_declared_by_the_generated_crd() {
    let set = load(&format!(
        "  crd: {{}}\n{CHILD}  status:\n    inventory: true\n"
    ))
    .unwrap();
    let crd = set.rules[0].crd.as_ref().unwrap();
    let status = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
    assert_eq!(status["childrenTruncated"]["type"], "integer");
    let item = &status["children"]["items"];
    assert_eq!(
        item["required"],
        json!(["id", "apiVersion", "kind", "name", "ready"])
    );
    assert_eq!(item["properties"]["ready"], json!({"type": "boolean"}));
    let d = errors(&format!(
        "  crd:\n    statusSchema: {{type: object, properties: {{children: {{type: string}}}}}}\n{CHILD}  status:\n    inventory: true\n"
    ));
    has(
        &d,
        10,
        "spec.crd.statusSchema.properties.children",
        "written by trellis",
    );
}

#[test]
fn every_version_must_hold_the_spec_replicas_path() {
    let versioned = |old: &str| {
        format!(
            "  parent: {{apiVersion: demo.trellis.dev/v2, kind: App}}\n{SCHEMA}  crd:\n    scale: {{specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas.ready}}\n  versions:\n    - name: v1\n      schema:\n        type: object\n        properties:\n{old}      toHub: |\n        replicas: 1\n      fromHub: |\n        name: x\n{CHILD}{FIELDS}"
        )
    };
    let head = "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: app\nspec:\n";
    let load_spec = |spec: String| {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("rule.yaml"), format!("{head}{spec}")).unwrap();
        load_dir(dir.path()).map_err(|d| d.iter().map(ToString::to_string).collect::<Vec<_>>())
    };
    let ok = load_spec(versioned("          replicas: {type: integer}\n")).unwrap();
    let crd = ok.rules[0].crd.as_ref().unwrap();
    for version in crd["spec"]["versions"].as_array().unwrap() {
        assert_eq!(
            version["subresources"]["scale"]["specReplicasPath"], ".spec.replicas",
            "{}",
            version["name"]
        );
    }
    let d = load_spec(versioned("          name: {type: string}\n")).unwrap_err();
    assert!(
        d.iter()
            .any(|m| m.contains("spec.crd.scale.specReplicasPath")
                && m.contains("not an integer declared by spec.versions[0].schema")),
        "{d:#?}"
    );
}
