//! What a well-formed name is in a rule: DNS-1123 labels and subdomains,
//! child ids, kinds, apiVersions and condition reasons. The compiler checks
//! a rule's names with these, and so does the generation of its CRD
//! (plural, short names, categories): one definition of each.

/// Whether `name` may name a cluster (a spoke's Secret label, a
/// `--cluster-name`, a `cluster:` value): a DNS-1123 label.
pub(crate) fn check_cluster_name(name: &str) -> Result<(), String> {
    if is_dns_label(name) {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not a cluster name (a DNS-1123 label: lowercase letters, digits, '-', at most 63)"
        ))
    }
}

/// The text of a string literal that is the whole expression (a
/// `cluster:` naming one cluster, `"'eu-1'"`).
pub(crate) fn quoted_constant(src: &str) -> Option<&str> {
    let src = src.trim();
    ['\'', '"'].into_iter().find_map(|q| {
        let inner = src.strip_prefix(q)?.strip_suffix(q)?;
        (!inner.contains(q)).then_some(inner)
    })
}

/// A DNS-1123 label (a namespace, a plural): lowercase letters, digits and
/// '-', at most 63 characters, neither starting nor ending with '-'.
pub(super) fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain (a ServiceAccount's name): dot-separated labels,
/// at most 253 characters.
pub(super) fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

pub(super) fn is_child_id(s: &str) -> bool {
    let mut bytes = s.bytes();
    s.len() <= 63
        && bytes.next().is_some_and(|b| b.is_ascii_lowercase())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

pub(super) fn is_kind(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase()) && chars.all(|c| c.is_ascii_alphanumeric())
}

/// A condition type trellis writes: CamelCase, at most 316 characters
/// (metav1.Condition's limit).
pub(crate) fn is_condition_type(s: &str) -> bool {
    s.len() <= 316 && is_kind(s)
}

pub(super) fn is_api_version(s: &str) -> bool {
    let (group, version) = s.split_once('/').unwrap_or(("", s));
    let version_ok = !version.is_empty()
        && version
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let group_ok = group.is_empty() || group.split('.').all(is_dns_label);
    version_ok && group_ok && !(group.is_empty() && s.contains('/'))
}

pub(super) fn is_reason(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ',' || c == ':')
        && s.len() <= 1024
}
