//! CRD manifests read from disk (`render`/`check --crds PATH`): what the
//! offline commands learn from them about a parent kind — its scope, its
//! schema, and which status fields its status schema would prune.

use std::path::Path;

use serde_json::Value;

use crate::kinds::Gvk;
use crate::rules::model::Scope;
use crate::rules::{CompiledRule, Diagnostic};

/// Why `--crds` could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Manifest(#[from] crate::manifests::Error),
}

/// Every CustomResourceDefinition found under a path (a file or a directory
/// of `*.yaml`/`*.yml`/`*.json`).
#[derive(Debug, Clone, Default)]
pub struct OfflineCrds {
    crds: Vec<Value>,
}

impl OfflineCrds {
    pub fn load(path: &Path) -> Result<OfflineCrds, LoadError> {
        // `kubectl get crd -o yaml` prints a List: its items count.
        let objects = crate::manifests::read_objects_under(path, &crate::yaml::Limits::FILES)?;
        let crds = objects
            .into_iter()
            .map(|(_, v)| v)
            .filter(|v| v.get("kind").and_then(Value::as_str) == Some("CustomResourceDefinition"))
            .collect();
        Ok(OfflineCrds { crds })
    }

    /// The CRDs trellis generates for the rules that set `crd:`: what the
    /// offline commands take as the parent's CRD when `--crds` is not given.
    pub fn generated<'a>(rules: impl IntoIterator<Item = &'a CompiledRule>) -> OfflineCrds {
        let crds = rules
            .into_iter()
            .filter_map(|rule| crate::rules::crd::generate(&rule.rule).0)
            .collect();
        OfflineCrds { crds }
    }

    /// The CRD and its version that serve `gvk`.
    pub fn find(&self, gvk: &Gvk) -> Option<(&Value, &Value)> {
        self.crds.iter().find_map(|crd| {
            let spec = crd.get("spec")?;
            if spec.get("group")?.as_str()? != gvk.group
                || spec.pointer("/names/kind")?.as_str()? != gvk.kind
            {
                return None;
            }
            let version =
                spec.get("versions")?.as_array()?.iter().find(|v| {
                    v.get("name").and_then(Value::as_str) == Some(gvk.version.as_str())
                })?;
            Some((crd, version))
        })
    }
}

/// The scope a CRD declares.
pub fn scope_of(crd: &Value) -> Scope {
    match crd.pointer("/spec/scope").and_then(Value::as_str) {
        Some("Cluster") => Scope::Cluster,
        _ => Scope::Namespaced,
    }
}

/// The parent's scope offline, when anything says: the `--crds` manifest,
/// the rule's `spec.parent.scope`, its generated CRD (`crd:`); else, for a
/// CRD kind, a parent written without `metadata.namespace` is cluster-scoped.
pub fn parent_scope(
    rule: &CompiledRule,
    parent: &Value,
    crds: Option<&OfflineCrds>,
) -> Option<Scope> {
    if let Some((crd, _)) = crds.and_then(|c| c.find(&rule.parent)) {
        return Some(scope_of(crd));
    }
    let spec = &rule.rule.spec;
    spec.parent
        .scope
        .or_else(|| {
            spec.crd
                .as_ref()
                .map(|_| crate::rules::crd::scope(&rule.rule))
        })
        .or_else(|| {
            let has_ns = parent.pointer("/metadata/namespace").is_some();
            (!rule.parent.is_builtin() && !has_ns).then_some(Scope::Cluster)
        })
}

/// Whether a status schema keeps `.status.<path>`.
fn keeps(mut schema: &Value, path: &[&str]) -> bool {
    for seg in path {
        if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
            || schema
                .get("additionalProperties")
                .is_some_and(Value::is_object)
        {
            return true;
        }
        match schema.get("properties").and_then(|p| p.get(*seg)) {
            Some(next) => schema = next,
            None => return false,
        }
    }
    true
}

/// Warnings for the rule's status fields that the CRD's status schema would
/// prune (what the running operator reports as `StatusFieldDropped`).
pub fn dropped_status_fields(rule: &CompiledRule, crd: &Value, version: &Value) -> Vec<Diagnostic> {
    let name = crd
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("?");
    let Some(status) = version.pointer("/schema/openAPIV3Schema/properties/status") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut paths: Vec<(String, String)> = vec![
        ("spec.status".into(), "observedGeneration".into()),
        ("spec.status".into(), "conditions".into()),
    ];
    for (i, f) in rule
        .rule
        .spec
        .status
        .iter()
        .flat_map(|s| &s.fields)
        .enumerate()
    {
        paths.push((format!("spec.status.fields[{i}].path"), f.path.clone()));
    }
    if rule.rule.spec.status.as_ref().is_some_and(|s| s.inventory) {
        paths.push(("spec.status.inventory".into(), "children".into()));
    }
    for (field, path) in paths {
        let segs: Vec<&str> = path.split('.').collect();
        if !keeps(status, &segs) {
            out.push(Diagnostic::warning(
                &rule.file,
                rule.lines.line_of(&field),
                &field,
                format!(
                    "the CRD {name} would drop .status.{path}: its status schema does not declare it"
                ),
            ));
        }
    }
    out
}

/// Fills in `default:` values as the API server does at admission.
fn apply_defaults(schema: &Value, value: &mut Value) {
    if let (Some(props), Some(obj)) = (
        schema.get("properties").and_then(Value::as_object),
        value.as_object_mut(),
    ) {
        for (name, prop) in props {
            if !obj.contains_key(name)
                && let Some(d) = prop.get("default")
            {
                obj.insert(name.clone(), d.clone());
            }
            if let Some(v) = obj.get_mut(name) {
                apply_defaults(prop, v);
            }
        }
    }
    if let (Some(items), Some(list)) = (schema.get("items"), value.as_array_mut()) {
        for v in list {
            apply_defaults(items, v);
        }
    }
}

/// A CRD's OpenAPI v3 schema as the JSON Schema (draft 4) that accepts what
/// the API server accepts, where the two differ in words only: `nullable:
/// true` admits `null`, `x-kubernetes-int-or-string` an integer or a string,
/// and `x-kubernetes-list-type: set` refuses duplicates. What has no JSON
/// Schema counterpart (CEL `x-kubernetes-validations`, `map` list keys) is
/// not checked offline.
fn as_json_schema(schema: &Value) -> Value {
    let Value::Object(map) = schema else {
        return schema.clone();
    };
    let mut out = serde_json::Map::new();
    for (k, v) in map {
        let v = match (k.as_str(), v) {
            ("properties", Value::Object(props)) => Value::Object(
                props
                    .iter()
                    .map(|(name, p)| (name.clone(), as_json_schema(p)))
                    .collect(),
            ),
            ("items" | "additionalProperties" | "not", v) => as_json_schema(v),
            ("allOf" | "anyOf" | "oneOf", Value::Array(list)) => {
                Value::Array(list.iter().map(as_json_schema).collect())
            }
            _ => v.clone(),
        };
        out.insert(k.clone(), v);
    }
    let flag = |name: &str| map.get(name) == Some(&Value::Bool(true));
    if flag("nullable")
        && let Some(Value::String(t)) = map.get("type")
    {
        out.insert("type".into(), serde_json::json!([t, "null"]));
    }
    if flag("x-kubernetes-int-or-string") {
        out.insert("type".into(), serde_json::json!(["integer", "string"]));
    }
    if map.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("set") {
        out.insert("uniqueItems".into(), Value::Bool(true));
    }
    Value::Object(out)
}

/// The parent's `.spec` checked against the CRD's spec schema (after its
/// defaults), as the API server would at admission; one message per problem.
/// Not checked offline: CEL rules, and fields the schema does not declare
/// (the API server prunes those silently rather than refusing them).
pub fn validate_parent(version: &Value, parent: &Value) -> Vec<String> {
    let Some(schema) = version.pointer("/schema/openAPIV3Schema/properties/spec") else {
        return Vec::new();
    };
    let mut spec = parent
        .get("spec")
        .cloned()
        .unwrap_or(Value::Object(Default::default()));
    apply_defaults(schema, &mut spec);
    match jsonschema::draft4::new(&as_json_schema(schema)) {
        Ok(validator) => validator
            .iter_errors(&spec)
            .map(|e| {
                let at = e.instance_path().to_string().replace('/', ".");
                format!("the CRD's schema refuses spec{at}: {e}")
            })
            .collect(),
        Err(e) => vec![format!(
            "the CRD's spec schema cannot be checked offline: {e}"
        )],
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    #[test]
    fn offline_parent_check_reads_nullable_int_or_string_and_set_lists_as_the_api_server_does() {
        use super::validate_parent;
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
        use super::{OfflineCrds, dropped_status_fields};
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
    fn an_inventory_is_kept_by_its_generated_crd_and_dropped_by_one_without_it() {
        use super::{OfflineCrds, dropped_status_fields};
        let spec = "  parent: {apiVersion: demo.example.com/v1, kind: App}
  crd: {}
  children: []
  status:
    inventory: true
";
        let rule = crate::rules::testing::rule_with_spec(spec);
        let crds = OfflineCrds::generated([rule.as_ref()]);
        let (crd, version) = crds.find(&rule.parent).expect("generated");
        assert!(dropped_status_fields(&rule, crd, version).is_empty());
        // The CRD of the same rule before it kept an inventory.
        let before =
            crate::rules::testing::rule_with_spec(&spec.replace("    inventory: true\n", ""));
        let crds = OfflineCrds::generated([before.as_ref()]);
        let (crd, version) = crds.find(&before.parent).expect("generated");
        let warnings = dropped_status_fields(&rule, crd, version);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(warnings[0].field, "spec.status.inventory");
        assert!(warnings[0].message.contains("would drop .status.children"));
    }

    #[test]
    fn offline_crds_are_found_inside_a_list_as_kubectl_get_prints_it() {
        use super::OfflineCrds;
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
        assert_eq!(super::scope_of(crd), crate::rules::model::Scope::Cluster);
    }
}
