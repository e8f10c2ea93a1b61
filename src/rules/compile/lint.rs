//! Static checks on templates and expressions that need no evaluation:
//! unknown filters, tests and functions; another tool's `${...}` syntax;
//! every use of `| safe`, on its own line; leading-zero (octal) integer
//! literals in child templates.

use std::sync::OnceLock;

use regex::Regex;

use super::Checker;
use crate::render::{EngineBuilder, ExprId, TemplateId};

/// A compiled piece of rule code to lint.
pub(super) enum Code<'a> {
    /// A child template (renders YAML): octal literals are read as kubectl does.
    Object(&'a TemplateId, &'a str),
    /// A plain-text template (a condition message).
    Text(&'a TemplateId, &'a str),
    Expression(ExprId, &'a str),
}

pub(super) fn lint(ck: &mut Checker, builder: &EngineBuilder, field: &str, code: Code) {
    let (calls, source) = match &code {
        Code::Object(id, src) | Code::Text(id, src) => (builder.template_calls(id), *src),
        Code::Expression(id, src) => (builder.expression_calls(*id), *src),
    };
    for message in builder.unknown_calls(&calls) {
        ck.error(field, message);
    }
    if source.contains("${") {
        ck.warning(
            field,
            "`${...}` is another tool's syntax (kro, shell); trellis reads `{{ ... }}` in templates \
             and bare expressions elsewhere, so this is literal text",
        );
    }
    // A safe string stays safe through vars and related values: wherever
    // it is applied, it is printed unescaped in a child template.
    for (_, line) in calls.filter_uses.iter().filter(|(name, _)| name == "safe") {
        ck.warning_in(
            field,
            source,
            *line,
            "`| safe` turns off JSON escaping where the value is printed in a child template: \
             a value from the parent could add YAML structure",
        );
    }
    if let Code::Object(..) = code {
        for literal in octal_literals(source) {
            ck.warning(
                field,
                format!(
                    "`{literal}` has a leading zero: it is read as octal ({}), as kubectl reads \
                     manifests; write {} or quote it",
                    i64::from_str_radix(literal.trim_start_matches('0'), 8).unwrap_or(0),
                    i64::from_str_radix(literal.trim_start_matches('0'), 8).unwrap_or(0),
                ),
            );
        }
    }
}

/// Plain YAML integers with a leading zero (`mode: 0400`, `- 0644`), outside `{{ }}`.
fn octal_literals(source: &str) -> Vec<&str> {
    static OCTAL: OnceLock<Option<Regex>> = OnceLock::new();
    let Some(re) = OCTAL
        .get_or_init(|| Regex::new(r"(?m)(?:^\s*-|:)\s+(0[0-7]+)\s*(?:#.*)?$").ok())
        .as_ref()
    else {
        return Vec::new();
    };
    re.captures_iter(source)
        .filter_map(|c| c.get(1))
        .map(|m| m.as_str())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::octal_literals;

    #[test]
    fn finds_leading_zero_integers_only() {
        let text = "a: 0400\nb: 400\nc: \"0400\"\n- 0644\nd: 0\ne: {{ 0400 }}\nf: 0x1F\n";
        assert_eq!(octal_literals(text), vec!["0400", "0644"]);
    }
}
