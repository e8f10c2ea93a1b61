//! The versions of a generated CRD beyond the hub (`spec.versions`): each
//! one a copy of the hub's entry (subresources, printer columns, the status
//! schema every version shares) with its own `spec` schema, `served` and
//! `deprecationWarning`; `storage: true` on `spec.storageVersion`; and
//! `conversion.strategy: Webhook` naming trellis's `/convert`. A rule
//! without `versions:` gets none of this: its CRD is as it always was.

use serde_json::{Map, Value, json};

use super::schema::{Converter, apply_defaults};
use crate::rules::model::Rule;

/// Where the generated CRD sends ConversionReviews until the operator
/// (`--manage-crds`) writes its own `--webhook-service` or `--webhook-url`
/// and the CA: the default Service in the default namespace.
pub const DEFAULT_SERVICE_NAMESPACE: &str = "trellis-system";
pub const DEFAULT_SERVICE_NAME: &str = "trellis-webhook";
pub const CONVERT_PATH: &str = "/convert";

/// Adds the rule's other versions and the conversion webhook to `doc`, the
/// CRD generated for the hub alone.
pub(super) fn extend(conv: &mut Converter, rule: &Rule, doc: &mut Value) {
    if rule.spec.versions.is_empty() {
        return;
    }
    let Some(hub) = doc.pointer("/spec/versions/0").cloned() else {
        return;
    };
    let storage = rule
        .spec
        .storage_version
        .clone()
        .unwrap_or_else(|| hub["name"].as_str().unwrap_or_default().to_owned());
    let mut entries = Vec::new();
    for (i, v) in rule.spec.versions.iter().enumerate() {
        let mut entry = hub.clone();
        entry["name"] = json!(v.name);
        entry["served"] = json!(v.served);
        let spec = version_spec_schema(conv, v.schema.as_ref(), v.defaults.as_ref(), i);
        if let Some(scale) = rule.spec.crd.as_ref().and_then(|c| c.scale.as_ref()) {
            super::scale::check_version(conv, scale, &spec, &format!("spec.versions[{i}]"));
        }
        let root = &mut entry["schema"]["openAPIV3Schema"];
        let required = spec
            .get("required")
            .is_some_and(|r| r.as_array().is_some_and(|r| !r.is_empty()))
            && !spec.contains_key("default");
        root["properties"]["spec"] = Value::Object(spec);
        match (required, root.as_object_mut()) {
            (true, Some(r)) => {
                r.insert("required".into(), json!(["spec"]));
            }
            (false, Some(r)) => {
                r.shift_remove("required");
            }
            _ => {}
        }
        if let Some(warning) = &v.deprecated {
            entry["deprecated"] = json!(true);
            entry["deprecationWarning"] = json!(warning);
        }
        entries.push(entry);
    }
    // Oldest first, the hub last (the order `versions:` is written in).
    entries.push(hub);
    for entry in &mut entries {
        let name = entry["name"].as_str().unwrap_or_default().to_owned();
        entry["storage"] = json!(name == storage);
    }
    doc["spec"]["versions"] = Value::Array(entries);
    doc["spec"]["conversion"] = json!({
        "strategy": "Webhook",
        "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": {
                "service": {
                    "namespace": DEFAULT_SERVICE_NAMESPACE,
                    "name": DEFAULT_SERVICE_NAME,
                    "path": CONVERT_PATH,
                    "port": 443,
                },
            },
        },
    });
}

fn version_spec_schema(
    conv: &mut Converter,
    schema: Option<&Value>,
    defaults: Option<&Value>,
    i: usize,
) -> Map<String, Value> {
    let at = format!("spec.versions[{i}]");
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
