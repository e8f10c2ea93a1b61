//! `related:` entries and `vars:`: validation and compilation.
//!
//! A related entry's name, namespace and selector are templates over the
//! parent alone (`parent`, `spec`, `metadata`, `rule`): they decide what to
//! read, so they cannot depend on what was read. Its `readyWhen` sees the
//! same names and `self` (the object read), nothing else: it is evaluated
//! while the entries are read, before any child or var. Vars see everything before
//! them: the parent, `related`, `children` and earlier vars.

use std::collections::BTreeSet;

use super::lint::{Code, lint};
use super::{Checker, context_names};
use crate::kinds::Gvk;
use crate::render::shape::Shape;
use crate::render::{Calls, EngineBuilder, ExprId, TemplateId, TemplateKind};
use crate::rules::model::{
    RelatedSelector, RelatedSpec, SelectorOperator, TemplatedExpressions, TemplatedLabels, VarSpec,
};

/// Ids and names a template may refer to, for `check`.
#[derive(Debug, Default)]
pub struct Known {
    pub children: BTreeSet<String>,
    pub related: BTreeSet<String>,
    pub patches: BTreeSet<String>,
    /// Vars visible here (for a var: those declared before it).
    pub vars: BTreeSet<String>,
}

#[derive(Debug)]
pub struct CompiledRelated {
    pub spec: RelatedSpec,
    pub gvk: Gvk,
    pub name: Option<TemplateId>,
    pub namespace: Option<TemplateId>,
    pub selector: Option<CompiledSelector>,
    pub ready_when: Option<ExprId>,
    /// `cluster:`, the expression naming the cluster read from.
    pub cluster: Option<ExprId>,
}

#[derive(Debug, Default)]
pub struct CompiledSelector {
    pub match_labels: Option<Templated<Vec<(String, TemplateId)>>>,
    pub match_expressions: Option<Templated<Vec<CompiledRequirement>>>,
}

/// Parts written out in the rule, or one template yielding the whole part (YAML).
#[derive(Debug)]
pub enum Templated<T> {
    Parts(T),
    Whole(TemplateId),
}

#[derive(Debug)]
pub struct CompiledRequirement {
    pub key: String,
    pub operator: SelectorOperator,
    pub values: Vec<TemplateId>,
}

#[derive(Debug)]
pub struct CompiledVar {
    pub name: String,
    pub source: VarSource,
    /// The vars before it that it reads.
    pub reads: VarReads,
    /// Whether it reads `related` or `children`, itself or through a var
    /// it reads: such a var has no value outside a pass (a conversion).
    pub reads_pass: bool,
}

/// Whether names read at the top level include what only a pass has.
fn names_pass(names: &std::collections::HashSet<String>) -> bool {
    names
        .iter()
        .any(|n| matches!(n.split('.').next(), Some("related" | "children")))
}

/// The vars a template or expression reads, found statically: what a var
/// that fails in a pass withholds from it (`plan::vars`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct VarReads {
    /// Read by a constant name: `vars.x`, `vars["x"]`.
    pub names: BTreeSet<String>,
    /// `vars` read some other way (a computed subscript, whole, in a
    /// loop): it may read any var.
    pub any: bool,
}

impl VarReads {
    /// The vars `calls` (one piece of code, or several merged) read.
    pub fn of(calls: &Calls) -> VarReads {
        VarReads {
            names: calls
                .reads
                .iter()
                .filter(|(root, _)| root == "vars")
                .map(|(_, name)| name.clone())
                .collect(),
            any: calls.dynamic.contains("vars"),
        }
    }

    /// Whether the code may read `var`.
    pub fn reads(&self, var: &str) -> bool {
        self.any || self.names.contains(var)
    }
}

#[derive(Debug)]
pub enum VarSource {
    Value(ExprId),
    Template {
        template: TemplateId,
        /// What its text writes: the value it yields when it renders no
        /// YAML node (a loop with no items) is that shape's empty one.
        shape: Option<Shape>,
    },
}

/// Names a related entry's name/namespace/selector templates may use.
fn parent_only() -> BTreeSet<&'static str> {
    ["parent", "spec", "metadata", "rule"].into_iter().collect()
}

fn text_template(
    ck: &mut Checker,
    builder: &mut EngineBuilder,
    field: &str,
    name: &str,
    kind: TemplateKind,
    source: &str,
    known: &Known,
) -> Option<TemplateId> {
    match builder.add_template(name, kind, source) {
        Ok(id) => {
            let code = match kind {
                TemplateKind::Object => Code::Object(&id, source),
                TemplateKind::Text => Code::Text(&id, source),
            };
            lint(ck, builder, field, code);
            let names = builder.template_names(&id, true);
            ck.check_names(
                field,
                "a related entry's name, namespace and selector",
                names,
                &parent_only(),
                known,
            );
            Some(id)
        }
        Err(err) => {
            ck.error(field, format!("template syntax: {err}"));
            None
        }
    }
}

pub(super) fn compile_related(
    ck: &mut Checker,
    builder: &mut EngineBuilder,
    entries: &[RelatedSpec],
    known: &Known,
) -> Vec<CompiledRelated> {
    let mut out = Vec::new();
    for (i, r) in entries.iter().enumerate() {
        let at = format!("spec.related[{i}]");
        ck.check_entry_names(&at, &r.id, &r.api_version, &r.kind);
        if r.name.is_some() == r.selector.is_some() {
            ck.error(
                &at,
                "set exactly one of `name` (one object) and `selector` (a list)",
            );
        }
        if r.all_namespaces && r.selector.is_none() {
            ck.error(
                &format!("{at}.allNamespaces"),
                "only a `selector:` entry can read all namespaces",
            );
        }
        if r.all_namespaces && r.namespace.is_some() {
            ck.error(
                &format!("{at}.allNamespaces"),
                "set either `namespace` or `allNamespaces`, not both",
            );
        }
        let tname = |part: &str| format!("related:{}:{part}", r.id);
        let name = r.name.as_ref().and_then(|src| {
            text_template(
                ck,
                builder,
                &format!("{at}.name"),
                &tname("name"),
                TemplateKind::Text,
                src,
                known,
            )
        });
        let namespace = r.namespace.as_ref().and_then(|src| {
            text_template(
                ck,
                builder,
                &format!("{at}.namespace"),
                &tname("namespace"),
                TemplateKind::Text,
                src,
                known,
            )
        });
        let selector = r
            .selector
            .as_ref()
            .map(|sel| compile_selector(ck, builder, &format!("{at}.selector"), &r.id, sel, known));
        let ready_when = r.ready_when.as_ref().and_then(|src| {
            let field = format!("{at}.readyWhen");
            match builder.add_expression(src) {
                Ok(id) => {
                    lint(ck, builder, &field, Code::Expression(id, src));
                    let names = builder.expression_names(id, true);
                    // Evaluated while the related entries are read, before
                    // children, other related objects or vars are in the context.
                    let mut allowed = parent_only();
                    allowed.insert("self");
                    ck.check_names(
                        &field,
                        "a related entry's readyWhen",
                        names,
                        &allowed,
                        known,
                    );
                    Some(id)
                }
                Err(err) => {
                    ck.error(&field, format!("expression syntax: {err}"));
                    None
                }
            }
        });
        let cluster = r.cluster.as_ref().and_then(|src| {
            let place = super::cluster::Place {
                field: &format!("{at}.cluster"),
                what: "a related entry's cluster",
                allowed: &parent_only(),
                known,
            };
            super::cluster::compile(ck, builder, &place, src, None)
        });
        out.push(CompiledRelated {
            cluster,
            spec: r.clone(),
            gvk: Gvk::new(&r.api_version, &r.kind),
            name,
            namespace,
            selector,
            ready_when,
        });
    }
    out
}

/// A related entry's `selector`, each part a template: `matchLabels` as a
/// map of templated values or one template, `matchExpressions` as a list
/// of requirements with templated values or one template.
fn compile_selector(
    ck: &mut Checker,
    builder: &mut EngineBuilder,
    field: &str,
    id: &str,
    sel: &RelatedSelector,
    known: &Known,
) -> CompiledSelector {
    let tname = |part: &str| format!("related:{id}:{part}");
    let match_labels = sel.match_labels.as_ref().map(|labels| match labels {
        TemplatedLabels::Map(map) => Templated::Parts(
            map.iter()
                .filter_map(|(k, v)| {
                    let f = format!("{field}.matchLabels.{k}");
                    text_template(
                        ck,
                        builder,
                        &f,
                        &tname(&format!("label:{k}")),
                        TemplateKind::Text,
                        v,
                        known,
                    )
                    .map(|t| (k.clone(), t))
                })
                .collect(),
        ),
        TemplatedLabels::Template(src) => {
            let f = format!("{field}.matchLabels");
            match text_template(
                ck,
                builder,
                &f,
                &tname("labels"),
                TemplateKind::Object,
                src,
                known,
            ) {
                Some(t) => Templated::Whole(t),
                None => Templated::Parts(Vec::new()),
            }
        }
    });
    let match_expressions = sel.match_expressions.as_ref().map(|exprs| match exprs {
        TemplatedExpressions::List(list) => Templated::Parts(
            list.iter()
                .enumerate()
                .map(|(j, req)| {
                    let needs_values =
                        matches!(req.operator, SelectorOperator::In | SelectorOperator::NotIn);
                    if needs_values == req.values.is_empty() {
                        ck.error(
                            &format!("{field}.matchExpressions[{j}].values"),
                            if needs_values {
                                "operators In and NotIn need values"
                            } else {
                                "operators Exists and DoesNotExist take no values"
                            },
                        );
                    }
                    let values = req
                        .values
                        .iter()
                        .enumerate()
                        .filter_map(|(k, v)| {
                            let f = format!("{field}.matchExpressions[{j}].values[{k}]");
                            text_template(
                                ck,
                                builder,
                                &f,
                                &tname(&format!("expr:{j}:{k}")),
                                TemplateKind::Text,
                                v,
                                known,
                            )
                        })
                        .collect();
                    CompiledRequirement {
                        key: req.key.clone(),
                        operator: req.operator,
                        values,
                    }
                })
                .collect(),
        ),
        TemplatedExpressions::Template(src) => {
            let f = format!("{field}.matchExpressions");
            match text_template(
                ck,
                builder,
                &f,
                &tname("exprs"),
                TemplateKind::Object,
                src,
                known,
            ) {
                Some(t) => Templated::Whole(t),
                None => Templated::Parts(Vec::new()),
            }
        }
    });
    CompiledSelector {
        match_labels,
        match_expressions,
    }
}

pub(super) fn is_var_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

pub(super) fn compile_vars(
    ck: &mut Checker,
    builder: &mut EngineBuilder,
    vars: &[VarSpec],
    known: &mut Known,
) -> Vec<CompiledVar> {
    let mut out = Vec::new();
    known.vars.clear();
    for (i, v) in vars.iter().enumerate() {
        let at = format!("spec.vars[{i}]");
        if !is_var_name(&v.name) {
            ck.error(
                &format!("{at}.name"),
                format!(
                    "`{}` is not a valid var name ([a-zA-Z_][a-zA-Z0-9_]*)",
                    v.name
                ),
            );
        }
        if known.vars.contains(&v.name) {
            ck.error(&format!("{at}.name"), format!("duplicate var `{}`", v.name));
        }
        let allowed = context_names(false, false);
        let mut reads = VarReads::default();
        let mut reads_pass = false;
        let source = match (&v.value, &v.template) {
            (Some(src), None) => {
                let field = format!("{at}.value");
                match builder.add_expression(src) {
                    Ok(id) => {
                        lint(ck, builder, &field, Code::Expression(id, src));
                        let names = builder.expression_names(id, true);
                        reads_pass = names_pass(&names);
                        ck.check_names(&field, "a var", names, &allowed, known);
                        reads = VarReads::of(&builder.expression_calls(id));
                        Some(VarSource::Value(id))
                    }
                    Err(err) => {
                        ck.error(&field, format!("expression syntax: {err}"));
                        None
                    }
                }
            }
            (None, Some(src)) => {
                let field = format!("{at}.template");
                match builder.add_template(&format!("var:{}", v.name), TemplateKind::Object, src) {
                    Ok(id) => {
                        lint(ck, builder, &field, Code::Object(&id, src));
                        let names = builder.template_names(&id, true);
                        reads_pass = names_pass(&names);
                        ck.check_names(&field, "a var", names, &allowed, known);
                        reads = VarReads::of(&builder.template_calls(&id));
                        let shape = builder.template_shape(&id);
                        Some(VarSource::Template {
                            template: id,
                            shape,
                        })
                    }
                    Err(err) => {
                        ck.error(&field, format!("template syntax: {err}"));
                        None
                    }
                }
            }
            _ => {
                ck.error(
                    &at,
                    "set exactly one of `value` (an expression) and `template` (YAML)",
                );
                None
            }
        };
        known.vars.insert(v.name.clone());
        reads_pass |= out
            .iter()
            .any(|earlier: &CompiledVar| earlier.reads_pass && reads.reads(&earlier.name));
        if let Some(source) = source {
            out.push(CompiledVar {
                name: v.name.clone(),
                source,
                reads,
                reads_pass,
            });
        }
    }
    out
}
