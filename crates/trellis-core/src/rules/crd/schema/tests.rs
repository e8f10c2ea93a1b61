//! Tests of `schema.rs`: `spec.schema` converted to a structural schema,
//! and `spec.defaults` to `default` values. In a file of their own because
//! `schema.rs` alone is some 750 lines.

use serde_json::{Value, json};

use super::{Converter, Finding, apply_defaults};

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
