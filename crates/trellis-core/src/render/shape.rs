//! The YAML collection a template's own text writes: a block sequence
//! (`- item` lines) or a block mapping (`key: value` lines), read from its
//! compiled instructions.
//!
//! A template that builds a list with a loop renders *nothing* when the
//! loop has no items, and an empty YAML document is null, not `[]`. What
//! the template meant is in its literal text, outside every tag: the first
//! line of it that holds anything (each `{{ }}` standing for one value,
//! `{% %}` tags and comments left out) starts with `- ` for a sequence, or
//! is `key: …` for a mapping. `plan::vars` gives a `template:` var that
//! renders no YAML node the empty value of that shape.

use std::sync::Arc;

use minijinja::AutoEscape;
use minijinja::machinery::{CompiledTemplate, Instruction, TemplateConfig};
use minijinja::syntax::SyntaxConfig;
use serde_json::{Value, json};

/// What a template's literal text writes at its top level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `- item` lines.
    Sequence,
    /// `key: value` lines.
    Mapping,
}

impl Shape {
    /// The shape's value with nothing in it: `[]` or `{}`.
    pub fn empty(self) -> Value {
        match self {
            Shape::Sequence => json!([]),
            Shape::Mapping => json!({}),
        }
    }
}

/// The shape `source` (a template) writes; `None` when its text writes
/// neither (a bare `{{ value }}`, a flow collection, a scalar).
pub fn of(source: &str) -> Option<Shape> {
    let config = TemplateConfig {
        syntax_config: SyntaxConfig::default(),
        default_auto_escape: Arc::new(|_: &str| AutoEscape::None),
    };
    let compiled = CompiledTemplate::new("shape", source, &config).ok()?;
    // The text as if every loop ran once and every branch were taken, in
    // the order written; each printed value is `v`.
    let mut text = String::new();
    let instructions = &compiled.instructions;
    let mut pc = 0;
    while let Some(instruction) = instructions.get(pc) {
        match instruction {
            Instruction::EmitRaw(raw) => text.push_str(raw),
            Instruction::Emit => text.push('v'),
            _ => {}
        }
        pc += 1;
    }
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#') && *l != "---")?;
    if line == "-" || line.starts_with("- ") {
        return Some(Shape::Sequence);
    }
    // A key, plain or quoted, then `:` ending the line or before a space.
    let after_key = match line.chars().next()? {
        '[' | '{' => return None,
        quote @ ('"' | '\'') => &line[line[1..].find(quote)? + 2..],
        _ => &line[line.find(':').filter(|&i| i > 0)?..],
    };
    (after_key == ":" || after_key.starts_with(": ")).then_some(Shape::Mapping)
}

/// Whether rendered YAML `text` holds no node: only blank and comment
/// lines (what a loop with no items leaves), as opposed to an explicit
/// `null` or `~`.
pub fn holds_nothing(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .all(|l| l.is_empty() || l.starts_with('#'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_of_list_items_writes_a_sequence() {
        let source = "{% for h in hosts %}\n- name: {{ h }}\n  port: 80\n{% endfor %}\n";
        assert_eq!(of(source), Some(Shape::Sequence));
        assert_eq!(
            of("{%- if x -%}\n-  {{ x }}\n{%- endif %}"),
            Some(Shape::Sequence)
        );
        assert_eq!(
            of("# hosts\n{% for h in hs %}\n-\n  {{ h }}\n{% endfor %}"),
            Some(Shape::Sequence)
        );
    }

    #[test]
    fn a_loop_of_keys_writes_a_mapping() {
        assert_eq!(
            of("{% for k, v in m | items %}\n{{ k }}: {{ v }}\n{% endfor %}"),
            Some(Shape::Mapping)
        );
        assert_eq!(of("name: {{ x }}\nitems:\n- a\n"), Some(Shape::Mapping));
        assert_eq!(
            of("{% if x %}\nkey:\n  - a\n{% endif %}"),
            Some(Shape::Mapping)
        );
        assert_eq!(of("\"app/name\": {{ x }}"), Some(Shape::Mapping));
    }

    #[test]
    fn a_bare_value_or_a_flow_collection_writes_neither() {
        for source in [
            "{{ x }}",
            "[{{ x }}]",
            "{a: 1}",
            "~",
            "'a: b'",
            "http://x",
            "",
            "{# - a #}",
        ] {
            assert_eq!(of(source), None, "{source}");
        }
    }

    #[test]
    fn only_blank_and_comment_lines_hold_nothing() {
        assert!(holds_nothing("\n  \n# none\n"));
        assert!(!holds_nothing("~\n"));
        assert!(!holds_nothing("null"));
        assert!(!holds_nothing("[]"));
    }
}
