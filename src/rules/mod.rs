//! The rule format: its serde model, loading from directories, validation
//! with file:line diagnostics, and compilation into a [`RuleSet`].
//!
//! ```text
//!  dirs ──read_documents──▶ YAML docs (+ line index)
//!        ──compile (per doc)──▶ CompiledRule  (templates, expressions, JSONPaths, schema)
//!        ──set checks (names unique)──▶ RuleSet  or  every Diagnostic at once
//! ```
//!
//! A set with any error is rejected whole; warnings ride along with a good set.

mod compile;
pub mod load;
pub mod model;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use compile::{
    CompiledChild, CompiledCondition, CompiledField, CompiledRule, FieldSource, context_names,
};

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
        let mut diags = Vec::new();
        let docs = load::read_documents(dirs, &mut diags);
        let mut rules: Vec<CompiledRule> = docs
            .into_iter()
            .filter_map(|doc| compile::compile(doc, limits, &mut diags))
            .collect();
        check_unique_names(&rules, &mut diags);
        rules.sort_by(|a, b| a.name.cmp(&b.name));
        diags.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
        if diags.iter().any(|d| d.severity == Severity::Error) {
            return Err(diags);
        }
        Ok(RuleSet {
            rules: rules.into_iter().map(Arc::new).collect(),
            warnings: diags,
        })
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

fn check_unique_names(rules: &[CompiledRule], diags: &mut Vec<Diagnostic>) {
    let mut seen: BTreeMap<&str, &CompiledRule> = BTreeMap::new();
    for rule in rules {
        if let Some(first) = seen.get(rule.name.as_str()) {
            diags.push(Diagnostic::error(
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
            ));
        } else {
            seen.insert(&rule.name, rule);
        }
    }
}

/// Convenience for tests and tools: load a single directory.
pub fn load_dir(dir: &Path) -> Result<RuleSet, Vec<Diagnostic>> {
    RuleSet::load(&[dir.to_path_buf()], Limits::default())
}

/// Helpers for the crate's unit tests: rules from text.
#[cfg(test)]
pub(crate) mod testing {
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
mod tests_check;
