//! The rule format: its serde model, loading from directories, validation
//! with file:line diagnostics, and compilation into a [`RuleSet`].
//!
//! ```text
//!  dirs ──read_documents──▶ YAML docs (+ line index)
//!        ──compile (per doc)──▶ CompiledRule  (templates, expressions, JSONPaths, schema)
//!        ──set checks (names unique)──▶ RuleSet  or  every Diagnostic at once
//! ```
//!
//! `check` and the initial load reject a set with any error whole; warnings
//! ride along with a good set. [`Loaded`] keeps each diagnostic tied to the
//! rules it concerns, so a reload can keep what validates.

mod compile;
pub mod crd;
pub mod load;
pub mod model;
pub(crate) mod names;
pub mod revision;
pub mod rollout;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use compile::{
    CompiledChild, CompiledCondition, CompiledField, CompiledForEach, CompiledRelated,
    CompiledRequirement, CompiledRule, CompiledSelector, CompiledVar, FieldSource, Known,
    MAX_FOR_EACH_NAMES, MAX_PROPAGATE_KEYS, PerItem, Templated, VarReads, VarSource, code_line,
    context_names, scope,
};

pub(crate) use names::is_condition_type;

use crate::kinds::Gvk;
use crate::render::Limits;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Warning,
    Error,
}

/// One finding about a rule file: where, which field, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub file: PathBuf,
    pub line: Option<u64>,
    /// Dotted path of the field, e.g. `spec.children[1].dependsOn[0]`.
    pub field: String,
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        write!(f, ": {level}: ")?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        write!(f, "{}", self.message)
    }
}

/// A validated, compiled set of rules, ready to render. Cheap to share.
#[derive(Debug, Clone, Default)]
pub struct RuleSet {
    pub rules: Vec<Arc<CompiledRule>>,
    /// Warnings found while loading; the set is still good.
    pub warnings: Vec<Diagnostic>,
}

impl RuleSet {
    /// Loads, validates and compiles every rule under `dirs`. On any error the
    /// whole set is rejected with every diagnostic found (warnings included).
    pub fn load(dirs: &[PathBuf], limits: Limits) -> Result<RuleSet, Vec<Diagnostic>> {
        Loaded::read(dirs, limits).into_set()
    }

    pub fn get(&self, name: &str) -> Option<&Arc<CompiledRule>> {
        self.rules.iter().find(|r| r.name == name)
    }

    /// Rules whose parent kind is `gvk`.
    pub fn for_parent<'a>(&'a self, gvk: &Gvk) -> impl Iterator<Item = &'a Arc<CompiledRule>> {
        let gvk = gvk.clone();
        self.rules.iter().filter(move |r| r.parent == gvk)
    }
}

/// Every rule document under the rules directories, each compiled on its
/// own, with each diagnostic tied to what it concerns: one document, a
/// whole file or directory (unreadable, not YAML), or several rules (one
/// name used twice). [`RuleSet::load`] takes it whole or not at all; a
/// reload keeps what validates (`reload::partition`).
#[derive(Debug, Default)]
pub struct Loaded {
    pub docs: Vec<LoadedDoc>,
    /// Problems with a file or directory as a whole; `file` names it.
    pub files: Vec<Diagnostic>,
    /// Problems between documents, with the rule names they concern.
    pub set: Vec<(BTreeSet<String>, Diagnostic)>,
}

/// One rule document and what compiling it found.
#[derive(Debug)]
pub struct LoadedDoc {
    pub file: PathBuf,
    /// `metadata.name` as written, when it is a string (also for a broken rule).
    pub name: Option<String>,
    /// `None` when the document has errors.
    pub rule: Option<Arc<CompiledRule>>,
    /// Errors and warnings found in this document.
    pub diags: Vec<Diagnostic>,
}

impl LoadedDoc {
    pub fn has_errors(&self) -> bool {
        self.rule.is_none() || self.diags.iter().any(|d| d.severity == Severity::Error)
    }
}

impl Loaded {
    /// Reads, validates and compiles every document under `dirs`.
    pub fn read(dirs: &[PathBuf], limits: Limits) -> Loaded {
        Loaded::read_with(dirs, limits, &load::disk())
    }

    /// [`Loaded::read`], with the files' text from `read` (an editor's
    /// unsaved buffers).
    pub fn read_with(dirs: &[PathBuf], limits: Limits, read: &load::Read) -> Loaded {
        let mut files = Vec::new();
        let raw = load::read_documents(dirs, &mut files, read);
        let docs: Vec<LoadedDoc> = raw
            .into_iter()
            .map(|doc| {
                let file = doc.file.clone();
                let name = doc
                    .value
                    .pointer("/metadata/name")
                    .and_then(serde_json::Value::as_str)
                    .map(str::to_owned);
                let mut diags = Vec::new();
                let rule = compile::compile(doc, limits, &mut diags).map(Arc::new);
                let rule = rule.filter(|_| !diags.iter().any(|d| d.severity == Severity::Error));
                LoadedDoc {
                    file,
                    name,
                    rule,
                    diags,
                }
            })
            .collect();
        let set = unique_names(&docs);
        Loaded { docs, files, set }
    }

    /// Every diagnostic, sorted by file and line (what `check` prints).
    /// `trellis run --require-service-account`: a rule without
    /// `serviceAccountName` becomes a broken rule (an error of its own
    /// document), so it is rejected like one while the others run.
    pub fn require_service_account(&mut self) {
        for doc in &mut self.docs {
            let Some(rule) = &doc.rule else {
                continue;
            };
            if rule.rule.spec.service_account_name.is_none() {
                doc.diags.push(Diagnostic {
                    severity: Severity::Error,
                    file: doc.file.clone(),
                    line: None,
                    field: "spec.serviceAccountName".into(),
                    message: format!(
                        "rule `{}` names no ServiceAccount, and trellis runs with --require-service-account",
                        rule.name
                    ),
                });
            }
        }
    }

    pub fn diagnostics(&self) -> Vec<Diagnostic> {
        let mut all: Vec<Diagnostic> = self.files.clone();
        all.extend(self.docs.iter().flat_map(|d| d.diags.iter().cloned()));
        all.extend(self.set.iter().map(|(_, d)| d.clone()));
        all.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
        all
    }

    /// The whole set, or every diagnostic when any is an error.
    pub fn into_set(self) -> Result<RuleSet, Vec<Diagnostic>> {
        let diags = self.diagnostics();
        if diags.iter().any(|d| d.severity == Severity::Error) {
            return Err(diags);
        }
        let mut rules: Vec<Arc<CompiledRule>> =
            self.docs.into_iter().filter_map(|d| d.rule).collect();
        rules.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(RuleSet {
            rules,
            warnings: diags,
        })
    }
}

/// One error per compiled rule whose name an earlier one already used; it
/// concerns every document of that name.
fn unique_names(docs: &[LoadedDoc]) -> Vec<(BTreeSet<String>, Diagnostic)> {
    let mut out = Vec::new();
    let mut seen: BTreeMap<&str, &CompiledRule> = BTreeMap::new();
    for rule in docs.iter().filter_map(|d| d.rule.as_deref()) {
        if let Some(first) = seen.get(rule.name.as_str()) {
            let diag = Diagnostic::error(
                &rule.file,
                rule.lines.line_of("metadata.name"),
                "metadata.name",
                format!(
                    "rule name `{}` is already used in {}{}",
                    rule.name,
                    first.file.display(),
                    first
                        .lines
                        .line_of("metadata.name")
                        .map(|l| format!(":{l}"))
                        .unwrap_or_default()
                ),
            );
            out.push((BTreeSet::from([rule.name.clone()]), diag));
        } else {
            seen.insert(&rule.name, rule);
        }
    }
    out
}

/// Compiles a version kept as data (a revision ConfigMap: the document and
/// its template files) as [`Loaded::read`] would have compiled it from
/// disk; `origin` names where it came from in diagnostics. Its revision is
/// computed again from the data, so the caller can check it.
pub fn rebuild(
    document: serde_json::Value,
    template_files: BTreeMap<String, String>,
    origin: &Path,
    limits: Limits,
) -> Result<CompiledRule, Vec<Diagnostic>> {
    let raw = load::RawDocument {
        file: origin.to_path_buf(),
        root: origin.to_path_buf(),
        value: document,
        lines: crate::yaml::LineIndex::default(),
        source: Arc::from(""),
        files: Some(template_files),
        read: load::disk(),
    };
    let mut diags = Vec::new();
    match compile::compile(raw, limits, &mut diags) {
        Some(rule) if !diags.iter().any(|d| d.severity == Severity::Error) => Ok(rule),
        _ => Err(diags),
    }
}

/// Convenience for tests and tools: load a single directory.
pub fn load_dir(dir: &Path) -> Result<RuleSet, Vec<Diagnostic>> {
    RuleSet::load(&[dir.to_path_buf()], Limits::default())
}

/// Helpers for unit tests, here and in the binary crate (feature
/// `testing`): rules from text.
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    use std::sync::Arc;

    use super::{CompiledRule, RuleSet, load_dir};

    /// Loads rule files given as (file name, text); panics with every diagnostic.
    pub fn load_texts(files: &[(&str, &str)]) -> RuleSet {
        let dir = tempfile::tempdir().expect("temp dir");
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).expect("write rule file");
        }
        load_dir(dir.path()).unwrap_or_else(|diags| {
            let lines: Vec<String> = diags.iter().map(|d| d.to_string()).collect();
            panic!("rule set rejected:\n{}", lines.join("\n"))
        })
    }

    /// The rule `app` with the given `spec:` body (indented two spaces).
    pub fn rule_with_spec(spec: &str) -> Arc<CompiledRule> {
        let text = format!(
            "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: app\nspec:\n{spec}"
        );
        load_texts(&[("rule.yaml", &text)]).rules[0].clone()
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_budget;
#[cfg(test)]
mod tests_check;
#[cfg(test)]
mod tests_patches;
#[cfg(test)]
mod tests_sharing;
