//! The schemas of the kinds built into Kubernetes 1.35, bundled.
//!
//! `kubernetes-1.35.json` was generated once from a 1.35 API server's
//! `/openapi/v3` (every built-in group it serves) and trimmed to what
//! [`super::validate`] reads: types, properties, items,
//! additionalProperties, `$ref`s and the int-or-string and
//! preserve-unknown-fields markers; descriptions, defaults and enums left
//! out. `tests/conform_bundle.rs` regenerates it from the test cluster and
//! fails when it differs (`TRELLIS_BLESS=1` writes it anew).
//!
//! Why not the k8s-openapi crate: its `schemars` feature derives schemas
//! for every type at build time (all of k8s-openapi rebuilt with it, and
//! every kind's schema generated at run time through a table of types we
//! would keep by hand), while the document is 180 KB of text that the
//! server itself describes.

use std::sync::OnceLock;

use serde_json::{Map, Value};

use crate::kinds::Gvk;

/// The bundled document: `{kubernetes, kinds: {"apps/v1/Deployment":
/// definition name}, definitions: {name: schema}}`.
pub const BUNDLE: &str = include_str!("kubernetes-1.35.json");

struct Bundle {
    kinds: Map<String, Value>,
    definitions: Map<String, Value>,
}

fn bundle() -> Option<&'static Bundle> {
    static BUNDLE_PARSED: OnceLock<Option<Bundle>> = OnceLock::new();
    BUNDLE_PARSED
        .get_or_init(|| {
            let mut doc: Value = serde_json::from_str(BUNDLE).ok()?;
            let mut take = |key: &str| match doc.get_mut(key).map(Value::take) {
                Some(Value::Object(map)) => Some(map),
                _ => None,
            };
            Some(Bundle {
                kinds: take("kinds")?,
                definitions: take("definitions")?,
            })
        })
        .as_ref()
}

/// The key of a kind in the bundle: `apps/v1/Deployment`, `v1/ConfigMap`.
pub fn kind_key(gvk: &Gvk) -> String {
    format!("{}/{}", gvk.api_version(), gvk.kind)
}

/// Every built-in definition, for `$ref`s (also from CRD schemas'
/// `metadata`).
pub fn definitions() -> &'static Map<String, Value> {
    static EMPTY: OnceLock<Map<String, Value>> = OnceLock::new();
    bundle()
        .map(|b| &b.definitions)
        .unwrap_or_else(|| EMPTY.get_or_init(Map::new))
}

/// The schema of a built-in kind (a `$ref` to its definition), when
/// Kubernetes 1.35 serves that group, version and kind.
pub fn schema_of(gvk: &Gvk) -> Option<Value> {
    let name = bundle()?.kinds.get(&kind_key(gvk))?.as_str()?;
    Some(serde_json::json!({ "$ref": name }))
}
