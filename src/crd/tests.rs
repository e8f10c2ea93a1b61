use serde_json::{Value, json};

use super::schema::{Converter, apply_defaults};
use super::{Finding, generate};
use crate::rules::model::Rule;

/// Converts a `spec.schema`; panics on any finding.
fn convert(schema: Value) -> Value {
    let mut conv = Converter::default();
    let out = conv.convert(&schema, "spec.schema");
    assert!(conv.findings.is_empty(), "{:#?}", conv.findings);
    Value::Object(out)
}

/// The findings of converting a `spec.schema` that should be refused.
fn refused(schema: Value) -> Vec<Finding> {
    let mut conv = Converter::default();
    conv.convert(&schema, "spec.schema");
    assert!(conv.has_errors(), "accepted: {schema}");
    conv.findings
}

fn assert_refused(schema: Value, field: &str, words: &str) {
    let findings = refused(schema);
    assert!(
        findings
            .iter()
            .any(|f| f.error && f.field == field && f.message.contains(words)),
        "expected an error at {field} containing {words:?}: {findings:#?}"
    );
}

#[test]
fn types_and_value_checks_pass_through() {
    let out = convert(json!({
        "type": "object",
        "required": ["image"],
        "properties": {
            "image": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[a-z]", "description": "d"},
            "replicas": {"type": "integer", "minimum": 0, "maximum": 50, "multipleOf": 1, "format": "int32"},
            "ratio": {"type": "number"},
            "on": {"type": "boolean"},
            "mode": {"type": "string", "enum": ["a", "b"]},
        },
    }));
    assert_eq!(
        out,
        json!({
            "type": "object",
            "properties": {
                "image": {"description": "d", "type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[a-z]"},
                "replicas": {"type": "integer", "format": "int32", "multipleOf": 1, "minimum": 0, "maximum": 50},
                "ratio": {"type": "number"},
                "on": {"type": "boolean"},
                "mode": {"type": "string", "enum": ["a", "b"]},
            },
            "required": ["image"],
        })
    );
}

#[test]
fn exclusive_bounds_become_openapi_booleans() {
    assert_eq!(
        convert(json!({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10})),
        json!({"type": "integer", "minimum": 0, "exclusiveMinimum": true, "maximum": 10, "exclusiveMaximum": true})
    );
    // Both given: the stricter bound wins.
    assert_eq!(
        convert(json!({"type": "integer", "minimum": 5, "exclusiveMinimum": 0})),
        json!({"type": "integer", "minimum": 5})
    );
    assert_eq!(
        convert(json!({"type": "integer", "minimum": 0, "exclusiveMinimum": 5})),
        json!({"type": "integer", "minimum": 5, "exclusiveMinimum": true})
    );
}

#[test]
fn const_is_a_one_value_enum_and_enums_give_their_type() {
    assert_eq!(
        convert(json!({"const": "x"})),
        json!({"type": "string", "enum": ["x"]})
    );
    assert_eq!(
        convert(json!({"enum": ["15", "16"]})),
        json!({"type": "string", "enum": ["15", "16"]})
    );
    assert_eq!(
        convert(json!({"enum": [1, 2]})),
        json!({"type": "integer", "enum": [1, 2]})
    );
    assert_refused(
        json!({"enum": ["a", true]}),
        "spec.schema.enum",
        "need a `type:`",
    );
}

#[test]
fn missing_types_are_inferred_from_keywords() {
    assert_eq!(
        convert(json!({"minLength": 1}))["type"],
        "string",
        "string keywords"
    );
    assert_eq!(convert(json!({"minimum": 1}))["type"], "number");
    assert_eq!(
        convert(json!({"properties": {"a": {"type": "string"}}}))["type"],
        "object"
    );
    assert_eq!(
        convert(json!({"items": {"type": "string"}}))["type"],
        "array"
    );
}

#[test]
fn nullable_and_int_or_string_type_lists() {
    assert_eq!(
        convert(json!({"type": ["string", "null"]})),
        json!({"type": "string", "nullable": true})
    );
    assert_eq!(
        convert(json!({"type": ["string", "integer"], "pattern": "^[0-9]+m?$"})),
        json!({"x-kubernetes-int-or-string": true, "pattern": "^[0-9]+m?$"})
    );
    assert_eq!(
        convert(json!({"anyOf": [{"type": "integer"}, {"type": "string"}]})),
        json!({"x-kubernetes-int-or-string": true, "anyOf": [{}, {}]})
    );
    assert_refused(
        json!({"type": ["string", "boolean"]}),
        "spec.schema.type",
        "several types",
    );
    assert_refused(json!({"type": "null"}), "spec.schema.type", "only be null");
}

#[test]
fn nested_objects_and_lists() {
    let out = convert(json!({
        "type": "object",
        "properties": {
            "admins": {
                "type": "array",
                "maxItems": 5,
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {"name": {"type": "string"}, "kind": {"enum": ["User", "Group"]}},
                },
            },
        },
    }));
    assert_eq!(
        out["properties"]["admins"],
        json!({
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "kind": {"type": "string", "enum": ["User", "Group"]}},
                "required": ["name"],
            },
            "minItems": 1,
            "maxItems": 5,
        })
    );
}

#[test]
fn a_list_without_items_keeps_any_item() {
    assert_eq!(
        convert(json!({"type": "array"})),
        json!({"type": "array", "items": {"x-kubernetes-preserve-unknown-fields": true}})
    );
}

#[test]
fn unique_scalar_items_become_a_set_list() {
    assert_eq!(
        convert(json!({"type": "array", "uniqueItems": true, "items": {"type": "string"}})),
        json!({"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"})
    );
    assert_refused(
        json!({"type": "array", "uniqueItems": true, "items": {"type": "object", "properties": {"a": {"type": "string"}}}}),
        "spec.schema.uniqueItems",
        "x-kubernetes-list-type: map",
    );
}

#[test]
fn maps_and_open_objects() {
    assert_eq!(
        convert(json!({"type": "object", "additionalProperties": {"type": "string"}})),
        json!({"type": "object", "additionalProperties": {"type": "string"}})
    );
    // Without properties, JSON Schema accepts any field: so does the CRD.
    assert_eq!(
        convert(json!({"type": "object"})),
        json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
    );
    assert_eq!(
        convert(
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": true})
        ),
        json!({"type": "object", "properties": {"a": {"type": "string"}}, "x-kubernetes-preserve-unknown-fields": true})
    );
    // `false` is what pruning does anyway.
    assert_eq!(
        convert(
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": false})
        ),
        json!({"type": "object", "properties": {"a": {"type": "string"}}})
    );
    assert_refused(
        json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "string"}}),
        "spec.schema.additionalProperties",
        "not both",
    );
}

#[test]
fn an_empty_schema_keeps_any_value() {
    assert_eq!(
        convert(json!({"type": "object", "properties": {"any": {}, "also": true}})),
        json!({"type": "object", "properties": {
            "any": {"x-kubernetes-preserve-unknown-fields": true},
            "also": {"x-kubernetes-preserve-unknown-fields": true},
        }})
    );
}

#[test]
fn kubernetes_extensions_and_cel_rules_pass_through() {
    let rules = json!([{"rule": "self == oldSelf", "message": "immutable"}]);
    let out = convert(json!({
        "type": "object",
        "properties": {
            "storage": {"type": "string", "x-kubernetes-validations": rules},
            "ports": {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
            },
            "labels": {"type": "object", "additionalProperties": {"type": "string"}, "x-kubernetes-map-type": "granular"},
            "raw": {"type": "object", "x-kubernetes-embedded-resource": true, "x-kubernetes-preserve-unknown-fields": true},
        },
    }));
    let p = &out["properties"];
    assert_eq!(p["storage"]["x-kubernetes-validations"], rules);
    assert_eq!(p["ports"]["x-kubernetes-list-type"], "map");
    assert_eq!(p["ports"]["x-kubernetes-list-map-keys"], json!(["name"]));
    assert_eq!(p["labels"]["x-kubernetes-map-type"], "granular");
    assert_eq!(
        p["raw"],
        json!({"type": "object", "x-kubernetes-embedded-resource": true, "x-kubernetes-preserve-unknown-fields": true})
    );
    assert_refused(
        json!({"type": "string", "x-kubernetes-typo": true}),
        "spec.schema.x-kubernetes-typo",
        "unknown extension",
    );
}

#[test]
fn combinators_may_add_checks_to_fields_declared_outside() {
    let out = convert(json!({
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
        "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
        "not": {"properties": {"a": {"type": "string", "enum": ["forbidden"]}}},
        "allOf": [{"properties": {"b": {"minLength": 2}}}],
    }));
    assert_eq!(
        out["oneOf"],
        json!([{"required": ["a"]}, {"required": ["b"]}])
    );
    assert_eq!(
        out["not"],
        json!({"properties": {"a": {"enum": ["forbidden"]}}})
    );
    assert_eq!(
        out["allOf"],
        json!([{"properties": {"b": {"minLength": 2}}}])
    );
}

#[test]
fn refuses_combinator_branches_of_other_types() {
    assert_refused(
        json!({"oneOf": [{"type": "string"}, {"type": "boolean"}]}),
        "spec.schema.oneOf",
        "branches of different types",
    );
    assert_refused(
        json!({"type": "string", "anyOf": [{"type": "integer"}]}),
        "spec.schema.anyOf[0].type",
        "restate the type",
    );
}

#[test]
fn refuses_combinators_that_declare_fields_or_defaults() {
    assert_refused(
        json!({"type": "object", "properties": {"a": {"type": "string"}}, "anyOf": [{"properties": {"c": {"type": "string"}}}]}),
        "spec.schema.anyOf[0].properties.c",
        "declared outside",
    );
    assert_refused(
        json!({"type": "string", "allOf": [{"default": "x"}]}),
        "spec.schema.allOf[0].default",
        "may only add checks",
    );
    assert_refused(
        json!({"type": "object", "properties": {"a": {"type": "string"}}, "allOf": [{"additionalProperties": false}]}),
        "spec.schema.allOf[0].additionalProperties",
        "may only add checks",
    );
}

#[test]
fn refuses_references_with_a_hint() {
    assert_refused(
        json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"type": "string"}}}),
        "spec.schema.properties.a.$ref",
        "YAML anchor",
    );
    assert_refused(
        json!({"type": "object", "$defs": {"x": {"type": "string"}}}),
        "spec.schema.$defs",
        "no references",
    );
}

#[test]
fn refuses_every_keyword_without_a_structural_equivalent() {
    for (keyword, value, words) in [
        ("if", json!({"required": ["a"]}), "x-kubernetes-validations"),
        (
            "then",
            json!({"required": ["b"]}),
            "x-kubernetes-validations",
        ),
        (
            "else",
            json!({"required": ["c"]}),
            "x-kubernetes-validations",
        ),
        (
            "dependentRequired",
            json!({"a": ["b"]}),
            "x-kubernetes-validations",
        ),
        (
            "dependentSchemas",
            json!({"a": {}}),
            "x-kubernetes-validations",
        ),
        (
            "propertyNames",
            json!({"pattern": "^a"}),
            "x-kubernetes-validations",
        ),
        (
            "patternProperties",
            json!({"^a": {}}),
            "additionalProperties",
        ),
        ("unevaluatedProperties", json!(false), "pruned"),
        ("frobnicate", json!(1), "not part of the schema dialect"),
    ] {
        let mut schema = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        schema[keyword] = value;
        assert_refused(schema, &format!("spec.schema.{keyword}"), words);
    }
    for (keyword, value) in [
        ("contains", json!({"type": "string"})),
        ("prefixItems", json!([{"type": "string"}])),
        ("unevaluatedItems", json!(false)),
    ] {
        let mut schema = json!({"type": "array", "items": {"type": "string"}});
        schema[keyword] = value;
        assert_refused(schema, &format!("spec.schema.{keyword}"), "no equivalent");
    }
    assert_refused(
        json!({"type": "array", "items": [{"type": "string"}]}),
        "spec.schema.items",
        "tuple",
    );
    assert_refused(
        json!({"type": "integer", "exclusiveMinimum": true}),
        "spec.schema.exclusiveMinimum",
        "the bound itself",
    );
    assert_refused(
        json!({"type": "object", "properties": {"a": false}}),
        "spec.schema.properties.a",
        "accepts nothing",
    );
}

#[test]
fn annotations_without_effect_are_dropped() {
    assert_eq!(
        convert(
            json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "$comment": "c", "type": "string", "deprecated": true, "examples": ["x", "y"]})
        ),
        json!({"type": "string", "example": "x"})
    );
}

fn defaulted(schema: Value, defaults: Value) -> (Value, Vec<Finding>) {
    let mut conv = Converter::default();
    let mut out = conv.convert(&schema, "spec.schema");
    apply_defaults(&mut conv, &mut out, &defaults, "spec.defaults");
    (Value::Object(out), conv.findings)
}

#[test]
fn defaults_become_default_values_down_to_each_field() {
    let (out, findings) = defaulted(
        json!({"type": "object", "properties": {
            "replicas": {"type": "integer"},
            "quota": {"type": "object", "required": ["cpu"], "properties": {"cpu": {"type": "string"}, "pods": {"type": "integer"}}},
            "hosts": {"type": "array", "items": {"type": "string"}},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        }}),
        json!({"replicas": 1, "quota": {"cpu": "4"}, "hosts": [], "labels": {"a": "b"}}),
    );
    assert!(findings.is_empty(), "{findings:#?}");
    let p = &out["properties"];
    assert_eq!(
        out["default"],
        json!({"replicas": 1, "quota": {"cpu": "4"}, "hosts": [], "labels": {"a": "b"}})
    );
    assert_eq!(p["replicas"]["default"], 1);
    // An absent object is created whole, a partial one completed field by field.
    assert_eq!(p["quota"]["default"], json!({"cpu": "4"}));
    assert_eq!(p["quota"]["properties"]["cpu"]["default"], "4");
    assert!(p["quota"]["properties"]["pods"].get("default").is_none());
    assert_eq!(p["hosts"]["default"], json!([]));
    assert_eq!(p["labels"]["default"], json!({"a": "b"}));
}

#[test]
fn an_object_with_a_required_field_without_default_is_not_defaulted_whole() {
    let (out, _) = defaulted(
        json!({"type": "object", "required": ["image"], "properties": {"image": {"type": "string"}, "port": {"type": "integer"}}}),
        json!({"port": 8080}),
    );
    assert!(out.get("default").is_none(), "{out:#}");
    assert_eq!(out["properties"]["port"]["default"], 8080);
}

#[test]
fn a_default_without_a_property_is_a_warning() {
    let (_, findings) = defaulted(
        json!({"type": "object", "properties": {"a": {"type": "string"}}}),
        json!({"b": 1}),
    );
    assert_eq!(findings.len(), 1, "{findings:#?}");
    assert!(!findings[0].error);
    assert_eq!(findings[0].field, "spec.defaults.b");
}

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

#[test]
fn rbac_for_manage_crds_grants_create_and_patch_on_the_generated_crds_by_name() {
    let set = crate::rules::testing::load_texts(&[(
        "rule.yaml",
        "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: app\nspec:\n  parent: {apiVersion: demo.example.com/v1, kind: Policy}\n  crd: {}\n",
    )]);
    let crd_rules = |role: &Value| -> Vec<Value> {
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["resources"] == json!(["customresourcedefinitions"]))
            .cloned()
            .collect()
    };
    let plain = crate::rbac::cluster_role_with(&set, "trellis", false);
    assert_eq!(
        crd_rules(&plain),
        [
            json!({"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["get", "list", "watch"]})
        ]
    );
    let managing = crate::rbac::cluster_role_with(&set, "trellis", true);
    let named: Vec<Value> = crd_rules(&managing)
        .into_iter()
        .filter(|r| r.get("resourceNames").is_some())
        .collect();
    assert_eq!(
        named,
        [
            json!({"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "resourceNames": ["policies.demo.example.com"], "verbs": ["create"]}),
            json!({"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "resourceNames": ["policies.demo.example.com"], "verbs": ["patch"]}),
        ]
    );
}

#[test]
fn offline_crds_give_scope_schema_checks_and_dropped_status_warnings() {
    use super::offline::{OfflineCrds, dropped_status_fields, parent_scope};
    let dir = tempfile::tempdir().unwrap();
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "apps.demo.example.com"},
        "spec": {
            "group": "demo.example.com",
            "scope": "Cluster",
            "names": {"kind": "App", "plural": "apps"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {"type": "object", "properties": {
                        "replicas": {"type": "integer", "maximum": 5, "default": 1},
                    }},
                    "status": {"type": "object", "properties": {
                        "observedGeneration": {"type": "integer"},
                        "conditions": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                        "ready": {"type": "integer"},
                    }},
                },
            }}}],
        },
    });
    std::fs::write(
        dir.path().join("app.yaml"),
        crate::yaml::to_string(&crd).unwrap(),
    )
    .unwrap();
    let crds = OfflineCrds::load(dir.path()).unwrap();
    let rule = crate::rules::testing::rule_with_spec(
        "  parent: {apiVersion: demo.example.com/v1, kind: App}
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata: {namespace: team, name: {{ parent.metadata.name }}}
  status:
    fields:
      - {path: ready, value: '1'}
      - {path: url, value: \"'x'\"}
",
    );
    let parent = json!({"apiVersion": "demo.example.com/v1", "kind": "App",
        "metadata": {"name": "a", "namespace": "ns"}, "spec": {"replicas": 9}});
    assert_eq!(
        parent_scope(&rule, &parent, Some(&crds)),
        Some(crate::rules::model::Scope::Cluster)
    );
    let doc = crate::cli::render_document_with(
        &rule,
        &parent,
        vec![],
        "2026-11-29T00:00:00Z",
        Some(&crds),
    );
    let errors: Vec<&str> = doc["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("cluster-scoped parent must not have metadata.namespace")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("the CRD's schema refuses spec.replicas")),
        "{errors:?}"
    );
    let (crd_doc, version) = crds.find(&rule.parent).unwrap();
    let warnings = dropped_status_fields(&rule, crd_doc, version);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].field, "spec.status.fields[1].path");
    assert!(
        warnings[0].message.contains("would drop .status.url"),
        "{}",
        warnings[0]
    );
}

#[test]
fn offline_parent_check_reads_nullable_int_or_string_and_set_lists_as_the_api_server_does() {
    use super::offline::validate_parent;
    let version = json!({"schema": {"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "note": {"type": "string", "nullable": true},
            "port": {"x-kubernetes-int-or-string": true},
            "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
            "nested": {"type": "object", "properties": {
                "hosts": {"type": "array", "items": {"type": "string", "nullable": true}},
            }},
        }},
    }}}});
    let check = |spec: Value| validate_parent(&version, &json!({"spec": spec}));
    assert_eq!(
        check(json!({"note": null, "port": "http", "tags": ["a", "b"]})),
        Vec::<String>::new()
    );
    assert_eq!(
        check(json!({"port": 8080, "nested": {"hosts": [null, "a"]}})),
        Vec::<String>::new()
    );
    let refused = check(json!({"port": true, "tags": ["a", "a"], "note": 1}));
    assert_eq!(refused.len(), 3, "{refused:?}");
    assert!(
        refused
            .iter()
            .any(|e| e.starts_with("the CRD's schema refuses spec.tags")),
        "{refused:?}"
    );
    assert!(
        refused
            .iter()
            .any(|e| e.starts_with("the CRD's schema refuses spec.port")),
        "{refused:?}"
    );
}

#[test]
fn without_crds_the_generated_crd_stands_for_the_parents_and_keeps_every_status_field() {
    use super::offline::{OfflineCrds, dropped_status_fields};
    let rule = crate::rules::testing::rule_with_spec(
        "  parent: {apiVersion: demo.example.com/v1, kind: App}
  crd:
    statusSchema:
      type: object
      properties:
        info: {type: object, properties: {a: {type: string}}}
  children:
    - id: c
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata: {name: x}
  status:
    fields:
      - {path: info.b, value: \"'y'\"}
      - {path: url, value: \"'x'\"}
",
    );
    let crds = OfflineCrds::generated([rule.as_ref()]);
    let (crd, version) = crds
        .find(&rule.parent)
        .expect("the generated CRD serves App");
    assert_eq!(crd["metadata"]["name"], "apps.demo.example.com");
    assert!(dropped_status_fields(&rule, crd, version).is_empty());
    let plain = crate::rules::testing::rule_with_spec(
        "  parent: {apiVersion: demo.example.com/v1, kind: App}\n  children: []\n",
    );
    assert!(
        OfflineCrds::generated([plain.as_ref()])
            .find(&plain.parent)
            .is_none()
    );
}

#[test]
fn offline_crds_are_found_inside_a_list_as_kubectl_get_prints_it() {
    use super::offline::OfflineCrds;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crds.yaml");
    std::fs::write(
        &path,
        "apiVersion: v1
kind: List
items:
  - apiVersion: apiextensions.k8s.io/v1
    kind: CustomResourceDefinition
    metadata: {name: apps.demo.example.com}
    spec:
      group: demo.example.com
      scope: Cluster
      names: {kind: App, plural: apps}
      versions: [{name: v1, served: true, storage: true}]
",
    )
    .unwrap();
    let crds = OfflineCrds::load(&path).unwrap();
    let gvk = crate::kinds::Gvk::new("demo.example.com/v1", "App");
    let (crd, _) = crds.find(&gvk).expect("the CRD inside the List");
    assert_eq!(
        super::offline::scope_of(crd),
        crate::rules::model::Scope::Cluster
    );
}
