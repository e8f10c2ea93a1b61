//! `spec.propagate`, checked: each key a label or annotation key as
//! Kubernetes spells them (`[prefix/]name`), or the start of one ending in
//! `*`; never a key trellis writes itself.

use super::Checker;
use crate::rules::model::Propagate;

/// Most keys one list of `propagate` may name.
pub const MAX_PROPAGATE_KEYS: usize = 64;

/// Reports every malformed key of `propagate` (an error) and every key
/// that can only match what trellis writes itself (a warning: never copied).
pub(super) fn check_propagate(ck: &mut Checker, propagate: &Propagate) {
    for (list, keys) in [
        ("labels", &propagate.labels),
        ("annotations", &propagate.annotations),
    ] {
        if keys.len() > MAX_PROPAGATE_KEYS {
            ck.error(
                &format!("spec.propagate.{list}"),
                format!(
                    "names {} keys, more than the limit of {MAX_PROPAGATE_KEYS}",
                    keys.len()
                ),
            );
        }
        for (i, key) in keys.iter().enumerate() {
            let field = format!("spec.propagate.{list}[{i}]");
            if let Err(why) = check_key(key) {
                ck.error(&field, format!("`{key}` {why}"));
            } else if key.starts_with(crate::labels::TRELLIS_PREFIX) {
                ck.warning(
                    &field,
                    format!(
                        "`{key}` matches only keys trellis writes itself (`{}*`), which are never copied",
                        crate::labels::TRELLIS_PREFIX
                    ),
                );
            }
        }
    }
}

/// A key (`example.com/team`) or a prefix pattern (`example.com/*`,
/// `team-*`): the text before a trailing `*` must be the start of a valid
/// key, and `*` may appear only at the end.
fn check_key(key: &str) -> Result<(), String> {
    let (text, prefix) = match key.strip_suffix('*') {
        Some(text) => (text, true),
        None => (key, false),
    };
    if text.contains('*') {
        return Err("may hold `*` only at its end (a prefix)".into());
    }
    if text.is_empty() && !prefix {
        return Err("is empty".into());
    }
    let (domain, name) = match text.split_once('/') {
        Some((d, n)) => (Some(d), n),
        None => (None, text),
    };
    if name.contains('/') {
        return Err("holds more than one `/`".into());
    }
    if let Some(domain) = domain {
        let ok = !domain.is_empty()
            && domain.len() <= 253
            && domain.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            });
        if !ok {
            return Err("has a prefix that is not a DNS subdomain (before the `/`)".into());
        }
    }
    let name_ok = name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && (prefix
            || name
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphanumeric()))
        && (prefix
            || name
                .bytes()
                .last()
                .is_some_and(|b| b.is_ascii_alphanumeric()));
    if !name_ok {
        return Err(
            "is not a label or annotation key ([prefix/]name: letters, digits, '-', '_', '.', \
             at most 63, starting and ending with a letter or digit), nor a prefix of one ending in `*`"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_key;

    #[test]
    fn keys_and_prefixes() {
        for ok in [
            "team",
            "example.com/team",
            "example.com/*",
            "team-*",
            "*",
            "app.kubernetes.io/part-of",
        ] {
            assert!(check_key(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a*b",
            "a/b/c",
            "Example.com/x",
            "-team",
            "team-",
            "x/",
            "/x",
        ] {
            assert!(check_key(bad).is_err(), "{bad}");
        }
    }
}
