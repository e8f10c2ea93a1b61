//! One child or one patch, compiled: id, kind, template (inline or from a
//! file), `includeWhen`, `forEach`, `readyWhen`, and its dependencies,
//! explicit (`dependsOn`) and implicit (static reads of `children.X`,
//! `related.Y` and, for a patch, `patches.Z`), and the vars it reads.
//!
//! Children and patches share all of this; they differ only in where they
//! sit (`spec.children[i]`, `spec.patches[i]`), in what they may read
//! (`patches` is planned after every child, so only patches and status see
//! it) and in what they may wait for (a child never waits for a patch).

use std::collections::{BTreeMap, BTreeSet};

use super::lint::{Code, lint};
use super::{Checker, CompiledChild, Known, VarReads, context_names, merge_reads, scope};
use crate::kinds::Gvk;
use crate::render::{self, EngineBuilder, TemplateKind};
use crate::rules::load::RawDocument;
use crate::rules::model::{ChildSpec, RuleSpec};

/// What is being compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Child,
    Patch,
}

impl Role {
    fn list(self) -> &'static str {
        match self {
            Role::Child => "children",
            Role::Patch => "patches",
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Role::Child => "child",
            Role::Patch => "patch",
        }
    }

    /// Names visible in this role's templates and expressions.
    fn names(self, for_each: bool, with_self: bool) -> BTreeSet<&'static str> {
        let mut names = context_names(for_each, with_self);
        if self == Role::Patch {
            names.insert("patches");
        }
        names
    }
}

/// What compiling one entry needs of the document being compiled.
pub(super) struct Entry<'e, 'c> {
    pub ck: &'e mut Checker<'c>,
    pub builder: &'e mut EngineBuilder,
    pub doc: &'e RawDocument,
    pub spec: &'e RuleSpec,
    pub known: &'e Known,
    /// Id → template text, as loaded.
    pub templates: &'e mut std::collections::BTreeMap<String, String>,
    /// `templateFile` path as written → contents (the rule's revision).
    pub template_files: &'e mut std::collections::BTreeMap<String, String>,
}

impl Entry<'_, '_> {
    /// Compiles `child` (the `i`th of its role's list); `None` when its
    /// template cannot be had (every problem is reported to the checker).
    pub fn compile(&mut self, role: Role, i: usize, child: &ChildSpec) -> Option<CompiledChild> {
        let ck = &mut *self.ck;
        let builder = &mut *self.builder;
        let (spec, known, doc) = (self.spec, self.known, self.doc);
        let at = format!("spec.{}[{i}]", role.list());
        let noun = role.noun();
        ck.check_entry_names(&at, &child.id, &child.api_version, &child.kind);
        scope::check(ck, &at, spec, child);
        let source = template_source(ck, doc, self.template_files, &at, child);
        let field = if child.template.is_some() {
            format!("{at}.template")
        } else {
            format!("{at}.templateFile")
        };
        let for_each = child.for_each.is_some();
        // Static reads of children.X / related.Y / patches.Z: implicit dependencies.
        let mut reads = render::Calls::default();
        let template = source.and_then(|text| {
            self.templates.insert(child.id.clone(), text.clone());
            match builder.add_template(&child.id, TemplateKind::Object, &text) {
                Ok(id) => {
                    lint(ck, builder, &field, Code::Object(&id, &text));
                    merge_reads(&mut reads, builder.template_calls(&id));
                    let names = builder.template_names(&id, true);
                    let place = if for_each {
                        format!("a forEach {noun}'s template")
                    } else {
                        format!("a {noun}'s template (without forEach)")
                    };
                    ck.check_names(&field, &place, names, &role.names(for_each, false), known);
                    Some(id)
                }
                Err(err) => {
                    ck.error(&field, format!("template syntax: {err}"));
                    None
                }
            }
        });
        let for_each_expr = child.for_each.as_ref().and_then(|fe| {
            let place = super::for_each::Place {
                field: &format!("{at}.forEach"),
                what: &format!("a {noun}'s forEach"),
                allowed: &role.names(false, false),
                known,
            };
            super::for_each::compile_for_each(ck, builder, &place, fe, &mut reads)
        });
        let mut expr =
            |ck: &mut Checker, name: &str, src: &Option<String>, allowed: BTreeSet<&str>| {
                let src = src.as_ref()?;
                let field = format!("{at}.{name}");
                match builder.add_expression(src) {
                    Ok(id) => {
                        lint(ck, builder, &field, Code::Expression(id, src));
                        merge_reads(&mut reads, builder.expression_calls(id));
                        let names = builder.expression_names(id, true);
                        ck.check_names(
                            &field,
                            &format!("a {noun}'s {name}"),
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
            };
        let include_when = expr(
            ck,
            "includeWhen",
            &child.include_when,
            role.names(false, false),
        );
        let ready_when = expr(
            ck,
            "readyWhen",
            &child.ready_when,
            role.names(for_each, true),
        );

        let cluster = child.cluster.as_ref().and_then(|src| {
            let place = super::cluster::Place {
                field: &format!("{at}.cluster"),
                what: &format!("a {noun}'s cluster"),
                allowed: &role.names(false, false),
                known,
            };
            super::cluster::compile(ck, builder, &place, src, Some(&mut reads))
        });
        let deps = dependencies(ck, spec, role, i, &at, child, &reads);
        let hand_off = super::hand_off::compile(ck, &at, child);
        Some(CompiledChild {
            spec: child.clone(),
            gvk: Gvk::new(&child.api_version, &child.kind),
            template: template?,
            include_when,
            for_each: for_each_expr,
            ready_when,
            depends_on: deps.children,
            depends_on_related: deps.related,
            depends_on_patches: deps.patches,
            reads_vars: VarReads::of(&reads),
            hand_off,
            cluster,
        })
    }
}

/// What an entry waits for, as indexes into the rule's lists.
struct Dependencies {
    children: Vec<usize>,
    related: Vec<usize>,
    patches: Vec<usize>,
}

/// An entry's dependencies: explicit (`dependsOn`, checked against the ids
/// it may name) and implicit (static reads of `children.X`, `related.Y`,
/// `patches.Z`); a computed read adds none and is warned about.
fn dependencies(
    ck: &mut Checker,
    spec: &RuleSpec,
    role: Role,
    i: usize,
    at: &str,
    child: &ChildSpec,
    reads: &render::Calls,
) -> Dependencies {
    let noun = role.noun();
    let mut depends_on = Vec::new();
    let mut depends_on_related = Vec::new();
    let mut depends_on_patches = Vec::new();
    let own = |list: &[String], id: &str| list.iter().position(|x| x == id);
    let child_ids: Vec<String> = spec.children.iter().map(|c| c.id.clone()).collect();
    let patch_ids: Vec<String> = spec.patches.iter().map(|p| p.id.clone()).collect();
    let related_ids: Vec<String> = spec.related.iter().map(|r| r.id.clone()).collect();
    let mine = match role {
        Role::Child => &child_ids,
        Role::Patch => &patch_ids,
    };
    for (j, dep) in child.depends_on.iter().enumerate() {
        let here = format!("{at}.dependsOn[{j}]");
        if own(mine, dep) == Some(i) {
            ck.error(&here, format!("{noun} `{dep}` cannot depend on itself"));
        } else if let Some(k) = own(&child_ids, dep) {
            depends_on.push(k);
        } else if let Some(k) = own(&related_ids, dep) {
            depends_on_related.push(k);
        } else if let Some(k) = own(&patch_ids, dep) {
            match role {
                Role::Patch => depends_on_patches.push(k),
                Role::Child => ck.error(
                    &here,
                    format!(
                        "`{dep}` is a patch: patches are planned after every child, \
                         so a child cannot wait for one"
                    ),
                ),
            }
        } else {
            let ids = match role {
                Role::Child => "child or related",
                Role::Patch => "child, related or patch",
            };
            ck.error(&here, format!("unknown {ids} id `{dep}`"));
        }
    }
    // Implicit edges: reading children.X, patches.Z (not its own id) or related.Y.
    for (root, id) in &reads.reads {
        match root.as_str() {
            "children" => match own(&child_ids, id) {
                Some(k) if (role, k) != (Role::Child, i) && !depends_on.contains(&k) => {
                    depends_on.push(k)
                }
                _ => {}
            },
            "patches" => match own(&patch_ids, id) {
                Some(k) if role == Role::Patch && k != i && !depends_on_patches.contains(&k) => {
                    depends_on_patches.push(k)
                }
                _ => {}
            },
            "related" => {
                if let Some(k) = own(&related_ids, id)
                    && !depends_on_related.contains(&k)
                {
                    depends_on_related.push(k);
                }
            }
            // `vars.*` adds no edge: a var sees whatever is observed.
            _ => {}
        }
    }
    for root in reads.dynamic.iter().filter(|r| *r != "vars") {
        ck.warning(
            at,
            format!(
                "reads `{root}` with a computed subscript: that adds no dependency; \
                 list what must be ready first in `dependsOn`"
            ),
        );
    }
    Dependencies {
        children: depends_on,
        related: depends_on_related,
        patches: depends_on_patches,
    }
}

/// The template's text: inline, or read from `templateFile` (which the
/// checker then names in findings inside it, and the revision counts).
fn template_source(
    ck: &mut Checker,
    doc: &RawDocument,
    template_files: &mut BTreeMap<String, String>,
    at: &str,
    child: &ChildSpec,
) -> Option<String> {
    match (&child.template, &child.template_file) {
        (Some(t), None) => Some(t.clone()),
        (None, Some(rel)) => match doc.template_file(rel) {
            Ok(text) => {
                let dir = doc.file.parent().unwrap_or(&doc.root);
                ck.template_files
                    .insert(format!("{at}.templateFile"), dir.join(rel));
                template_files.insert(rel.clone(), text.clone());
                Some(text)
            }
            Err(err) => {
                ck.error(&format!("{at}.templateFile"), err.to_string());
                None
            }
        },
        (Some(_), Some(_)) => {
            ck.error(at, "set either `template` or `templateFile`, not both");
            None
        }
        (None, None) => {
            ck.error(at, "needs `template` or `templateFile`");
            None
        }
    }
}
