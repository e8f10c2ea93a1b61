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

#[cfg(test)]
mod tests;

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

    /// `type` as written: one type, a list with `null`, or integer+string.
    fn declared_type(
        &mut self,
        s: &Map<String, Value>,
        at: &str,
        outer: Option<&Map<String, Value>>,
    ) -> Declared {
        let field = format!("{at}.type");
        let mut names: Vec<&str> = match s.get("type") {
            None => return Declared::default(),
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            Some(_) => {
                self.error(&field, "must be a type name or a list of them");
                return Declared::default();
            }
        };
        let nullable = names.contains(&"null");
        names.retain(|t| *t != "null");
        names.sort();
        names.dedup();
        if let Some(bad) = names.iter().find(|t| !TYPES.contains(t)) {
            self.error(&field, format!("unknown type `{bad}`"));
            return Declared::default();
        }
        let declared = match names.as_slice() {
            [] => {
                self.error(
                    &field,
                    "a field that can only be null has no equivalent in a CRD schema",
                );
                Declared::default()
            }
            [one] => Declared {
                ty: Some((*one).to_owned()),
                nullable,
                int_or_string: false,
            },
            ["integer", "string"] => Declared {
                ty: None,
                nullable,
                int_or_string: true,
            },
            ["integer", "number"] => Declared {
                ty: Some("number".into()),
                nullable,
                int_or_string: false,
            },
            many => {
                self.error(
                    &field,
                    format!(
                        "a field of several types ({}) has no equivalent in a CRD schema \
                         (only [integer, string], as x-kubernetes-int-or-string)",
                        many.join(", ")
                    ),
                );
                Declared::default()
            }
        };
        let Some(outer) = outer else {
            return declared;
        };
        // Inside a junctor a type may only restate the outer one.
        let outer_ty = outer.get("type").and_then(Value::as_str);
        let outer_ios = outer.get(INT_OR_STRING) == Some(&Value::Bool(true));
        let restates = match (&declared.ty, declared.int_or_string) {
            (Some(t), _) => {
                outer_ty == Some(t.as_str())
                    || (outer_ios && (t == "integer" || t == "string"))
                    || (outer_ty == Some("number") && t == "integer")
            }
            (None, true) => outer_ios,
            (None, false) => true,
        };
        if !restates || declared.nullable {
            self.error(
                &field,
                format!(
                    "a branch of a combinator may only restate the type around it ({}): \
                     branches of different types have no equivalent in a CRD schema",
                    outer_ty.unwrap_or(if outer_ios { "int-or-string" } else { "none" })
                ),
            );
        }
        Declared::default()
    }

    fn infer_type(&mut self, s: &Map<String, Value>, at: &str) -> Inferred {
        let has = |keys: &[&str]| keys.iter().any(|k| s.contains_key(*k));
        if has(&[
            "properties",
            "additionalProperties",
            "required",
            "minProperties",
            "maxProperties",
        ]) {
            return Inferred::Type("object".into());
        }
        if has(&["items", "minItems", "maxItems", "uniqueItems"]) {
            return Inferred::Type("array".into());
        }
        let values: Vec<&Value> = match (s.get("enum"), s.get("const")) {
            (Some(Value::Array(e)), _) => e.iter().collect(),
            (None, Some(c)) => vec![c],
            _ => Vec::new(),
        };
        if !values.is_empty() {
            let mut types: Vec<&str> = values.iter().map(|v| json_type(v)).collect();
            types.sort();
            types.dedup();
            return match types.as_slice() {
                [one] if *one != "null" => Inferred::Type((*one).into()),
                ["integer", "number"] => Inferred::Type("number".into()),
                ["integer", "string"] => Inferred::IntOrString,
                _ => {
                    self.error(
                        &format!("{at}.enum"),
                        "values of several types need a `type:` (a CRD field has one type)",
                    );
                    Inferred::Unknown
                }
            };
        }
        if has(&["minLength", "maxLength", "pattern"]) {
            return Inferred::Type("string".into());
        }
        if has(&[
            "minimum",
            "maximum",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "multipleOf",
        ]) {
            return Inferred::Type("number".into());
        }
        // `anyOf: [{type: integer}, {type: string}]` and friends.
        for key in ["anyOf", "oneOf"] {
            let Some(branches) = s.get(key).and_then(Value::as_array) else {
                continue;
            };
            let mut types: Vec<&str> = Vec::new();
            for b in branches {
                match b.get("type").and_then(Value::as_str) {
                    Some(t) => types.push(t),
                    None => return Inferred::Unknown,
                }
            }
            types.sort();
            types.dedup();
            return match types.as_slice() {
                [one] => Inferred::Type((*one).into()),
                ["integer", "string"] => Inferred::IntOrString,
                _ => {
                    self.error(
                        &format!("{at}.{key}"),
                        format!(
                            "branches of different types ({}) have no equivalent in a CRD schema",
                            types.join(", ")
                        ),
                    );
                    Inferred::Unknown
                }
            };
        }
        Inferred::Unknown
    }

    fn numbers(&mut self, s: &Map<String, Value>, at: &str, out: &mut Map<String, Value>) {
        if let Some(v) = s.get("multipleOf") {
            out.insert("multipleOf".into(), v.clone());
        }
        // 2020-12 writes the bound itself in `exclusiveMinimum`; OpenAPI v3.0
        // writes `minimum` and a boolean. Keep the stricter bound.
        for (bound, exclusive, stricter) in [
            ("minimum", "exclusiveMinimum", 1.0),
            ("maximum", "exclusiveMaximum", -1.0),
        ] {
            let inclusive = s.get(bound);
            match (inclusive, s.get(exclusive)) {
                (_, Some(Value::Bool(_))) => self.error(
                    &format!("{at}.{exclusive}"),
                    "in JSON Schema 2020-12 this is the bound itself (a number), not a boolean",
                ),
                (Some(i), Some(e)) => {
                    let (iv, ev) = (i.as_f64().unwrap_or(0.0), e.as_f64().unwrap_or(0.0));
                    if (ev - iv) * stricter >= 0.0 {
                        out.insert(bound.into(), e.clone());
                        out.insert(exclusive.into(), json!(true));
                    } else {
                        out.insert(bound.into(), i.clone());
                    }
                }
                (None, Some(e)) => {
                    out.insert(bound.into(), e.clone());
                    out.insert(exclusive.into(), json!(true));
                }
                (Some(i), None) => {
                    out.insert(bound.into(), i.clone());
                }
                (None, None) => {}
            }
        }
    }

    fn array(
        &mut self,
        s: &Map<String, Value>,
        at: &str,
        outer: Option<&Map<String, Value>>,
        ty: Option<&str>,
        out: &mut Map<String, Value>,
    ) {
        match s.get("items") {
            Some(Value::Array(_)) => self.error(
                &format!("{at}.items"),
                "a list of item schemas (a tuple) has no equivalent in a CRD schema: \
                 every item has the same schema",
            ),
            Some(items) => {
                let field = format!("{at}.items");
                let outer_items = match outer {
                    Some(o) => match o.get("items").and_then(Value::as_object) {
                        Some(oi) => Some(oi),
                        None => {
                            self.error(&field, declared_outside("items"));
                            None
                        }
                    },
                    None => None,
                };
                if outer.is_none() || outer_items.is_some() {
                    let converted = self.node(items, &field, outer_items);
                    out.insert("items".into(), Value::Object(converted));
                }
            }
            None if ty == Some("array") && outer.is_none() => {
                out.insert("items".into(), json!({PRESERVE: true}));
            }
            None => {}
        }
        for key in ["minItems", "maxItems"] {
            if let Some(v) = s.get(key) {
                out.insert(key.into(), v.clone());
            }
        }
        if s.get("uniqueItems") == Some(&Value::Bool(true)) {
            let field = format!("{at}.uniqueItems");
            let item_ty = out
                .get("items")
                .and_then(|i| i.get("type"))
                .and_then(Value::as_str);
            if outer.is_some() {
                self.error(&field, junctor_only_checks("uniqueItems"));
            } else if s.contains_key("x-kubernetes-list-type") {
                // The author chose the list type; theirs wins.
            } else if matches!(item_ty, Some("string" | "integer" | "number" | "boolean")) {
                out.insert("x-kubernetes-list-type".into(), json!("set"));
            } else {
                self.error(
                    &field,
                    "`uniqueItems` has no equivalent in a CRD schema for items that are not \
                     scalars: use `x-kubernetes-list-type: map` with `x-kubernetes-list-map-keys`",
                );
            }
        }
    }

    fn object(
        &mut self,
        s: &Map<String, Value>,
        at: &str,
        outer: Option<&Map<String, Value>>,
        ty: Option<&str>,
        keeps_anything: bool,
        out: &mut Map<String, Value>,
    ) {
        let properties = s.get("properties").and_then(Value::as_object);
        if let Some(props) = properties {
            let outer_props = outer.map(|o| o.get("properties").and_then(Value::as_object));
            let mut converted = Map::new();
            for (name, prop) in props {
                let field = format!("{at}.properties.{name}");
                let outer_prop = match outer_props {
                    None => None,
                    Some(op) => match op.and_then(|op| op.get(name)).and_then(Value::as_object) {
                        Some(p) => Some(p),
                        None => {
                            self.error(&field, declared_outside(&format!("property `{name}`")));
                            continue;
                        }
                    },
                };
                converted.insert(
                    name.clone(),
                    Value::Object(self.node(prop, &field, outer_prop)),
                );
            }
            out.insert("properties".into(), Value::Object(converted));
        }
        if let Some(required) = s.get("required") {
            out.insert("required".into(), required.clone());
        }
        for key in ["minProperties", "maxProperties"] {
            if let Some(v) = s.get(key) {
                out.insert(key.into(), v.clone());
            }
        }
        let field = format!("{at}.additionalProperties");
        match s.get("additionalProperties") {
            Some(_) if outer.is_some() => {
                self.error(&field, junctor_only_checks("additionalProperties"));
            }
            // Undeclared fields are pruned: the CRD way of saying no extras.
            Some(Value::Bool(false)) => {}
            Some(Value::Bool(true)) => {
                out.insert(PRESERVE.into(), json!(true));
            }
            Some(schema) if properties.is_some() => {
                let _ = schema;
                self.error(
                    &field,
                    "a CRD object has either `properties` or `additionalProperties` (a map), \
                     not both",
                );
            }
            Some(schema) => {
                let converted = self.node(schema, &field, None);
                out.insert("additionalProperties".into(), Value::Object(converted));
            }
            None => {
                if ty == Some("object")
                    && outer.is_none()
                    && properties.is_none()
                    && !keeps_anything
                {
                    // `type: object` alone accepts any field in JSON Schema.
                    out.insert(PRESERVE.into(), json!(true));
                }
            }
        }
    }

    fn junctors(&mut self, s: &Map<String, Value>, at: &str, out: &mut Map<String, Value>) {
        let around = out.clone();
        for key in JUNCTORS {
            let Some(value) = s.get(*key) else { continue };
            let Some(branches) = value.as_array() else {
                self.error(&format!("{at}.{key}"), "must be a list of schemas");
                continue;
            };
            let converted: Vec<Value> = branches
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    Value::Object(self.node(b, &format!("{at}.{key}[{i}]"), Some(&around)))
                })
                .collect();
            out.insert((*key).into(), Value::Array(converted));
        }
        if let Some(not) = s.get("not") {
            let converted = self.node(not, &format!("{at}.not"), Some(&around));
            out.insert("not".into(), Value::Object(converted));
        }
    }

    fn refuse_unknown(&mut self, s: &Map<String, Value>, at: &str) {
        const HANDLED: &[&str] = &[
            "type",
            "title",
            "description",
            "nullable",
            "format",
            "enum",
            "const",
            "multipleOf",
            "minimum",
            "maximum",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "minLength",
            "maxLength",
            "pattern",
            "items",
            "minItems",
            "maxItems",
            "uniqueItems",
            "properties",
            "required",
            "additionalProperties",
            "minProperties",
            "maxProperties",
            "default",
            "example",
            "examples",
            "allOf",
            "anyOf",
            "oneOf",
            "not",
        ];
        for key in s.keys() {
            let k = key.as_str();
            if HANDLED.contains(&k) || EXTENSIONS.contains(&k) || IGNORED.contains(&k) {
                continue;
            }
            let message = if k.starts_with("x-kubernetes-") {
                format!("unknown extension `{k}` (known: {})", EXTENSIONS.join(", "))
            } else {
                refusal(k)
            };
            self.error(&format!("{at}.{k}"), message);
        }
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
