//! Hover and completion on rule fields: where the cursor is in a rule file
//! (the path of keys down to it, read from indentation, as an editor's
//! buffer may not be valid YAML while typed), and what `trellis schema`
//! says about the field there.

use serde_json::Value;

/// The keys from the document's root down to the key written on line
/// `line` (0-based), for hover. `None` when the line writes no key, or is
/// text rather than structure (a template in a block scalar).
pub fn path_at(text: &str, line: usize) -> Option<Vec<String>> {
    let here = text.lines().nth(line)?;
    let key = key_of(here)?;
    let mut path = enclosing(text, line, key_column(here))?;
    path.push(key.to_owned());
    Some(path)
}

/// The keys of the blocks that hold column `col` of line `line`: where a
/// key typed there would go, for completion.
pub fn enclosing(text: &str, line: usize, col: usize) -> Option<Vec<String>> {
    let lines: Vec<&str> = text.lines().collect();
    let mut limit = col;
    let mut path = Vec::new();
    for prev in lines.get(..line)?.iter().rev() {
        if limit == 0 {
            break;
        }
        let trimmed = prev.trim_start();
        if trimmed == "---" {
            break;
        }
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let key = key_of(prev);
        if let Some(k) = key
            && key_column(prev) < limit
        {
            // A key holding a block scalar (`template: |`) holds text.
            if is_block_scalar(prev) {
                return None;
            }
            path.push(k.to_owned());
            limit = indent_of(prev);
        } else if indent_of(prev) < limit {
            // A list item's first line (`- id: a`), or text of a scalar
            // that began above.
            if key.is_none() && is_block_scalar(prev) {
                return None;
            }
            limit = indent_of(prev);
        }
    }
    path.reverse();
    Some(path)
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The column of a line's key, past any list dashes (`  - id: a`: 4).
fn key_column(line: &str) -> usize {
    let mut col = indent_of(line);
    let mut rest = line.trim_start();
    while let Some(r) = rest.strip_prefix("- ") {
        col += 2 + (r.len() - r.trim_start().len());
        rest = r.trim_start();
    }
    col
}

/// `key` of a `key:` line (after list dashes), plain or quoted.
fn key_of(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    while let Some(r) = rest.strip_prefix("- ") {
        rest = r.trim_start();
    }
    let end = rest.find(':')?;
    let after = &rest[end + 1..];
    if !(after.is_empty() || after.starts_with(' ')) {
        return None;
    }
    let key = rest[..end].trim().trim_matches(['"', '\'']);
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
    plain.then_some(key)
}

/// `key: |`, `key: >-` and the like: the lines below are text.
fn is_block_scalar(line: &str) -> bool {
    let value = line.split_once(':').map(|(_, v)| v).unwrap_or_default();
    let token = value.split(" #").next().unwrap_or_default().trim();
    token.starts_with('|') || token.starts_with('>')
}

/// The schema node for the field at `path` in the rule format's JSON
/// Schema (lists are passed through: `children` → its items).
pub fn schema_at<'s>(root: &'s Value, path: &[String]) -> Option<&'s Value> {
    let mut node = resolve(root, root);
    for key in path {
        node = child(root, node, key)?;
    }
    Some(node)
}

fn resolve<'s>(root: &'s Value, mut node: &'s Value) -> &'s Value {
    for _ in 0..16 {
        let Some(r) = node.get("$ref").and_then(Value::as_str) else {
            break;
        };
        match r
            .strip_prefix("#/")
            .and_then(|p| root.pointer(&format!("/{p}")))
        {
            Some(target) => node = target,
            None => break,
        }
    }
    node
}

/// The schema of `key` under `node`, through list items and alternatives.
fn child<'s>(root: &'s Value, node: &'s Value, key: &str) -> Option<&'s Value> {
    let node = resolve(root, node);
    if let Some(found) = node.get("properties").and_then(|p| p.get(key)) {
        return Some(found);
    }
    if let Some(items) = node.get("items")
        && let Some(found) = child(root, items, key)
    {
        return Some(found);
    }
    alternatives(node).find_map(|branch| child(root, branch, key))
}

/// The branches of a node's `anyOf`, `oneOf` and `allOf`, in that order.
fn alternatives(node: &Value) -> impl Iterator<Item = &Value> {
    ["anyOf", "oneOf", "allOf"]
        .into_iter()
        .filter_map(|alt| node.get(alt).and_then(Value::as_array))
        .flatten()
}

/// The fields a node declares (through list items and alternatives), with
/// their descriptions.
pub fn fields_of<'s>(root: &'s Value, node: &'s Value) -> Vec<(&'s str, Option<&'s str>)> {
    let node = resolve(root, node);
    let mut out = Vec::new();
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            out.push((k.as_str(), description(root, v)));
        }
    }
    if out.is_empty() {
        if let Some(items) = node.get("items") {
            return fields_of(root, items);
        }
        for branch in alternatives(node) {
            out.extend(fields_of(root, branch));
        }
    }
    out
}

/// A field's description: its own, else its type's.
pub fn description<'s>(root: &'s Value, node: &'s Value) -> Option<&'s str> {
    node.get("description").and_then(Value::as_str).or_else(|| {
        resolve(root, node)
            .get("description")
            .and_then(Value::as_str)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: &str = "apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: app
spec:
  parent:
    apiVersion: v1
    kind: ConfigMap
  children:
    - id: a
      apiVersion: v1
      includeWhen: x
      template: |
        metadata:
          name: b
";

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_path_of_a_line_goes_through_list_items() {
        assert_eq!(path_at(RULE, 7), Some(strings(&["spec", "parent", "kind"])));
        assert_eq!(path_at(RULE, 9), Some(strings(&["spec", "children", "id"])));
        assert_eq!(
            path_at(RULE, 11),
            Some(strings(&["spec", "children", "includeWhen"]))
        );
        // Inside a template: text, not fields.
        assert_eq!(path_at(RULE, 14), None);
    }

    #[test]
    fn the_schema_describes_the_field_at_a_path() {
        let schema = crate::rules::model::json_schema();
        let node = schema_at(&schema, &strings(&["spec", "children", "includeWhen"]))
            .expect("includeWhen in the schema");
        assert!(
            description(&schema, node).is_some_and(|d| d.contains("not rendered")),
            "{node}"
        );
        let spec = schema_at(&schema, &strings(&["spec"])).expect("spec");
        let names: Vec<&str> = fields_of(&schema, spec).iter().map(|(k, _)| *k).collect();
        assert!(
            names.contains(&"children") && names.contains(&"parent"),
            "{names:?}"
        );
    }

    #[test]
    fn the_sharing_fields_are_offered_where_they_belong() {
        let schema = crate::rules::model::json_schema();
        for (path, field) in [
            (&["spec"][..], "propagate"),
            (&["spec", "status"][..], "inventory"),
            (&["spec", "crd"][..], "scale"),
            (&["spec", "crd", "scale"][..], "labelSelectorPath"),
            (&["spec", "status", "conditions"][..], "forEach"),
            (&["spec", "propagate"][..], "annotations"),
        ] {
            let node = schema_at(&schema, &strings(path)).unwrap_or_else(|| panic!("{path:?}"));
            let names: Vec<&str> = fields_of(&schema, node).iter().map(|(k, _)| *k).collect();
            assert!(names.contains(&field), "{path:?}: {names:?}");
        }
        let for_each = schema_at(&schema, &strings(&["spec", "children", "forEach"])).unwrap();
        assert!(
            description(&schema, for_each).is_some_and(|d| d.contains("combination")),
            "{for_each}"
        );
    }
}
