//! Diagnostics of one rule document: each finding with its file, line and
//! field, a finding inside a template on that template's own line, and the
//! check that a template or expression uses only the names its place sees.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;

use super::Known;
use crate::rules::Diagnostic;
use crate::rules::names::{is_api_version, is_child_id, is_kind};
use crate::yaml::LineIndex;

/// Every name of the evaluation context: the base names, then those visible
/// only in some places.
const ALL_NAMES: &[&str] = &[
    "parent", "spec", "metadata", "children", "related", "vars", "rule", "item", "index", "self",
    "patches",
];

/// Collects diagnostics for one rule document.
pub(super) struct Checker<'a> {
    pub file: &'a PathBuf,
    pub lines: &'a LineIndex,
    /// The rule file's text.
    pub source: &'a str,
    /// Field → the `templateFile` its code was read from: a finding inside
    /// that code names the template file and its line there.
    pub template_files: BTreeMap<String, PathBuf>,
    pub diags: &'a mut Vec<Diagnostic>,
    pub errors: usize,
}

impl Checker<'_> {
    /// An entry's (a child's, a patch's, a related entry's) id, apiVersion
    /// and kind, each well-formed.
    pub fn check_entry_names(&mut self, at: &str, id: &str, api_version: &str, kind: &str) {
        if !is_child_id(id) {
            self.error(
                &format!("{at}.id"),
                format!("`{id}` is not a valid id ([a-z][a-z0-9-]*, at most 63)"),
            );
        }
        if !is_api_version(api_version) {
            self.error(
                &format!("{at}.apiVersion"),
                format!("`{api_version}` is not a valid apiVersion"),
            );
        }
        if !is_kind(kind) {
            self.error(
                &format!("{at}.kind"),
                format!("`{kind}` is not a valid kind (CamelCase)"),
            );
        }
    }

    pub fn error(&mut self, field: &str, message: impl Into<String>) {
        self.errors += 1;
        self.diags.push(Diagnostic::error(
            self.file,
            self.lines.line_of(field),
            field,
            message,
        ));
    }

    pub fn warning(&mut self, field: &str, message: impl Into<String>) {
        self.diags.push(Diagnostic::warning(
            self.file,
            self.lines.line_of(field),
            field,
            message,
        ));
    }

    /// A warning about line `line` (1-based) of the code written at `field`:
    /// on that line of its `templateFile`, or of the rule file.
    pub fn warning_in(&mut self, field: &str, code: &str, line: usize, message: impl Into<String>) {
        let diag = match self.template_files.get(field) {
            Some(path) => Diagnostic::warning(path, u64::try_from(line).ok(), field, message),
            None => Diagnostic::warning(self.file, self.line_in(field, code, line), field, message),
        };
        self.diags.push(diag);
    }

    fn line_in(&self, field: &str, code: &str, n: usize) -> Option<u64> {
        code_line(self.lines, self.source, field, code, n)
    }

    /// Names outside the evaluation context of `place` (e.g. "a related
    /// entry's readyWhen"), and `children.<id>`, `related.<id>` or
    /// `vars.<name>` that the rule does not declare (here).
    pub fn check_names(
        &mut self,
        field: &str,
        place: &str,
        used: HashSet<String>,
        allowed: &BTreeSet<&str>,
        known: &Known,
    ) {
        let mut used: Vec<String> = used.into_iter().collect();
        used.sort();
        let mut reported = BTreeSet::new();
        for name in used {
            let mut parts = name.split('.');
            let root = parts.next().unwrap_or_default().to_owned();
            if !allowed.contains(root.as_str()) {
                if reported.insert(root.clone()) {
                    let visible: Vec<&str> = ALL_NAMES
                        .iter()
                        .copied()
                        .filter(|n| allowed.contains(n))
                        .collect();
                    let message = if ALL_NAMES.contains(&root.as_str()) {
                        format!(
                            "`{root}` is not available here ({place} sees {})",
                            and_list(&visible)
                        )
                    } else {
                        format!(
                            "`{root}` is not in the evaluation context (available: {})",
                            visible.join(", ")
                        )
                    };
                    self.error(field, message);
                }
            } else if let Some(id) = parts.next() {
                let (set, what) = match root.as_str() {
                    "children" => (&known.children, "the rule has no child"),
                    "related" => (&known.related, "the rule has no related entry"),
                    "patches" => (&known.patches, "the rule has no patch"),
                    "vars" => (&known.vars, "no var declared before this point is named"),
                    _ => continue,
                };
                if !set.contains(id) && reported.insert(format!("{root}.{id}")) {
                    self.error(field, format!("`{root}.{id}`: {what} `{id}`"));
                }
            }
        }
    }
}

/// `a, b and c`.
fn and_list(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// The rule file's line (`source` its text) of line `n` (1-based) of the code written at
/// `field`: counted in a literal block (`|`), else the first line from
/// the field on that holds its text, else the field's own line.
pub fn code_line(
    lines: &LineIndex,
    source: &str,
    field: &str,
    code: &str,
    n: usize,
) -> Option<u64> {
    let at = lines.line_of(field)?;
    let Some(wanted) = code.lines().nth(n.saturating_sub(1)).map(str::trim) else {
        return Some(at);
    };
    let start = usize::try_from(at).ok()?.saturating_sub(1);
    let mut rest = source.lines().skip(start);
    let header = rest.next().unwrap_or_default();
    // `key: |`, `- |-`, `key: |2 # comment`: the code starts on the next line.
    let literal_block = header
        .split(" #")
        .next()
        .and_then(|h| h.split_whitespace().last())
        .and_then(|t| t.strip_prefix('|'))
        .is_some_and(|t| {
            t.bytes()
                .all(|b| b == b'-' || b == b'+' || b.is_ascii_digit())
        });
    let found = if literal_block {
        rest.nth(n.saturating_sub(1))
            .is_some_and(|l| l.contains(wanted))
            .then_some(n)
    } else {
        // Quoted, plain or folded: near the field, found by its text.
        let window = code.lines().count() * 2 + 1;
        std::iter::once(header)
            .chain(rest)
            .take(window)
            .skip(n.saturating_sub(1))
            .position(|l| l.contains(wanted))
            .map(|p| p + n.saturating_sub(1))
    };
    Some(found.map_or(at, |offset| at + offset as u64))
}
