//! YAML in and out, through the project's one YAML library (serde-saphyr).
//!
//! Parsing goes through a small node tree that remembers where every value
//! came from, so that a validation error found long after parsing (a
//! duplicate child id, an unknown `dependsOn`) can still name its line.
//! Budgets bound what a hostile file can make us allocate; duplicate keys are
//! an error rather than a silent last-wins.

use std::collections::HashMap;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use serde_saphyr::{Budget, DuplicateKeyPolicy, Options, Spanned};

/// Limits on what one YAML stream may contain.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_bytes: usize,
    pub max_depth: usize,
    pub max_nodes: usize,
    pub max_documents: usize,
}

impl Limits {
    /// Budget for rule files and parent/observed files given on the command line.
    pub const FILES: Limits = Limits {
        max_bytes: 4 * 1024 * 1024,
        max_depth: 48,
        max_nodes: 200_000,
        max_documents: 1_000,
    };

    /// Budget for a `render --observed` stream: a snapshot of live objects,
    /// which may hold more objects than one related selector may match
    /// (1000), so that cap can be tried offline too.
    pub const OBSERVED: Limits = Limits {
        max_bytes: 64 * 1024 * 1024,
        max_depth: 48,
        max_nodes: 4_000_000,
        max_documents: 100_000,
    };
}

/// Most aliases (`*name`) and anchors (`&name`) one YAML stream may hold:
/// aliases are how a small file asks for a huge tree ("billion laughs").
pub const MAX_ALIASES: usize = 1_000;
pub const MAX_ANCHORS: usize = 1_000;

#[derive(Debug, thiserror::Error)]
#[error("{}{message}", line.map(|l| format!("line {l}: ")).unwrap_or_default())]
pub struct YamlError {
    pub line: Option<u64>,
    pub message: String,
    /// The input broke a [`Limits`] budget (the message names the limit and
    /// its value) rather than being malformed YAML.
    pub over_budget: bool,
}

/// One parsed document: its JSON value and where each path of it was written.
#[derive(Debug, Clone)]
pub struct Document {
    pub value: Value,
    pub lines: LineIndex,
}

/// Path (`spec.children[1].id`) → 1-based source line.
#[derive(Debug, Clone, Default)]
pub struct LineIndex {
    lines: HashMap<String, u64>,
    /// Offset added to every line (a document's place in a larger file is already counted).
    pub first_line: u64,
}

impl LineIndex {
    /// The line of `path`, or of its closest recorded ancestor.
    pub fn line_of(&self, path: &str) -> Option<u64> {
        let mut p = path;
        loop {
            if let Some(l) = self.lines.get(p) {
                return Some(*l);
            }
            let cut = p.rfind(['.', '['])?;
            p = &p[..cut];
        }
    }
}

/// A value with its source line, as read by serde-saphyr.
struct Node {
    line: u64,
    kind: NodeKind,
}

enum NodeKind {
    Scalar(Value),
    Seq(Vec<Node>),
    Map(Vec<(String, u64, Node)>),
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let spanned = Spanned::<NodeKind>::deserialize(d)?;
        Ok(Node {
            line: spanned.referenced.line(),
            kind: spanned.value,
        })
    }
}

impl<'de> Deserialize<'de> for NodeKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = NodeKind;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<NodeKind, E> {
        Ok(NodeKind::Scalar(Value::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<NodeKind, E> {
        Ok(NodeKind::Scalar(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<NodeKind, E> {
        Ok(NodeKind::Scalar(v.into()))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<NodeKind, E> {
        i64::try_from(v)
            .map(|v| NodeKind::Scalar(v.into()))
            .map_err(|_| E::custom("integer out of range"))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<NodeKind, E> {
        u64::try_from(v)
            .map(|v| NodeKind::Scalar(v.into()))
            .map_err(|_| E::custom("integer out of range"))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<NodeKind, E> {
        serde_json::Number::from_f64(v)
            .map(|n| NodeKind::Scalar(Value::Number(n)))
            .ok_or_else(|| E::custom("non-finite numbers are not allowed"))
    }
    fn visit_str<E>(self, v: &str) -> Result<NodeKind, E> {
        Ok(NodeKind::Scalar(Value::String(v.to_owned())))
    }
    fn visit_string<E>(self, v: String) -> Result<NodeKind, E> {
        Ok(NodeKind::Scalar(Value::String(v)))
    }
    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<NodeKind, E> {
        Err(E::custom("binary values are not supported"))
    }
    fn visit_none<E>(self) -> Result<NodeKind, E> {
        Ok(NodeKind::Scalar(Value::Null))
    }
    fn visit_unit<E>(self) -> Result<NodeKind, E> {
        Ok(NodeKind::Scalar(Value::Null))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<NodeKind, D::Error> {
        NodeKind::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<NodeKind, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Node>()? {
            items.push(item);
        }
        Ok(NodeKind::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NodeKind, A::Error> {
        let mut entries: Vec<(String, u64, Node)> = Vec::new();
        while let Some(key) = map.next_key::<Spanned<KeyString>>()? {
            let line = key.referenced.line();
            let name = key.value.0;
            if let Some((_, first, _)) = entries.iter().find(|(k, _, _)| *k == name) {
                return Err(de::Error::custom(format!(
                    "duplicate key `{name}` at line {line} (first at line {first})"
                )));
            }
            let value = map.next_value::<Node>()?;
            entries.push((name, line, value));
        }
        Ok(NodeKind::Map(entries))
    }
}

/// Mapping keys become strings, as in JSON (`80: x` → `"80"`).
struct KeyString(String);

impl<'de> Deserialize<'de> for KeyString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Asked for a string, a plain `n` or `80` stays the text it is.
        String::deserialize(d)
            .map(KeyString)
            .map_err(|e| de::Error::custom(format!("mapping keys must be scalars: {e}")))
    }
}

fn options(limits: &Limits, legacy_octal: bool) -> Options {
    let mut budget = Budget::default();
    budget.max_depth = limits.max_depth;
    budget.max_nodes = limits.max_nodes;
    budget.max_documents = limits.max_documents;
    budget.max_total_scalar_bytes = limits.max_bytes;
    budget.max_aliases = MAX_ALIASES;
    budget.max_anchors = MAX_ANCHORS;
    budget.flow_nesting_limit = limits.max_depth;
    // Every node is at most two parser events (start and end), every
    // document a few: the node and document budgets are what bind. The
    // library's fixed default (1,000,000) would refuse an `--observed`
    // snapshot well inside them.
    budget.max_events = limits
        .max_nodes
        .saturating_mul(2)
        .saturating_add(limits.max_documents.saturating_mul(4))
        .saturating_add(MAX_ALIASES + 16);
    let mut options = Options::default();
    options.budget = Some(budget);
    options.duplicate_keys = DuplicateKeyPolicy::Error;
    options.with_snippet = false;
    // Comments are never read; capturing them costs a quarter of parse time.
    options.emit_comments = false;
    // YAML 1.2: `yes`, `no`, `on`, `y` are strings, not booleans.
    options.strict_booleans = true;
    // Rendered children are read as kubectl reads manifests: `0400` is octal.
    options.legacy_octal_numbers = legacy_octal;
    options
}

/// What a budget breach means to whoever wrote the input: which limit, and
/// its value. `within` places it (" in one file"), or is empty.
fn over_budget(err: &serde_saphyr::Error, limits: &Limits, within: &str) -> Option<String> {
    use serde_saphyr::Error;
    use serde_saphyr::budget::BudgetBreach;
    let mut err = err.without_snippet();
    while let Error::AliasError { error, .. } = err {
        err = error.without_snippet();
    }
    let depth = || {
        format!(
            "YAML nested more than {} levels deep (the limit)",
            limits.max_depth
        )
    };
    let breach = match err {
        Error::Budget { breach, .. } => breach,
        // Flow collections (`[[[...]]]`) hit the parser's own nesting cap,
        // which is set to the depth budget.
        Error::ExternalMessage { source, .. } => {
            return match source.as_ref() {
                serde_saphyr::ExternalMessageSource::Parser(scan)
                    if matches!(
                        scan.kind(),
                        serde_saphyr::granit_parser::ErrorKind::RecursionLimitExceeded
                    ) =>
                {
                    Some(depth())
                }
                _ => None,
            };
        }
        _ => return None,
    };
    let budget = options(limits, false).budget.unwrap_or_default();
    Some(match breach {
        BudgetBreach::Documents { .. } => format!(
            "more than {} YAML documents{within} (the limit)",
            limits.max_documents
        ),
        BudgetBreach::Depth { .. } => depth(),
        BudgetBreach::Nodes { .. } => format!(
            "more than {} YAML nodes (scalars, lists and maps){within} (the limit)",
            limits.max_nodes
        ),
        BudgetBreach::Aliases { .. } => {
            format!("more than {MAX_ALIASES} YAML aliases (`*name`){within} (the limit)")
        }
        BudgetBreach::Anchors { .. } => {
            format!("more than {MAX_ANCHORS} YAML anchors (`&name`){within} (the limit)")
        }
        BudgetBreach::ScalarBytes { .. } => format!(
            "more than {} bytes of YAML scalar text{within} (the limit)",
            limits.max_bytes
        ),
        BudgetBreach::Events { .. } => format!(
            "more than {} YAML parser events{within} (the limit)",
            budget.max_events
        ),
        BudgetBreach::MergeKeys { .. } => format!(
            "more than {} YAML merge keys (`<<`){within} (the limit)",
            budget.max_merge_keys
        ),
        BudgetBreach::AliasAnchorRatio { aliases, anchors } => format!(
            "{aliases} YAML aliases for {anchors} anchor(s){within}, more than {} per anchor \
             (the limit, against alias bombs)",
            budget.alias_anchor_ratio_multiplier
        ),
        BudgetBreach::RecordedAnchorEvents { .. } | BudgetBreach::RecordedAnchorBytes { .. } => {
            format!(
                "anchored YAML (`&name`) too large to repeat{within}: more than {} parser events \
                 or {} bytes kept for aliases (the limit)",
                budget.max_recorded_anchor_events, budget.max_recorded_anchor_bytes
            )
        }
        other => format!("a YAML budget was exceeded{within}: {other:?}"),
    })
}

fn to_yaml_error(err: serde_saphyr::Error, limits: &Limits, within: &str) -> YamlError {
    let line = err.location().map(|l| l.line()).filter(|l| *l > 0);
    if let Some(message) = over_budget(&err, limits, within) {
        return YamlError {
            line,
            message,
            over_budget: true,
        };
    }
    let text = err.to_string();
    // The library appends its own location; ours goes in front, uniformly.
    let message = text
        .split(" at line ")
        .next()
        .unwrap_or(&text)
        .trim()
        // Library advice addressed to programmers, not rule authors.
        .trim_end_matches(", set DuplicateKeyPolicy in Options if acceptable")
        .to_owned();
    YamlError {
        line,
        message,
        over_budget: false,
    }
}

fn check_size(text: &str, limits: &Limits) -> Result<(), YamlError> {
    if text.len() > limits.max_bytes {
        return Err(YamlError {
            line: None,
            message: format!(
                "input is {} bytes, more than the limit of {} bytes",
                text.len(),
                limits.max_bytes
            ),
            over_budget: true,
        });
    }
    Ok(())
}

/// Parses a YAML stream into its documents; empty documents are skipped.
pub fn parse_documents(text: &str, limits: &Limits) -> Result<Vec<Document>, YamlError> {
    check_size(text, limits)?;
    let nodes: Vec<Option<Node>> =
        serde_saphyr::from_multiple_with_options(text, options(limits, false))
            .map_err(|e| to_yaml_error(e, limits, " in one file"))?;
    Ok(nodes
        .into_iter()
        .flatten()
        .filter(|n| !matches!(n.kind, NodeKind::Scalar(Value::Null)))
        .map(|node| {
            let mut lines = LineIndex {
                first_line: node.line,
                ..LineIndex::default()
            };
            let value = into_value(node, String::new(), &mut lines.lines);
            Document { value, lines }
        })
        .collect())
}

/// Parses one YAML value (e.g. a rendered child) straight into JSON, without
/// the line index: this is the hot path of every render.
pub fn parse_value(text: &str, limits: &Limits) -> Result<Value, YamlError> {
    parse_one(text, limits, true)
}

/// Parses one YAML value read as data (the `fromyaml` filter): YAML 1.2
/// numbers, under the same budgets.
pub fn parse_data(text: &str, limits: &Limits) -> Result<Value, YamlError> {
    parse_one(text, limits, false)
}

fn parse_one(text: &str, limits: &Limits, legacy_octal: bool) -> Result<Value, YamlError> {
    check_size(text, limits)?;
    let mut docs: Vec<Option<Value>> =
        serde_saphyr::from_multiple_with_options(text, options(limits, legacy_octal))
            .map_err(|e| to_yaml_error(e, limits, ""))?;
    docs.retain(|d| d.as_ref().is_some_and(|v| !v.is_null()));
    match docs.len() {
        0 => Ok(Value::Null),
        1 => Ok(docs.pop().flatten().unwrap_or(Value::Null)),
        n => Err(YamlError {
            line: None,
            message: format!("expected one YAML document, found {n}"),
            over_budget: false,
        }),
    }
}

fn into_value(node: Node, path: String, lines: &mut HashMap<String, u64>) -> Value {
    lines.insert(path.clone(), node.line);
    match node.kind {
        NodeKind::Scalar(v) => v,
        NodeKind::Seq(items) => Value::Array(
            items
                .into_iter()
                .enumerate()
                .map(|(i, n)| into_value(n, format!("{path}[{i}]"), lines))
                .collect(),
        ),
        NodeKind::Map(entries) => {
            let mut map = Map::with_capacity(entries.len());
            for (key, key_line, n) in entries {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                lines.insert(child.clone(), key_line);
                let v = into_value(n, child.clone(), lines);
                // The key's own line is the better pointer for a field.
                lines.insert(child, key_line);
                map.insert(key, v);
            }
            Value::Object(map)
        }
    }
}

pub use serde_saphyr::SerializeError;

/// Serializes any value as block-style YAML.
pub fn to_string<T: serde::Serialize>(value: &T) -> Result<String, SerializeError> {
    serde_saphyr::to_string(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_lines_of_nested_fields() {
        let text = "a: 1\nb:\n  c:\n    - x\n    - d: 2\n";
        let docs = parse_documents(text, &Limits::FILES).unwrap();
        let lines = &docs[0].lines;
        assert_eq!(lines.line_of("a"), Some(1));
        assert_eq!(lines.line_of("b.c"), Some(3));
        assert_eq!(lines.line_of("b.c[1].d"), Some(5));
        assert_eq!(lines.line_of("b.c[1].d.missing"), Some(5));
    }

    #[test]
    fn rejects_duplicate_keys_with_line() {
        let err = parse_documents("a: 1\nb: 2\na: 3\n", &Limits::FILES).unwrap_err();
        assert_eq!(err.message, "duplicate mapping key: a", "{err}");
        assert_eq!(err.line, Some(3), "{err}");
    }

    #[test]
    fn parse_value_rejects_duplicates_and_extra_documents() {
        let err = parse_value("a: 1\na: 2\n", &Limits::FILES).unwrap_err();
        assert!(err.message.contains("duplicate"), "{err}");
        let err = parse_value("a: 1\n---\nb: 2\n", &Limits::FILES).unwrap_err();
        assert!(err.message.contains("found 2"), "{err}");
        assert_eq!(
            parse_value("n: yes\n80: x\n", &Limits::FILES).unwrap(),
            serde_json::json!({"n": "yes", "80": "x"})
        );
    }

    #[test]
    fn splits_multi_document_streams_and_skips_empty_ones() {
        let docs = parse_documents("a: 1\n---\n---\nb: 2\n", &Limits::FILES).unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1].lines.line_of("b"), Some(4));
    }

    #[test]
    fn enforces_depth_budget() {
        let deep = "[".repeat(100) + &"]".repeat(100);
        assert!(parse_documents(&deep, &Limits::FILES).is_err());
        // Just inside the budget parses without exhausting a test thread's stack.
        let ok = "[".repeat(40) + &"]".repeat(40);
        assert!(parse_documents(&ok, &Limits::FILES).is_ok());
        let block: String = (0..40)
            .map(|i| format!("{}k{i}:\n", "  ".repeat(i)))
            .collect();
        assert!(parse_documents(&block, &Limits::FILES).is_ok());
    }

    #[test]
    fn enforces_size_budget() {
        let limits = Limits {
            max_bytes: 10,
            ..Limits::FILES
        };
        let err = parse_documents("a: 12345678901234567890", &limits).unwrap_err();
        assert!(err.message.contains("limit"), "{err}");
    }

    #[test]
    fn reports_syntax_error_line() {
        let err = parse_documents("a: 1\nb: [unclosed\nc: 2\n", &Limits::FILES).unwrap_err();
        assert!(err.line.is_some(), "{err}");
    }
}
