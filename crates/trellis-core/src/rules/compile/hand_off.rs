//! A child's `handOff:` paths, checked: each a field path
//! ([`crate::ownership::parse_path`]) that trellis may let go of. What
//! makes the object what it is — apiVersion, kind, name, namespace,
//! trellis's labels and annotations, ownerReferences — and `status` (never
//! sent by an apply) cannot be handed off. Whether the template sets the
//! path is checked against a rendering (`conform`), which only a sample
//! parent gives.

use super::Checker;
use crate::labels::{LABEL_MANAGED_BY, LABEL_PREFIX};
use crate::ownership::{MAX_HAND_OFF_PATHS, parse_path};
use crate::rules::model::ChildSpec;

/// The paths of `child.handOff` as keys; each problem reported at
/// `{at}.handOff[i]`.
pub(super) fn compile(ck: &mut Checker, at: &str, child: &ChildSpec) -> Vec<Vec<String>> {
    if child.hand_off.len() > MAX_HAND_OFF_PATHS {
        ck.error(
            &format!("{at}.handOff"),
            format!(
                "{} paths, more than the limit of {MAX_HAND_OFF_PATHS}",
                child.hand_off.len()
            ),
        );
        return Vec::new();
    }
    let mut out: Vec<Vec<String>> = Vec::new();
    for (i, text) in child.hand_off.iter().enumerate() {
        let field = format!("{at}.handOff[{i}]");
        let keys = match parse_path(text) {
            Ok(keys) => keys,
            Err(err) => {
                ck.error(&field, err.to_string());
                continue;
            }
        };
        if let Some(why) = refused(&keys) {
            ck.error(&field, format!("`{text}` cannot be handed off: {why}"));
            continue;
        }
        if out
            .iter()
            .any(|k| keys.starts_with(k) || k.starts_with(&keys))
        {
            ck.error(
                &field,
                format!("`{text}` overlaps another handOff path of this child"),
            );
            continue;
        }
        out.push(keys);
    }
    out
}

/// Why a path may not be handed off; `None` when it may.
fn refused(keys: &[String]) -> Option<&'static str> {
    let key = |i: usize| keys.get(i).map(String::as_str);
    match (key(0), key(1), key(2)) {
        (Some("apiVersion" | "kind"), _, _) => Some("it names the object's kind"),
        (Some("status"), _, _) => Some("an apply never sends status"),
        (Some("metadata"), Some("labels" | "annotations"), Some(k))
            if k.starts_with(LABEL_PREFIX) || k == LABEL_MANAGED_BY =>
        {
            Some("trellis keeps its own labels and annotations")
        }
        (Some("metadata"), Some("labels" | "annotations"), Some(_)) => None,
        (Some("metadata"), _, _) => Some(
            "only a single label or annotation of metadata can be (`metadata.labels[\"key\"]`)",
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::refused;

    fn keys(path: &str) -> Vec<String> {
        crate::ownership::parse_path(path).unwrap()
    }

    #[test]
    fn what_makes_the_object_trellis_s_is_never_handed_off() {
        for path in [
            "apiVersion",
            "kind",
            "status.replicas",
            "metadata.name",
            "metadata.labels",
            "metadata.ownerReferences",
            r#"metadata.labels["trellis.dev/rule"]"#,
            r#"metadata.labels["app.kubernetes.io/managed-by"]"#,
        ] {
            assert!(refused(&keys(path)).is_some(), "{path} is refused");
        }
        for path in [
            "spec.replicas",
            "spec.template.spec.containers",
            r#"metadata.annotations["example.com/x"]"#,
        ] {
            assert_eq!(refused(&keys(path)), None, "{path} may be handed off");
        }
    }
}
