//! `bind` grants for binding children: the roles a RoleBinding or
//! ClusterRoleBinding template may reference, read from its text.

use super::{Bind, Grants, RBAC_GROUP};
use crate::kinds::Gvk;

/// A child kind that binds a role, which the API server allows only to
/// holders of every permission in the role or of `bind` on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BindingKind {
    RoleBinding,
    ClusterRoleBinding,
}

impl BindingKind {
    pub(super) fn of(gvk: &Gvk) -> Option<BindingKind> {
        match (gvk.group.as_str(), gvk.kind.as_str()) {
            (RBAC_GROUP, "RoleBinding") => Some(BindingKind::RoleBinding),
            (RBAC_GROUP, "ClusterRoleBinding") => Some(BindingKind::ClusterRoleBinding),
            _ => None,
        }
    }
}

/// A `roleRef` found in a template; `None` where the value is templated or
/// cannot be read statically.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RoleRef {
    pub(super) kind: Option<String>,
    pub(super) name: Option<String>,
}

impl RoleRef {
    const UNKNOWN: RoleRef = RoleRef {
        kind: None,
        name: None,
    };
}

/// `bind` on the roles a binding child may reference: limited by
/// `resourceNames` when the name is static, on every role of the kind
/// otherwise. A ClusterRoleBinding can only reference a ClusterRole; a static
/// kind that is neither Role nor ClusterRole gets nothing (the API server
/// rejects such a binding anyway).
pub(super) fn bind_grants(binding: BindingKind, refs: &[RoleRef], grants: &mut Grants) {
    for role_ref in refs {
        let resources: &[&str] = match role_ref.kind.as_deref() {
            Some("ClusterRole") => &["clusterroles"],
            Some("Role") if binding == BindingKind::RoleBinding => &["roles"],
            Some(_) => &[],
            None if binding == BindingKind::RoleBinding => &["clusterroles", "roles"],
            None => &["clusterroles"],
        };
        for resource in resources {
            match &role_ref.name {
                Some(name) => grants.allow_named(RBAC_GROUP, resource, Bind, name),
                None => grants.allow(RBAC_GROUP, resource, &[Bind]),
            }
        }
    }
}

/// Every `roleRef` a binding template may render, read from its text.
///
/// A `roleRef:` line starts a block of more-indented lines whose `kind:` and
/// `name:` are static when they hold no `{{`/`{%` and the block holds no
/// `{%`; a flow mapping `roleRef: {kind: ClusterRole, name: view}` is read the
/// same way. Every occurrence counts, so `{% if %}` branches around whole
/// `roleRef:` blocks each contribute their role. When the text mentions
/// `roleRef` in a way not read here (inside an expression, say), or not at
/// all, an unknown reference is added so the role stays sufficient.
pub(super) fn role_refs(template: &str) -> Vec<RoleRef> {
    let lines: Vec<&str> = template.lines().collect();
    let mut refs = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let Some(rest) = trimmed.strip_prefix("roleRef:") else {
            continue;
        };
        let indent = line.len() - trimmed.len();
        let rest = strip_comment(rest).trim();
        refs.push(if rest.is_empty() {
            block_role_ref(&lines[i + 1..], indent)
        } else if rest.starts_with('{') && !rest.starts_with("{{") && !rest.starts_with("{%") {
            flow_role_ref(&lines[i..], rest)
        } else {
            RoleRef::UNKNOWN
        });
    }
    if template.matches("roleRef").count() > refs.len() {
        refs.push(RoleRef::UNKNOWN);
    }
    refs
}

/// A block-style `roleRef` body: the lines after `roleRef:` indented deeper
/// than `indent` (blank and comment lines do not end it).
fn block_role_ref(after: &[&str], indent: usize) -> RoleRef {
    let mut body = Vec::new();
    for line in after {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if line.len() - trimmed.len() <= indent {
            break;
        }
        body.push(*line);
    }
    if body.is_empty() || body.iter().any(|l| l.contains("{%")) {
        return RoleRef::UNKNOWN;
    }
    // Only the block's own keys, not those of anything nested deeper.
    let key_indent = body
        .iter()
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    let mut role_ref = RoleRef::UNKNOWN;
    for line in body
        .iter()
        .filter(|l| l.len() - l.trim_start().len() == key_indent)
    {
        if let Some((key, value)) = line.trim().split_once(':') {
            match key.trim() {
                "kind" => role_ref.kind = static_scalar(value),
                "name" => role_ref.name = static_scalar(value),
                _ => {}
            }
        }
    }
    role_ref
}

/// A flow-style `roleRef: {kind: ..., name: ...}`, possibly spanning lines
/// (`from[0]` is the `roleRef:` line, `rest` what follows the key on it).
fn flow_role_ref(from: &[&str], rest: &str) -> RoleRef {
    let mut text = rest.to_owned();
    for line in &from[1..] {
        if balanced_end(&text).is_some() {
            break;
        }
        text.push(' ');
        text.push_str(strip_comment(line).trim());
    }
    let Some(end) = balanced_end(&text) else {
        return RoleRef::UNKNOWN;
    };
    let inner = &text[1..end];
    if inner.contains("{%") {
        return RoleRef::UNKNOWN;
    }
    let mut role_ref = RoleRef::UNKNOWN;
    for entry in split_top_level(inner) {
        if let Some((key, value)) = entry.split_once(':') {
            match unquote(key.trim()) {
                "kind" => role_ref.kind = static_scalar(value),
                "name" => role_ref.name = static_scalar(value),
                _ => {}
            }
        }
    }
    role_ref
}

/// Byte index of the brace closing the `{` that starts `text`, if any.
fn balanced_end(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote = None;
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '{' | '[') => depth += 1,
            (None, '}' | ']') => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Splits a flow mapping's inside at commas outside nested braces, brackets
/// and quotes (so `{{ a ~ ", " ~ b }}` stays one value).
fn split_top_level(inner: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut quote, mut start) = (0usize, None, 0);
    for (i, c) in inner.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '{' | '[') => depth += 1,
            (None, '}' | ']') => depth = depth.saturating_sub(1),
            (None, ',') if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
}

/// A plain or quoted scalar with no template syntax in it; `None` otherwise.
fn static_scalar(value: &str) -> Option<String> {
    let value = unquote(strip_comment(value).trim());
    let templated = value.contains("{{") || value.contains("{%");
    let structured = value.starts_with(['{', '[', '&', '*', '|', '>']);
    (!value.is_empty() && !templated && !structured).then(|| value.to_owned())
}

fn unquote(s: &str) -> &str {
    for q in ['"', '\''] {
        if let Some(inner) = s.strip_prefix(q).and_then(|s| s.strip_suffix(q)) {
            return inner;
        }
    }
    s
}

/// Drops a YAML comment (` #` outside quotes) from the end of a line.
fn strip_comment(line: &str) -> &str {
    let mut quote = None;
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '#') if prev.is_whitespace() => return &line[..i],
            _ => {}
        }
        prev = c;
    }
    line
}
