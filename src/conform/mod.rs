//! Whether the children a rule renders fit their kinds' schemas: what
//! `check` adds to the rule-file checks, without a cluster.
//!
//! ```text
//!  rule ─▶ sample parent (schema + defaults, or one from --observed)
//!       ─▶ every child and patch rendered once (plan::sample; includeWhen obeyed)
//!       ─▶ each object against its kind's OpenAPI schema:
//!            built-in kinds: the bundled Kubernetes 1.35 definitions (builtin)
//!            custom kinds:   --crds, else the CRDs the rules' `crd:` blocks generate
//!       ─▶ unknown fields, wrong types ─▶ warnings on the template's line
//! ```
//!
//! What one sample cannot show is not reported: a child whose
//! `includeWhen` is false for it, a template branch it does not take, a
//! template that fails to render for it (it reads a child or related object
//! the sample lacks), a kind with no known schema. `docs/rules.md` says so
//! to rule authors.

pub mod builtin;
mod lines;
mod sample;
mod validate;

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::crd::offline::OfflineCrds;
use crate::kinds::Gvk;
use crate::plan::sample::{Sampled, render_children};
use crate::plan::{Input, Observed};
use crate::rules::{CompiledChild, CompiledRule, Diagnostic, code_line};
pub use validate::{Finding, closest, validate};

/// What the check knows besides the rule.
pub struct Context<'a> {
    /// `--crds`: custom kinds' schemas, and the parent kind's scope.
    pub crds: Option<&'a OfflineCrds>,
    /// The CRDs the rule set's `crd:` blocks generate: the schemas of
    /// custom kinds that `--crds` does not give.
    pub generated: &'a OfflineCrds,
    /// Parents given by the user (`--observed`): one of the rule's parent
    /// kind is used instead of a sample.
    pub parents: &'a [Value],
    /// Live children and related objects (`--observed`), labelled for each
    /// parent as `render` labels them.
    pub observed: &'a [Value],
    /// The text of a rule file, to place a finding in an inline template
    /// on its own line (the editor's unsaved text, or the file's).
    pub source: &'a dyn Fn(&Path) -> Option<String>,
}

/// The timestamp the sample pass uses (conditions are not looked at).
const NOW: &str = "1970-01-01T00:00:00Z";

/// Warnings about the children `rule` renders for a sample parent.
pub fn check_rule(rule: &CompiledRule, cx: &Context) -> Vec<Diagnostic> {
    let given = cx.parents.iter().find(|p| {
        Gvk::new(
            p.get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or_default(),
            p.get("kind").and_then(Value::as_str).unwrap_or_default(),
        ) == rule.parent
    });
    let candidates: Vec<Value> = match given {
        Some(parent) => vec![parent.clone()],
        None => {
            // What the CRD or the rule says, else the built-in table (which
            // takes a kind it does not know as namespaced, as most are).
            let declared = cx
                .crds
                .and_then(|c| c.find(&rule.parent))
                .map(|(crd, _)| crate::crd::offline::scope_of(crd))
                .or(rule.rule.spec.parent.scope)
                .or_else(|| {
                    rule.rule
                        .spec
                        .crd
                        .as_ref()
                        .map(|_| crate::crd::scope(&rule.rule))
                });
            let scope = declared.unwrap_or_else(|| crate::kinds::scope(&rule.parent));
            sample::parents(rule, scope)
        }
    };
    let mut refusals = Vec::new();
    let mut rendered = None;
    for parent in &candidates {
        let hint = crate::crd::offline::parent_scope(rule, parent, cx.crds);
        let scope_of = crate::cli::offline_scope_with(rule, hint);
        let observed = if cx.observed.is_empty() {
            Observed::from_objects(Vec::new())
        } else {
            crate::cli::label_observed(rule, parent, cx.observed.to_vec(), NOW, &scope_of)
        };
        let input = Input {
            parent,
            observed: &observed,
            now: NOW,
            scope_of: &scope_of,
        };
        match render_children(rule, &input) {
            Ok(children) => {
                rendered = Some(children);
                break;
            }
            Err(errors) => refusals = errors,
        }
    }
    let Some(sample) = rendered else {
        let why = if given.is_some() {
            "the parent given with --observed is refused".to_owned()
        } else {
            "the sample parent built from `schema` and `defaults` is refused; give one with \
             --observed"
                .to_owned()
        };
        return vec![Diagnostic::warning(
            &rule.file,
            rule.lines.line_of("spec.schema"),
            "spec.schema",
            format!(
                "children not checked against their kinds' schemas: {why}: {}",
                refusals.join("; ")
            ),
        )];
    };
    let mut out = Vec::new();
    for (i, sampled) in &sample.children {
        if let Sampled::Failed(why) = sampled
            && SHAPE_ERRORS.iter().any(|e| why.contains(e))
        {
            out.push(unrenderable(rule, *i, why, cx));
        }
    }
    let rendered = sample
        .children
        .into_iter()
        .filter_map(|(i, sampled)| match sampled {
            Sampled::Rendered(objects) => Some((Entry::Child(i), objects)),
            _ => None,
        });
    let patches = sample
        .patches
        .into_iter()
        .map(|(i, bodies)| (Entry::Patch(i), bodies));
    for (entry, objects) in rendered.chain(patches) {
        let compiled = entry.compiled(rule);
        let Some((root, crd)) = schema_for(&compiled.gvk, cx) else {
            continue;
        };
        let mut seen = std::collections::BTreeSet::new();
        for object in &objects {
            for finding in validate(object, &root, builtin::definitions(), crd) {
                if seen.insert((finding.path.clone(), finding.message.clone())) {
                    out.push(diagnostic(rule, entry, &finding, cx));
                }
            }
        }
    }
    out
}

/// A child or a patch, by its index.
#[derive(Debug, Clone, Copy)]
enum Entry {
    Child(usize),
    Patch(usize),
}

impl Entry {
    fn compiled(self, rule: &CompiledRule) -> &CompiledChild {
        match self {
            Entry::Child(i) => &rule.children[i],
            Entry::Patch(i) => &rule.patches[i],
        }
    }

    /// `children[1]`, `patches[0]`: also the field under `spec`.
    fn at(self) -> String {
        match self {
            Entry::Child(i) => format!("children[{i}]"),
            Entry::Patch(i) => format!("patches[{i}]"),
        }
    }
}

/// Render failures that say the template's YAML is broken or has the
/// wrong shape (`metadat:` for `metadata:`): values are printed as JSON,
/// so no sample value causes them, and they are worth a warning. Any other failure may come from the sample (a value it lacks,
/// a string a filter cannot decode) and is not reported.
const SHAPE_ERRORS: &[&str] = &[
    "rendered text is not valid YAML",
    "must render a YAML mapping",
    "metadata must be a mapping",
    "metadata.name must be set",
];

/// A child whose rendered YAML cannot be an object, on its template's
/// first line.
fn unrenderable(rule: &CompiledRule, i: usize, why: &str, cx: &Context) -> Diagnostic {
    let finding = Finding {
        path: String::new(),
        keys: Vec::new(),
        message: String::new(),
    };
    let mut d = diagnostic(rule, Entry::Child(i), &finding, cx);
    d.message = format!("cannot be applied as it renders for the sample parent: {why}");
    d
}

/// The schema of a child's kind, and whether it is a CRD's.
fn schema_for(gvk: &Gvk, cx: &Context) -> Option<(Value, bool)> {
    if gvk.is_builtin() {
        return builtin::schema_of(gvk).map(|s| (s, false));
    }
    let (_, version) = cx
        .crds
        .and_then(|c| c.find(gvk))
        .or_else(|| cx.generated.find(gvk))?;
    let schema = version.pointer("/schema/openAPIV3Schema")?;
    Some((schema.clone(), true))
}

/// A finding as a warning on the template line that writes the field, else
/// on the template's first line.
fn diagnostic(rule: &CompiledRule, entry: Entry, finding: &Finding, cx: &Context) -> Diagnostic {
    let child = entry.compiled(rule);
    let template = rule
        .templates
        .get(&child.spec.id)
        .map(String::as_str)
        .unwrap_or_default();
    let n = lines::line_of(template, &finding.keys).unwrap_or(1);
    let field = format!("{} ({}) {}", entry.at(), child.spec.id, child.gvk.kind);
    let message = format!("{}: {}", finding.path, finding.message);
    let (file, line) = match &child.spec.template_file {
        Some(rel) => (template_path(&rule.file, rel), u64::try_from(n).ok()),
        None => {
            let at = format!("spec.{}.template", entry.at());
            let line = (cx.source)(&rule.file)
                .and_then(|text| code_line(&rule.lines, &text, &at, template, n))
                .or_else(|| rule.lines.line_of(&at));
            (rule.file.clone(), line)
        }
    };
    Diagnostic::warning(&file, line, &field, message)
}

/// A `templateFile`, as the loader found it: beside the rule file.
fn template_path(rule_file: &Path, rel: &str) -> PathBuf {
    rule_file
        .parent()
        .unwrap_or_else(|| Path::new(""))
        .join(rel)
}

#[cfg(test)]
mod tests;
