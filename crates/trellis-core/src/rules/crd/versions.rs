//! The versions of a generated CRD beyond the hub (`spec.versions`): each
//! one a copy of the hub's entry (subresources, printer columns, the status
//! schema every version shares) with its own `spec` schema, `served` and
//! `deprecationWarning`; `storage: true` on `spec.storageVersion`; and
//! `conversion.strategy: Webhook` naming trellis's `/convert`. A rule
//! without `versions:` gets none of this: its CRD is as it always was.

use serde_json::{Value, json};

use super::schema::Converter;
use super::{needs_spec, spec_schema};
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
        let at = format!("spec.versions[{i}]");
        let spec = spec_schema(conv, v.schema.as_ref(), v.defaults.as_ref(), &at);
        if let Some(scale) = rule.spec.crd.as_ref().and_then(|c| c.scale.as_ref()) {
            super::scale::check_version(conv, scale, &spec, &at);
        }
        let root = &mut entry["schema"]["openAPIV3Schema"];
        let required = needs_spec(&spec);
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
