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
//!  rule with a schema ─▶ the same sample with every list empty
//!       ─▶ a child, patch or var that worked and now fails ─▶ a warning
//!       ─▶ each object against its kind's schema, as above
//! ```
//!
//! What one sample cannot show is not reported: a child whose
//! `includeWhen` is false for it, a template branch it does not take, a
//! template that fails to render for it (it reads a child or related object
//! the sample lacks), a kind with no known schema. The empty-list sample
//! differs from the first in its lists alone, so what fails only there is
//! the lists' doing and is reported. `docs/rules.md` says so to rule
//! authors.

pub mod builtin;
mod hand_off;
mod lines;
mod reserved;
mod sample;
mod validate;
mod versions;

pub use versions::parent_findings;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::crd::offline::OfflineCrds;
use crate::kinds::Gvk;
use crate::plan::sample::{Sample, Sampled, render_children};
use crate::plan::{Input, Observed};
use crate::rules::model::Scope;
use crate::rules::{CompiledChild, CompiledRule, Diagnostic, VarSource, code_line};
pub use reserved::reserved_labels;
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

/// Warnings about the children `rule` renders for a sample parent, and,
/// unless a parent is given, about what breaks when its lists are empty.
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
        None => sample::parents(rule, parent_scope(rule, cx)),
    };
    let mut refusals = Vec::new();
    let mut rendered = None;
    for parent in &candidates {
        match render_sample(rule, parent, cx) {
            Ok(children) => {
                rendered = Some((parent, children));
                break;
            }
            Err(errors) => refusals = errors,
        }
    }
    let Some((sampled_parent, sample)) = rendered else {
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
            out.push(on_template(
                rule,
                Entry::Child(*i),
                format!("cannot be applied as it renders for the sample parent: {why}"),
                cx,
            ));
        }
    }
    out.extend(hand_off::findings(rule, &sample));
    out.extend(versions::findings(rule, sampled_parent));
    let mut seen = BTreeSet::new();
    out.extend(schema_findings(rule, &sample, cx, &mut seen));
    // A sample refused with its lists empty (a `minItems`, a `oneOf`) has
    // nothing to add: the schema keeps such parents out.
    let empty = given
        .is_none()
        .then(|| sample::with_empty_lists(rule, parent_scope(rule, cx)))
        .flatten()
        .and_then(|parent| render_sample(rule, &parent, cx).ok());
    if let Some(empty) = empty {
        out.extend(empty_list_findings(rule, &sample, &empty, cx));
        out.extend(schema_findings(rule, &empty, cx, &mut seen));
    }
    out
}

/// The parent kind's scope for a sample: what the CRD or the rule says,
/// else the built-in table (which takes a kind it does not know as
/// namespaced, as most are).
fn parent_scope(rule: &CompiledRule, cx: &Context) -> Scope {
    cx.crds
        .and_then(|c| c.find(&rule.parent))
        .map(|(crd, _)| crate::crd::offline::scope_of(crd))
        .or(rule.rule.spec.parent.scope)
        .or_else(|| {
            rule.rule
                .spec
                .crd
                .as_ref()
                .map(|_| crate::rules::crd::scope(&rule.rule))
        })
        .unwrap_or_else(|| crate::kinds::scope(&rule.parent))
}

/// Every child and patch rendered for `parent`; `Err` when it is refused.
fn render_sample(rule: &CompiledRule, parent: &Value, cx: &Context) -> Result<Sample, Vec<String>> {
    let hint = crate::crd::offline::parent_scope(rule, parent, cx.crds);
    let scope_of = crate::plan::offline_input::offline_scope_with(rule, hint);
    let observed = if cx.observed.is_empty() {
        Observed::from_objects(Vec::new())
    } else {
        crate::plan::offline_input::label_observed(
            rule,
            parent,
            cx.observed.to_vec(),
            NOW,
            &scope_of,
        )
    };
    let input = Input {
        parent,
        observed: &observed,
        now: NOW,
        scope_of: &scope_of,
        clusters: &crate::clusters::Clusters::offline(),
    };
    render_children(rule, &input)
}

/// Each object rendered in `sample` against its kind's schema; `seen`
/// holds the findings already reported (by entry, path and message).
fn schema_findings(
    rule: &CompiledRule,
    sample: &Sample,
    cx: &Context,
    seen: &mut BTreeSet<(String, String, String)>,
) -> Vec<Diagnostic> {
    let rendered = sample
        .children
        .iter()
        .filter_map(|(i, sampled)| match sampled {
            Sampled::Rendered(objects) => Some((Entry::Child(*i), objects)),
            _ => None,
        });
    let patches = sample
        .patches
        .iter()
        .map(|(i, bodies)| (Entry::Patch(*i), bodies));
    let mut out = Vec::new();
    for (entry, objects) in rendered.chain(patches) {
        let compiled = entry.compiled(rule);
        let Some((root, crd)) = schema_for(&compiled.gvk, cx) else {
            continue;
        };
        for object in objects {
            for finding in validate(object, &root, builtin::definitions(), crd) {
                let key = (entry.at(), finding.path.clone(), finding.message.clone());
                if seen.insert(key) {
                    out.push(diagnostic(rule, entry, &finding, cx));
                }
            }
        }
    }
    out
}

/// What breaks when every list is empty: each child, patch or var that
/// rendered (or was excluded) for the `rich` sample but fails for `empty`.
/// Whatever reads a var that fails is left out: the var is reported.
fn empty_list_findings(
    rule: &CompiledRule,
    rich: &Sample,
    empty: &Sample,
    cx: &Context,
) -> Vec<Diagnostic> {
    const WHEN: &str = "fails for the sample parent with every list empty (`[]`)";
    let mut out = Vec::new();
    for (i, sampled) in &empty.children {
        let Sampled::Failed(why) = sampled else {
            continue;
        };
        let before = rich.children.iter().find(|(j, _)| j == i).map(|(_, s)| s);
        if matches!(before, Some(Sampled::Rendered(_) | Sampled::Excluded)) {
            let message = format!("{WHEN}: {why}");
            out.push(on_template(rule, Entry::Child(*i), message, cx));
        }
    }
    for (i, why) in &empty.failed_patches {
        if !rich.failed_patches.iter().any(|(j, _)| j == i) {
            let message = format!("{WHEN}: {why}");
            out.push(on_template(rule, Entry::Patch(*i), message, cx));
        }
    }
    for (i, why) in &empty.vars {
        if rich.vars.iter().any(|(j, _)| j == i) {
            continue;
        }
        let Some(var) = rule.vars.get(*i) else {
            continue;
        };
        let Some(at) = rule.rule.spec.vars.iter().position(|v| v.name == var.name) else {
            continue;
        };
        let field = match var.source {
            VarSource::Value(_) => format!("spec.vars[{at}].value"),
            VarSource::Template { .. } => format!("spec.vars[{at}].template"),
        };
        let line = rule.lines.line_of(&field);
        out.push(Diagnostic::warning(
            &rule.file,
            line,
            &field,
            format!("{WHEN}: {why}"),
        ));
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

/// A warning about a child or a patch as a whole, on its template's first
/// line.
fn on_template(rule: &CompiledRule, entry: Entry, message: String, cx: &Context) -> Diagnostic {
    let finding = Finding {
        path: String::new(),
        keys: Vec::new(),
        message: String::new(),
    };
    let mut d = diagnostic(rule, entry, &finding, cx);
    d.message = message;
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
