//! `spec.crd`: what a rule says about its parent's generated
//! CustomResourceDefinition beyond the parent and the schema (scope, names,
//! printer columns, CEL validations), as written. `crate::rules::crd`
//! generates the CRD from it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Scope;

/// The parent's generated CustomResourceDefinition: group, version and kind
/// come from `spec.parent`, the `spec` schema from `spec.schema` and
/// `spec.defaults`; this block says the rest.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CrdSpec {
    /// `Namespaced` (default) or `Cluster`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
    /// Resource name; default: kubectl-style plural of the lowercased kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plural: Option<String>,
    /// Short names for kubectl, e.g. `[wa]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub short_names: Vec<String>,
    /// Categories for `kubectl get <category>`, e.g. `[all]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub categories: Vec<String>,
    /// Columns of `kubectl get`; default: Ready, Synced, Age. A column named
    /// `Ready`, `Synced`, `Reason` or `Age` without a `jsonPath` is the
    /// built-in one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub printer_columns: Option<Vec<PrinterColumn>>,
    /// CEL rules on the whole object (`self.metadata`, `self.spec`), checked
    /// by the API server at admission.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validations: Vec<CelValidation>,
    /// JSON Schema of `.status` properties, to type the rule's status fields
    /// (each one is kept as any value otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_schema: Option<Value>,
    /// The `scale` subresource: `kubectl scale` and HorizontalPodAutoscalers
    /// on parents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<super::ScaleSpec>,
    /// Apply a changed CRD even when the change would break stored parents
    /// or clients (`--manage-crds` refuses such a change otherwise).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_breaking: bool,
}

/// One `kubectl get` column of the generated CRD.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrinterColumn {
    pub name: String,
    /// JSONPath (kubectl syntax, starting with `.`) into the parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_path: Option<String>,
    /// Default `string`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<ColumnType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// 0 (default) shows in `kubectl get`; higher only with `-o wide`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ColumnType {
    String,
    Integer,
    Number,
    Boolean,
    Date,
}

/// A CEL validation rule, as in `x-kubernetes-validations`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CelValidation {
    pub rule: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_expression: Option<String>,
    /// `FieldValueInvalid` (default), `FieldValueForbidden`, `FieldValueRequired`, `FieldValueDuplicate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Field the error is reported on, e.g. `.spec.replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_path: Option<String>,
}
