//! Validation and compilation of one rule document.
//!
//! Every check reports a [`Diagnostic`] with file, line and field and carries
//! on, so `trellis check` shows the whole picture at once. A rule that
//! compiles has every template, expression, JSONPath and schema parsed once;
//! rendering never parses again.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use jsonpath_rust::parser::model::JpQuery;
use serde_json::Value;

use super::Diagnostic;
use super::load::RawDocument;
use super::model::{self, ChildSpec, Rule, SelectorOperator};
use crate::kinds::Gvk;
use crate::render::{self, Engine, EngineBuilder, ExprId, Limits, TemplateId, TemplateKind};
use crate::yaml::LineIndex;

mod checker;
mod entry;
mod lint;
mod patch;
mod related;
pub mod scope;
mod status;

use checker::Checker;
pub use checker::code_line;
use entry::{Entry, Role};
use lint::{Code, lint};
pub use related::{
    CompiledRelated, CompiledRequirement, CompiledSelector, CompiledVar, Known, Templated,
    VarReads, VarSource,
};
use related::{compile_related, compile_vars};
use status::compile_status;

/// A rule ready to plan with.
#[derive(Debug)]
pub struct CompiledRule {
    pub name: String,
    pub rule: Rule,
    pub file: PathBuf,
    pub lines: LineIndex,
    pub parent: Gvk,
    pub engine: Engine,
    pub related: Vec<CompiledRelated>,
    pub vars: Vec<CompiledVar>,
    pub children: Vec<CompiledChild>,
    /// Indexes into `children`, dependencies first.
    pub order: Vec<usize>,
    /// `spec.patches`, compiled as children are (each one's `spec` is
    /// [`model::PatchSpec::as_child`]); planned after every child.
    pub patches: Vec<CompiledChild>,
    /// Indexes into `patches`, dependencies first.
    pub patch_order: Vec<usize>,
    pub schema: Option<jsonschema::Validator>,
    pub fields: Vec<CompiledField>,
    pub conditions: Vec<CompiledCondition>,
    pub resync: Option<Duration>,
    /// Child id → template text, as loaded (inline or from `templateFile`).
    pub templates: BTreeMap<String, String>,
    /// The parent's CustomResourceDefinition, generated when the rule sets `crd:`.
    pub crd: Option<Value>,
    /// This version's revision ([`super::revision`]).
    pub revision: String,
    /// The rule document as parsed: with `template_files`, what rebuilds
    /// this version (a revision ConfigMap keeps both).
    pub document: Value,
    /// `templateFile` path as written → contents.
    pub template_files: BTreeMap<String, String>,
    /// `spec.rollout`, checked: a change moves parents in steps.
    pub rollout: Option<super::rollout::Settings>,
}

impl CompiledRule {
    /// True when the parent is a CRD and so gets status written.
    pub fn writes_status(&self) -> bool {
        !self.parent.is_builtin()
    }

    pub fn child(&self, id: &str) -> Option<&CompiledChild> {
        self.children.iter().find(|c| c.spec.id == id)
    }

    /// Whether a child has `deletionPolicy: retain`.
    pub fn retains_children(&self) -> bool {
        self.children
            .iter()
            .any(|c| c.spec.deletion_policy == model::DeletionPolicy::Retain)
    }

    pub fn patch(&self, id: &str) -> Option<&CompiledChild> {
        self.patches.iter().find(|c| c.spec.id == id)
    }
}

#[derive(Debug)]
pub struct CompiledChild {
    pub spec: ChildSpec,
    pub gvk: Gvk,
    pub template: TemplateId,
    pub include_when: Option<ExprId>,
    pub for_each: Option<ExprId>,
    pub ready_when: Option<ExprId>,
    /// Indexes of the children this one depends on (explicit and implicit).
    pub depends_on: Vec<usize>,
    /// Indexes of the related entries it depends on (explicit and implicit).
    pub depends_on_related: Vec<usize>,
    /// A patch: indexes of the patches it depends on (always empty for a child).
    pub depends_on_patches: Vec<usize>,
    /// The vars its template and expressions read.
    pub reads_vars: VarReads,
}

#[derive(Debug)]
pub struct CompiledField {
    /// Path segments under `.status`.
    pub path: Vec<String>,
    pub source: FieldSource,
    pub default: Option<Value>,
    /// The vars its `value` reads (none for a `jsonPath`).
    pub reads_vars: VarReads,
}

#[derive(Debug)]
pub enum FieldSource {
    JsonPath {
        child: String,
        query: JpQuery,
        text: String,
    },
    Value(ExprId),
}

#[derive(Debug)]
pub struct CompiledCondition {
    pub type_: String,
    pub when: ExprId,
    pub reason: String,
    pub message: Option<TemplateId>,
    /// The vars its `when` and `message` read.
    pub reads_vars: VarReads,
}

/// Names every template and expression may use.
const BASE_NAMES: &[&str] = &[
    "parent", "spec", "metadata", "children", "related", "vars", "rule",
];

/// Names visible in a given place: the base context plus `item`/`index`
/// inside `forEach` children and `self` in `readyWhen`.
pub fn context_names(for_each: bool, with_self: bool) -> BTreeSet<&'static str> {
    let mut names: BTreeSet<&str> = BASE_NAMES.iter().copied().collect();
    if for_each {
        names.extend(["item", "index"]);
    }
    if with_self {
        names.insert("self");
    }
    names
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain (a ServiceAccount's name): dot-separated labels,
/// at most 253 characters.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

fn is_child_id(s: &str) -> bool {
    let mut bytes = s.bytes();
    s.len() <= 63
        && bytes.next().is_some_and(|b| b.is_ascii_lowercase())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn is_kind(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase()) && chars.all(|c| c.is_ascii_alphanumeric())
}

fn is_api_version(s: &str) -> bool {
    let (group, version) = s.split_once('/').unwrap_or(("", s));
    let version_ok = !version.is_empty()
        && version
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let group_ok = group.is_empty() || group.split('.').all(is_dns_label);
    version_ok && group_ok && !(group.is_empty() && s.contains('/'))
}

fn is_reason(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ',' || c == ':')
        && s.len() <= 1024
}

/// Validator for the rule format itself, derived from the serde types.
fn format_validator() -> Option<&'static jsonschema::Validator> {
    static VALIDATOR: OnceLock<Option<jsonschema::Validator>> = OnceLock::new();
    VALIDATOR
        .get_or_init(|| jsonschema::validator_for(&model::json_schema()).ok())
        .as_ref()
}

/// Converts a JSON Pointer (`/spec/children/1/id`) to our field syntax.
fn pointer_to_field(pointer: &str) -> String {
    let mut out = String::new();
    for seg in pointer.split('/').skip(1) {
        let seg = seg.replace("~1", "/").replace("~0", "~");
        if seg.parse::<usize>().is_ok() {
            out.push_str(&format!("[{seg}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&seg);
        }
    }
    out
}

/// Validates and compiles one document; `None` when it has errors.
pub(super) fn compile(
    doc: RawDocument,
    limits: Limits,
    diags: &mut Vec<Diagnostic>,
) -> Option<CompiledRule> {
    let mut ck = Checker {
        file: &doc.file,
        lines: &doc.lines,
        source: &doc.source,
        template_files: BTreeMap::new(),
        diags,
        errors: 0,
    };

    // A CRD or a parent left in the rules directory: one clear error, not a
    // dump of every way it fails the Rule schema.
    let doc_api = doc.value.get("apiVersion").and_then(Value::as_str);
    let doc_kind = doc.value.get("kind").and_then(Value::as_str);
    if doc_kind != Some(model::KIND) {
        let found = |v: Option<&str>| v.map(|s| format!("`{s}`")).unwrap_or("nothing".into());
        ck.error(
            if doc_kind.is_some() { "kind" } else { "" },
            format!(
                "not a Rule: this document has apiVersion {} and kind {}; a rules directory \
                 holds only `{}` `{}` documents (move CRDs and parents elsewhere)",
                found(doc_api),
                found(doc_kind),
                model::API_VERSION,
                model::KIND
            ),
        );
        return None;
    }

    // Shape first: every structural error in the document at once.
    if let Some(validator) = format_validator() {
        let mut shape_errors: Vec<(String, String)> = validator
            .iter_errors(&doc.value)
            .map(|e| {
                (
                    pointer_to_field(&e.instance_path().to_string()),
                    e.to_string(),
                )
            })
            .collect();
        shape_errors.sort();
        shape_errors.dedup();
        for (field, message) in shape_errors {
            ck.error(&field, message);
        }
    }
    if ck.errors > 0 {
        return None;
    }
    let rule: Rule = match serde_path_to_error::deserialize(&doc.value) {
        Ok(rule) => rule,
        Err(err) => {
            let field = err.path().to_string();
            let field = if field == "." { String::new() } else { field };
            ck.error(&field, err.inner().to_string());
            return None;
        }
    };

    if rule.api_version != model::API_VERSION {
        ck.error(
            "apiVersion",
            format!(
                "must be `{}`, not `{}`",
                model::API_VERSION,
                rule.api_version
            ),
        );
    }
    if rule.kind != model::KIND {
        ck.error(
            "kind",
            format!("must be `{}`, not `{}`", model::KIND, rule.kind),
        );
    }
    if !is_dns_label(&rule.metadata.name) {
        ck.error(
            "metadata.name",
            format!(
                "`{}` is not a DNS-1123 label (lowercase letters, digits, '-', at most 63)",
                rule.metadata.name
            ),
        );
    }

    let spec = &rule.spec;
    let parent = Gvk::new(&spec.parent.api_version, &spec.parent.kind);
    if !is_api_version(&spec.parent.api_version) {
        ck.error(
            "spec.parent.apiVersion",
            format!("`{}` is not a valid apiVersion", spec.parent.api_version),
        );
    }
    if !is_kind(&spec.parent.kind) {
        ck.error(
            "spec.parent.kind",
            format!("`{}` is not a valid kind (CamelCase)", spec.parent.kind),
        );
    }
    for (i, ns) in spec.parent.namespaces.iter().enumerate() {
        if !is_dns_label(ns) {
            ck.error(
                &format!("spec.parent.namespaces[{i}]"),
                format!("`{ns}` is not a valid namespace name"),
            );
        }
    }
    if let Some(account) = &spec.service_account_name
        && !is_dns_subdomain(account)
    {
        ck.error(
            "spec.serviceAccountName",
            format!(
                "`{account}` is not a valid ServiceAccount name (a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', at most 253)"
            ),
        );
    }
    if let Some(selector) = &spec.parent.selector {
        for (i, req) in selector.match_expressions.iter().enumerate() {
            let needs_values =
                matches!(req.operator, SelectorOperator::In | SelectorOperator::NotIn);
            if needs_values == req.values.is_empty() {
                ck.error(
                    &format!("spec.parent.selector.matchExpressions[{i}].values"),
                    if needs_values {
                        "operators In and NotIn need values"
                    } else {
                        "operators Exists and DoesNotExist take no values"
                    },
                );
            }
        }
    }

    let schema = match &spec.schema {
        Some(schema) => match jsonschema::draft202012::new(schema) {
            Ok(v) => Some(v),
            Err(err) => {
                ck.error("spec.schema", format!("invalid JSON Schema: {err}"));
                None
            }
        },
        None => None,
    };
    if let Some(defaults) = &spec.defaults
        && !defaults.is_object()
    {
        ck.error(
            "spec.defaults",
            "must be an object (it is merged under .spec)",
        );
    }
    let resync = spec
        .resync
        .as_deref()
        .and_then(|text| match humantime::parse_duration(text) {
            Ok(d) if d >= Duration::from_secs(1) => Some(d),
            Ok(_) => {
                ck.error("spec.resync", "must be at least 1s");
                None
            }
            Err(err) => {
                ck.error(
                    "spec.resync",
                    format!("`{text}` is not a duration like 10m: {err}"),
                );
                None
            }
        });

    let rollout = spec
        .rollout
        .as_ref()
        .and_then(|r| match super::rollout::Settings::compile(r) {
            Ok(settings) => Some(settings),
            Err(errors) => {
                for (field, message) in errors {
                    ck.error(&format!("spec.rollout.{field}"), message);
                }
                None
            }
        });

    // Related entries and vars first: children read them.
    let mut known = Known {
        children: spec.children.iter().map(|c| c.id.clone()).collect(),
        related: spec.related.iter().map(|r| r.id.clone()).collect(),
        patches: spec.patches.iter().map(|p| p.id.clone()).collect(),
        vars: BTreeSet::new(),
    };
    let mut builder = EngineBuilder::new(limits);
    let mut seen_related: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, r) in spec.related.iter().enumerate() {
        if let Some(first) = seen_related.insert(&r.id, i) {
            ck.error(
                &format!("spec.related[{i}].id"),
                format!(
                    "duplicate related id `{}` (also spec.related[{first}])",
                    r.id
                ),
            );
        }
        if let Some(j) = spec.children.iter().position(|c| c.id == r.id) {
            ck.error(
                &format!("spec.related[{i}].id"),
                format!("id `{}` is also spec.children[{j}]: ids are unique across children and related", r.id),
            );
        }
    }
    let related = compile_related(&mut ck, &mut builder, &spec.related, &known);
    let vars = compile_vars(&mut ck, &mut builder, &spec.vars, &mut known);

    // Children, then patches: ids, kinds, templates, expressions, dependencies.
    let mut templates = BTreeMap::new();
    let mut template_files = BTreeMap::new();
    let mut children = Vec::new();
    let mut seen_ids: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, child) in spec.children.iter().enumerate() {
        if let Some(first) = seen_ids.insert(&child.id, i) {
            ck.error(
                &format!("spec.children[{i}].id"),
                format!(
                    "duplicate child id `{}` (also spec.children[{first}])",
                    child.id
                ),
            );
        }
        let mut entry = Entry {
            ck: &mut ck,
            builder: &mut builder,
            doc: &doc,
            spec,
            known: &known,
            templates: &mut templates,
            template_files: &mut template_files,
        };
        if let Some(compiled) = entry.compile(Role::Child, i, child) {
            children.push(compiled);
        }
    }
    let mut patches = Vec::new();
    if !spec.patches.is_empty() {
        patch::check_ids(&mut ck, spec);
        for (i, p) in spec.patches.iter().enumerate() {
            let mut entry = Entry {
                ck: &mut ck,
                builder: &mut builder,
                doc: &doc,
                spec,
                known: &known,
                templates: &mut templates,
                template_files: &mut template_files,
            };
            if let Some(compiled) = entry.compile(Role::Patch, i, &p.as_child()) {
                patches.push(compiled);
            }
        }
    }
    let order = if ck.errors == 0 {
        let deps: Vec<&[usize]> = children.iter().map(|c| c.depends_on.as_slice()).collect();
        let ids: Vec<&str> = children.iter().map(|c| c.spec.id.as_str()).collect();
        match topological_order(&deps, &ids) {
            Ok(order) => order,
            Err(cycle) => {
                let i = spec
                    .children
                    .iter()
                    .position(|c| c.id == cycle[0])
                    .unwrap_or(0);
                ck.error(
                    &format!("spec.children[{i}].dependsOn"),
                    format!("dependency cycle: {}", cycle.join(" -> ")),
                );
                Vec::new()
            }
        }
    } else {
        Vec::new()
    };
    let patch_order = if ck.errors == 0 {
        patch::order(&mut ck, spec, &patches)
    } else {
        Vec::new()
    };

    let (fields, conditions) = match &spec.status {
        Some(status) => compile_status(&mut ck, status, &parent, &mut builder, &known),
        None => (Vec::new(), Vec::new()),
    };

    let (crd, findings) = super::crd::generate(&rule);
    for f in findings {
        if f.error {
            ck.error(&f.field, f.message);
        } else {
            ck.warning(&f.field, f.message);
        }
    }

    if ck.errors > 0 {
        return None;
    }
    let engine = match builder.build() {
        Ok(engine) => engine,
        Err(err) => {
            ck.error("spec", format!("cannot compile: {err}"));
            return None;
        }
    };
    let revision = super::revision::revision(&doc.value, &template_files);
    Some(CompiledRule {
        name: rule.metadata.name.clone(),
        revision,
        template_files,
        rollout,
        parent,
        engine,
        related,
        vars,
        children,
        order,
        patches,
        patch_order,
        schema,
        fields,
        conditions,
        resync,
        templates,
        crd,
        file: doc.file,
        lines: doc.lines,
        document: doc.value,
        rule,
    })
}

fn merge_reads(into: &mut render::Calls, from: render::Calls) {
    into.reads.extend(from.reads);
    into.dynamic.extend(from.dynamic);
}

/// Entries (children, or patches) in dependency order (Kahn's algorithm,
/// stable by declaration): `deps[i]` are the indexes `i` waits for; on a
/// cycle, the ids along it.
fn topological_order(deps: &[&[usize]], ids: &[&str]) -> Result<Vec<usize>, Vec<String>> {
    let n = deps.len();
    let mut done = vec![false; n];
    let mut order = Vec::with_capacity(n);
    while order.len() < n {
        let next = (0..n).find(|&i| !done[i] && deps[i].iter().all(|&d| done[d]));
        match next {
            Some(i) => {
                done[i] = true;
                order.push(i);
            }
            None => return Err(find_cycle(deps, ids, &done)),
        }
    }
    Ok(order)
}

fn find_cycle(deps: &[&[usize]], ids: &[&str], done: &[bool]) -> Vec<String> {
    // Walk unfinished dependencies until a node repeats.
    let start = done.iter().position(|d| !d).unwrap_or(0);
    let mut path = vec![start];
    let mut current = start;
    loop {
        let next = deps[current]
            .iter()
            .copied()
            .find(|&d| !done[d])
            .unwrap_or(start);
        if let Some(pos) = path.iter().position(|&p| p == next) {
            let mut cycle: Vec<String> = path[pos..].iter().map(|&i| ids[i].to_owned()).collect();
            cycle.push(ids[next].to_owned());
            return cycle;
        }
        path.push(next);
        current = next;
    }
}
