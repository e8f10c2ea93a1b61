//! The built-in kinds' schemas that `check` validates children against
//! (crates/trellis-core/src/conform/kubernetes-1.35.json) are what a Kubernetes 1.35 API server
//! serves: regenerated here from the test cluster's `/openapi/v3`, trimmed
//! the same way, they must equal the bundled file byte for byte.
//! `TRELLIS_BLESS=1 cargo test --test conform_bundle` writes the file anew.
mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{Map, Value, json};
use trellis::kinds::Gvk;

fn bundle_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("crates/trellis-core/src/conform/kubernetes-1.35.json")
}

async fn get_json(client: &kube::Client, path: &str) -> Value {
    let request = http::Request::get(path)
        .body(Vec::new())
        .unwrap_or_else(|e| panic!("request {path}: {e}"));
    let text = client
        .request_text(request)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {path}: not JSON: {e}"))
}

/// What `conform::validate` reads of a schema: types, the object and list
/// structure, `$ref`s (as bare definition names), and the markers that
/// widen a type. Descriptions, defaults, enums and list/map types go.
fn trim(schema: &Value) -> Value {
    let reference = |s: &Value| {
        s.get("$ref")
            .and_then(Value::as_str)
            .map(|r| json!({ "$ref": r.rsplit('/').next().unwrap_or(r) }))
    };
    if let Some(r) = reference(schema) {
        return r;
    }
    // `allOf: [{$ref}]` is how OpenAPI v3 writes a described reference.
    if let Some([only]) = schema
        .get("allOf")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        && let Some(r) = reference(only)
    {
        return r;
    }
    let mut out = Map::new();
    if let Some(t) = schema.get("type") {
        out.insert("type".into(), t.clone());
    }
    if schema.get("format").and_then(Value::as_str) == Some("int-or-string") {
        out.insert("format".into(), json!("int-or-string"));
    }
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true)) {
        out.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        let sorted: BTreeMap<&String, Value> = props.iter().map(|(k, v)| (k, trim(v))).collect();
        out.insert("properties".into(), json!(sorted));
    }
    if let Some(items) = schema.get("items") {
        out.insert("items".into(), trim(items));
    }
    match schema.get("additionalProperties") {
        Some(Value::Bool(b)) => {
            out.insert("additionalProperties".into(), json!(b));
        }
        Some(extra) => {
            out.insert("additionalProperties".into(), trim(extra));
        }
        None => {}
    }
    if let Some(alts) = schema.get("oneOf").and_then(Value::as_array) {
        out.insert("oneOf".into(), alts.iter().map(trim).collect());
    }
    Value::Object(out)
}

/// The bundle, one kind and one definition a line (readable diffs).
fn write_bundle(
    version: &str,
    kinds: &BTreeMap<String, String>,
    defs: &BTreeMap<String, Value>,
) -> String {
    let line = |k: &str, v: &Value| format!("{}:{}", json!(k), v);
    let kinds: Vec<String> = kinds.iter().map(|(k, v)| line(k, &json!(v))).collect();
    let defs: Vec<String> = defs.iter().map(|(k, v)| line(k, v)).collect();
    format!(
        "{{\"kubernetes\":{},\n\"kinds\":{{\n{}}},\n\"definitions\":{{\n{}}}}}\n",
        json!(version),
        kinds.join(",\n"),
        defs.join(",\n")
    )
}

#[tokio::test]
async fn bundled_schemas_are_the_servers() {
    let client = support::client().await;
    let info = client.apiserver_version().await.expect("GET /version");
    let version = format!("{}.{}", info.major, info.minor.trim_end_matches('+'));
    let index = get_json(&client, "/openapi/v3").await;
    let paths = index["paths"].as_object().expect("/openapi/v3 lists paths");
    let mut kinds = BTreeMap::new();
    let mut defs = BTreeMap::new();
    for (path, entry) in paths {
        // `api/v1` and `apis/<group>/<version>` of the groups Kubernetes
        // itself serves; CRDs other tests installed are left out.
        let group_version = match path.split('/').collect::<Vec<_>>().as_slice() {
            ["api", v] => v.to_string(),
            ["apis", g, v] => format!("{g}/{v}"),
            _ => continue,
        };
        if !Gvk::new(&group_version, "Any").is_builtin() {
            continue;
        }
        let url = entry["serverRelativeURL"]
            .as_str()
            .expect("serverRelativeURL");
        let doc = get_json(&client, url).await;
        let schemas = doc
            .pointer("/components/schemas")
            .and_then(Value::as_object)
            .unwrap_or_else(|| panic!("{url}: no components.schemas"));
        for (name, schema) in schemas {
            for gvk in schema["x-kubernetes-group-version-kind"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let (g, v, k) = (
                    gvk["group"].as_str().unwrap_or_default(),
                    gvk["version"].as_str().unwrap_or_default(),
                    gvk["kind"].as_str().unwrap_or_default(),
                );
                let api_version = if g.is_empty() {
                    v.to_owned()
                } else {
                    format!("{g}/{v}")
                };
                // Only the kinds of this group version (meta kinds such as
                // DeleteOptions list every group).
                if api_version == group_version {
                    kinds.insert(format!("{api_version}/{k}"), name.clone());
                }
            }
            defs.insert(name.clone(), trim(schema));
        }
    }
    assert!(
        kinds.contains_key("apps/v1/Deployment") && kinds.contains_key("v1/ConfigMap"),
        "the server's OpenAPI documents lack the core kinds"
    );
    let generated = write_bundle(&version, &kinds, &defs);
    let path = bundle_path();
    if std::env::var_os("TRELLIS_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write the bundle");
    }
    let bundled = std::fs::read_to_string(&path).expect("read the bundle");
    assert_eq!(version, "1.35", "the test cluster is not Kubernetes 1.35");
    if bundled != generated {
        let first = bundled
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| bundled.lines().count().min(generated.lines().count()));
        panic!(
            "{} differs from the server's schemas from line {} on \
             (TRELLIS_BLESS=1 cargo test --test conform_bundle writes it anew):\n\
             bundled:   {}\nserver's:  {}",
            path.display(),
            first + 1,
            bundled.lines().nth(first).unwrap_or("<end>"),
            generated.lines().nth(first).unwrap_or("<end>")
        );
    }
}
