//! What a template or expression calls, read from its compiled instructions:
//! filters, tests and functions by name, and the names it assigns itself.
//!
//! `check` uses this to reject an unknown filter before anything renders,
//! and to know that a variable set in `{% if %}`/`{% else %}` branches is
//! the template's own (minijinja's `undeclared_variables` reports it).

use std::collections::BTreeSet;
use std::sync::Arc;

use minijinja::machinery::{CompiledTemplate, Instruction, TemplateConfig};
use minijinja::syntax::SyntaxConfig;
use minijinja::{AutoEscape, Environment, ErrorKind};

/// Names a piece of template code calls or assigns.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Calls {
    pub filters: BTreeSet<String>,
    /// Every filter applied, with its line (1-based) in the code, in line order.
    pub filter_uses: Vec<(String, usize)>,
    pub tests: BTreeSet<String>,
    pub functions: BTreeSet<String>,
    /// Variables and macros the code assigns (`set`, `for`, `macro`).
    pub locals: BTreeSet<String>,
    /// `(root, id)` for every static read of `children.<id>`,
    /// `children["<id>"]` and the same under `related`, `patches` and `vars`.
    pub reads: BTreeSet<(String, String)>,
    /// Roots (`children`, `related`, `patches`, `vars`) read other than by a
    /// constant id: by a computed subscript, or whole (`vars | tojson`).
    pub dynamic: BTreeSet<String>,
    /// Whether the code reads `self` from the context (minijinja reserves
    /// the name in templates, so it never counts as undeclared there).
    pub reads_self: bool,
}

/// Context names whose reads are recorded: `children`, `related` and
/// `patches` for dependency edges, `vars` for what a var that fails in a
/// pass withholds.
const READ_ROOTS: [&str; 4] = ["children", "related", "patches", "vars"];

/// Scans `source` (a template; wrap an expression in `{{ }}` first).
pub fn scan(source: &str) -> Calls {
    let config = TemplateConfig {
        syntax_config: SyntaxConfig::default(),
        default_auto_escape: Arc::new(|_: &str| AutoEscape::None),
    };
    let mut calls = Calls::default();
    let Ok(compiled) = CompiledTemplate::new("check", source, &config) else {
        return calls;
    };
    let blocks = compiled.blocks.values();
    for instructions in std::iter::once(&compiled.instructions).chain(blocks) {
        let mut pc = 0;
        while let Some(instruction) = instructions.get(pc) {
            match instruction {
                Instruction::ApplyFilter(name, ..) => {
                    calls.filters.insert((*name).to_owned());
                    let line = instructions.get_line(pc).unwrap_or(1);
                    calls.filter_uses.push(((*name).to_owned(), line));
                }
                Instruction::PerformTest(name, ..) => {
                    calls.tests.insert((*name).to_owned());
                }
                Instruction::CallFunction(name, ..) => {
                    calls.functions.insert((*name).to_owned());
                }
                Instruction::StoreLocal(name) | Instruction::BuildMacro(name, ..) => {
                    calls.locals.insert((*name).to_owned());
                }
                Instruction::Lookup("self") => calls.reads_self = true,
                Instruction::Lookup(root) if READ_ROOTS.contains(root) => {
                    let id = match (instructions.get(pc + 1), instructions.get(pc + 2)) {
                        (Some(Instruction::GetAttr(id)), _) => Some((*id).to_owned()),
                        (Some(Instruction::LoadConst(v)), Some(Instruction::GetItem)) => {
                            v.as_str().map(str::to_owned)
                        }
                        _ => None,
                    };
                    match id {
                        Some(id) => {
                            calls.reads.insert(((*root).to_owned(), id));
                        }
                        None => {
                            calls.dynamic.insert((*root).to_owned());
                        }
                    }
                }
                _ => {}
            }
            pc += 1;
        }
    }
    calls.filter_uses.sort_by_key(|(_, line)| *line);
    calls
}

/// Messages for every filter, test or function `calls` names that `env` lacks.
pub fn unknown(env: &Environment<'_>, calls: &Calls) -> Vec<String> {
    let mut out = Vec::new();
    let state = env.empty_state();
    let mut state = state;
    for name in &calls.filters {
        if let Err(e) = state.apply_filter(name, &[])
            && e.kind() == ErrorKind::UnknownFilter
        {
            out.push(format!("unknown filter `{name}`"));
        }
    }
    for name in &calls.tests {
        if let Err(e) = state.perform_test(name, &[])
            && e.kind() == ErrorKind::UnknownTest
        {
            out.push(format!("unknown test `{name}`"));
        }
    }
    for name in &calls.functions {
        let global = env.globals().any(|(g, _)| g == name);
        if !global && !calls.locals.contains(name) {
            out.push(format!("unknown function `{name}`"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads(source: &str) -> Vec<(String, String)> {
        scan(source).reads.into_iter().collect()
    }

    #[test]
    fn static_reads_of_children_and_related_are_found() {
        assert_eq!(
            reads("{{ children.db.status.x }} {{ related['src'].data }}"),
            vec![
                ("children".to_owned(), "db".to_owned()),
                ("related".to_owned(), "src".to_owned())
            ]
        );
        assert!(scan("{{ children.db is defined }}").dynamic.is_empty());
    }

    #[test]
    fn every_filter_use_is_listed_with_its_line() {
        let calls = scan(
            "a: {{ x | safe }}\n{% if y %}\nb: {{ y|upper|safe }}\n{% endif %}\n{% macro m(v) %}{{ v | safe }}{% endmacro %}",
        );
        let safe: Vec<usize> = calls
            .filter_uses
            .iter()
            .filter(|(name, _)| name == "safe")
            .map(|(_, line)| *line)
            .collect();
        assert_eq!(safe, vec![1, 3, 5]);
    }

    #[test]
    fn vars_read_by_name_or_whole_are_told_apart() {
        let calls = scan("{{ vars.full }} {{ vars['short'] | default('') }}");
        assert_eq!(
            calls.reads.into_iter().collect::<Vec<_>>(),
            [
                ("vars".to_owned(), "full".to_owned()),
                ("vars".to_owned(), "short".to_owned())
            ]
        );
        assert!(scan("{{ vars | tojson }}").dynamic.contains("vars"));
        assert!(
            scan("{% for k in vars %}{{ k }}{% endfor %}")
                .dynamic
                .contains("vars")
        );
    }

    #[test]
    fn dynamic_subscripts_are_reported_not_read() {
        let calls = scan("{{ children[spec.which] }}");
        assert!(calls.reads.is_empty());
        assert!(calls.dynamic.contains("children"));
    }
}
