//! Golden tests for `trellis graph` on the shipped rules, and the README's
//! graph is what `trellis graph` prints for the webapp rule.
//!
//! After an intended change: `TRELLIS_UPDATE_GOLDEN=1 cargo test --test graph`.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn graph(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .arg("graph")
        .arg("--rules")
        .arg(root().join("rules"))
        .args(args)
        .output()
        .expect("run trellis graph");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn golden(name: &str, text: &str) {
    let path = root().join("tests/graph").join(name);
    if std::env::var_os("TRELLIS_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, text).expect("write golden");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        text,
        want,
        "{} differs: TRELLIS_UPDATE_GOLDEN=1 cargo test --test graph",
        path.display()
    );
}

#[test]
fn graph_of_every_rule_as_mermaid_matches_the_golden_file() {
    let (ok, text, err) = graph(&["-o", "mermaid"]);
    assert!(ok, "{err}");
    golden("rules.mmd", &text);
}

#[test]
fn graph_of_every_rule_as_dot_matches_the_golden_file() {
    let (ok, text, err) = graph(&["-o", "dot"]);
    assert!(ok, "{err}");
    golden("rules.dot", &text);
}

#[test]
fn readme_shows_the_webapp_graph_as_trellis_prints_it() {
    let (ok, text, err) = graph(&["webapp"]);
    assert!(ok, "{err}");
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    assert!(
        readme.contains(&format!("```mermaid\n{text}```")),
        "README.md's mermaid block is not `trellis graph --rules rules webapp` output:\n{text}"
    );
}

#[test]
fn an_unknown_rule_is_an_error_naming_the_rules() {
    let (ok, _, err) = graph(&["nosuch"]);
    assert!(!ok);
    assert!(
        err.contains("no rule named `nosuch`") && err.contains("webapp"),
        "{err}"
    );
}
