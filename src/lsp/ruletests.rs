//! Rule tests in the editor: every `*.test.yaml` in the workspace (or open)
//! is read against the rule set it tests and run, as `trellis test` runs
//! it; a wrong test file shows its errors where they are, a failing case an
//! error on its `name` line listing each mismatch. They run again whenever
//! a rule or a test changes: a rule edit that breaks a case shows at once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::offline::ruletest::{self, discover};
use crate::render::Limits;
use crate::rules::{Diagnostic, Loaded, RuleSet};

use super::workspace::{Workspace, canonical};

/// Whether `path` names a rule test file.
pub fn is_test_file(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n.to_string_lossy().ends_with(discover::SUFFIX))
}

impl Workspace {
    /// Each known test file's diagnostics (an empty list: all is well).
    pub fn check_tests(&self) -> BTreeMap<PathBuf, Vec<Diagnostic>> {
        if self.tests.is_empty() {
            // No rule set to compile a second time for nothing.
            return BTreeMap::new();
        }
        let read = self.reader();
        // Rules that compile, even while another rule of the set is broken:
        // its tests still run in the editor.
        let sets: Vec<(PathBuf, RuleSet)> = self
            .dirs
            .iter()
            .map(|dir| {
                let loaded = Loaded::read_with(std::slice::from_ref(dir), Limits::default(), &read);
                let rules = loaded.docs.iter().filter_map(|d| d.rule.clone()).collect();
                (
                    dir.clone(),
                    RuleSet {
                        rules,
                        warnings: Vec::new(),
                    },
                )
            })
            .collect();
        let mut out = BTreeMap::new();
        for file in &self.tests {
            let Some(text) = self.text(file) else {
                continue;
            };
            let set = set_for(file, &text, &sets);
            let (suites, mut diags) = ruletest::load_text(file, &text, set);
            for suite in ruletest::run_suites(&suites).suites {
                for case in suite.cases.iter().filter(|c| !c.passed()) {
                    let mismatches: Vec<String> =
                        case.mismatches.iter().map(ToString::to_string).collect();
                    diags.push(Diagnostic::error(
                        file,
                        case.line,
                        "",
                        format!("rule test `{}` fails: {}", case.name, mismatches.join("; ")),
                    ));
                }
            }
            out.insert(canonical(file), diags);
        }
        out
    }
}

/// The rule set a test file tests: that of the rules directory whose
/// default test directory (`DIR/../tests`) holds the file, else the
/// nearest one holding the rule it names, else the nearest one.
fn set_for<'s>(file: &Path, text: &str, sets: &'s [(PathBuf, RuleSet)]) -> &'s RuleSet {
    static EMPTY: RuleSet = RuleSet {
        rules: Vec::new(),
        warnings: Vec::new(),
    };
    let rule = crate::yaml::parse_documents(text, &crate::yaml::Limits::FILES)
        .ok()
        .and_then(|docs| {
            docs.iter()
                .find_map(|d| d.value.pointer("/spec/rule")?.as_str().map(str::to_owned))
        });
    let mut ranked: Vec<&(PathBuf, RuleSet)> = sets.iter().collect();
    ranked.sort_by_key(|(dir, _)| {
        let beside = file.starts_with(canonical(&discover::default_dir(dir)));
        let shared = file
            .components()
            .zip(canonical(dir).components())
            .take_while(|(a, b)| a == b)
            .count();
        (!beside, std::cmp::Reverse(shared))
    });
    ranked
        .iter()
        .find(|(_, set)| {
            rule.as_deref()
                .is_some_and(|name| set.rules.iter().any(|r| r.name == name))
        })
        .or(ranked.first())
        .map_or(&EMPTY, |(_, set)| set)
}
