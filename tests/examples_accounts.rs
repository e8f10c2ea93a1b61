//! `examples/deploy-per-rule-accounts`, the kustomize overlay in which every
//! example rule acts as its own ServiceAccount: its rules are rules/ with
//! exactly one line added, and its roles are what `trellis rbac` prints for
//! them. After an intended change: `examples/deploy-per-rule-accounts/regenerate`.

use std::path::{Path, PathBuf};

use serde_json::Value;
use trellis::render::Limits;
use trellis::rules::RuleSet;
use trellis::yaml;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn overlay(file: &str) -> PathBuf {
    root().join("examples/deploy-per-rule-accounts").join(file)
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    yaml::parse_documents(&text, &yaml::Limits::FILES)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .map(|d| d.value)
        .collect()
}

const STALE: &str = "stale: run examples/deploy-per-rule-accounts/regenerate";

/// The overlay's rules ConfigMap, as files (`templates.x.j2` is
/// `templates/x.j2`, as the Deployment's volume items place it).
fn overlay_rules() -> (tempfile::TempDir, Vec<(String, String)>) {
    let cm = documents(&overlay("rules.yaml")).remove(0);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut files = Vec::new();
    for (key, text) in cm["data"].as_object().expect("data") {
        let text = text.as_str().expect("text").to_owned();
        let path = match key.strip_prefix("templates.") {
            Some(rest) => format!("templates/{rest}"),
            None => key.clone(),
        };
        let at = dir.path().join(&path);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::fs::write(&at, &text).unwrap();
        files.push((path, text));
    }
    (dir, files)
}

#[test]
fn the_overlay_rules_are_the_example_rules_with_an_account_each() {
    let (_dir, files) = overlay_rules();
    let mut originals: Vec<String> = Vec::new();
    for entry in walk(&root().join("rules")) {
        originals.push(
            entry
                .strip_prefix(root().join("rules"))
                .unwrap()
                .to_string_lossy()
                .into_owned(),
        );
    }
    originals.sort();
    let mut ours: Vec<String> = files.iter().map(|(p, _)| p.clone()).collect();
    ours.sort();
    assert_eq!(
        ours, originals,
        "rules.yaml holds other files than rules/: {STALE}"
    );
    for (path, text) in &files {
        let original = std::fs::read_to_string(root().join("rules").join(path)).unwrap();
        let added: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("  serviceAccountName: "))
            .collect();
        let without: String = text
            .lines()
            .filter(|l| !l.starts_with("  serviceAccountName: "))
            .map(|l| format!("{l}\n"))
            .collect();
        let original_lines: String = original.lines().map(|l| format!("{l}\n")).collect();
        assert_eq!(without, original_lines, "{path}: {STALE}");
        if path.ends_with(".yaml") {
            assert_eq!(added.len(), 1, "{path}: one account per rule");
        }
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[test]
fn the_overlay_roles_are_what_trellis_rbac_prints_and_every_account_is_bound() {
    let (dir, _) = overlay_rules();
    let set = RuleSet::load(&[dir.path().to_path_buf()], Limits::default())
        .unwrap_or_else(|d| panic!("the overlay's rules fail check: {d:?}"));
    assert!(
        set.rules
            .iter()
            .all(|r| r.rule.spec.service_account_name.as_deref()
                == Some(format!("rule-{}", r.name).as_str())),
        "every rule acts as rule-<name>"
    );
    let printed = trellis::rbac::cluster_roles(&set, "trellis", false);
    let operator = documents(&overlay("clusterrole.yaml")).remove(0);
    assert_eq!(operator, printed[0], "clusterrole.yaml is {STALE}");
    let accounts = documents(&overlay("accounts.yaml"));
    let roles: Vec<&Value> = accounts
        .iter()
        .filter(|d| d["kind"] == "ClusterRole")
        .collect();
    assert_eq!(
        roles,
        printed[1..].iter().collect::<Vec<_>>(),
        "accounts.yaml is {STALE}"
    );
    for rule in &set.rules {
        let account = format!("rule-{}", rule.name);
        let role = trellis::rbac::account_role_name("trellis", &rule.name);
        assert!(
            accounts.iter().any(|d| d["kind"] == "ServiceAccount"
                && d["metadata"]["name"] == account.as_str()
                && d["metadata"]["namespace"] == "trellis-system"),
            "no ServiceAccount {account}"
        );
        assert!(
            accounts.iter().any(|d| d["kind"] == "ClusterRoleBinding"
                && d["roleRef"]["name"] == role.as_str()
                && d["subjects"][0]["name"] == account.as_str()
                && d["subjects"][0]["namespace"] == "trellis-system"),
            "{account} is not bound to {role}"
        );
    }
    // The operator writes none of the rules' children itself.
    let text = serde_json::to_string(&operator).unwrap();
    assert!(text.contains("impersonate"), "{text}");
    for rule in operator["rules"].as_array().unwrap() {
        let verbs = rule["verbs"].to_string();
        let resource = rule["resources"][0].as_str().unwrap_or_default();
        let own = resource.ends_with("/status")
            || [
                "events",
                "leases",
                "subjectaccessreviews",
                "selfsubjectaccessreviews",
            ]
            .contains(&resource);
        if !own && rule.get("resourceNames").is_none() {
            assert!(
                !verbs.contains("create") && !verbs.contains("delete"),
                "the operator may write {resource}: {verbs}"
            );
        }
    }
}

#[test]
fn the_overlay_builds_with_kustomize() {
    let out = std::process::Command::new("kubectl")
        .args(["kustomize"])
        .arg(overlay(""))
        .output()
        .expect("kubectl (tests need it for the control plane anyway)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let docs = yaml::parse_documents(&text, &yaml::Limits::FILES).expect("kustomize output");
    let docs: Vec<Value> = docs.into_iter().map(|d| d.value).collect();
    let operator = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "trellis")
        .expect("the operator's role");
    assert_eq!(
        *operator,
        documents(&overlay("clusterrole.yaml")).remove(0),
        "the overlay's role replaces the base's"
    );
    let rules = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "trellis-rules")
        .expect("the rules ConfigMap");
    assert_eq!(
        rules["data"],
        documents(&overlay("rules.yaml")).remove(0)["data"],
        "the overlay's rules replace the base's"
    );
}
