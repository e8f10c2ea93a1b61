//! JSON Schema (2020-12, as rules write `spec.schema`) to a structural
//! OpenAPI v3 schema, the dialect a CustomResourceDefinition accepts.
//!
//! Structural means: every node has a `type` (or says it keeps anything,
//! `x-kubernetes-preserve-unknown-fields`, or is `x-kubernetes-int-or-string`);
//! `allOf`/`anyOf`/`oneOf`/`not` only add value checks to fields declared
//! outside them; no references. The conversion maps what has an equivalent
//! (`exclusiveMinimum: 5` → `minimum: 5, exclusiveMinimum: true`; `const` →
//! a one-value `enum`; `type: [string, "null"]` → `nullable`;
//! `type: [integer, string]` → int-or-string; `uniqueItems` on scalars → a
//! `set` list; an object without `properties` → one that keeps any field) and
//! reports every keyword that has none as an error naming it, so `check`
//! fails instead of the API server refusing the CRD, or worse, silently
//! validating less than the rule says.
//!
//! One deliberate difference: an object with `properties` and no
//! `additionalProperties` accepts extra fields in JSON Schema, while the API
//! server prunes fields its schema does not declare. Pruning is what every
//! CRD does, and what `additionalProperties: false` asks for anyway.

use serde_json::{Map, Value, json};

mod keywords;
#[cfg(test)]
mod tests;
mod types;

/// One thing the conversion found, at a rule field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub field: String,
    pub message: String,
    pub error: bool,
}

const PRESERVE: &str = "x-kubernetes-preserve-unknown-fields";
const INT_OR_STRING: &str = "x-kubernetes-int-or-string";

/// Extensions of the CRD dialect, passed through as written.
const EXTENSIONS: &[&str] = &[
    PRESERVE,
    INT_OR_STRING,
    "x-kubernetes-embedded-resource",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
];

/// Annotations with no effect on validation; dropped.
const IGNORED: &[&str] = &[
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "contentEncoding",
    "contentMediaType",
];

const JUNCTORS: &[&str] = &["allOf", "anyOf", "oneOf"];

const TYPES: &[&str] = &["object", "array", "string", "integer", "number", "boolean"];

/// Why a keyword has no structural equivalent, and what to write instead.
fn refusal(keyword: &str) -> String {
    let cel = "write the check as a CEL rule in `x-kubernetes-validations` instead";
    let hint = match keyword {
        "$ref" | "$defs" | "definitions" | "$dynamicRef" | "$anchor" | "$dynamicAnchor" => {
            "a CRD schema has no references: write the schema inline \
             (a YAML anchor `&name` and alias `*name` repeat it without copying)"
        }
        "if" | "then" | "else" | "dependentRequired" | "dependentSchemas" | "dependencies"
        | "propertyNames" | "contains" | "minContains" | "maxContains" => cel,
        "patternProperties" => {
            "use `additionalProperties` with a schema, and a CEL rule in \
             `x-kubernetes-validations` on the keys"
        }
        "prefixItems" => "a CRD list has one schema for every item (`items`)",
        "unevaluatedProperties" | "unevaluatedItems" => {
            "fields a CRD schema does not declare are pruned; use `additionalProperties: false`"
        }
        _ => "it is not part of the schema dialect of a CustomResourceDefinition",
    };
    format!("`{keyword}` has no equivalent in a CRD's structural schema: {hint}")
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The type a node declares: one type, maybe nullable, or int-or-string.
#[derive(Debug, Default, Clone, PartialEq)]
struct Declared {
    ty: Option<String>,
    nullable: bool,
    int_or_string: bool,
}

/// Collects findings while converting.
#[derive(Debug, Default)]
pub struct Converter {
    pub findings: Vec<Finding>,
}

impl Converter {
    pub fn error(&mut self, field: &str, message: impl Into<String>) {
        self.findings.push(Finding {
            field: field.to_owned(),
            message: message.into(),
            error: true,
        });
    }

    pub fn warning(&mut self, field: &str, message: impl Into<String>) {
        self.findings.push(Finding {
            field: field.to_owned(),
            message: message.into(),
            error: false,
        });
    }

    pub fn has_errors(&self) -> bool {
        self.findings.iter().any(|f| f.error)
    }

    /// Converts the schema written at rule field `at`.
    pub fn convert(&mut self, schema: &Value, at: &str) -> Map<String, Value> {
        self.node(schema, at, None)
    }

    /// One node. `outer` is set inside `allOf`/`anyOf`/`oneOf`/`not`: the
    /// converted schema this branch only adds checks to.
    fn node(
        &mut self,
        schema: &Value,
        at: &str,
        outer: Option<&Map<String, Value>>,
    ) -> Map<String, Value> {
        let mut out = Map::new();
        let s = match schema {
            Value::Bool(true) => {
                if outer.is_none() {
                    out.insert(PRESERVE.into(), json!(true));
                }
                return out;
            }
            Value::Object(s) => s,
            _ => {
                self.error(at, "a schema that accepts nothing (`false`, or not an object) cannot be a CRD field");
                return out;
            }
        };
        let junctor = outer.is_some();

        let declared = self.declared_type(s, at, outer);
        let mut ty = declared.ty.clone();
        let mut int_or_string =
            declared.int_or_string || s.get(INT_OR_STRING) == Some(&Value::Bool(true));
        if !junctor && ty.is_none() && !int_or_string {
            match self.infer_type(s, at) {
                Inferred::Type(t) => ty = Some(t),
                Inferred::IntOrString => int_or_string = true,
                Inferred::Unknown => {}
            }
        }
        let keeps_anything = s.get(PRESERVE) == Some(&Value::Bool(true));

        if !junctor {
            for key in ["title", "description"] {
                if let Some(v) = s.get(key) {
                    out.insert(key.into(), v.clone());
                }
            }
            if let Some(t) = &ty {
                out.insert("type".into(), json!(t));
            }
            if declared.nullable || s.get("nullable") == Some(&Value::Bool(true)) {
                out.insert("nullable".into(), json!(true));
            }
            if int_or_string {
                out.insert(INT_OR_STRING.into(), json!(true));
            }
        } else if s.get("nullable").is_some() {
            self.error(&format!("{at}.nullable"), junctor_only_checks("nullable"));
        }
        if let Some(v) = s.get("format") {
            out.insert("format".into(), v.clone());
        }

        match (s.get("enum"), s.get("const")) {
            (Some(e), _) => {
                out.insert("enum".into(), e.clone());
            }
            (None, Some(c)) => {
                out.insert("enum".into(), json!([c]));
            }
            _ => {}
        }

        self.numbers(s, at, &mut out);
        for key in ["minLength", "maxLength", "pattern"] {
            if let Some(v) = s.get(key) {
                out.insert(key.into(), v.clone());
            }
        }

        self.array(s, at, outer, ty.as_deref(), &mut out);
        self.object(s, at, outer, ty.as_deref(), keeps_anything, &mut out);

        if let Some(d) = s.get("default") {
            if junctor {
                self.error(&format!("{at}.default"), junctor_only_checks("default"));
            } else {
                out.insert("default".into(), d.clone());
            }
        }
        if !junctor {
            if let Some(e) = s.get("example") {
                out.insert("example".into(), e.clone());
            } else if let Some(e) = s.get("examples").and_then(|e| e.as_array()?.first()) {
                out.insert("example".into(), e.clone());
            }
        }
        for ext in EXTENSIONS {
            if let Some(v) = s.get(*ext) {
                if junctor {
                    self.error(&format!("{at}.{ext}"), junctor_only_checks(ext));
                } else if *ext != INT_OR_STRING {
                    out.insert((*ext).into(), v.clone());
                }
            }
        }
        if !junctor && ty.is_none() && !int_or_string && !out.contains_key(PRESERVE) {
            // `{}` in JSON Schema accepts any value.
            out.insert(PRESERVE.into(), json!(true));
        }

        self.junctors(s, at, &mut out);
        self.refuse_unknown(s, at);
        out
    }
}

enum Inferred {
    Type(String),
    IntOrString,
    Unknown,
}

fn junctor_only_checks(keyword: &str) -> String {
    format!(
        "`{keyword}` inside allOf/anyOf/oneOf/not has no equivalent in a CRD schema: \
         a combinator may only add checks (required, enum, pattern, bounds) to fields \
         declared outside it"
    )
}

fn declared_outside(what: &str) -> String {
    format!(
        "{what} is only declared inside a combinator: a CRD schema needs it declared \
         outside allOf/anyOf/oneOf/not too"
    )
}

/// Writes a rule's `defaults` into a converted `spec` schema as `default:`
/// values, so the API server stores them at admission. Each declared
/// property gets its own default (so a partly given object is completed, the
/// way `defaults` is deep-merged), and the object holding them their sum (so
/// an absent one is created); maps, lists and scalars get the value itself.
pub fn apply_defaults(
    conv: &mut Converter,
    node: &mut Map<String, Value>,
    defaults: &Value,
    at: &str,
) {
    let has_properties = node.get("properties").is_some_and(Value::is_object);
    let Some(entries) = defaults.as_object().filter(|_| has_properties) else {
        node.insert("default".into(), defaults.clone());
        return;
    };
    let mut extra = Map::new();
    let keeps_unknown = node.get(PRESERVE) == Some(&Value::Bool(true));
    for (key, value) in entries {
        let field = format!("{at}.{key}");
        let prop = node
            .get_mut("properties")
            .and_then(Value::as_object_mut)
            .and_then(|p| p.get_mut(key))
            .and_then(Value::as_object_mut);
        match prop {
            Some(prop) => apply_defaults(conv, prop, value, &field),
            None if keeps_unknown => {
                extra.insert(key.clone(), value.clone());
            }
            None => conv.warning(
                &field,
                format!(
                    "the schema declares no property `{key}`, so the generated CRD cannot \
                     default it (trellis still merges it under .spec)"
                ),
            ),
        }
    }
    // The object itself gets the defaults of its properties as one value:
    // so an absent object is created whole. The API server validates a
    // `default:` as written (without filling in nested defaults), so this is
    // only possible where every required property has a default.
    let props = node.get("properties").and_then(Value::as_object);
    let required_defaulted = node
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .all(|r| {
            props
                .and_then(|p| p.get(r))
                .is_some_and(|p| p.get("default").is_some())
        });
    if required_defaulted && !node.contains_key("default") {
        let mut whole: Map<String, Value> = props
            .into_iter()
            .flatten()
            .filter_map(|(k, p)| Some((k.clone(), p.get("default")?.clone())))
            .collect();
        whole.extend(extra);
        node.insert("default".into(), Value::Object(whole));
    }
}
