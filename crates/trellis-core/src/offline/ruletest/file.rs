//! A `RuleTest` file read and checked against the rule set: every problem
//! (bad YAML, an unknown rule, child id or field, a parent of another kind)
//! is a [`Diagnostic`] naming the file, line and field, as the rule loader's
//! are. A file with any such error yields no suite: a wrong test must not
//! pass for a right one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::kinds::Gvk;
use crate::manifests::read_objects;
use crate::rules::{CompiledRule, Diagnostic, RuleSet};
use crate::yaml::{self, LineIndex};

pub const API_VERSION: &str = "trellis.dev/v1alpha1";
pub const KIND: &str = "RuleTest";

/// The cases of one `RuleTest` document, for one rule.
#[derive(Debug, Clone)]
pub struct Suite {
    pub file: PathBuf,
    /// `metadata.name`, else the file's name.
    pub name: String,
    pub rule: Arc<CompiledRule>,
    pub cases: Vec<Case>,
}

/// One case: a parent, what the pass observes, and what it must produce.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    /// The line of the case's `name`, where a failure is shown in an editor.
    pub line: Option<u64>,
    pub parent: Value,
    pub observed: Vec<Value>,
    pub expect: Expect,
}

/// What a case expects; what is not given is not checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Expect {
    /// Child (or patch) id → a subset of its object; a forEach child's is a
    /// list of subsets, in item order.
    pub children: BTreeMap<String, Value>,
    /// Ids without an object in this pass.
    pub absent: Vec<String>,
    /// Id → a substring of its pending reason.
    pub pending: BTreeMap<String, String>,
    /// A subset of the parent's new `.status`.
    pub status: Option<Value>,
    /// Condition type → `Status` or `Status/Reason`.
    pub conditions: BTreeMap<String, String>,
    /// Substrings, one per error of the pass; `Some([])`: no error.
    pub errors: Option<Vec<String>>,
}

/// Reads `path` and checks it against `set`.
pub fn load_file(path: &Path, set: &RuleSet) -> (Vec<Suite>, Vec<Diagnostic>) {
    match std::fs::read_to_string(path) {
        Ok(text) => load_text(path, &text, set),
        Err(e) => (
            Vec::new(),
            vec![Diagnostic::error(
                path,
                None,
                "",
                format!("cannot read: {e}"),
            )],
        ),
    }
}

/// The suites of a test file's `text` (read from `path`, which `parentFile`
/// and `observedFile` are relative to), or what is wrong with it.
pub fn load_text(path: &Path, text: &str, set: &RuleSet) -> (Vec<Suite>, Vec<Diagnostic>) {
    let docs = match yaml::parse_documents(text, &yaml::Limits::FILES) {
        Ok(docs) => docs,
        Err(e) => {
            return (
                Vec::new(),
                vec![Diagnostic::error(path, e.line, "", e.message)],
            );
        }
    };
    let mut suites = Vec::new();
    let mut diags = Vec::new();
    if docs.is_empty() {
        diags.push(Diagnostic::error(
            path,
            None,
            "",
            "no RuleTest document in a test file",
        ));
    }
    for doc in docs {
        let mut reader = Reader {
            file: path,
            lines: &doc.lines,
            diags: Vec::new(),
        };
        let suite = reader.suite(&doc.value, set);
        if reader.diags.is_empty()
            && let Some(suite) = suite
        {
            suites.push(suite);
        }
        diags.extend(reader.diags);
    }
    if !diags.is_empty() {
        suites.clear();
    }
    (suites, diags)
}

/// Reads one document, collecting every problem rather than the first.
pub(super) struct Reader<'a> {
    pub(super) file: &'a Path,
    pub(super) lines: &'a LineIndex,
    pub(super) diags: Vec<Diagnostic>,
}

const SPEC_KEYS: &[&str] = &["rule", "cases"];
const CASE_KEYS: &[&str] = &[
    "name",
    "parent",
    "parentFile",
    "observed",
    "observedFile",
    "expect",
];
pub(super) const EXPECT_KEYS: &[&str] = &[
    "children",
    "absent",
    "pending",
    "status",
    "conditions",
    "errors",
];

impl Reader<'_> {
    pub(super) fn error(&mut self, field: &str, message: impl Into<String>) {
        let line = self.lines.line_of(field);
        self.diags
            .push(Diagnostic::error(self.file, line, field, message));
    }

    /// The object at `field`, or an error.
    pub(super) fn object<'v>(
        &mut self,
        value: &'v Value,
        field: &str,
    ) -> Option<&'v serde_json::Map<String, Value>> {
        let object = value.as_object();
        if object.is_none() {
            self.error(
                field,
                format!("must be a mapping, not {}", type_name(value)),
            );
        }
        object
    }

    pub(super) fn string(&mut self, value: &Value, field: &str) -> Option<String> {
        match value {
            Value::String(s) => Some(s.clone()),
            other => {
                self.error(field, format!("must be a string, not {}", type_name(other)));
                None
            }
        }
    }

    /// Unknown keys are errors: a misspelt `expect` key would check nothing.
    pub(super) fn known_keys(
        &mut self,
        object: &serde_json::Map<String, Value>,
        at: &str,
        keys: &[&str],
    ) {
        for key in object.keys().filter(|k| !keys.contains(&k.as_str())) {
            self.error(
                &join(at, key),
                format!(
                    "unknown field `{key}` (expected one of: {})",
                    keys.join(", ")
                ),
            );
        }
    }

    fn suite(&mut self, doc: &Value, set: &RuleSet) -> Option<Suite> {
        let root = self.object(doc, "")?;
        let api_version = root.get("apiVersion").and_then(Value::as_str);
        let kind = root.get("kind").and_then(Value::as_str);
        if (api_version, kind) != (Some(API_VERSION), Some(KIND)) {
            let hint = if kind == Some("Rule") {
                " (a Rule belongs in the rules directory, never in a test file)"
            } else {
                ""
            };
            self.error(
                "kind",
                format!(
                    "a test file holds `apiVersion: {API_VERSION}`, `kind: {KIND}` documents, \
                     not {}/{}{hint}",
                    api_version.unwrap_or("?"),
                    kind.unwrap_or("?")
                ),
            );
            return None;
        }
        let name = match root.get("metadata").and_then(|m| m.get("name")) {
            Some(v) => self.string(v, "metadata.name")?,
            None => self
                .file
                .file_name()
                .map(|f| {
                    f.to_string_lossy()
                        .trim_end_matches(".test.yaml")
                        .to_owned()
                })
                .unwrap_or_default(),
        };
        let Some(spec) = root.get("spec") else {
            self.error("spec", "missing field `spec`");
            return None;
        };
        let spec = self.object(spec, "spec")?;
        self.known_keys(spec, "spec", SPEC_KEYS);
        let Some(rule_name) = spec.get("rule") else {
            self.error(
                "spec",
                "missing field `rule` (the rule under test, by name)",
            );
            return None;
        };
        let rule_name = self.string(rule_name, "spec.rule")?;
        let Some(rule) = set.rules.iter().find(|r| r.name == rule_name).cloned() else {
            let names: Vec<&str> = set.rules.iter().map(|r| r.name.as_str()).collect();
            self.error(
                "spec.rule",
                format!("unknown rule `{rule_name}` (rules: {})", names.join(", ")),
            );
            return None;
        };
        let cases = match spec.get("cases") {
            Some(Value::Array(cases)) if !cases.is_empty() => cases,
            Some(Value::Array(_)) | None => {
                self.error("spec.cases", "a RuleTest needs at least one case");
                return None;
            }
            Some(other) => {
                self.error(
                    "spec.cases",
                    format!("must be a list of cases, not {}", type_name(other)),
                );
                return None;
            }
        };
        let mut names = BTreeSet::new();
        let cases: Vec<Case> = cases
            .iter()
            .enumerate()
            .filter_map(|(i, case)| {
                let at = format!("spec.cases[{i}]");
                let case = self.case(case, &at, set, &rule)?;
                if !names.insert(case.name.clone()) {
                    self.error(
                        &format!("{at}.name"),
                        format!("case name `{}` is used twice in this file", case.name),
                    );
                }
                Some(case)
            })
            .collect();
        Some(Suite {
            file: self.file.to_owned(),
            name,
            rule,
            cases,
        })
    }

    fn case(
        &mut self,
        value: &Value,
        at: &str,
        set: &RuleSet,
        rule: &Arc<CompiledRule>,
    ) -> Option<Case> {
        let case = self.object(value, at)?;
        self.known_keys(case, at, CASE_KEYS);
        let name = match case.get("name") {
            Some(v) => self.string(v, &join(at, "name")),
            None => {
                self.error(at, "a case needs a `name`");
                None
            }
        };
        let parent = self.parent(case, at, set, rule);
        let observed = self.observed(case, at);
        let expect = match case.get("expect") {
            Some(v) => self.expect(v, &join(at, "expect"), rule),
            None => {
                self.error(at, "a case needs `expect` (what the pass must produce)");
                None
            }
        };
        Some(Case {
            line: self.lines.line_of(&join(at, "name")),
            name: name?,
            parent: parent?,
            observed: observed?,
            expect: expect?,
        })
    }

    fn parent(
        &mut self,
        case: &serde_json::Map<String, Value>,
        at: &str,
        set: &RuleSet,
        rule: &CompiledRule,
    ) -> Option<Value> {
        let (parent, field) = match (case.get("parent"), case.get("parentFile")) {
            (Some(_), Some(_)) => {
                self.error(at, "give `parent` or `parentFile`, not both");
                return None;
            }
            (None, None) => {
                self.error(at, "a case needs `parent` (inline) or `parentFile`");
                return None;
            }
            (Some(p), None) => (p.clone(), join(at, "parent")),
            (None, Some(f)) => {
                let field = join(at, "parentFile");
                let objects = self.objects_file(f, &field)?;
                let [parent] = <[Value; 1]>::try_from(objects)
                    .map_err(|o| {
                        self.error(
                            &field,
                            format!("expected exactly one parent object, found {}", o.len()),
                        )
                    })
                    .ok()?;
                (parent, field)
            }
        };
        self.object(&parent, &field)?;
        let gvk = Gvk::new(
            parent
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or_default(),
            parent
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or_default(),
        );
        if !set.for_parent(&gvk).any(|r| r.name == rule.name) {
            self.error(
                &field,
                format!(
                    "the parent is a {gvk}; rule `{}` takes parents of kind {}",
                    rule.name, rule.parent
                ),
            );
            return None;
        }
        Some(parent)
    }

    fn observed(&mut self, case: &serde_json::Map<String, Value>, at: &str) -> Option<Vec<Value>> {
        match (case.get("observed"), case.get("observedFile")) {
            (Some(_), Some(_)) => {
                self.error(at, "give `observed` or `observedFile`, not both");
                None
            }
            (None, None) => Some(Vec::new()),
            (None, Some(f)) => self.objects_file(f, &join(at, "observedFile")),
            (Some(Value::Array(items)), None) => {
                let field = join(at, "observed");
                let mut ok = true;
                for (i, item) in items.iter().enumerate() {
                    if !item.is_object() || crate::plan::ObjectKey::of(item).is_none() {
                        self.error(
                            &format!("{field}[{i}]"),
                            "an observed object needs apiVersion, kind and metadata.name",
                        );
                        ok = false;
                    }
                }
                ok.then(|| items.clone())
            }
            (Some(other), None) => {
                self.error(
                    &join(at, "observed"),
                    format!("must be a list of objects, not {}", type_name(other)),
                );
                None
            }
        }
    }

    /// The objects of a manifest file named relative to the test file.
    fn objects_file(&mut self, value: &Value, field: &str) -> Option<Vec<Value>> {
        let rel = self.string(value, field)?;
        let path = self.file.parent().unwrap_or(Path::new("")).join(&rel);
        match read_objects(&path, &yaml::Limits::OBSERVED) {
            Ok(objects) => Some(objects),
            Err(e) => {
                self.error(field, e.to_string());
                None
            }
        }
    }
}

pub(super) fn join(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_owned()
    } else {
        format!("{at}.{key}")
    }
}

pub(super) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}
