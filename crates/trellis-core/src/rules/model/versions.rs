//! `spec.versions` and `spec.storageVersion`: the other API versions of a
//! parent kind whose CRD the rule generates, as written. The hub is
//! `spec.parent.apiVersion`: the version the rule renders and watches;
//! every other version converts to and from it (`crate::conversion`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One served version besides the hub.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VersionSpec {
    /// The version name (`v1`, `v1beta1`): a DNS-1123 label, not the hub's.
    pub name: String,
    /// JSON Schema of this version's `.spec` (converted to the CRD as
    /// `spec.schema` is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// Defaults of this version's `.spec` (in its CRD schema).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<Value>,
    /// The CRD's `deprecationWarning` for this version; it is `deprecated`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated: Option<String>,
    /// Served by the API server (default true).
    #[serde(default = "served", skip_serializing_if = "is_served")]
    pub served: bool,
    /// Template: this version's `spec` → the hub's `spec` (a YAML mapping).
    pub to_hub: String,
    /// Template: the hub's `spec` → this version's `spec` (a YAML mapping).
    pub from_hub: String,
    /// Hub paths (`spec.ports`) a round trip through this version may lose.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lossy: Vec<String>,
}

fn served() -> bool {
    true
}

fn is_served(served: &bool) -> bool {
    *served
}
