//! `trellis check` and `trellis lsp`: read the inputs, print or publish the
//! diagnostics [`crate::offline::check`] finds.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::{load_crds, report};
use crate::manifests::{read_objects, read_objects_under};
use crate::offline::check::{Inputs, diagnostics};
use crate::render::Limits;
use crate::rules::Severity;
use crate::yaml;

/// The files `trellis check` reads besides the rules.
pub struct CheckInputs<'a> {
    /// `--crds`.
    pub crds: Option<&'a Path>,
    /// `--observed`.
    pub observed: Option<&'a Path>,
    /// `--parents`.
    pub parents: Option<&'a Path>,
}

/// `trellis check`: exit 1 when anything is an error.
pub fn check(
    dirs: &[PathBuf],
    limits: Limits,
    paths: CheckInputs<'_>,
    strict: bool,
    tests: &[PathBuf],
) -> ExitCode {
    let crds = match load_crds(paths.crds) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let observed = match paths
        .observed
        .map(|p| read_objects(p, &yaml::Limits::FILES))
    {
        None => Vec::new(),
        Some(Ok(objects)) => objects,
        Some(Err(e)) => {
            stderr!("error: --observed: {e}");
            return ExitCode::from(1);
        }
    };
    let parents = match paths
        .parents
        .map(|p| read_objects_under(p, &yaml::Limits::FILES))
    {
        None => Vec::new(),
        Some(Ok(objects)) => objects
            .into_iter()
            .map(|(file, object)| (file.display().to_string(), object))
            .collect(),
        Some(Err(e)) => {
            stderr!("error: --parents: {e}");
            return ExitCode::from(1);
        }
    };
    let inputs = Inputs {
        crds,
        observed,
        parents,
        strict,
    };
    let mut checked = diagnostics(dirs, limits, &crate::rules::load::disk(), &inputs);
    if !tests.is_empty() {
        checked
            .diagnostics
            .extend(test_diagnostics(dirs, limits, tests, strict));
    }
    let count = |s: Severity| {
        checked
            .diagnostics
            .iter()
            .filter(|d| d.severity == s)
            .count()
    };
    if report(&checked.diagnostics) {
        stderr!(
            "{} error(s); the rule set is rejected",
            count(Severity::Error)
        );
        return ExitCode::from(1);
    }
    let warnings = count(Severity::Warning);
    stderr!(
        "{} rule(s) OK{}",
        checked.rules,
        if warnings > 0 {
            format!(", {warnings} warning(s)")
        } else {
            String::new()
        }
    );
    ExitCode::SUCCESS
}

/// What is wrong with the test files under `tests`, as `trellis test`
/// would refuse them; nothing when the rules themselves do not load (their
/// errors are reported already, and tests of rules that do not compile
/// cannot be judged).
fn test_diagnostics(
    dirs: &[PathBuf],
    limits: Limits,
    tests: &[PathBuf],
    strict: bool,
) -> Vec<crate::rules::Diagnostic> {
    let Ok(set) = crate::rules::RuleSet::load(dirs, limits) else {
        return Vec::new();
    };
    let (_, mut diags) = crate::offline::ruletest::load_suites(tests, &set);
    if strict {
        for d in &mut diags {
            d.severity = Severity::Error;
        }
    }
    diags
}

/// `trellis lsp`.
pub fn lsp(crds_path: Option<&Path>, strict: bool) -> ExitCode {
    let crds = match load_crds(crds_path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    crate::lsp::run(Inputs {
        crds,
        strict,
        ..Inputs::default()
    })
}
