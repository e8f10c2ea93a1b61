//! `crd.scale`: the generated CRD's `scale` subresource, with each path
//! checked against the schema the CRD itself declares — `specReplicasPath`
//! an integer of `spec`, `statusReplicasPath` a field of `status` (a rule's
//! status field or `crd.statusSchema`), `labelSelectorPath` either — so a
//! path the API server would read nothing from fails `check`, not an HPA.

use serde_json::{Map, Value, json};

use super::schema::Converter;
use crate::rules::model::ScaleSpec;

/// The `scale` subresource for `scale`, checked against the generated
/// `spec` and `status` schemas; problems are reported on `conv`.
pub(super) fn subresource(
    conv: &mut Converter,
    scale: &ScaleSpec,
    spec: &Map<String, Value>,
    status: &Value,
) -> Value {
    let at = "spec.crd.scale";
    let roots = |path: &str| -> Option<(&'static str, Value)> {
        if path.starts_with(".spec.") {
            Some(("spec", Value::Object(spec.clone())))
        } else if path.starts_with(".status.") {
            Some(("status", status.clone()))
        } else {
            None
        }
    };
    let mut check = |field: &str, path: &str, allowed: &[&str], integer: bool| {
        let field = format!("{at}.{field}");
        let Some((root, schema)) = roots(path).filter(|(r, _)| allowed.contains(r)) else {
            let under: Vec<String> = allowed.iter().map(|r| format!("`.{r}.`")).collect();
            conv.error(
                &field,
                format!("`{path}` must start with {}", under.join(" or ")),
            );
            return;
        };
        let segments: Vec<&str> = path[root.len() + 2..].split('.').collect();
        if segments
            .iter()
            .any(|s| s.is_empty() || s.contains(['[', ']']))
        {
            conv.error(
                &field,
                format!("`{path}` is not a dotted path of field names"),
            );
            return;
        }
        match find(&schema, &segments) {
            Found::Declared(node) => {
                let ty = node.get("type").and_then(Value::as_str);
                let want = if integer { "integer" } else { "string" };
                if ty.is_some_and(|t| t != want) {
                    conv.error(
                        &field,
                        format!("`{path}` is of type {}, not {want}", ty.unwrap_or("?")),
                    );
                }
            }
            // A rule's status field keeps any value: what it holds is the
            // rule's to say.
            Found::AnyValue if root == "status" => {}
            Found::AnyValue | Found::Missing => conv.error(
                &field,
                if root == "spec" {
                    format!(
                        "`{path}` is not declared by spec.schema (declare it there, of type {})",
                        if integer { "integer" } else { "string" }
                    )
                } else {
                    format!(
                        "`{path}` is not a status field of the rule (spec.status.fields) \
                         nor declared by spec.crd.statusSchema"
                    )
                },
            ),
        }
    };
    check(
        "specReplicasPath",
        &scale.spec_replicas_path,
        &["spec"],
        true,
    );
    check(
        "statusReplicasPath",
        &scale.status_replicas_path,
        &["status"],
        true,
    );
    let mut out = Map::new();
    out.insert("specReplicasPath".into(), json!(scale.spec_replicas_path));
    out.insert(
        "statusReplicasPath".into(),
        json!(scale.status_replicas_path),
    );
    if let Some(selector) = &scale.label_selector_path {
        check("labelSelectorPath", selector, &["spec", "status"], false);
        out.insert("labelSelectorPath".into(), json!(selector));
    }
    Value::Object(out)
}

/// `specReplicasPath` checked against the `spec` schema of one more
/// version (`at`: that version's field, e.g. `spec.versions[0]`): the
/// `scale` subresource is on every version, so each must hold the path.
pub(super) fn check_version(
    conv: &mut Converter,
    scale: &ScaleSpec,
    spec: &Map<String, Value>,
    at: &str,
) {
    let path = &scale.spec_replicas_path;
    let Some(rest) = path.strip_prefix(".spec.") else {
        return; // reported once, against the hub
    };
    let segments: Vec<&str> = rest.split('.').collect();
    let schema = Value::Object(spec.clone());
    let held = match find(&schema, &segments) {
        Found::Declared(node) => {
            node.get("type")
                .and_then(Value::as_str)
                .unwrap_or("integer")
                == "integer"
        }
        Found::AnyValue | Found::Missing => false,
    };
    if !held {
        conv.error(
            "spec.crd.scale.specReplicasPath",
            format!(
                "`{path}` is not an integer declared by {at}.schema (every version serves /scale)"
            ),
        );
    }
}

/// What a structural schema says is at a path.
enum Found<'a> {
    /// A declared property.
    Declared(&'a Value),
    /// Under a node that keeps unknown fields (a rule's status field).
    AnyValue,
    Missing,
}

fn find<'a>(schema: &'a Value, segments: &[&str]) -> Found<'a> {
    let mut node = schema;
    for seg in segments {
        if node.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true))
            && node.get("properties").is_none()
        {
            return Found::AnyValue;
        }
        match node.get("properties").and_then(|p| p.get(*seg)) {
            Some(next) => node = next,
            None => return Found::Missing,
        }
    }
    if node.get("type").is_none()
        && node.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true))
    {
        return Found::AnyValue;
    }
    Found::Declared(node)
}
