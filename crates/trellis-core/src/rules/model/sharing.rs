//! What a rule shares with other controllers and people, as written:
//! `forEach` (one list, or the combinations of several), `propagate:` (the
//! parent's labels and annotations copied onto its children) and
//! `crd.scale` (the generated CRD's `scale` subresource). The compiler
//! checks them; the planner and the CRD generator use them.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `forEach:` of a child, a patch or a condition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum ForEach {
    /// An expression yielding a list: one object per item (`item`, `index`).
    List(String),
    /// Names → expressions yielding lists: one object per combination, the
    /// first name varying slowest (`item.<name>`, `index`).
    Product(NamedLists),
}

impl ForEach {
    /// The expressions with their names (`None` for a single list), in order.
    pub fn lists(&self) -> Vec<(Option<&str>, &str)> {
        match self {
            ForEach::List(expr) => vec![(None, expr.as_str())],
            ForEach::Product(named) => named
                .0
                .iter()
                .map(|(n, e)| (Some(n.as_str()), e.as_str()))
                .collect(),
        }
    }
}

impl fmt::Display for ForEach {
    /// As written: `spec.hosts`, or `{region: spec.regions, tier: spec.tiers}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ForEach::List(expr) => f.write_str(expr),
            ForEach::Product(named) => {
                let parts: Vec<String> = named.0.iter().map(|(n, e)| format!("{n}: {e}")).collect();
                write!(f, "{{{}}}", parts.join(", "))
            }
        }
    }
}

/// A mapping of names to expressions that keeps the order it was written
/// in: the order of a cartesian `forEach` is the order of its names.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NamedLists(pub Vec<(String, String)>);

impl Serialize for NamedLists {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, expr) in &self.0 {
            map.serialize_entry(name, expr)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for NamedLists {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Ordered;
        impl<'de> Visitor<'de> for Ordered {
            type Value = NamedLists;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mapping of names to list expressions")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NamedLists, A::Error> {
                let mut out = Vec::new();
                while let Some((name, expr)) = map.next_entry::<String, String>()? {
                    out.push((name, expr));
                }
                Ok(NamedLists(out))
            }
        }
        deserializer.deserialize_map(Ordered)
    }
}

impl JsonSchema for NamedLists {
    fn schema_name() -> Cow<'static, str> {
        "NamedLists".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "Names → expressions yielding lists: one object per combination, the first name varying slowest (`item.<name>`, `index`).",
            "type": "object",
            "minProperties": 1,
            "additionalProperties": {"type": "string"},
        })
    }
}

/// `propagate:`: keys of the parent's metadata copied onto every child.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Propagate {
    /// Label keys, exact or a prefix ending in `*` (`example.com/*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// Annotation keys, exact or a prefix ending in `*`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub annotations: Vec<String>,
}

/// `crd.scale`: the generated CRD's `scale` subresource, so that `kubectl
/// scale` and a HorizontalPodAutoscaler work on parents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ScaleSpec {
    /// Where the desired replicas live, e.g. `.spec.replicas` (an integer of the schema).
    pub spec_replicas_path: String,
    /// Where the observed replicas live, e.g. `.status.replicas.ready` (a status field).
    pub status_replicas_path: String,
    /// Optional: a status field (or spec field) holding the Pods' label
    /// selector as a string, e.g. `.status.selector`; an HPA needs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector_path: Option<String>,
}
