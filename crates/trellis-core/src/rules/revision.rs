//! A rule version's identity: its revision.
//!
//! A version is each accepted text of a rule, its template files included.
//! Its canonical form is the rule document as parsed data, serialized with
//! every mapping's keys sorted, next to the contents of the template files
//! it names (by the path the rule writes); the revision is the first 10 hex
//! digits of that form's SHA-256. So reformatting the YAML, reordering keys
//! or editing comments is the same version, while a changed character in a
//! template file is a new one. The same form is what a revision ConfigMap
//! keeps to rebuild the version after a restart (`rollout`).

use std::collections::BTreeMap;

use serde_json::Value;

/// How many hex digits of the SHA-256 a revision keeps.
pub const REVISION_LEN: usize = 10;

/// JSON text of `value` with every object's keys in sorted order, whatever
/// order they were parsed in (serde_json keeps insertion order here).
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// The canonical form of a version: the document and its template files
/// (path as written in `templateFile` → contents).
pub fn canonical_form(document: &Value, template_files: &BTreeMap<String, String>) -> String {
    let files: serde_json::Map<String, Value> = template_files
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    canonical_json(&serde_json::json!({
        "rule": document,
        "templateFiles": Value::Object(files),
    }))
}

/// The revision of a version: first [`REVISION_LEN`] hex digits of the
/// SHA-256 of its canonical form.
pub fn revision(document: &Value, template_files: &BTreeMap<String, String>) -> String {
    let full = crate::render::sha256_hex(canonical_form(document, template_files).as_bytes());
    full[..REVISION_LEN].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::testing::load_texts;

    const RULE: &str = "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: app\nspec:\n  parent: {apiVersion: demo.trellis.dev/v1, kind: App}\n  children:\n    - id: cm\n      apiVersion: v1\n      kind: ConfigMap\n      templateFile: cm.yaml.j2\n";

    /// The same rule as RULE, reformatted: block style, keys reordered, comments.
    const REFORMATTED: &str = "# the app rule\nkind: Rule\napiVersion: trellis.dev/v1alpha1\nmetadata:\n  name: app   # named\nspec:\n  children:\n  - kind: ConfigMap\n    id: cm\n    apiVersion: v1\n    templateFile: cm.yaml.j2\n  parent:\n    kind: App\n    apiVersion: demo.trellis.dev/v1\n";

    const TEMPLATE: &str = "metadata:\n  name: x\ndata: {a: b}\n";

    fn revision_of(rule: &str, template: &str) -> String {
        let set = load_texts(&[("rule.yaml", rule), ("cm.yaml.j2", template)]);
        set.rules[0].revision.clone()
    }

    #[test]
    fn a_revision_is_ten_hex_digits() {
        let r = revision_of(RULE, TEMPLATE);
        assert_eq!(r.len(), REVISION_LEN);
        assert!(
            r.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
            "{r}"
        );
    }

    #[test]
    fn reformatting_the_yaml_is_not_a_new_revision() {
        assert_eq!(
            revision_of(RULE, TEMPLATE),
            revision_of(REFORMATTED, TEMPLATE)
        );
    }

    #[test]
    fn a_template_file_change_is_a_new_revision() {
        let changed = TEMPLATE.replace("{a: b}", "{a: c}");
        assert_ne!(revision_of(RULE, TEMPLATE), revision_of(RULE, &changed));
    }

    #[test]
    fn a_rule_change_is_a_new_revision() {
        let changed = RULE.replace("name: app", "name: app\n  labels: {x: y}");
        assert_ne!(revision_of(RULE, TEMPLATE), revision_of(&changed, TEMPLATE));
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_depth() {
        let a: Value =
            serde_json::from_str(r#"{"b":1,"a":{"d":[{"y":1,"x":2}],"c":"s"}}"#).unwrap();
        assert_eq!(
            canonical_json(&a),
            r#"{"a":{"c":"s","d":[{"x":2,"y":1}]},"b":1}"#
        );
    }

    #[test]
    fn the_revision_is_stable_across_processes() {
        // A fixed input, a fixed answer: nothing random or process-bound
        // (no hasher seeds) goes into it.
        let doc = serde_json::json!({"kind": "Rule", "metadata": {"name": "x"}});
        let files = BTreeMap::from([("t.j2".to_owned(), "a".to_owned())]);
        let form = canonical_form(&doc, &files);
        assert_eq!(
            form,
            r#"{"rule":{"kind":"Rule","metadata":{"name":"x"}},"templateFiles":{"t.j2":"a"}}"#
        );
        assert_eq!(
            revision(&doc, &files),
            crate::render::sha256_hex(form.as_bytes())[..10]
        );
    }
}
