//! Rule tests (`trellis test`): `RuleTest` files, each naming a rule and
//! cases — a parent, the objects the pass observes, and what the pass must
//! produce — run through the very pass `trellis render` prints
//! ([`super::render::pass`]), never a second planner.
//!
//! ```text
//!  *.test.yaml ──file::load──▶ Suite (rule, cases)   or  Diagnostics (file:line)
//!       │
//!       ▼ per case
//!  render::pass(rule, parent, observed) ──▶ Plan ──matcher──▶ Mismatches
//!       │
//!       ▼
//!  Report ──▶ text lines, JSON, JUnit XML
//! ```
//!
//! This module owns the file format, the matching and the report; finding
//! files on disk and printing is the CLI's (`trellis test`), publishing
//! the LSP's. Nothing here talks to a cluster.

pub mod discover;
mod expect;
pub mod file;
pub mod matcher;
pub mod report;
pub mod run;

pub use file::{Case, Expect, Suite, load_file, load_text};
pub use matcher::Mismatch;
pub use report::{CaseResult, Report, SuiteResult};
pub use run::{NOW, run_case, run_suites};

use std::path::PathBuf;

use crate::rules::{Diagnostic, RuleSet};

/// The suites of every test file under `paths` ([`discover::test_files`]),
/// checked against `set`, or every problem found in them (then no suite:
/// a run with a wrong test file runs nothing).
pub fn load_suites(paths: &[PathBuf], set: &RuleSet) -> (Vec<Suite>, Vec<Diagnostic>) {
    let files = match discover::test_files(paths) {
        Ok(files) => files,
        Err(diag) => return (Vec::new(), vec![diag]),
    };
    if files.is_empty() {
        let searched: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        let first = paths.first().cloned().unwrap_or_default();
        return (
            Vec::new(),
            vec![Diagnostic::error(
                &first,
                None,
                "",
                format!(
                    "no test files (*{}) under {}",
                    discover::SUFFIX,
                    searched.join(", ")
                ),
            )],
        );
    }
    let mut suites = Vec::new();
    let mut diags = Vec::new();
    for file in files {
        let (s, d) = load_file(&file, set);
        suites.extend(s);
        diags.extend(d);
    }
    if !diags.is_empty() {
        suites.clear();
    }
    (suites, diags)
}

#[cfg(test)]
mod tests;
