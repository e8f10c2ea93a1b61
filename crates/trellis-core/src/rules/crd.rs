//! CustomResourceDefinitions generated from rules (`crd:`): the rule is the
//! single source of its parent's API.
//!
//! ```text
//!  spec.parent ──▶ group, version, kind, names, scope
//!  spec.schema ──schema::Converter──▶ structural `spec` ◀──apply_defaults── spec.defaults
//!  spec.status.fields + crd.statusSchema ──▶ `status` (conditions, observedGeneration, fields)
//!  crd.printerColumns / shortNames / categories / validations ──▶ the rest
//! ```
//!
//! Pure: [`generate`] turns a rule into the CRD as a JSON value (its key
//! order is fixed, so `trellis crd` prints the same text every time) plus
//! the findings, which `check` reports with the rule's file and line. Applying
//! CRDs to a cluster is `operator::crds`'s business.
//!
//! It lives with the rule format, not above it, because generating the CRD
//! is part of compiling a rule: a rule whose CRD cannot be generated does not
//! compile, and the compiled rule carries its CRD. What the offline commands
//! learn from CRDs read from disk is `crate::crd`.

mod scale;
pub mod schema;
pub mod versions;

#[cfg(test)]
mod tests;

use serde_json::{Map, Value, json};

use super::model::{ColumnType, CrdSpec, PrinterColumn, Rule, Scope};
use super::names::is_dns_label;
use crate::kinds::{self, Gvk};
pub use schema::Finding;
use schema::{Converter, apply_defaults};

/// The resource (plural) name of a rule's generated CRD.
pub fn plural(rule: &Rule) -> String {
    let parent = &rule.spec.parent;
    rule.spec
        .crd
        .as_ref()
        .and_then(|c| c.plural.clone())
        .or_else(|| parent.plural.clone())
        .unwrap_or_else(|| kinds::plural(&Gvk::new(&parent.api_version, &parent.kind)))
}

/// The scope of a rule's generated CRD (`Namespaced` unless it says otherwise).
pub fn scope(rule: &Rule) -> Scope {
    rule.spec
        .crd
        .as_ref()
        .and_then(|c| c.scope)
        .or(rule.spec.parent.scope)
        .unwrap_or(Scope::Namespaced)
}

/// `<plural>.<group>`, the CRD's name.
pub fn name(rule: &Rule) -> String {
    let gvk = Gvk::new(&rule.spec.parent.api_version, &rule.spec.parent.kind);
    format!("{}.{}", plural(rule), gvk.group)
}

/// The CRD of a rule that sets `crd:` (else `None`), and what the conversion
/// found. With any error finding the CRD is `None`.
pub fn generate(rule: &Rule) -> (Option<Value>, Vec<Finding>) {
    let Some(crd) = &rule.spec.crd else {
        return (None, Vec::new());
    };
    let mut conv = Converter::default();
    let gvk = Gvk::new(&rule.spec.parent.api_version, &rule.spec.parent.kind);
    check_names(&mut conv, rule, crd, &gvk);

    let spec = spec_schema(
        &mut conv,
        rule.spec.schema.as_ref(),
        rule.spec.defaults.as_ref(),
        "spec",
    );
    let status = status_schema(&mut conv, rule, crd);
    let mut root = Map::new();
    root.insert("type".into(), json!("object"));
    if needs_spec(&spec) {
        root.insert("required".into(), json!(["spec"]));
    }
    root.insert(
        "properties".into(),
        json!({
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        }),
    );
    if !crd.validations.is_empty() {
        root.insert(
            "x-kubernetes-validations".into(),
            serde_json::to_value(&crd.validations).unwrap_or(Value::Null),
        );
    }

    let mut names = Map::new();
    names.insert("kind".into(), json!(gvk.kind));
    names.insert("listKind".into(), json!(format!("{}List", gvk.kind)));
    names.insert("plural".into(), json!(plural(rule)));
    names.insert("singular".into(), json!(gvk.kind.to_lowercase()));
    if !crd.short_names.is_empty() {
        names.insert("shortNames".into(), json!(crd.short_names));
    }
    if !crd.categories.is_empty() {
        names.insert("categories".into(), json!(crd.categories));
    }
    let columns = printer_columns(&mut conv, crd);
    let mut subresources = Map::new();
    subresources.insert("status".into(), json!({}));
    if let Some(scale) = &crd.scale {
        let status = root
            .get("properties")
            .and_then(|p| p.get("status"))
            .cloned()
            .unwrap_or_default();
        let scale = scale::subresource(&mut conv, scale, &spec_of(&root), &status);
        subresources.insert("scale".into(), scale);
    }

    let doc = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": name(rule),
            "labels": {
                "app.kubernetes.io/managed-by": "trellis",
                "trellis.dev/rule": rule.metadata.name,
            },
        },
        "spec": {
            "group": gvk.group,
            "scope": match scope(rule) { Scope::Namespaced => "Namespaced", Scope::Cluster => "Cluster" },
            "names": names,
            "versions": [{
                "name": gvk.version,
                "served": true,
                "storage": true,
                "subresources": subresources,
                "additionalPrinterColumns": columns,
                "schema": {"openAPIV3Schema": root},
            }],
        },
    });
    let mut doc = doc;
    versions::extend(&mut conv, rule, &mut doc);
    let ok = !conv.has_errors();
    (ok.then_some(doc), conv.findings)
}

fn check_names(conv: &mut Converter, rule: &Rule, crd: &CrdSpec, gvk: &Gvk) {
    let parent = &rule.spec.parent;
    if gvk.is_builtin() {
        conv.error(
            "spec.crd",
            format!(
                "`{}` is a built-in group: a CRD needs a group of its own with a dot, \
                 like `example.com`",
                if gvk.group.is_empty() {
                    "core"
                } else {
                    &gvk.group
                }
            ),
        );
    }
    if let (Some(a), Some(b)) = (crd.scope, parent.scope)
        && a != b
    {
        conv.error(
            "spec.crd.scope",
            format!("differs from spec.parent.scope ({b:?}); set only one"),
        );
    }
    if let (Some(a), Some(b)) = (&crd.plural, &parent.plural)
        && a != b
    {
        conv.error(
            "spec.crd.plural",
            format!("differs from spec.parent.plural (`{b}`); set only one"),
        );
    }
    let plural = plural(rule);
    if !is_dns_label(&plural) {
        conv.error(
            "spec.crd.plural",
            format!("`{plural}` is not a DNS-1123 label (lowercase letters, digits, '-')"),
        );
    }
    for (list, field) in [
        (&crd.short_names, "spec.crd.shortNames"),
        (&crd.categories, "spec.crd.categories"),
    ] {
        for (i, name) in list.iter().enumerate() {
            if !is_dns_label(name) {
                conv.error(
                    &format!("{field}[{i}]"),
                    format!("`{name}` is not a DNS-1123 label (lowercase letters, digits, '-')"),
                );
            }
        }
    }
}

/// The `spec` schema of a CRD's root schema being built.
fn spec_of(root: &Map<String, Value>) -> Map<String, Value> {
    root.get("properties")
        .and_then(|p| p.get("spec"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// The CRD schema of a parent's `.spec` from a rule's `schema` and
/// `defaults` (the hub's at `spec`, another version's at
/// `spec.versions[i]`; `at` names where, in findings).
fn spec_schema(
    conv: &mut Converter,
    schema: Option<&Value>,
    defaults: Option<&Value>,
    at: &str,
) -> Map<String, Value> {
    let mut spec = match schema {
        Some(schema) => conv.convert(schema, &format!("{at}.schema")),
        None => {
            let mut m = Map::new();
            m.insert("type".into(), json!("object"));
            m.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
            m
        }
    };
    if schema.is_some() && spec.get("type") != Some(&json!("object")) {
        conv.error(
            &format!("{at}.schema.type"),
            "the schema of a parent's .spec must be of type object",
        );
    }
    if let Some(defaults) = defaults.filter(|d| d.is_object()) {
        apply_defaults(conv, &mut spec, defaults, &format!("{at}.defaults"));
    }
    spec
}

/// Whether the object must have `.spec`: its schema requires fields and
/// gives no default (the API server would accept a parent without `.spec`
/// that trellis refuses).
fn needs_spec(spec: &Map<String, Value>) -> bool {
    spec.get("required")
        .is_some_and(|r| r.as_array().is_some_and(|r| !r.is_empty()))
        && !spec.contains_key("default")
}

/// Standard `metav1.Condition` fields, as every Kubernetes API types them.
fn conditions_schema() -> Value {
    json!({
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "required": ["type", "status"],
            "properties": {
                "type": {"type": "string", "maxLength": 316},
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "reason": {"type": "string", "maxLength": 1024},
                "message": {"type": "string", "maxLength": 32768},
                "lastTransitionTime": {"type": "string", "format": "date-time"},
                "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
            },
        },
    })
}

/// `status.children` (`status.inventory: true`): one entry per child object.
fn inventory_schema() -> Value {
    let string = json!({"type": "string"});
    json!({
        "type": "array",
        "description": "The parent's child objects, in the rule's declaration order (at most 100).",
        "items": {
            "type": "object",
            "required": ["id", "apiVersion", "kind", "name", "ready"],
            "properties": {
                "id": string,
                "apiVersion": string,
                "kind": string,
                "namespace": string,
                "name": string,
                "ready": {"type": "boolean"},
            },
        },
    })
}

fn status_schema(conv: &mut Converter, rule: &Rule, crd: &CrdSpec) -> Value {
    let mut props = Map::new();
    props.insert(
        "observedGeneration".into(),
        json!({"type": "integer", "format": "int64"}),
    );
    props.insert("conditions".into(), conditions_schema());
    props.insert(
        "ruleRevision".into(),
        json!({"type": "string", "description": "The revision of the rule version this object is on."}),
    );
    let inventory = rule.spec.status.as_ref().is_some_and(|s| s.inventory);
    if inventory {
        props.insert("children".into(), inventory_schema());
        props.insert(
            "childrenTruncated".into(),
            json!({"type": "integer", "description": "How many child objects status.children leaves out."}),
        );
    }
    let fields = rule.spec.status.iter().flat_map(|s| &s.fields);
    for field in fields {
        let segments: Vec<&str> = field.path.split('.').collect();
        insert_leaf(&mut props, &segments);
    }
    let mut status = Map::new();
    status.insert("type".into(), json!("object"));
    status.insert("description".into(), json!("Written by trellis."));
    if let Some(typed) = &crd.status_schema {
        let at = "spec.crd.statusSchema";
        let converted = conv.convert(typed, at);
        if converted.get("type") != Some(&json!("object")) {
            conv.error(
                &format!("{at}.type"),
                "the status schema must be of type object",
            );
        }
        if let Some(Value::Object(typed_props)) = converted.get("properties") {
            let inventory_fields: &[&str] = if inventory {
                &["children", "childrenTruncated"]
            } else {
                &[]
            };
            let owned = ["observedGeneration", "conditions", "ruleRevision"];
            for own in owned.iter().chain(inventory_fields) {
                if typed_props.contains_key(*own) {
                    conv.error(
                        &format!("{at}.properties.{own}"),
                        format!("`{own}` is written by trellis and typed by it"),
                    );
                }
            }
        }
        overlay(&mut props, &converted);
        if let Some(d) = converted.get("description") {
            status.insert("description".into(), d.clone());
        }
    }
    status.insert("properties".into(), Value::Object(props));
    Value::Object(status)
}

/// Declares `.status.<a>.<b>…` as nested objects ending in a field that
/// keeps any value.
fn insert_leaf(props: &mut Map<String, Value>, segments: &[&str]) {
    let Some((first, rest)) = segments.split_first() else {
        return;
    };
    if rest.is_empty() {
        props.insert(
            (*first).into(),
            json!({"x-kubernetes-preserve-unknown-fields": true}),
        );
        return;
    }
    let entry = props
        .entry((*first).to_owned())
        .or_insert_with(|| json!({"type": "object", "properties": {}}));
    // A shorter path already keeps anything below it.
    if let Some(inner) = entry.get_mut("properties").and_then(Value::as_object_mut) {
        insert_leaf(inner, rest);
    }
}

/// Lays the typed status schema over the generated one: typed nodes win,
/// and objects typed on both sides merge property by property.
fn overlay(props: &mut Map<String, Value>, typed: &Map<String, Value>) {
    let Some(Value::Object(typed_props)) = typed.get("properties") else {
        return;
    };
    for (name, typed_node) in typed_props {
        let merged = match (props.get_mut(name), typed_node) {
            (Some(Value::Object(existing)), Value::Object(t))
                if existing.get("properties").is_some() && t.get("properties").is_some() =>
            {
                let mut inner = existing
                    .get("properties")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                overlay(&mut inner, t);
                let mut node = t.clone();
                node.insert("properties".into(), Value::Object(inner));
                Value::Object(node)
            }
            _ => typed_node.clone(),
        };
        props.insert(name.clone(), merged);
    }
}

const READY_PATH: &str = r#".status.conditions[?(@.type=="Ready")].status"#;

/// A built-in column by name.
fn builtin_column(name: &str) -> Option<Value> {
    Some(match name {
        "Ready" => json!({"name": "Ready", "type": "string", "jsonPath": READY_PATH}),
        "Synced" => json!({
            "name": "Synced",
            "type": "string",
            "jsonPath": r#".status.conditions[?(@.type=="Synced")].status"#,
        }),
        "Reason" => json!({
            "name": "Reason",
            "type": "string",
            "priority": 1,
            "jsonPath": r#".status.conditions[?(@.type=="Ready")].reason"#,
        }),
        "Age" => json!({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}),
        _ => return None,
    })
}

fn printer_columns(conv: &mut Converter, crd: &CrdSpec) -> Vec<Value> {
    let Some(columns) = &crd.printer_columns else {
        return ["Ready", "Synced", "Age"]
            .into_iter()
            .filter_map(builtin_column)
            .collect();
    };
    let mut out = Vec::new();
    for (i, column) in columns.iter().enumerate() {
        let at = format!("spec.crd.printerColumns[{i}]");
        match column_value(column) {
            Ok(v) => out.push(v),
            Err(message) => conv.error(&at, message),
        }
    }
    out
}

fn column_value(column: &PrinterColumn) -> Result<Value, String> {
    let Some(path) = &column.json_path else {
        let mut v = builtin_column(&column.name).ok_or_else(|| {
            format!(
                "column `{}` needs a `jsonPath` (only Ready, Synced, Reason and Age are built in)",
                column.name
            )
        })?;
        if let Some(p) = column.priority {
            v["priority"] = json!(p);
        }
        if let Some(d) = &column.description {
            v["description"] = json!(d);
        }
        return Ok(v);
    };
    if !path.starts_with('.') {
        return Err(format!(
            "jsonPath `{path}` must start with `.` (kubectl syntax, e.g. `.status.url`)"
        ));
    }
    let mut v = Map::new();
    v.insert("name".into(), json!(column.name));
    let ty = match column.type_.unwrap_or(ColumnType::String) {
        ColumnType::String => "string",
        ColumnType::Integer => "integer",
        ColumnType::Number => "number",
        ColumnType::Boolean => "boolean",
        ColumnType::Date => "date",
    };
    v.insert("type".into(), json!(ty));
    if let Some(f) = &column.format {
        v.insert("format".into(), json!(f));
    }
    if let Some(d) = &column.description {
        v.insert("description".into(), json!(d));
    }
    if let Some(p) = column.priority {
        v.insert("priority".into(), json!(p));
    }
    v.insert("jsonPath".into(), json!(path));
    Ok(Value::Object(v))
}
