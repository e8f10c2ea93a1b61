//! Loader and validation tests: every check reports file, line and field.

use std::fs;
use std::path::Path;

use super::*;

const GOOD: &str = r#"apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: app
spec:
  parent:
    apiVersion: demo.trellis.dev/v1
    kind: App
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name }}
"#;

fn write(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).unwrap();
    }
    fs::write(path, text).unwrap();
}

/// Loads one rule file's text; returns the diagnostics (errors and warnings).
fn diagnostics(text: &str) -> Vec<Diagnostic> {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "rule.yaml", text);
    match load_dir(dir.path()) {
        Ok(set) => set.warnings,
        Err(diags) => diags,
    }
}

/// Asserts exactly one error, on `field` at `line`, mentioning `needle`.
#[track_caller]
fn assert_error(text: &str, field: &str, line: u64, needle: &str) {
    let diags = diagnostics(text);
    let errors: Vec<&Diagnostic> = diags
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .collect();
    assert!(
        errors
            .iter()
            .any(|d| d.field == field && d.line == Some(line) && d.message.contains(needle)),
        "expected error on {field} at line {line} containing {needle:?}, got:\n{}",
        diags
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

fn with_child(extra: &str) -> String {
    format!("{GOOD}{extra}")
}

#[test]
fn accepts_a_good_rule() {
    assert!(diagnostics(GOOD).is_empty());
}

#[test]
fn rejects_unknown_fields() {
    assert_error(
        &GOOD.replace("  children:", "  childs: []\n  children:"),
        "spec",
        5,
        "childs",
    );
    assert_error(
        &GOOD.replace(
            "      kind: ConfigMap",
            "      kind: ConfigMap\n      tempalte: x",
        ),
        "spec.children[0]",
        10,
        "tempalte",
    );
}

#[test]
fn rejects_wrong_api_version_and_kind() {
    assert_error(
        &GOOD.replace("trellis.dev/v1alpha1", "trellis.dev/v2"),
        "apiVersion",
        1,
        "trellis.dev/v1alpha1",
    );
    assert_error(
        &GOOD.replace("kind: Rule", "kind: Rules"),
        "kind",
        2,
        "Rule",
    );
}

#[test]
fn rejects_bad_rule_name() {
    assert_error(
        &GOOD.replace("name: app", "name: My_App"),
        "metadata.name",
        4,
        "DNS-1123",
    );
}

#[test]
fn rejects_bad_child_id() {
    assert_error(
        &GOOD.replace("id: config", "id: Config"),
        "spec.children[0].id",
        10,
        "not a valid id",
    );
}

#[test]
fn rejects_duplicate_child_ids() {
    let text = with_child(
        "    - id: config\n      apiVersion: v1\n      kind: Secret\n      template: 'metadata: {name: x}'\n",
    );
    assert_error(
        &text,
        "spec.children[1].id",
        16,
        "duplicate child id `config`",
    );
}

#[test]
fn rejects_unknown_and_cyclic_depends_on() {
    let text = GOOD.replace(
        "      kind: ConfigMap",
        "      kind: ConfigMap\n      dependsOn: [nothere]",
    );
    assert_error(
        &text,
        "spec.children[0].dependsOn[0]",
        13,
        "unknown child or related id `nothere`",
    );

    let text = GOOD.replace(
        "      kind: ConfigMap",
        "      kind: ConfigMap\n      dependsOn: [b]",
    ) + "    - id: b\n      apiVersion: v1\n      kind: Secret\n      dependsOn: [config]\n      template: 'metadata: {name: x}'\n";
    assert_error(
        &text,
        "spec.children[0].dependsOn",
        13,
        "dependency cycle: config -> b -> config",
    );
}

#[test]
fn rejects_template_syntax_errors() {
    let text = GOOD.replace("{{ parent.metadata.name }}", "{{ parent.metadata.name ");
    assert_error(&text, "spec.children[0].template", 13, "template syntax");
}

#[test]
fn rejects_expression_syntax_errors() {
    let text = GOOD.replace(
        "      kind: ConfigMap",
        "      kind: ConfigMap\n      includeWhen: \"spec.a ==\"",
    );
    assert_error(
        &text,
        "spec.children[0].includeWhen",
        13,
        "expression syntax",
    );
}

#[test]
fn rejects_names_outside_the_context() {
    let text = GOOD.replace("parent.metadata.name", "parnet.metadata.name");
    assert_error(
        &text,
        "spec.children[0].template",
        13,
        "`parnet` is not in the evaluation context",
    );
    let text = GOOD.replace(
        "      kind: ConfigMap",
        "      kind: ConfigMap\n      includeWhen: \"item.enabled\"",
    );
    assert_error(&text, "spec.children[0].includeWhen", 13, "`item`");
    let text = GOOD.replace(
        "      kind: ConfigMap",
        "      kind: ConfigMap\n      readyWhen: \"slef.status\"",
    );
    assert_error(&text, "spec.children[0].readyWhen", 13, "`slef`");
}

#[test]
fn allows_item_and_self_where_they_exist() {
    let text = GOOD.replace(
        "      kind: ConfigMap",
        "      kind: ConfigMap\n      forEach: spec.items\n      readyWhen: \"self.data is defined and index >= 0\"",
    )
    .replace("{{ parent.metadata.name }}", "{{ parent.metadata.name ~ item }}");
    assert!(diagnostics(&text).is_empty(), "{:?}", diagnostics(&text));
}

#[test]
fn rejects_references_to_unknown_children() {
    let text = with_child(
        "  status:\n    conditions:\n      - type: Up\n        when: \"children.confg.data is defined\"\n        reason: Up\n",
    );
    assert_error(
        &text,
        "spec.status.conditions[0].when",
        19,
        "no child `confg`",
    );
}

#[test]
fn rejects_bad_json_path() {
    let text = with_child(
        "  status:\n    fields:\n      - path: x\n        from: config\n        jsonPath: \"$.data[\"\n",
    );
    assert_error(
        &text,
        "spec.status.fields[0].jsonPath",
        20,
        "JSONPath syntax",
    );
}

#[test]
fn rejects_status_fields_with_unknown_child_or_both_sources() {
    let text = with_child(
        "  status:\n    fields:\n      - path: x\n        from: nope\n        jsonPath: $.a\n",
    );
    assert_error(
        &text,
        "spec.status.fields[0].from",
        19,
        "unknown child id `nope`",
    );
    let text = with_child(
        "  status:\n    fields:\n      - path: x\n        value: \"1\"\n        from: config\n",
    );
    assert_error(&text, "spec.status.fields[0]", 18, "either");
}

#[test]
fn warns_that_default_of_a_non_singular_json_path_is_never_used() {
    let fields = |jp: &str| {
        with_child(&format!(
            "  status:\n    fields:\n      - path: x\n        from: config\n        jsonPath: \"{jp}\"\n        default: 0\n"
        ))
    };
    for jp in ["$.data[*]", "$..v", "$.data[?@.v]", "$.a[0:2]", "$.a[0,1]"] {
        let diags = diagnostics(&fields(jp));
        assert_eq!(diags.len(), 1, "{jp}: {diags:?}");
        let d = &diags[0];
        assert_eq!(d.severity, Severity::Warning, "{jp}");
        assert_eq!(d.field, "spec.status.fields[0].default", "{jp}");
        assert_eq!(d.line, Some(21), "{jp}");
        assert!(d.message.contains("never used"), "{jp}: {d}");
    }
    for jp in ["$.data.v", "$['data']['v']", "$.a[0]", "$"] {
        assert!(diagnostics(&fields(jp)).is_empty(), "{jp}");
    }
}

#[test]
fn rejects_status_on_builtin_parent() {
    let text = with_child("  status:\n    fields:\n      - path: x\n        value: \"1\"\n")
        .replace(
            "apiVersion: demo.trellis.dev/v1\n    kind: App",
            "apiVersion: apps/v1\n    kind: Deployment",
        );
    assert_error(&text, "spec.status", 16, "built-in kind");
}

#[test]
fn rejects_trellis_owned_condition_types() {
    let text = with_child(
        "  status:\n    conditions:\n      - type: Ready\n        when: \"true\"\n        reason: X\n",
    );
    assert_error(
        &text,
        "spec.status.conditions[0].type",
        18,
        "written by trellis",
    );
}

#[test]
fn rejects_invalid_schema_and_defaults() {
    let text = GOOD.replace("  children:", "  schema: {type: 12}\n  children:");
    assert_error(&text, "spec.schema", 9, "invalid JSON Schema");
    let text = GOOD.replace("  children:", "  defaults: [1]\n  children:");
    assert_error(&text, "spec.defaults", 9, "must be an object");
}

#[test]
fn rejects_bad_resync() {
    let text = GOOD.replace("  children:", "  resync: soon\n  children:");
    assert_error(&text, "spec.resync", 9, "duration");
}

#[test]
fn service_account_name_must_be_a_dns_subdomain() {
    for bad in ["Webapp", "web_app", "-webapp", "a..b"] {
        let text = GOOD.replace(
            "  children:",
            &format!("  serviceAccountName: \"{bad}\"\n  children:"),
        );
        assert_error(&text, "spec.serviceAccountName", 9, "ServiceAccount name");
    }
    for good in ["webapp-rule", "team.a.webapp"] {
        let text = GOOD.replace(
            "  children:",
            &format!("  serviceAccountName: {good}\n  children:"),
        );
        let diags = diagnostics(&text);
        assert!(diags.is_empty(), "{good}: {diags:?}");
    }
}

#[test]
fn rejects_yaml_syntax_errors_with_line() {
    let text = GOOD.replace("kind: App", "kind: [App");
    let diags = diagnostics(&text);
    assert!(
        diags
            .iter()
            .any(|d| d.message.starts_with("YAML") && d.line.is_some()),
        "{diags:?}"
    );
}

#[test]
fn rejects_duplicate_yaml_keys() {
    let text = GOOD.replace("  name: app", "  name: app\n  name: app2");
    let diags = diagnostics(&text);
    assert!(
        diags
            .iter()
            .any(|d| d.message.contains("duplicate mapping key: name") && d.line == Some(5)),
        "{diags:?}"
    );
}

#[test]
fn reports_every_error_at_once() {
    let text = GOOD
        .replace("name: app", "name: App")
        .replace("id: config", "id: Config")
        .replace("parent.metadata.name", "parnet.metadata.name");
    let errors = diagnostics(&text)
        .into_iter()
        .filter(|d| d.severity == Severity::Error)
        .count();
    assert_eq!(errors, 3);
}

#[test]
fn warns_about_safe_but_accepts() {
    let text = GOOD.replace(
        "{{ parent.metadata.name }}",
        "{{ parent.metadata.name | safe }}",
    );
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "rule.yaml", &text);
    let set = load_dir(dir.path()).expect("warnings do not fail the set");
    assert_eq!(set.warnings.len(), 1);
    assert!(set.warnings[0].message.contains("safe"));
    assert_eq!(set.warnings[0].line, Some(15), "the line of the use");
}

#[test]
fn rejects_duplicate_rule_names_across_files() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", GOOD);
    write(dir.path(), "b.yaml", GOOD);
    let diags = load_dir(dir.path()).unwrap_err();
    assert_eq!(diags.len(), 1);
    assert!(diags[0].file.ends_with("b.yaml"));
    assert!(diags[0].message.contains("a.yaml:4"), "{}", diags[0]);
}

#[test]
fn loads_multi_document_files() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "both.yaml",
        &format!("{GOOD}---\n{}", GOOD.replace("name: app", "name: app2")),
    );
    let set = load_dir(dir.path()).unwrap();
    assert_eq!(set.rules.len(), 2);
    // Lines of the second document count from the top of the file.
    let diags = diagnostics(&format!(
        "{GOOD}---\n{}",
        GOOD.replace("name: app", "name: Bad")
    ));
    assert_eq!(diags[0].line, Some(20));
}

#[test]
fn reads_template_files_relative_to_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "rule.yaml",
        &GOOD.replace(
            "      template: |\n        metadata:\n          name: {{ parent.metadata.name }}\n",
            "      templateFile: tpl/cm.yaml.j2\n",
        ),
    );
    write(
        dir.path(),
        "tpl/cm.yaml.j2",
        "metadata:\n  name: {{ parent.metadata.name }}\n",
    );
    let set = load_dir(dir.path()).unwrap();
    assert!(set.rules[0].templates["config"].contains("parent.metadata.name"));
}

#[test]
fn refuses_template_files_outside_the_rules_directory() {
    let outer = tempfile::tempdir().unwrap();
    let dir = outer.path().join("rules");
    fs::create_dir(&dir).unwrap();
    write(outer.path(), "secret.j2", "metadata: {name: x}\n");
    let rule = GOOD.replace(
        "      template: |\n        metadata:\n          name: {{ parent.metadata.name }}\n",
        "      templateFile: ../secret.j2\n",
    );
    write(&dir, "rule.yaml", &rule);
    let diags = load_dir(&dir).unwrap_err();
    assert!(
        diags[0].message.contains("leaves the rules directory"),
        "{diags:?}"
    );
    assert_eq!(diags[0].field, "spec.children[0].templateFile");

    // A symlink inside pointing outside is refused too.
    std::os::unix::fs::symlink(outer.path().join("secret.j2"), dir.join("link.j2")).unwrap();
    write(&dir, "rule.yaml", &rule.replace("../secret.j2", "link.j2"));
    let diags = load_dir(&dir).unwrap_err();
    assert!(
        diags[0].message.contains("leaves the rules directory"),
        "{diags:?}"
    );
}

#[test]
fn loads_a_configmap_volume_layout_once() {
    // kubelet layout: ..2026_x/ holds files, ..data -> ..2026_x, key -> ..data/key
    let dir = tempfile::tempdir().unwrap();
    let stamp = dir.path().join("..2026_11_29_08_00_00.000000001");
    fs::create_dir(&stamp).unwrap();
    write(&stamp, "app.yaml", GOOD);
    write(&stamp, "deployment.yaml.j2", "metadata: {name: x}\n");
    std::os::unix::fs::symlink("..2026_11_29_08_00_00.000000001", dir.path().join("..data"))
        .unwrap();
    std::os::unix::fs::symlink("..data/app.yaml", dir.path().join("app.yaml")).unwrap();
    std::os::unix::fs::symlink(
        "..data/deployment.yaml.j2",
        dir.path().join("deployment.yaml.j2"),
    )
    .unwrap();
    let set = load_dir(dir.path()).unwrap();
    assert_eq!(set.rules.len(), 1);
    assert_eq!(set.rules[0].name, "app");
}

#[test]
fn formats_diagnostics_as_file_line_field_message() {
    let d = Diagnostic::error(
        Path::new("rules/a.yaml"),
        Some(7),
        "spec.children[0].id",
        "bad",
    );
    assert_eq!(
        d.to_string(),
        "rules/a.yaml:7: error: spec.children[0].id: bad"
    );
}

#[test]
fn format_schema_describes_the_rule_type() {
    let schema = model::json_schema();
    assert_eq!(schema["title"], "trellis Rule (trellis.dev/v1alpha1)");
    assert!(schema["properties"]["spec"].is_object());
}
