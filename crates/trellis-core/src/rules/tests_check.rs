//! `check` diagnostics of issue 10: unknown filters/tests/functions, locals
//! set in branches, `${...}`, octal literals, documents that are not Rules.

use std::fs;

use super::*;

const HEAD: &str = "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: app\nspec:\n  parent:\n    apiVersion: demo.trellis.dev/v1\n    kind: App\n  children:\n    - id: config\n      apiVersion: v1\n      kind: ConfigMap\n";

fn diagnostics(text: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("rule.yaml"), text).unwrap();
    let diags = match load_dir(dir.path()) {
        Ok(set) => set.warnings,
        Err(diags) => diags,
    };
    diags.iter().map(ToString::to_string).collect()
}

fn with_template(template: &str) -> Vec<String> {
    let indented: String = template.lines().map(|l| format!("        {l}\n")).collect();
    diagnostics(&format!("{HEAD}      template: |\n{indented}"))
}

#[test]
fn unknown_filter_test_and_function_are_errors_by_name() {
    let d = with_template("metadata:\n  name: {{ parent.metadata.name | uper }}");
    assert!(
        d.iter()
            .any(|m| m.contains("error") && m.contains("unknown filter `uper`")),
        "{d:?}"
    );
    let d = with_template("metadata:\n  name: {{ 'a' if spec.x is definde else 'b' }}");
    assert!(
        d.iter().any(|m| m.contains("unknown test `definde`")),
        "{d:?}"
    );
    let d = with_template("metadata:\n  name: {{ lenght(spec.x) }}");
    assert!(
        d.iter().any(|m| m.contains("unknown function `lenght`")),
        "{d:?}"
    );
}

#[test]
fn known_filters_tests_functions_and_macros_pass() {
    let d = with_template(
        "{% macro n(x) %}{{ x }}{% endmacro %}\nmetadata:\n  name: {{ n(parent.metadata.name | lower | dns_label) ~ range(2) | list | length | string }}\n  labels: {{ {'a': spec.x is defined} }}",
    );
    assert!(d.is_empty(), "{d:?}");
}

#[test]
fn variable_set_in_if_and_else_is_not_outside_the_context() {
    let d = with_template(
        "{% if spec.big | default(false) %}{% set size = 'l' %}{% else %}{% set size = 's' %}{% endif %}\nmetadata:\n  name: {{ size }}",
    );
    assert!(d.is_empty(), "{d:?}");
}

#[test]
fn dollar_brace_syntax_is_a_warning_that_names_it() {
    let d = with_template("metadata:\n  name: ${schema.spec.name}");
    assert!(
        d.iter()
            .any(|m| m.contains("warning") && m.contains("another tool's syntax")),
        "{d:?}"
    );
}

#[test]
fn leading_zero_integer_is_an_octal_warning() {
    let d = with_template("metadata:\n  name: x\ndata:\n  mode: 0400");
    assert!(
        d.iter()
            .any(|m| m.contains("warning") && m.contains("octal (256)")),
        "{d:?}"
    );
}

#[test]
fn a_crd_in_the_rules_directory_is_not_a_rule() {
    let crd = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: apps.demo.trellis.dev\nspec:\n  group: demo.trellis.dev\n";
    let d = diagnostics(&format!(
        "{crd}---\n{HEAD}      template: |\n        metadata: {{name: {{{{ spec.x | nope }}}}}}\n"
    ));
    let not_rule: Vec<_> = d.iter().filter(|m| m.contains("not a Rule")).collect();
    assert_eq!(not_rule.len(), 1, "{d:?}");
    assert!(d.len() <= 3, "one clear error, not a schema dump: {d:?}");
    assert!(
        d.iter().any(|m| m.contains("unknown filter `nope`")),
        "the other document is still checked: {d:?}"
    );
}

const TWO: &str = "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: app\nspec:\n  parent:\n    apiVersion: demo.trellis.dev/v1\n    kind: App\n";

#[test]
fn cycle_through_implicit_edges_is_an_error_naming_it() {
    let children = "  children:\n    - id: a\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata: {name: {{ children.b.metadata.name | default('x') }}}\n    - id: b\n      apiVersion: v1\n      kind: ConfigMap\n      dependsOn: [a]\n      template: |\n        metadata: {name: b}\n";
    let d = diagnostics(&format!("{TWO}{children}"));
    assert!(
        d.iter().any(|m| m.contains("dependency cycle: a -> b -> a")
            || m.contains("dependency cycle: b -> a -> b")),
        "{d:?}"
    );
}

#[test]
fn reading_own_id_adds_no_edge_and_dynamic_subscript_warns() {
    let children = "  children:\n    - id: a\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata: {name: {{ children.a.metadata.name | default('a') }}}\n        data: {x: {{ children[spec.which] is defined }}}\n";
    let d = diagnostics(&format!("{TWO}{children}"));
    assert!(
        !d.iter()
            .any(|m| m.contains("cycle") || m.contains("itself")),
        "{d:?}"
    );
    assert!(
        d.iter()
            .any(|m| m.contains("warning") && m.contains("computed subscript")),
        "{d:?}"
    );
}

#[test]
fn vars_read_by_a_computed_name_or_named_like_a_related_entry_add_no_edge() {
    let rule = "  related:
    - id: settings
      apiVersion: v1
      kind: ConfigMap
      name: x
  vars:
    - name: settings
      value: \"'s'\"
  children:
    - id: a
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata: {name: {{ vars[spec.which] | default('a') ~ vars.settings }}}
";
    let d = diagnostics(&format!("{TWO}{rule}"));
    assert!(d.is_empty(), "{d:?}");
    let set = crate::rules::testing::load_texts(&[("r.yaml", &format!("{TWO}{rule}"))]);
    let a = &set.rules[0].children[0];
    assert!(
        a.depends_on_related.is_empty(),
        "vars.settings is not related.settings"
    );
    assert!(a.reads_vars.any && a.reads_vars.names.contains("settings"));
}

#[test]
fn related_entries_are_validated() {
    let related = "  related:\n    - id: a\n      apiVersion: v1\n      kind: ConfigMap\n      name: x\n      selector: {}\n    - id: b\n      apiVersion: v1\n      kind: Secret\n      name: \"{{ children.a }}\"\n  children:\n    - id: b\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata: {name: {{ related.nope.x | default('y') }}}\n";
    let d = diagnostics(&format!("{TWO}{related}"));
    let has = |s: &str| d.iter().any(|m| m.contains(s));
    assert!(has("exactly one of `name`"), "{d:?}");
    assert!(has("unique across children and related"), "{d:?}");
    assert!(
        has(
            "`children` is not available here (a related entry's name, namespace and selector sees parent, spec, metadata and rule)"
        ),
        "{d:?}"
    );
    assert!(
        has("`related.nope`: the rule has no related entry"),
        "{d:?}"
    );
}

#[test]
fn a_var_sees_only_vars_declared_before_it() {
    let vars = "  vars:\n    - name: a\n      value: vars.b\n    - name: b\n      value: \"1\"\n  children: []\n";
    let d = diagnostics(&format!("{TWO}{vars}"));
    assert!(d.iter().any(|m| m.contains("`vars.b`")), "{d:?}");
}

/// A related entry with `readyWhen: <expr>`, and a child that reads it, a
/// var and a related `other` (so every name is declared somewhere).
fn related_ready_when(expr: &str) -> Vec<String> {
    let text = format!(
        "{TWO}  related:\n    - id: src\n      apiVersion: v1\n      kind: ConfigMap\n      name: src\n      readyWhen: \"{expr}\"\n    - id: other\n      apiVersion: v1\n      kind: ConfigMap\n      name: other\n  vars:\n    - name: v\n      value: \"1\"\n  children:\n    - id: config\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata: {{name: {{{{ related.src.metadata.name }}}}}}\n"
    );
    diagnostics(&text)
}

#[test]
fn related_ready_when_sees_only_the_parent_rule_and_self() {
    let d = related_ready_when(
        "self.data.ok == spec.ok and rule.name == metadata.name and parent is defined",
    );
    assert!(d.is_empty(), "{d:?}");
    for (name, expr) in [
        ("children", "children.config is defined"),
        ("related", "related.other is defined"),
        ("vars", "vars.v == 1"),
        ("item", "item == 1"),
    ] {
        let d = related_ready_when(expr);
        let want = format!(
            "rule.yaml:14: error: spec.related[0].readyWhen: `{name}` is not available here \
             (a related entry's readyWhen sees parent, spec, metadata, rule and self)"
        );
        assert!(d.iter().any(|m| m.ends_with(&want)), "{want}\n{d:?}");
    }
    let d = related_ready_when("parnet.x");
    assert!(
        d.iter()
            .any(|m| m.contains("`parnet` is not in the evaluation context")),
        "{d:?}"
    );
}

#[test]
fn related_name_namespace_and_selector_see_only_the_parent_and_rule() {
    let related = "  related:\n    - id: a\n      apiVersion: v1\n      kind: ConfigMap\n      namespace: \"{{ vars.ns }}\"\n      name: \"{{ self.x }}\"\n    - id: b\n      apiVersion: v1\n      kind: ConfigMap\n      selector:\n        matchLabels:\n          app: \"{{ related.a.metadata.name }}\"\n        matchExpressions: \"{{ children.c.data.list }}\"\n  vars:\n    - name: ns\n      value: \"'x'\"\n  children:\n    - id: c\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata: {name: c}\n";
    let d = diagnostics(&format!("{TWO}{related}"));
    let sees =
        "(a related entry's name, namespace and selector sees parent, spec, metadata and rule)";
    for want in [
        format!(
            "rule.yaml:13: error: spec.related[0].namespace: `vars` is not available here {sees}"
        ),
        format!("rule.yaml:14: error: spec.related[0].name: `self` is not available here {sees}"),
        format!(
            "rule.yaml:20: error: spec.related[1].selector.matchLabels.app: `related` is not available here {sees}"
        ),
        format!(
            "rule.yaml:21: error: spec.related[1].selector.matchExpressions: `children` is not available here {sees}"
        ),
    ] {
        assert!(d.iter().any(|m| m.ends_with(&want)), "{want}\n{d:?}");
    }
}

/// The `| safe` warnings among `d`.
fn safe_warnings(d: &[String]) -> Vec<&String> {
    d.iter()
        .filter(|m| m.contains("warning") && m.contains("`| safe`"))
        .collect()
}

#[test]
fn every_safe_use_in_a_child_template_warns_on_its_line() {
    // HEAD is 12 lines; `template: |` is line 13, its first line 14.
    let d = with_template(
        "metadata:\n  name: {{ spec.a | safe }}\ndata:\n  b: {{ spec.b | safe }}\n  c: {{ spec.c|safe }}{{ spec.d | safe }}\n  d: a | safe",
    );
    let lines: Vec<&str> = safe_warnings(&d)
        .iter()
        .map(|m| m.split(": warning").next().unwrap_or_default())
        .collect();
    assert_eq!(
        lines
            .iter()
            .map(|l| l.rsplit(':').next().unwrap())
            .collect::<Vec<_>>(),
        vec!["15", "17", "18", "18"],
        "{d:?}"
    );
    assert!(
        d.iter()
            .all(|m| !m.contains("warning") || m.contains("spec.children[0].template")),
        "{d:?}"
    );
}

#[test]
fn safe_in_a_template_file_warns_on_its_line_in_that_file() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("rule.yaml"),
        format!("{HEAD}      templateFile: cm.yaml.j2\n"),
    )
    .unwrap();
    fs::write(
        dir.path().join("cm.yaml.j2"),
        "metadata:\n  name: x\ndata:\n  a: {{ spec.a | safe }}\n",
    )
    .unwrap();
    let set = load_dir(dir.path()).expect("a warning does not fail the set");
    let d: Vec<String> = set.warnings.iter().map(ToString::to_string).collect();
    let safe = safe_warnings(&d);
    assert_eq!(safe.len(), 1, "{d:?}");
    assert!(
        safe[0].contains("cm.yaml.j2:4: warning: spec.children[0].templateFile: `| safe`"),
        "{d:?}"
    );
}

#[test]
fn safe_in_vars_and_selector_templates_warns() {
    let text = format!(
        "{TWO}  related:\n    - id: src\n      apiVersion: v1\n      kind: ConfigMap\n      selector:\n        matchLabels: |\n          app: {{{{ spec.app | safe }}}}\n        matchExpressions:\n          - key: tier\n            operator: In\n            values: [\"{{{{ spec.tier | safe }}}}\"]\n  vars:\n    - name: a\n      value: \"spec.a | safe\"\n    - name: b\n      template: |\n        x: 1\n        y: {{{{ spec.y | safe }}}}\n  children: []\n"
    );
    let d = diagnostics(&text);
    let safe = safe_warnings(&d);
    for want in [
        "rule.yaml:15: warning: spec.related[0].selector.matchLabels: ",
        "rule.yaml:19: warning: spec.related[0].selector.matchExpressions[0].values[0]: ",
        "rule.yaml:22: warning: spec.vars[0].value: ",
        "rule.yaml:26: warning: spec.vars[1].template: ",
    ] {
        assert!(safe.iter().any(|m| m.contains(want)), "{want}\n{d:?}");
    }
    assert_eq!(safe.len(), 4, "{d:?}");
}

#[test]
fn octal_warnings_cover_flow_style_and_name_their_line() {
    let d = with_template(
        "metadata:\n  name: x\ndata:\n  a: \"0400\"\nspec:\n  volumes: [{name: a, defaultMode: 0400}]\n  modes: [0644, 0.5, 0]",
    );
    let octal: Vec<&String> = d.iter().filter(|m| m.contains("octal")).collect();
    assert_eq!(octal.len(), 2, "{d:?}");
    assert!(
        octal[0].contains("rule.yaml:19: warning") && octal[0].contains("`0400`"),
        "{d:?}"
    );
    assert!(
        octal[1].contains("rule.yaml:20: warning")
            && octal[1].contains("`0644`")
            && octal[1].contains("octal (420)"),
        "{d:?}"
    );
}

#[test]
fn cluster_expressions_are_checked_with_file_line_and_field() {
    let child = |cluster: &str| {
        diagnostics(&format!(
            "{HEAD}      cluster: {cluster}\n      template: |\n        metadata: {{name: x}}\n"
        ))
    };
    let d = child("\"'EU_1'\"");
    assert!(
        d.iter().any(|m| m.contains("rule.yaml:13")
            && m.contains("spec.children[0].cluster")
            && m.contains("`EU_1` is not a cluster name")),
        "{d:?}"
    );
    let d = child("\"spec.region ~\"");
    assert!(
        d.iter()
            .any(|m| m.contains("spec.children[0].cluster") && m.contains("expression syntax")),
        "{d:?}"
    );
    let d = child("\"children.nope.data.x\"");
    assert!(
        d.iter()
            .any(|m| m.contains("spec.children[0].cluster") && m.contains("children.nope")),
        "{d:?}"
    );
    let d = child("\"item\"");
    assert!(
        d.iter()
            .any(|m| m.contains("spec.children[0].cluster") && m.contains("`item`")),
        "{d:?}"
    );
    assert!(child("\"spec.region | default('local')\"").is_empty());

    let related = "  related:\n    - id: r\n      apiVersion: v1\n      kind: ConfigMap\n      name: x\n      cluster: \"related.r.data.c\"\n";
    let d = diagnostics(&format!(
        "{HEAD}      template: |\n        metadata: {{name: x}}\n{related}"
    ));
    assert!(
        d.iter()
            .any(|m| m.contains("spec.related[0].cluster") && m.contains("`related`")),
        "{d:?}"
    );
}
