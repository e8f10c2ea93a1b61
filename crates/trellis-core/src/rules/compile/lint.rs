//! Static checks on templates and expressions that need no evaluation:
//! unknown filters, tests and functions; another tool's `${...}` syntax;
//! every use of `| safe`; leading-zero (octal) integer literals in code
//! that renders YAML. A finding inside the code names its own line.

use super::Checker;
use crate::render::{EngineBuilder, ExprId, TemplateId};

/// A compiled piece of rule code to lint.
pub(super) enum Code<'a> {
    /// Renders YAML (a child, a var `template:`, a whole selector part):
    /// octal literals are read as kubectl does.
    Object(&'a TemplateId, &'a str),
    /// A plain-text template (a name, a label value, a condition message).
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
        for (line, literal) in octal_literals(source) {
            let value = i64::from_str_radix(literal.trim_start_matches('0'), 8).unwrap_or(0);
            ck.warning_in(
                field,
                source,
                line,
                format!(
                    "`{literal}` has a leading zero: it is read as octal ({value}), as kubectl \
                     reads manifests; write {value} or quote it"
                ),
            );
        }
    }
}

/// Plain YAML integers with a leading zero, block style (`mode: 0400`,
/// `- 0644`) or flow style (`{mode: 0400}`, `[0400, 0644]`), with their line
/// (1-based). Not inside `{{ }}`/`{% %}`/`{# #}`, quotes, comments or block
/// scalars (`|`, `>`), and not part of a longer plain scalar (`echo a,0400`).
fn octal_literals(source: &str) -> Vec<(usize, String)> {
    let masked = mask_jinja(source);
    let mut found = Vec::new();
    let mut flow_depth = 0usize;
    // Inside a quoted scalar (it may span lines): its quote character.
    let mut quote: Option<u8> = None;
    // Inside a block scalar: lines indented past this column belong to it.
    let mut block_past: Option<usize> = None;
    // Whether a new scalar may start here.
    let mut at_value = true;
    for (number, line) in masked.split('\n').enumerate() {
        let b = line.as_bytes();
        let indent = b.iter().take_while(|&&c| c == b' ').count();
        if let Some(past) = block_past {
            if line.trim().is_empty() || indent > past {
                continue;
            }
            block_past = None;
        }
        if flow_depth == 0 && quote.is_none() {
            at_value = true;
        }
        // The column of the line's node (after any `- `), and of its last `- `.
        let mut node_column = indent;
        let mut dash_column = None;
        let spaced = |n: Option<&u8>| n.is_none_or(|n| matches!(n, b' ' | b'\t'));
        let mut i = indent;
        while i < b.len() {
            let c = b[i];
            if let Some(q) = quote {
                if c == b'\\' && q == b'"' {
                    i += 2;
                    continue;
                }
                if c == q && !(q == b'\'' && b.get(i + 1) == Some(&b'\'')) {
                    quote = None;
                } else if c == q {
                    i += 1;
                }
                i += 1;
                continue;
            }
            let next = b.get(i + 1);
            match c {
                b' ' | b'\t' => {}
                b'#' if i == 0 || matches!(b[i - 1], b' ' | b'\t') => break,
                b'-' if flow_depth == 0 && at_value && spaced(next) => {
                    dash_column = Some(i);
                    node_column = i + 1 + b[i + 1..].iter().take_while(|&&c| c == b' ').count();
                }
                b':' if spaced(next)
                    || flow_depth > 0 && matches!(next, Some(b',' | b']' | b'}')) =>
                {
                    at_value = true;
                }
                b',' if flow_depth > 0 => at_value = true,
                b'[' | b'{' if at_value => flow_depth += 1,
                b']' | b'}' if flow_depth > 0 => {
                    flow_depth -= 1;
                    at_value = false;
                }
                b'"' | b'\'' if at_value => {
                    quote = Some(c);
                    at_value = false;
                }
                b'|' | b'>' if at_value && flow_depth == 0 && is_block_header(&b[i + 1..]) => {
                    // Content is indented past the node that holds the scalar:
                    // the key, or the `-` of an item that is the scalar itself.
                    block_past = Some(match dash_column {
                        Some(dash) if i == node_column => dash,
                        _ => node_column,
                    });
                    break;
                }
                _ if at_value => {
                    let end = i + scalar_len(&b[i..], flow_depth > 0);
                    let rest = line[end..].trim_start();
                    let alone = rest.is_empty()
                        || rest.starts_with('#')
                        || flow_depth > 0 && rest.starts_with([',', ']', '}']);
                    if alone && is_octal(&b[i..end]) {
                        found.push((number + 1, line[i..end].to_owned()));
                    }
                    at_value = false;
                    i = end;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
    found
}

/// `0400`, `0644`: a zero, then octal digits.
fn is_octal(token: &[u8]) -> bool {
    token.len() > 1 && token[0] == b'0' && token[1..].iter().all(|d| (b'0'..=b'7').contains(d))
}

/// What follows `|` or `>` of a block scalar header: indicators, a comment.
fn is_block_header(rest: &[u8]) -> bool {
    let mut i = 0;
    while i < rest.len() && matches!(rest[i], b'-' | b'+' | b'0'..=b'9') {
        i += 1;
    }
    let tail = &rest[i..];
    let blank = tail
        .iter()
        .take_while(|&&c| matches!(c, b' ' | b'\t'))
        .count();
    blank == tail.len() || blank > 0 && tail[blank] == b'#'
}

/// Length of the plain scalar starting at `b[0]`, up to the first token
/// that ends it: `: `, whitespace, and in flow `,` and brackets.
fn scalar_len(b: &[u8], flow: bool) -> usize {
    let mut end = 0;
    while end < b.len() {
        let c = b[end];
        let next = b.get(end + 1);
        let ends_key = c == b':'
            && (next.is_none_or(|n| matches!(n, b' ' | b'\t'))
                || flow && matches!(next, Some(b',' | b']' | b'}')));
        if ends_key
            || matches!(c, b' ' | b'\t')
            || flow && matches!(c, b',' | b'[' | b']' | b'{' | b'}')
        {
            break;
        }
        end += 1;
    }
    end
}

/// `source` with every `{{ }}` region blanked to `x` and every `{% %}` and
/// `{# #}` region to spaces, byte for byte (newlines kept), so template code
/// never reads as YAML.
fn mask_jinja(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find('{') {
        // A printed value is some scalar; a statement or comment prints nothing.
        let (close, fill) = match rest.as_bytes().get(start + 1) {
            Some(b'{') => ("}}", 'x'),
            Some(b'%') => ("%}", ' '),
            Some(b'#') => ("#}", ' '),
            _ => {
                out.push_str(&rest[..=start]);
                rest = &rest[start + 1..];
                continue;
            }
        };
        out.push_str(&rest[..start]);
        let end = rest[start + 2..]
            .find(close)
            .map_or(rest.len(), |e| start + 2 + e + 2);
        for c in rest[start..end].chars() {
            if c == '\n' {
                out.push('\n');
            } else {
                out.extend(std::iter::repeat_n(fill, c.len_utf8()));
            }
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::octal_literals;

    fn literals(text: &str) -> Vec<(usize, String)> {
        octal_literals(text)
    }

    fn at(found: &[(usize, &str)]) -> Vec<(usize, String)> {
        found.iter().map(|(l, s)| (*l, (*s).to_owned())).collect()
    }

    #[test]
    fn finds_leading_zero_integers_in_block_style() {
        let text =
            "a: 0400\nb: 400\nc: \"0400\"\n- 0644\nd: 0\ne: {{ 0400 }}\nf: 0x1F\ng: 0400 # mode\n";
        assert_eq!(literals(text), at(&[(1, "0400"), (4, "0644"), (8, "0400")]));
    }

    #[test]
    fn finds_leading_zero_integers_in_flow_style() {
        let text = "a: {mode: 0400}\nb: [0400]\nc: [1, 0644, 2]\nd: {x: 1, mode: 0755, y: 2}\ne: {\n  mode: 0400,\n  n: [\n    0600\n  ]\n}\n- {path: a, mode: 0440}\n";
        assert_eq!(
            literals(text),
            at(&[
                (1, "0400"),
                (2, "0400"),
                (3, "0644"),
                (4, "0755"),
                (6, "0400"),
                (8, "0600"),
                (11, "0440")
            ])
        );
    }

    #[test]
    fn no_false_positives() {
        let text = concat!(
            "a: \"0400\"\n",
            "b: '0400'\n",
            "c: [\"0400\", '0644']\n",
            "d: {mode: \"0400\"}\n",
            "e: 0.5\n",
            "f: [0, 0.5, 00.5]\n",
            "g: 0\n",
            "h: echo a,0400\n",
            "i: echo [0400]\n",
            "j: 0400 apples\n",
            "k: {x: {{ 0400 }}}\n",
            "m: 089\n",
            "# n: 0400\n",
            "o: x # 0400\n",
            "p: |\n  mode: 0400\n  - 0644\n",
            "q: >-\n  [0400]\n",
            "r: \"it's {mode: 0400}\"\n",
            "s: 'a ''b'' [0400]'\n",
            "0400: key\n",
            "{{ x }}: 0\n",
        );
        assert_eq!(literals(text), Vec::<(usize, String)>::new());
    }

    #[test]
    fn a_literal_printed_by_a_branch_is_found() {
        let text = "l: [{{ spec.m }}, {% if x %}0400{% endif %}]\n{% for i in x %}\n- 0644\n{% endfor %}\n";
        assert_eq!(literals(text), at(&[(1, "0400"), (3, "0644")]));
    }

    #[test]
    fn a_block_scalar_ends_where_its_indentation_does() {
        let text =
            "- script: |\n    chmod 0400 f\n    mode: 0400\n  mode: 0400\n- |\n  0644\n- 0600\n";
        assert_eq!(literals(text), at(&[(4, "0400"), (7, "0600")]));
    }
}
