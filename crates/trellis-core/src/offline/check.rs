//! The diagnostics of a rule set, as `trellis check` prints them and
//! `trellis lsp` publishes them: the rule files' own checks, the scope the
//! parent kinds' CRDs settle (`--crds`), status fields those CRDs would
//! drop, and whether the children fit their kinds' schemas
//! ([`crate::conform`]).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::conform;
use crate::crd::offline::OfflineCrds;
use crate::render::Limits;
use crate::rules::load::Read;
use crate::rules::{Diagnostic, Loaded, Severity};

/// What a check reads besides the rule files.
#[derive(Default)]
pub struct Inputs {
    /// `--crds`.
    pub crds: Option<OfflineCrds>,
    /// `--observed`: parents to render with instead of samples, and the
    /// children and related objects they see.
    pub observed: Vec<Value>,
    /// `--parents DIR`: stored parents (file, object), each round-tripped
    /// through every version of its kind's rule.
    pub parents: Vec<(String, Value)>,
    /// `--strict`: every warning is an error.
    pub strict: bool,
}

/// What checking a rule set found.
pub struct Checked {
    pub diagnostics: Vec<Diagnostic>,
    /// How many rules compiled.
    pub rules: usize,
}

/// Every diagnostic of the rule set under `dirs`, the files read through
/// `read`, sorted by file and line.
pub fn diagnostics(dirs: &[PathBuf], limits: Limits, read: &Read, inputs: &Inputs) -> Checked {
    let mut loaded = Loaded::read_with(dirs, limits, read);
    let mut extra = Vec::new();
    let rules: Vec<_> = loaded.docs.iter().filter_map(|d| d.rule.clone()).collect();
    // The parent kind's CRD settles the scope questions the rules leave open.
    if let Some(crds) = &inputs.crds {
        for rule in &rules {
            if let Some((crd, _)) = crds.find(&rule.parent) {
                let scope = crate::crd::offline::scope_of(crd);
                for doc in loaded.docs.iter_mut().filter(|d| d.file == rule.file) {
                    extra.extend(crate::rules::scope::settle(rule, scope, &mut doc.diags));
                }
            }
        }
    }
    let generated = OfflineCrds::generated(rules.iter().map(|r| r.as_ref()));
    let crds = inputs.crds.as_ref().unwrap_or(&generated);
    for rule in &rules {
        if let Some((crd, version)) = crds.find(&rule.parent) {
            extra.extend(crate::crd::offline::dropped_status_fields(
                rule, crd, version,
            ));
        }
    }
    let source = |path: &Path| read(path).ok();
    let cx = conform::Context {
        crds: inputs.crds.as_ref(),
        generated: &generated,
        parents: &inputs.observed,
        observed: &inputs.observed,
        source: &source,
    };
    for rule in &rules {
        extra.extend(conform::check_rule(rule, &cx));
        extra.extend(conform::reserved_labels(rule, &cx));
        extra.extend(super::hazards::required_related_through_vars(rule));
        extra.extend(conform::parent_findings(rule, &inputs.parents));
    }
    let mut all = loaded.diagnostics();
    all.extend(extra);
    all.extend(first_of_duplicates(&loaded));
    if inputs.strict {
        for d in &mut all {
            d.severity = Severity::Error;
        }
    }
    all.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    all.dedup();
    Checked {
        diagnostics: all,
        rules: rules.len(),
    }
}

/// A rule name used twice is an error on the later document; this is the
/// same error on the first, so each file shows it (an editor shows one
/// file at a time).
fn first_of_duplicates(loaded: &Loaded) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for (names, later) in &loaded.set {
        for doc in &loaded.docs {
            let Some(rule) = doc.rule.as_deref() else {
                continue;
            };
            let line = rule.lines.line_of("metadata.name");
            if !names.contains(&rule.name) || (rule.file == later.file && line == later.line) {
                continue;
            }
            let also = later.line.map(|l| format!(":{l}")).unwrap_or_default();
            let diag = Diagnostic::error(
                &rule.file,
                line,
                "metadata.name",
                format!(
                    "rule name `{}` is used again in {}{also}",
                    rule.name,
                    later.file.display()
                ),
            );
            // Three of a name: the first is named by each later one once.
            if !out.contains(&diag)
                && !loaded
                    .set
                    .iter()
                    .any(|(_, d)| d.file == rule.file && d.line == line)
            {
                out.push(diag);
            }
        }
    }
    out
}
