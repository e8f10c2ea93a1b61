//! Labels a child template sets that trellis overwrites: every child gets
//! `app.kubernetes.io/managed-by: trellis` and trellis's own `trellis.dev/*`
//! labels (`crate::labels`), written over whatever the template says. A
//! template that sets one would silently lose its value (and a selector
//! built on it would match nothing the author meant), so `check` warns.
//!
//! The template is read as text (it is not YAML until rendered): each key
//! that looks reserved is confirmed to sit under `metadata.labels` by the
//! same line finder the schema findings use ([`super::lines`]).

use super::{Context, Entry, Finding, diagnostic, lines};
use crate::labels::LABEL_MANAGED_BY;
use crate::rules::{CompiledRule, Diagnostic};

/// The prefix of the labels trellis keeps to itself.
const RESERVED_PREFIX: &str = "trellis.dev/";

/// A warning for each reserved label a child template sets.
pub fn reserved_labels(rule: &CompiledRule, cx: &Context) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for (i, child) in rule.children.iter().enumerate() {
        let Some(template) = rule.templates.get(&child.spec.id) else {
            continue;
        };
        for key in reserved_keys(template) {
            let keys = vec!["metadata".to_owned(), "labels".to_owned(), key.clone()];
            if lines::line_of(template, &keys).is_none() {
                continue;
            }
            let finding = Finding {
                path: format!("metadata.labels[\"{key}\"]"),
                keys,
                message: format!(
                    "trellis sets this label on every child and overwrites the template's \
                     value (`{LABEL_MANAGED_BY}` and `{RESERVED_PREFIX}*` are trellis's own); \
                     use a label of your own"
                ),
            };
            out.push(diagnostic(rule, Entry::Child(i), &finding, cx));
        }
    }
    out
}

/// Keys in `template` that are reserved, each once, in order: a token
/// `app.kubernetes.io/managed-by` or `trellis.dev/<name>` (not the tail of
/// a longer domain such as `demo.trellis.dev/`) followed by a colon.
fn reserved_keys(template: &str) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    let is_key_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/');
    for (at, _) in template
        .match_indices(RESERVED_PREFIX)
        .chain(template.match_indices(LABEL_MANAGED_BY))
    {
        if template[..at].chars().next_back().is_some_and(is_key_char) {
            continue;
        }
        let key: String = template[at..]
            .chars()
            .take_while(|&c| is_key_char(c))
            .collect();
        let rest = template[at + key.len()..].trim_start_matches(['"', '\'']);
        let reserved = key == LABEL_MANAGED_BY
            || key
                .strip_prefix(RESERVED_PREFIX)
                .is_some_and(|n| !n.is_empty());
        if reserved && rest.starts_with(':') && !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::reserved_keys;

    #[test]
    fn reserved_keys_are_trellis_own_not_longer_domains_or_values() {
        let template = "metadata:
  labels:
    app.kubernetes.io/managed-by: helm
    \"trellis.dev/rule\": mine
    demo.trellis.dev/tenant: x
  annotations: {note: \"see trellis.dev/docs\"}
";
        assert_eq!(
            reserved_keys(template),
            ["trellis.dev/rule", "app.kubernetes.io/managed-by"]
        );
    }
}
