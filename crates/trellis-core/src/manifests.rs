//! The Kubernetes objects in a manifest file given on the command line (a
//! parent, `--observed`, `--crds`): a YAML stream of objects, where a List
//! document — what `kubectl get -o yaml` prints (`kind: List`), or a typed
//! list from the API (`ConfigMapList`) — stands for its items, as
//! `kubectl apply -f` reads it.
//! So `kubectl get cm,deploy -o yaml > observed.yaml` is a valid `--observed`.
//!
//! Rule files are not read here: a rules directory holds only `Rule`
//! documents (`rules::load`).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::yaml::{self, LineIndex, YamlError};

/// Why a manifest file could not be read; each message starts with the
/// file (and line, where one is known), as the CLI prints it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Yaml { path: PathBuf, source: YamlError },
    /// A document that is not an object, or a List item that is not one.
    #[error("{}{}: {message}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
    Object {
        path: PathBuf,
        line: Option<u64>,
        message: String,
    },
    #[error(
        "{}: more than {limit} objects in one file, counting the items of List documents \
         (the limit)",
        path.display()
    )]
    TooManyObjects { path: PathBuf, limit: usize },
}

/// The objects of a file, or of every `*.yaml`/`*.yml`/`*.json` file of a
/// directory (not its subdirectories, in name order), each with its file.
pub fn read_objects_under(
    path: &Path,
    limits: &yaml::Limits,
) -> Result<Vec<(PathBuf, Value)>, Error> {
    let mut files = Vec::new();
    if path.is_dir() {
        let entries = std::fs::read_dir(path).map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
        for entry in entries.flatten() {
            let p = entry.path();
            let ext = p.extension().and_then(|x| x.to_str()).unwrap_or_default();
            if p.is_file() && matches!(ext, "yaml" | "yml" | "json") {
                files.push(p);
            }
        }
        files.sort();
    } else {
        files.push(path.to_path_buf());
    }
    let mut out = Vec::new();
    for file in files {
        for object in read_objects(&file, limits)? {
            out.push((file.clone(), object));
        }
    }
    Ok(out)
}

/// The objects in `path`, List documents expanded, under `limits`: its
/// document budget counts objects after expansion, so a List cannot carry
/// more objects than a plain stream may.
pub fn read_objects(path: &Path, limits: &yaml::Limits) -> Result<Vec<Value>, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    let docs = yaml::parse_documents(&text, limits).map_err(|source| Error::Yaml {
        path: path.to_owned(),
        source,
    })?;
    let mut objects = Vec::with_capacity(docs.len());
    for doc in docs {
        expand(doc.value, "", &doc.lines, &mut objects).map_err(|(line, message)| {
            Error::Object {
                path: path.to_owned(),
                line,
                message,
            }
        })?;
        if objects.len() > limits.max_documents {
            return Err(Error::TooManyObjects {
                path: path.to_owned(),
                limit: limits.max_documents,
            });
        }
    }
    Ok(objects)
}

/// The kind a list document lists (`""` for `kind: List`), when `value` is
/// one: a kind ending in `List` with an `items` array.
fn listed_kind(value: &Value) -> Option<&str> {
    let kind = value.get("kind")?.as_str()?.strip_suffix("List")?;
    value.get("items")?.is_array().then_some(kind)
}

/// Pushes `value`, or each item of it when it is a List (recursively);
/// an error carries the line of the offending item. `at` is the value's path
/// in its document (`items[2]`), for that line.
fn expand(
    mut value: Value,
    at: &str,
    lines: &LineIndex,
    out: &mut Vec<Value>,
) -> Result<(), (Option<u64>, String)> {
    let Some(kind) = listed_kind(&value).map(str::to_owned) else {
        out.push(value);
        return Ok(());
    };
    let api_version = value.get("apiVersion").cloned();
    let items = match value.get_mut("items").map(Value::take) {
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    };
    for (i, mut item) in items.into_iter().enumerate() {
        let path = format!("{at}items[{i}]");
        let Some(object) = item.as_object_mut() else {
            return Err((
                lines.line_of(&path),
                format!("{path}: an item of a {kind}List must be an object"),
            ));
        };
        // The API server leaves kind and apiVersion off the items of a
        // typed list (`ConfigMapList`): they are the list's, as kubectl
        // reads them. `kind: List` says nothing; its items carry their own.
        if !kind.is_empty() && !object.contains_key("kind") {
            object.insert("kind".into(), Value::String(kind.clone()));
            if let Some(api_version) = &api_version
                && !object.contains_key("apiVersion")
            {
                object.insert("apiVersion".into(), api_version.clone());
            }
        }
        expand(item, &format!("{path}."), lines, out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use serde_json::json;

    use super::*;

    fn read(text: &str, limits: &yaml::Limits) -> Result<Vec<Value>, String> {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(text.as_bytes()).unwrap();
        read_objects(file.path(), limits).map_err(|e| {
            e.to_string()
                .replace(&file.path().display().to_string(), "FILE")
        })
    }

    #[test]
    fn a_kubectl_list_stands_for_its_items_among_other_documents() {
        let text = "apiVersion: v1
kind: List
metadata: {resourceVersion: \"\"}
items:
  - {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}
  - {apiVersion: apps/v1, kind: Deployment, metadata: {name: b}}
---
apiVersion: v1
kind: Secret
metadata: {name: c}
---
apiVersion: v1
kind: List
items: []
";
        let names: Vec<_> = read(text, &yaml::Limits::OBSERVED)
            .unwrap()
            .iter()
            .map(|o| format!("{}/{}", o["kind"], o["metadata"]["name"]))
            .collect();
        assert_eq!(
            names,
            [
                r#""ConfigMap"/"a""#,
                r#""Deployment"/"b""#,
                r#""Secret"/"c""#
            ]
        );
    }

    #[test]
    fn items_of_a_typed_list_take_its_kind_and_api_version() {
        let text = "apiVersion: apps/v1
kind: DeploymentList
items:
  - metadata: {name: a}
  - {apiVersion: apps/v1, kind: Deployment, metadata: {name: b}}
";
        let objects = read(text, &yaml::Limits::OBSERVED).unwrap();
        assert_eq!(
            objects[0],
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "a"}})
        );
        assert_eq!(objects[1]["metadata"]["name"], "b");
    }

    #[test]
    fn an_object_of_a_kind_ending_in_list_without_items_is_an_object() {
        let text = "apiVersion: demo.trellis.dev/v1\nkind: TodoList\nmetadata: {name: a}\nspec: {items: [x]}\n";
        let objects = read(text, &yaml::Limits::FILES).unwrap();
        assert_eq!(objects.len(), 1);
        assert_eq!(objects[0]["kind"], "TodoList");
    }

    #[test]
    fn an_item_that_is_not_an_object_is_an_error_naming_its_line() {
        let text = "apiVersion: v1\nkind: List\nitems:\n  - {kind: ConfigMap}\n  - just text\n";
        assert_eq!(
            read(text, &yaml::Limits::FILES).unwrap_err(),
            "FILE:5: items[1]: an item of a List must be an object"
        );
    }

    #[test]
    fn the_document_budget_counts_the_items_of_lists() {
        let limits = yaml::Limits {
            max_documents: 3,
            ..yaml::Limits::FILES
        };
        let list = |n: usize| {
            format!(
                "apiVersion: v1\nkind: List\nitems: [{}]\n",
                vec!["{kind: ConfigMap}"; n].join(", ")
            )
        };
        assert_eq!(read(&list(3), &limits).unwrap().len(), 3);
        assert_eq!(
            read(&format!("{}---\nkind: Secret\n", list(3)), &limits).unwrap_err(),
            "FILE: more than 3 objects in one file, counting the items of List documents \
             (the limit)"
        );
        assert!(read(&list(4), &limits).is_err());
    }
}
