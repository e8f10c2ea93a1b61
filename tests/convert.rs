//! `trellis convert` and `trellis check` on a kind with several API
//! versions (`versions:`), run as a user runs them: the built binary on
//! files in a temporary directory.

use std::path::Path;
use std::process::Command;

const RULE: &str = r#"apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata: {name: webapp}
spec:
  parent: {apiVersion: demo.trellis.dev/v2, kind: WebApp}
  crd: {}
  schema:
    type: object
    properties:
      image: {type: string}
      ports: {type: array, items: {type: integer}}
  defaults: {image: nginx, ports: [80]}
  versions:
    - name: v1
      deprecated: "WebApp v1 is deprecated; use v2"
      schema:
        type: object
        properties:
          image: {type: string}
          port: {type: integer}
      toHub: |
        image: {{ spec.image }}
        ports: [{{ spec.port }}]
      fromHub: |
        image: {{ spec.image }}
        port: {{ spec.ports[0] }}
  children: []
"#;

const PARENTS: &str = r#"apiVersion: demo.trellis.dev/v1
kind: WebApp
metadata: {name: shop, namespace: team-a}
spec: {image: "nginx:1.27", port: 8080}
---
apiVersion: demo.trellis.dev/v2
kind: WebApp
metadata: {name: cart, namespace: team-a}
spec: {image: "nginx:1.27", ports: [9090, 9443]}
"#;

fn trellis(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(args)
        .output()
        .expect("run trellis");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn convert_prints_each_parent_at_the_version_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "rules/webapp.yaml", RULE);
    let rules = dir.path().join("rules").display().to_string();
    let parents = write(dir.path(), "parents.yaml", PARENTS);

    let (code, out, err) = trellis(&["convert", "--rules", &rules, &parents, "--to", "v2"]);
    assert_eq!(code, 0, "{err}");
    let docs: Vec<serde_json::Value> =
        trellis::yaml::parse_documents(&out, &trellis::yaml::Limits::FILES)
            .expect("YAML out")
            .into_iter()
            .map(|d| d.value)
            .collect();
    assert_eq!(docs.len(), 2, "{out}");
    assert_eq!(docs[0]["apiVersion"], "demo.trellis.dev/v2");
    assert_eq!(
        docs[0]["spec"],
        serde_json::json!({"image": "nginx:1.27", "ports": [8080]})
    );
    assert_eq!(docs[0]["metadata"]["name"], "shop");
    assert_eq!(docs[1]["spec"]["ports"], serde_json::json!([9090, 9443]));

    let (code, out, err) = trellis(&[
        "convert",
        "--rules",
        &rules,
        &parents,
        "--to",
        "demo.trellis.dev/v1",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("port: 9090"), "{out}");

    let (code, _, err) = trellis(&["convert", "--rules", &rules, &parents, "--to", "v3"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("rule webapp: WebApp has no version `v3` (versions: v1, v2)"),
        "{err}"
    );
}

#[test]
fn check_reports_a_field_a_round_trip_loses_and_crd_prints_every_version() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules");
    write(dir.path(), "rules/webapp.yaml", RULE);
    let rules = rules.display().to_string();
    let (code, _, err) = trellis(&["check", "--rules", &rules]);
    assert_eq!(code, 0, "the default parent (one port) survives: {err}");

    let (code, out, err) = trellis(&["crd", "--rules", &rules]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("deprecationWarning: WebApp v1 is deprecated; use v2"),
        "{out}"
    );
    assert!(out.contains("strategy: Webhook"), "{out}");

    // Two ports: v1 keeps one, and the round trip says what it loses.
    write(
        dir.path(),
        "rules/webapp.yaml",
        &RULE.replace("ports: [80]}", "ports: [80, 443]}"),
    );
    let (code, out, err) = trellis(&["check", "--rules", &rules]);
    assert_eq!(code, 1, "{out}{err}");
    let all = format!("{out}{err}");
    assert!(
        all.contains("spec.versions[0].fromHub: a round trip v2 -> v1 -> v2 loses `spec.ports`"),
        "{all}"
    );
}

#[test]
fn check_parents_round_trips_every_stored_parent_and_names_the_one_that_loses_a_field() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "rules/webapp.yaml", RULE);
    let rules = dir.path().join("rules").display().to_string();
    // One parent at v1 (converts to the hub and back), and in a second
    // file a v2 parent with two ports (v1 keeps one) and another whose v1
    // form the hub's template cannot read.
    write(
        dir.path(),
        "stored/a.yaml",
        PARENTS.split("---").next().unwrap(),
    );
    write(
        dir.path(),
        "stored/b.yaml",
        &format!(
            "{}---\napiVersion: demo.trellis.dev/v1\nkind: WebApp\nmetadata: {{name: odd, namespace: team-b}}\nspec: {{image: x}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: other}}\n",
            PARENTS.split("---").nth(1).unwrap().trim_start()
        ),
    );
    write(dir.path(), "stored/notes.txt", "not a manifest");
    let stored = dir.path().join("stored").display().to_string();

    let (code, out, err) = trellis(&["check", "--rules", &rules, "--parents", &stored]);
    let all = format!("{out}{err}");
    assert_eq!(code, 1, "{all}");
    let b = dir.path().join("stored/b.yaml").display().to_string();
    assert!(
        all.contains(&format!(
            "spec.versions[0].fromHub: a round trip v2 -> v1 -> v2 loses `spec.ports` of parent team-a/cart ({b})"
        )),
        "{all}"
    );
    assert!(
        all.contains(&format!("parent team-b/odd ({b}) does not convert to v2")),
        "{all}"
    );
    assert!(!all.contains("shop"), "the v1 parent survives: {all}");

    // Listed as lossy, the two ports are no error; the odd parent still is.
    write(
        dir.path(),
        "rules/webapp.yaml",
        &RULE.replace(
            "  children: []",
            "      lossy: [spec.ports]\n  children: []",
        ),
    );
    let (code, out, err) = trellis(&["check", "--rules", &rules, "--parents", &stored]);
    let all = format!("{out}{err}");
    assert_eq!(code, 1, "{all}");
    assert!(!all.contains("cart"), "{all}");

    let (code, _, err) = trellis(&["check", "--rules", &rules, "--parents", "/nonexistent"]);
    assert_eq!(code, 1);
    assert!(err.contains("error: --parents: /nonexistent"), "{err}");
}
