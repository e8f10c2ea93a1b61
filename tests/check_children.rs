//! `trellis check` validates the children the rules render against their
//! kinds' schemas: the shipped rules are clean under `--strict`, with sample
//! parents and with every example parent given through `--observed`; a
//! misspelt field is a warning, and an error under `--strict`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `trellis check ARGS`: (exit code, stderr).
fn check(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .arg("check")
        .args(args)
        .current_dir(root())
        .output()
        .expect("run trellis check");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_example_rules_are_clean_under_strict() {
    let (code, stderr) = check(&["--strict", "--rules", "rules"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
}

#[test]
fn the_example_rules_are_clean_with_each_example_parent() {
    let dir = root().join("examples/parents");
    let mut parents: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("examples/parents")
        .map(|e| e.expect("entry").path())
        .filter(|p| !p.to_string_lossy().contains("invalid"))
        .collect();
    parents.sort();
    assert!(parents.len() > 5, "{parents:?}");
    for parent in parents {
        let (code, stderr) = check(&[
            "--strict",
            "--rules",
            "rules",
            "--observed",
            parent.to_str().expect("utf-8 path"),
        ]);
        assert_eq!(code, Some(0), "{}: {stderr}", parent.display());
    }
}

#[test]
fn a_misspelt_field_is_a_warning_and_an_error_under_strict() {
    let dir = tempfile::tempdir().expect("temp dir");
    let text = "apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: app
spec:
  parent: {apiVersion: apps/v1, kind: Deployment}
  children:
    - id: cm
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name }}
        dat:
          a: b
";
    std::fs::write(dir.path().join("app.yaml"), text).expect("write");
    let rules = dir.path().to_str().expect("utf-8 path");
    let file = Path::new(rules).join("app.yaml");
    let (code, stderr) = check(&["--rules", rules]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{}:14: warning: children[0] (cm) ConfigMap: dat: unknown field (did you mean data?)",
            file.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("1 rule(s) OK, 1 warning(s)"), "{stderr}");
    let (code, stderr) = check(&["--strict", "--rules", rules]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(":14: error: children[0] (cm) ConfigMap: dat:"),
        "{stderr}"
    );
}
