//! Whether a changed CRD would break what the cluster holds: stored
//! objects, and clients of a served version. Compared before
//! `--manage-crds` applies a rule's new CRD over the live one (and by
//! `trellis crd --against-cluster`). Breaking: dropping a version still in
//! `status.storedVersions`; un-serving a version objects are stored in
//! (un-serving or dropping one no object is stored in retires it: safe);
//! and, in a version served before and after, removing a field, narrowing
//! a type, adding a `required` field without a default, tightening an enum
//! or a bound, or adding or changing a pattern. Safe: adding an optional
//! field, widening a type (integer → number), loosening an enum or a
//! bound, making a field optional, adding a version.

use serde_json::{Map, Value};

/// One breaking change, named by version and path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("version {version}: {}{what}", if .path.is_empty() { String::new() } else { format!("{}: ", .path) })]
pub struct Breaking {
    pub version: String,
    /// A field path (`spec.port`); empty for the version itself.
    pub path: String,
    pub what: String,
}

/// Every breaking change of `new` over `live` (both whole CRDs).
pub fn changes(live: &Value, new: &Value) -> Vec<Breaking> {
    let stored: Vec<&str> = live
        .pointer("/status/storedVersions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let versions = |crd: &Value| -> Vec<Value> {
        crd.pointer("/spec/versions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let (old, new) = (versions(live), versions(new));
    let find = |list: &[Value], name: &str| list.iter().find(|v| v["name"] == name).cloned();
    let mut out = Vec::new();
    for before in &old {
        let name = before["name"].as_str().unwrap_or_default();
        let breaking = |path: &str, what: String| Breaking {
            version: name.to_owned(),
            path: path.to_owned(),
            what,
        };
        // Retiring a version (un-serving it, then dropping it) is how an
        // API evolves: safe once no object is stored in it.
        let Some(after) = find(&new, name) else {
            if stored.contains(&name) {
                out.push(breaking(
                    "",
                    "dropped, but objects are stored in it (status.storedVersions)".into(),
                ));
            }
            continue;
        };
        let served = |v: &Value| v["served"] == true;
        if served(before) && !served(&after) {
            if stored.contains(&name) {
                out.push(breaking(
                    "",
                    "no longer served, but objects are stored in it".into(),
                ));
            }
            continue;
        }
        if !served(before) {
            continue;
        }
        let schema = |v: &Value| {
            v.pointer("/schema/openAPIV3Schema")
                .cloned()
                .unwrap_or(Value::Null)
        };
        let mut found = Vec::new();
        compare(&schema(before), &schema(&after), "", &mut found);
        out.extend(found.into_iter().map(|(path, what)| breaking(&path, what)));
    }
    out
}

fn props(schema: &Value) -> Option<&Map<String, Value>> {
    schema.get("properties").and_then(Value::as_object)
}

fn open_ended(schema: &Value) -> bool {
    schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
}

fn names(schema: &Value, key: &str) -> Vec<String> {
    schema
        .get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|v| v.to_string())
        .collect()
}

fn join(path: &str, key: &str) -> String {
    let mut out = path.to_owned();
    crate::field_path::push_key(&mut out, key);
    out
}

/// The breaking differences of `after` over `before` at `path`.
fn compare(before: &Value, after: &Value, path: &str, out: &mut Vec<(String, String)>) {
    let here = path.to_owned();
    let ty = |s: &Value| s.get("type").and_then(Value::as_str).map(str::to_owned);
    match (ty(before), ty(after)) {
        (Some(b), Some(a)) if b != a && !(b == "integer" && a == "number") => {
            out.push((here.clone(), format!("type narrowed from {b} to {a}")));
            return;
        }
        // A field that took any value (untyped, or kept whole) and now has a type.
        (None, Some(a))
            if props(before).is_none()
                && before.get("x-kubernetes-int-or-string").is_none()
                && !before.is_null() =>
        {
            out.push((here.clone(), format!("type narrowed from any value to {a}")));
            return;
        }
        _ => {}
    }
    if let Some(old) = props(before) {
        let new = props(after);
        for (key, was) in old {
            let field = join(&here, key);
            match new.and_then(|p| p.get(key)) {
                Some(now) => compare(was, now, &field, out),
                None if open_ended(after) => {}
                None => out.push((field, "removed".into())),
            }
        }
    }
    let required_before = names(before, "required");
    for name in names(after, "required") {
        if required_before.contains(&name) {
            continue;
        }
        let key: String = serde_json::from_str(&name).unwrap_or_default();
        let defaulted = props(after)
            .and_then(|p| p.get(&key))
            .is_some_and(|s| s.get("default").is_some());
        if !defaulted {
            out.push((
                join(&here, &key),
                "required now, without a default: objects without it are refused".into(),
            ));
        }
    }
    let enum_before = names(before, "enum");
    let enum_after = names(after, "enum");
    if !enum_after.is_empty() {
        let dropped: Vec<&String> = if enum_before.is_empty() {
            Vec::new()
        } else {
            enum_before
                .iter()
                .filter(|v| !enum_after.contains(v))
                .collect()
        };
        if enum_before.is_empty() {
            out.push((
                here.clone(),
                format!("limited to [{}] now", enum_after.join(", ")),
            ));
        } else if !dropped.is_empty() {
            out.push((
                here.clone(),
                format!(
                    "enum no longer allows {}",
                    dropped
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    for (key, tighter) in [
        ("minimum", Tighter::Up),
        ("exclusiveMinimum", Tighter::Up),
        ("minLength", Tighter::Up),
        ("minItems", Tighter::Up),
        ("minProperties", Tighter::Up),
        ("maximum", Tighter::Down),
        ("exclusiveMaximum", Tighter::Down),
        ("maxLength", Tighter::Down),
        ("maxItems", Tighter::Down),
        ("maxProperties", Tighter::Down),
    ] {
        let num = |s: &Value| s.get(key).and_then(Value::as_f64);
        let tightened = match (num(before), num(after), tighter) {
            (None, Some(_), _) => true,
            (Some(b), Some(a), Tighter::Up) => a > b,
            (Some(b), Some(a), Tighter::Down) => a < b,
            _ => false,
        };
        if tightened {
            out.push((
                here.clone(),
                // As numbers: a typed live CRD says `10.0` where the rule said `10`.
                format!(
                    "{key} tightened from {} to {}",
                    num(before).map_or_else(|| "none".into(), |n| n.to_string()),
                    num(after).map(|n| n.to_string()).unwrap_or_default()
                ),
            ));
        }
    }
    if let Some(pattern) = after.get("pattern")
        && before.get("pattern") != Some(pattern)
    {
        out.push((here.clone(), format!("pattern now {pattern}")));
    }
    for key in ["items", "additionalProperties"] {
        if let (Some(b), Some(a)) = (before.get(key), after.get(key))
            && b.is_object()
            && a.is_object()
        {
            compare(b, a, &format!("{here}[]"), out);
        }
    }
}

#[derive(Clone, Copy)]
enum Tighter {
    Up,
    Down,
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::changes;

    fn crd(stored: &[&str], versions: Value) -> Value {
        json!({"spec": {"versions": versions}, "status": {"storedVersions": stored}})
    }

    fn version(name: &str, served: bool, spec: Value) -> Value {
        json!({"name": name, "served": served, "storage": false, "schema": {"openAPIV3Schema": {
            "type": "object", "properties": {"spec": spec}}}})
    }

    fn spec_change(before: Value, after: Value) -> Vec<String> {
        changes(
            &crd(&["v1"], json!([version("v1", true, before)])),
            &crd(&[], json!([version("v1", true, after)])),
        )
        .iter()
        .map(ToString::to_string)
        .collect()
    }

    #[test]
    fn each_kind_of_breaking_change_is_named_by_version_and_path() {
        let base = json!({"type": "object", "properties": {
            "port": {"type": "integer", "minimum": 1, "maximum": 65535},
            "mode": {"type": "string", "enum": ["a", "b"]},
            "name": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}}}});
        let with = |f: &dyn Fn(&mut Value)| {
            let mut s = base.clone();
            f(&mut s);
            s
        };
        assert_eq!(
            spec_change(
                base.clone(),
                with(&|s| {
                    s["properties"]
                        .as_object_mut()
                        .unwrap()
                        .shift_remove("name");
                })
            ),
            ["version v1: spec.name: removed"]
        );
        assert_eq!(
            spec_change(
                base.clone(),
                with(&|s| s["properties"]["name"]["type"] = json!("integer"))
            ),
            ["version v1: spec.name: type narrowed from string to integer"]
        );
        assert_eq!(
            spec_change(base.clone(), with(&|s| s["required"] = json!(["name"]))),
            [
                "version v1: spec.name: required now, without a default: objects without it are refused"
            ]
        );
        assert_eq!(
            spec_change(
                base.clone(),
                with(&|s| s["properties"]["mode"]["enum"] = json!(["a"]))
            ),
            ["version v1: spec.mode: enum no longer allows \"b\""]
        );
        assert_eq!(
            spec_change(
                base.clone(),
                with(&|s| s["properties"]["port"]["maximum"] = json!(1024))
            ),
            ["version v1: spec.port: maximum tightened from 65535 to 1024"]
        );
        assert_eq!(
            spec_change(
                base.clone(),
                with(&|s| s["properties"]["tags"]["items"]["maxLength"] = json!(8))
            ),
            ["version v1: spec.tags[]: maxLength tightened from none to 8"]
        );
        assert_eq!(
            spec_change(
                base.clone(),
                with(&|s| s["properties"]["name"]["pattern"] = json!("^[a-z]+$"))
            ),
            ["version v1: spec.name: pattern now \"^[a-z]+$\""]
        );
    }

    #[test]
    fn a_field_that_took_any_value_and_now_has_a_type_is_narrowed() {
        let before = json!({"type": "object", "properties": {"extra": {"x-kubernetes-preserve-unknown-fields": true}}});
        let after = json!({"type": "object", "properties": {"extra": {"type": "string"}}});
        assert_eq!(
            spec_change(before, after),
            ["version v1: spec.extra: type narrowed from any value to string"]
        );
    }

    #[test]
    fn safe_changes_are_not_breaking() {
        let base = json!({"type": "object", "required": ["name"], "properties": {
            "port": {"type": "integer", "minimum": 1},
            "mode": {"type": "string", "enum": ["a", "b"]},
            "name": {"type": "string"}}});
        let after = json!({"type": "object", "properties": {
            "port": {"type": "number"},
            "mode": {"type": "string", "enum": ["a", "b", "c"]},
            "name": {"type": "string"},
            "added": {"type": "string"},
            "defaulted": {"type": "string", "default": "x"}},
            "required": ["defaulted"]});
        assert_eq!(spec_change(base, after), Vec::<String>::new());
    }

    #[test]
    fn dropping_or_unserving_a_stored_version_is_breaking_and_adding_one_is_not() {
        let spec = json!({"type": "object"});
        let live = crd(
            &["v1"],
            json!([
                version("v1", true, spec.clone()),
                version("v2", true, spec.clone())
            ]),
        );
        let dropped = crd(&[], json!([version("v2", true, spec.clone())]));
        assert_eq!(
            changes(&live, &dropped)
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["version v1: dropped, but objects are stored in it (status.storedVersions)"]
        );
        let unserved = crd(
            &[],
            json!([
                version("v1", false, spec.clone()),
                version("v2", true, spec.clone())
            ]),
        );
        assert_eq!(
            changes(&live, &unserved)[0].to_string(),
            "version v1: no longer served, but objects are stored in it"
        );
        let added = crd(
            &[],
            json!([
                version("v1", true, spec.clone()),
                version("v2", true, spec.clone()),
                version("v3", true, spec.clone())
            ]),
        );
        assert!(changes(&live, &added).is_empty());
        // After the migration (only v2 stored), v1 retires: un-served, then dropped.
        let migrated = crd(
            &["v2"],
            json!([version("v1", true, spec.clone()), version("v2", true, spec)]),
        );
        assert!(changes(&migrated, &unserved).is_empty());
        assert!(changes(&migrated, &dropped).is_empty());
    }
}
