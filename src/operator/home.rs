//! The operator's namespace: where its own objects live (revision
//! ConfigMaps of staged rollouts) and where the ServiceAccounts that rules
//! act as (`serviceAccountName:`) are found.
//!
//! Resolved once at start, as RULES.md orders it: `--operator-namespace`,
//! else `$POD_NAMESPACE`, else the in-cluster service account's namespace
//! file, else `default`. Never an error: a process outside a Pod (a
//! developer's shell, the tests) lands on `default` unless told otherwise.

use std::path::Path;

use super::leadership::leader::SERVICE_ACCOUNT_NAMESPACE;

/// The namespace `trellis run` (and the CLI commands that talk to the
/// operator's objects) use; `flag` is `--operator-namespace`.
pub fn operator_namespace(flag: Option<&str>) -> String {
    resolve(
        flag,
        std::env::var("POD_NAMESPACE").ok().as_deref(),
        Path::new(SERVICE_ACCOUNT_NAMESPACE),
    )
}

fn resolve(flag: Option<&str>, pod_namespace: Option<&str>, service_account: &Path) -> String {
    let given = |value: Option<&str>| {
        value
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    given(flag)
        .or_else(|| given(pod_namespace))
        .or_else(|| given(std::fs::read_to_string(service_account).ok().as_deref()))
        .unwrap_or_else(|| "default".to_owned())
}

#[cfg(test)]
mod tests {
    use super::resolve;
    use std::path::Path;

    #[test]
    fn the_flag_wins_then_pod_namespace_then_service_account_then_default() {
        let dir = tempfile::tempdir().unwrap();
        let sa = dir.path().join("namespace");
        std::fs::write(&sa, "from-sa\n").unwrap();
        assert_eq!(resolve(Some("flag"), Some("pod"), &sa), "flag");
        assert_eq!(resolve(None, Some("pod"), &sa), "pod");
        assert_eq!(resolve(Some(" "), Some(""), &sa), "from-sa");
        assert_eq!(resolve(None, None, Path::new("/nonexistent/ns")), "default");
    }
}
