//! Validation and compilation of one rule document.
//!
//! Every check reports a [`Diagnostic`] with file, line and field and carries
//! on, so `trellis check` shows the whole picture at once. A rule that
//! compiles has every template, expression, JSONPath and schema parsed once;
//! rendering never parses again.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use jsonpath_rust::parser::model::JpQuery;
use serde_json::Value;

use super::Diagnostic;
use super::load::RawDocument;
use super::model::{self, ChildSpec, Rule, RuleSpec, SelectorOperator};
use super::names::{is_api_version, is_dns_label, is_dns_subdomain, is_kind};
use crate::kinds::Gvk;
use crate::render::{self, Engine, EngineBuilder, ExprId, Limits, TemplateId, TemplateKind};
use crate::yaml::LineIndex;

mod checker;
mod cluster;
mod entry;
mod for_each;
mod hand_off;
mod lint;
mod order;
mod patch;
mod propagate;
mod related;
pub mod scope;
mod shape;
mod status;
pub mod versions;

use checker::Checker;
pub use checker::code_line;
use entry::{Entry, Role};
pub use for_each::{CompiledForEach, MAX_FOR_EACH_NAMES};
use lint::{Code, lint};
use order::topological_order;
pub use propagate::MAX_PROPAGATE_KEYS;
pub use related::{
    CompiledRelated, CompiledRequirement, CompiledSelector, CompiledVar, Known, Templated,
    VarReads, VarSource,
};
use related::{compile_related, compile_vars};
use shape::read_rule;
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
    /// `spec.versions`: every served version but the hub (the parent's).
    pub versions: Vec<versions::CompiledVersion>,
    /// The version parents are stored in (`spec.storageVersion`, else the hub).
    pub storage_version: String,
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

    /// Paths under `.status` the rule writes besides trellis's conditions
    /// and generation: its fields, and the inventory's. One the pass no
    /// longer produces is removed from the parent.
    pub fn status_paths(&self) -> Vec<Vec<String>> {
        let mut paths: Vec<Vec<String>> = self.fields.iter().map(|f| f.path.clone()).collect();
        if self.rule.spec.status.as_ref().is_some_and(|s| s.inventory) {
            paths.push(vec!["children".into()]);
            paths.push(vec!["childrenTruncated".into()]);
        }
        paths
    }

    /// `crd: {allowBreaking: true}`: its CRD is applied even when the
    /// change would break stored parents or clients.
    pub fn allows_breaking_crd(&self) -> bool {
        self.rule
            .spec
            .crd
            .as_ref()
            .is_some_and(|c| c.allow_breaking)
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
    pub for_each: Option<CompiledForEach>,
    pub ready_when: Option<ExprId>,
    /// Indexes of the children this one depends on (explicit and implicit).
    pub depends_on: Vec<usize>,
    /// Indexes of the related entries it depends on (explicit and implicit).
    pub depends_on_related: Vec<usize>,
    /// A patch: indexes of the patches it depends on (always empty for a child).
    pub depends_on_patches: Vec<usize>,
    /// The vars its template and expressions read.
    pub reads_vars: VarReads,
    /// `handOff`, each path as keys ([`crate::ownership::parse_path`]).
    pub hand_off: Vec<Vec<String>>,
    /// `cluster:`, the expression naming the cluster it lives in.
    pub cluster: Option<ExprId>,
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
    /// The type; a template's text for a per-item condition.
    pub type_: String,
    /// `forEach` set: one condition per item, its type rendered per item.
    pub per_item: Option<PerItem>,
    pub when: ExprId,
    pub reason: String,
    pub message: Option<TemplateId>,
    /// The vars its `when` and `message` read.
    pub reads_vars: VarReads,
}

/// A per-item condition's `forEach` and `type` template.
#[derive(Debug)]
pub struct PerItem {
    pub for_each: CompiledForEach,
    pub type_: TemplateId,
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
    let rule = read_rule(&mut ck, &doc)?;
    check_header(&mut ck, &rule);
    let spec = &rule.spec;
    if let Some(propagate) = &spec.propagate {
        propagate::check_propagate(&mut ck, propagate);
    }
    let parent = Gvk::new(&spec.parent.api_version, &spec.parent.kind);
    let settings = compile_settings(&mut ck, spec);

    let mut builder = EngineBuilder::new(limits);
    let entries = compile_entries(&mut ck, &mut builder, &doc, spec);

    let (fields, conditions) = match &spec.status {
        Some(status) => compile_status(&mut ck, status, &parent, &mut builder, &entries.known),
        None => (Vec::new(), Vec::new()),
    };

    let (versions, storage_version) =
        versions::compile(&mut ck, &mut builder, spec, &parent, &entries.vars);

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
    let revision = super::revision::revision(&doc.value, &entries.template_files);
    Some(CompiledRule {
        name: rule.metadata.name.clone(),
        revision,
        template_files: entries.template_files,
        rollout: settings.rollout,
        versions,
        storage_version,
        parent,
        engine,
        related: entries.related,
        vars: entries.vars,
        children: entries.children,
        order: entries.order,
        patches: entries.patches,
        patch_order: entries.patch_order,
        schema: settings.schema,
        fields,
        conditions,
        resync: settings.resync,
        templates: entries.templates,
        crd,
        file: doc.file,
        lines: doc.lines,
        document: doc.value,
        rule,
    })
}

/// The rule's own names and its parent: apiVersion, kind, `metadata.name`,
/// `spec.parent` (apiVersion, kind, namespaces, selector) and the
/// ServiceAccount it runs as.
fn check_header(ck: &mut Checker, rule: &Rule) {
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
}

/// What a rule sets once for all its parents, checked.
struct Settings {
    schema: Option<jsonschema::Validator>,
    resync: Option<Duration>,
    rollout: Option<super::rollout::Settings>,
}

/// `spec.schema`, `spec.defaults`, `spec.resync` and `spec.rollout`.
fn compile_settings(ck: &mut Checker, spec: &RuleSpec) -> Settings {
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
    Settings {
        schema,
        resync,
        rollout,
    }
}

/// A rule's related entries, vars, children and patches, compiled, with
/// the order they are planned in.
struct Entries {
    known: Known,
    related: Vec<CompiledRelated>,
    vars: Vec<CompiledVar>,
    children: Vec<CompiledChild>,
    order: Vec<usize>,
    patches: Vec<CompiledChild>,
    patch_order: Vec<usize>,
    templates: BTreeMap<String, String>,
    template_files: BTreeMap<String, String>,
}

/// Related entries and vars first (children read them), then children and
/// patches: ids, kinds, templates, expressions, dependencies; the orders
/// only when all of that is sound.
fn compile_entries(
    ck: &mut Checker,
    builder: &mut EngineBuilder,
    doc: &RawDocument,
    spec: &RuleSpec,
) -> Entries {
    let mut known = Known {
        children: spec.children.iter().map(|c| c.id.clone()).collect(),
        related: spec.related.iter().map(|r| r.id.clone()).collect(),
        patches: spec.patches.iter().map(|p| p.id.clone()).collect(),
        vars: BTreeSet::new(),
    };
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
    let related = compile_related(ck, builder, &spec.related, &known);
    let vars = compile_vars(ck, builder, &spec.vars, &mut known);

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
            ck,
            builder,
            doc,
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
        patch::check_ids(ck, spec);
        for (i, p) in spec.patches.iter().enumerate() {
            let mut entry = Entry {
                ck,
                builder,
                doc,
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
        patch::order(ck, spec, &patches)
    } else {
        Vec::new()
    };
    Entries {
        known,
        related,
        vars,
        children,
        order,
        patches,
        patch_order,
        templates,
        template_files,
    }
}

fn merge_reads(into: &mut render::Calls, from: render::Calls) {
    into.reads.extend(from.reads);
    into.dynamic.extend(from.dynamic);
}
