//! Field paths written the way a user reads them: `spec.hosts[0]`,
//! `metadata.labels["app.kubernetes.io/name"]`. Used by messages that point
//! into an object (schema errors, `diff`); knows nothing else.

use std::fmt::Write;

/// Appends `key` to `path`: `.key` when it reads as an identifier (a dot is
/// left out at the start), else `["key"]` with the key as a JSON string.
pub fn push_key(path: &mut String, key: &str) {
    let plain = key
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if plain {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key);
    } else {
        let _ = write!(path, "[{}]", serde_json::Value::String(key.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::push_key;

    #[test]
    fn identifiers_take_a_dot_and_other_keys_brackets() {
        let mut path = String::new();
        for key in ["spec", "labels", "app.kubernetes.io/name", "0x", "_a-b"] {
            push_key(&mut path, key);
        }
        assert_eq!(path, r#"spec.labels["app.kubernetes.io/name"]["0x"]._a-b"#);
    }
}
