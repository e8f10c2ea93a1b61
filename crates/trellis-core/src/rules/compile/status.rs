//! The `status:` block of a rule: fields and conditions.

use std::collections::BTreeSet;

use super::*;
use crate::render::Calls;
use crate::rules::model::{ConditionSpec, StatusField};
use crate::rules::names::{is_kind, is_reason};

/// Validates and compiles the `status:` block: fields (JSONPath or
/// expression) and the rule's own conditions.
pub(super) fn compile_status(
    ck: &mut Checker,
    status: &super::model::StatusSpec,
    parent: &Gvk,
    builder: &mut EngineBuilder,
    known: &Known,
) -> (Vec<CompiledField>, Vec<CompiledCondition>) {
    let mut fields = Vec::new();
    let mut conditions = Vec::new();
    if parent.is_builtin() {
        ck.error(
            "spec.status",
            format!(
                "{parent} is a built-in kind: trellis does not write status to it (decorator rules get children only)"
            ),
        );
    }
    // Status is decided after every child and patch: it sees `patches`.
    let mut base = context_names(false, false);
    base.insert("patches");
    for (i, f) in status.fields.iter().enumerate() {
        let at = format!("spec.status.fields[{i}]");
        let first = f.path.split('.').next().unwrap_or_default();
        if status.inventory && (first == "children" || first == "childrenTruncated") {
            ck.error(
                &format!("{at}.path"),
                format!(
                    "`{}` is written by trellis itself (status.inventory is on)",
                    f.path
                ),
            );
        }
        fields.extend(compile_field(ck, builder, known, &base, &at, f));
    }
    let mut types = BTreeSet::new();
    for (i, c) in status.conditions.iter().enumerate() {
        let at = format!("spec.status.conditions[{i}]");
        // A per-item type is known only in a pass, which checks it then.
        let new_type = c.for_each.is_some() || types.insert(c.type_.clone());
        conditions.extend(compile_condition(
            ck, builder, known, &base, &at, c, new_type,
        ));
    }
    (fields, conditions)
}

/// One `spec.status.fields` entry: its path, and either a JSONPath on a
/// child or an expression; `None` when neither compiles.
fn compile_field(
    ck: &mut Checker,
    builder: &mut EngineBuilder,
    known: &Known,
    base: &BTreeSet<&str>,
    at: &str,
    f: &StatusField,
) -> Option<CompiledField> {
    let path: Vec<String> = f.path.split('.').map(str::to_owned).collect();
    if path.iter().any(|p| p.is_empty()) {
        ck.error(
            &format!("{at}.path"),
            format!("`{}` is not a dotted path", f.path),
        );
    }
    if path
        .first()
        .is_some_and(|p| p == "conditions" || p == "observedGeneration")
    {
        ck.error(
            &format!("{at}.path"),
            format!("`{}` is written by trellis itself", f.path),
        );
    }
    let mut reads_vars = VarReads::default();
    let source = match (&f.from, &f.json_path, &f.value) {
        (Some(from), Some(jp), None) => {
            if !known.children.contains(from.as_str()) {
                ck.error(&format!("{at}.from"), format!("unknown child id `{from}`"));
            }
            match jsonpath_rust::parser::parse_json_path(jp) {
                Ok(query) => {
                    if f.default.is_some() && !crate::json_path::is_singular(&query) {
                        ck.warning(
                            &format!("{at}.default"),
                            format!(
                                "never used: `{jp}` is not a singular query (a wildcard, \
                                 slice, filter or descendant), so it always yields a list, \
                                 [] when nothing matches or `{from}` does not exist"
                            ),
                        );
                    }
                    Some(FieldSource::JsonPath {
                        child: from.clone(),
                        query,
                        text: jp.clone(),
                    })
                }
                Err(err) => {
                    ck.error(&format!("{at}.jsonPath"), format!("JSONPath syntax: {err}"));
                    None
                }
            }
        }
        (None, None, Some(value)) => match builder.add_expression(value) {
            Ok(id) => {
                lint(
                    ck,
                    builder,
                    &format!("{at}.value"),
                    Code::Expression(id, value),
                );
                let names = builder.expression_names(id, true);
                ck.check_names(
                    &format!("{at}.value"),
                    "a status field's value",
                    names,
                    base,
                    known,
                );
                reads_vars = VarReads::of(&builder.expression_calls(id));
                Some(FieldSource::Value(id))
            }
            Err(err) => {
                ck.error(&format!("{at}.value"), format!("expression syntax: {err}"));
                None
            }
        },
        _ => {
            ck.error(at, "set either `from` with `jsonPath`, or `value`");
            None
        }
    };
    source.map(|source| CompiledField {
        path,
        source,
        default: f.default.clone(),
        reads_vars,
    })
}

/// One `spec.status.conditions` entry: its type (`new_type`: not used by an
/// earlier entry), reason, `when` and `message`; `None` when `when` does not
/// compile.
fn compile_condition(
    ck: &mut Checker,
    builder: &mut EngineBuilder,
    known: &Known,
    base: &BTreeSet<&str>,
    at: &str,
    c: &ConditionSpec,
    new_type: bool,
) -> Option<CompiledCondition> {
    // What `when`, `message` and a per-item `type` read of `vars`.
    let mut reads = Calls::default();
    let (for_each, type_template) = match &c.for_each {
        Some(fe) => {
            let item_names = context_names(true, false)
                .into_iter()
                .chain(["patches"])
                .collect();
            let place = super::for_each::Place {
                field: &format!("{at}.forEach"),
                what: "a condition's forEach",
                allowed: base,
                known,
            };
            let for_each = super::for_each::compile_for_each(ck, builder, &place, fe, &mut reads);
            let type_template = compile_text(
                ck,
                builder,
                (&format!("{at}.type"), "a per-item condition's type"),
                (&format!("condition-type:{at}"), &c.type_),
                &item_names,
                known,
                &mut reads,
            );
            if !c.type_.contains("{{") {
                ck.warning(
                    &format!("{at}.type"),
                    format!(
                        "`{}` is the same for every item: a second item makes it a duplicate type; \
                         write a template such as `{{{{ item | title }}}}Ready`",
                        c.type_
                    ),
                );
            }
            (for_each, type_template)
        }
        None => {
            if c.type_.contains("{{") {
                ck.error(
                    &format!("{at}.type"),
                    "a templated type needs `forEach` (one condition per item)",
                );
            } else if !is_kind(&c.type_) {
                ck.error(
                    &format!("{at}.type"),
                    format!("`{}` is not a CamelCase type", c.type_),
                );
            }
            (None, None)
        }
    };
    // `when` and `message` see `item` and `index` on a per-item condition.
    let names: BTreeSet<&str> = if c.for_each.is_some() {
        base.iter().copied().chain(["item", "index"]).collect()
    } else {
        base.clone()
    };
    let base = &names;
    if c.type_ == "Ready" || c.type_ == "Synced" {
        ck.error(
            &format!("{at}.type"),
            format!("`{}` is written by trellis itself", c.type_),
        );
    }
    if !new_type {
        ck.error(
            &format!("{at}.type"),
            format!("duplicate condition type `{}`", c.type_),
        );
    }
    if !is_reason(&c.reason) {
        ck.error(
            &format!("{at}.reason"),
            format!("`{}` is not a CamelCase reason", c.reason),
        );
    }
    let when = match builder.add_expression(&c.when) {
        Ok(id) => {
            lint(
                ck,
                builder,
                &format!("{at}.when"),
                Code::Expression(id, &c.when),
            );
            let names = builder.expression_names(id, true);
            ck.check_names(
                &format!("{at}.when"),
                "a condition's when",
                names,
                base,
                known,
            );
            merge_reads(&mut reads, builder.expression_calls(id));
            Some(id)
        }
        Err(err) => {
            ck.error(&format!("{at}.when"), format!("expression syntax: {err}"));
            None
        }
    };
    let name = match c.for_each {
        None => format!("condition:{}", c.type_),
        Some(_) => format!("condition:{at}"),
    };
    let message = c.message.as_ref().and_then(|text| {
        compile_text(
            ck,
            builder,
            (&format!("{at}.message"), "a condition's message"),
            (&name, text),
            base,
            known,
            &mut reads,
        )
    });
    let per_item = match (&c.for_each, for_each, type_template) {
        (None, _, _) => None,
        (Some(_), Some(for_each), Some(type_)) => Some(PerItem { for_each, type_ }),
        // Reported: a per-item condition without its forEach or type.
        (Some(_), _, _) => return None,
    };
    when.map(|when| CompiledCondition {
        type_: c.type_.clone(),
        per_item,
        when,
        reason: c.reason.clone(),
        message,
        reads_vars: VarReads::of(&reads),
    })
}

/// A text template (`field`, described as `place`) named `name` with its
/// `text`, checked against the names it may read; what it reads is added
/// to `reads`.
fn compile_text(
    ck: &mut Checker,
    builder: &mut EngineBuilder,
    (field, place): (&str, &str),
    (name, text): (&str, &str),
    allowed: &BTreeSet<&str>,
    known: &Known,
    reads: &mut Calls,
) -> Option<TemplateId> {
    match builder.add_template(name, TemplateKind::Text, text) {
        Ok(id) => {
            lint(ck, builder, field, Code::Text(&id, text));
            let names = builder.template_names(&id, true);
            ck.check_names(field, place, names, allowed, known);
            merge_reads(reads, builder.template_calls(&id));
            Some(id)
        }
        Err(err) => {
            ck.error(field, format!("template syntax: {err}"));
            None
        }
    }
}
