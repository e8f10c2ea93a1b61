//! A rule document as a [`Rule`]: a document that is not a Rule at all gets
//! one clear error; otherwise its shape is checked against the format's
//! JSON Schema (derived from the serde types) with every structural error
//! reported at once, before anything reads it as a Rule.

use std::sync::OnceLock;

use serde_json::Value;

use super::Checker;
use crate::rules::load::RawDocument;
use crate::rules::model::{self, Rule};

/// The document as a [`Rule`]: one clear error for a document that is not a
/// Rule at all, else every structural error at once; `None` with any.
pub(super) fn read_rule(ck: &mut Checker, doc: &RawDocument) -> Option<Rule> {
    // A CRD or a parent left in the rules directory: one clear error, not a
    // dump of every way it fails the Rule schema.
    let doc_api = doc.value.get("apiVersion").and_then(Value::as_str);
    let doc_kind = doc.value.get("kind").and_then(Value::as_str);
    if doc_kind != Some(model::KIND) {
        let found = |v: Option<&str>| v.map(|s| format!("`{s}`")).unwrap_or("nothing".into());
        ck.error(
            if doc_kind.is_some() { "kind" } else { "" },
            format!(
                "not a Rule: this document has apiVersion {} and kind {}; a rules directory \
                 holds only `{}` `{}` documents (move CRDs and parents elsewhere)",
                found(doc_api),
                found(doc_kind),
                model::API_VERSION,
                model::KIND
            ),
        );
        return None;
    }

    // Shape first: every structural error in the document at once.
    if let Some(validator) = format_validator() {
        let mut shape_errors: Vec<(String, String)> = validator
            .iter_errors(&doc.value)
            .map(|e| {
                (
                    pointer_to_field(&e.instance_path().to_string()),
                    e.to_string(),
                )
            })
            .collect();
        shape_errors.sort();
        shape_errors.dedup();
        for (field, message) in shape_errors {
            ck.error(&field, message);
        }
    }
    if ck.errors > 0 {
        return None;
    }
    match serde_path_to_error::deserialize(&doc.value) {
        Ok(rule) => Some(rule),
        Err(err) => {
            let field = err.path().to_string();
            let field = if field == "." { String::new() } else { field };
            ck.error(&field, err.inner().to_string());
            None
        }
    }
}

/// Validator for the rule format itself, derived from the serde types.
fn format_validator() -> Option<&'static jsonschema::Validator> {
    static VALIDATOR: OnceLock<Option<jsonschema::Validator>> = OnceLock::new();
    VALIDATOR
        .get_or_init(|| jsonschema::validator_for(&model::json_schema()).ok())
        .as_ref()
}

/// Converts a JSON Pointer (`/spec/children/1/id`) to our field syntax.
fn pointer_to_field(pointer: &str) -> String {
    let mut out = String::new();
    for seg in pointer.split('/').skip(1) {
        let seg = seg.replace("~1", "/").replace("~0", "~");
        if seg.parse::<usize>().is_ok() {
            out.push_str(&format!("[{seg}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&seg);
        }
    }
    out
}
