//! A test file read against a rule set, and cases run through the pass.

use std::path::Path;

use super::{load_text, run_suites};
use crate::rules::{Diagnostic, RuleSet};

const RULE: &str = "apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata: {name: app}
spec:
  parent: {apiVersion: demo.trellis.dev/v1, kind: App}
  crd: {}
  schema:
    type: object
    properties:
      names: {type: array, items: {type: string}}
      extra: {type: boolean}
  defaults: {names: [], extra: false}
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata: {name: {{ parent.metadata.name }}}
        data: {count: {{ spec.names | length | string }}}
    - id: web
      apiVersion: v1
      kind: ConfigMap
      dependsOn: [config]
      template: |
        metadata: {name: {{ parent.metadata.name ~ '-web' }}}
    - id: items
      apiVersion: v1
      kind: ConfigMap
      forEach: spec.names
      template: |
        metadata: {name: {{ item }}}
    - id: extra
      apiVersion: v1
      kind: ConfigMap
      includeWhen: spec.extra
      template: |
        metadata: {name: {{ parent.metadata.name ~ '-extra' }}}
  status:
    fields:
      - {path: names, value: spec.names | length}
    conditions:
      - type: Configured
        when: children.config is defined
        reason: ConfigExists
";

fn set() -> RuleSet {
    crate::rules::testing::load_texts(&[("app.yaml", RULE)])
}

fn suite(cases: &str) -> String {
    format!(
        "apiVersion: trellis.dev/v1alpha1
kind: RuleTest
metadata: {{name: app}}
spec:
  rule: app
  cases:
{cases}"
    )
}

const PARENT: &str =
    "parent: {apiVersion: demo.trellis.dev/v1, kind: App, metadata: {name: a, namespace: ns}";

fn diags(text: &str) -> Vec<String> {
    let (suites, diags) = load_text(Path::new("t.test.yaml"), text, &set());
    assert!(
        suites.is_empty() || diags.is_empty(),
        "a file with errors yields no suite"
    );
    diags.iter().map(Diagnostic::to_string).collect()
}

/// The mismatches of each case, as text.
fn run(cases: &str) -> Vec<Vec<String>> {
    let (suites, diags) = load_text(Path::new("t.test.yaml"), &suite(cases), &set());
    assert_eq!(diags, vec![], "the test file is fine");
    run_suites(&suites).suites[0]
        .cases
        .iter()
        .map(|c| c.mismatches.iter().map(ToString::to_string).collect())
        .collect()
}

#[test]
fn a_passing_case_checks_children_absent_pending_status_conditions_and_errors() {
    let outcome = run(&format!(
        "    - name: first pass
      {PARENT}, spec: {{names: [x, y]}}}}
      expect:
        children:
          config: {{metadata: {{name: a, namespace: ns}}, data: {{count: \"2\"}}}}
          items: [{{metadata: {{name: x}}}}, {{metadata: {{name: y}}}}]
        absent: [web, extra]
        pending: {{web: 'waiting for child \"config\"'}}
        status: {{names: 2}}
        conditions: {{Ready: \"False\", Synced: False/DependencyNotReady, Configured: False}}
        errors: []
"
    ));
    assert_eq!(outcome, vec![Vec::<String>::new()]);
}

#[test]
fn each_kind_of_expectation_fails_with_its_path_expected_and_actual() {
    let outcome = run(&format!(
        "    - name: wrong about everything
      {PARENT}, spec: {{names: [x], extra: true}}}}
      observed:
        - {{apiVersion: v1, kind: ConfigMap, metadata: {{name: a, namespace: ns}}}}
      expect:
        children:
          config: {{data: {{count: \"2\"}}}}
          items: [{{metadata: {{name: x}}}}, {{metadata: {{name: y}}}}]
        absent: [extra]
        pending: {{web: config}}
        status: {{names: 2, missing: true}}
        conditions: {{Configured: True/Other, Synced: \"False\"}}
        errors: [boom]
"
    ));
    assert_eq!(
        outcome,
        vec![vec![
            "children.config.data.count: expected \"2\", got \"1\"",
            "children.items: expected \"2 object(s)\", got \"1 object(s): ConfigMap ns/x\"",
            "absent.extra: expected \"no object\", got \"rendered: ConfigMap ns/a-extra\"",
            "pending.web: expected \"pending, the reason containing \\\"config\\\"\", \
             got \"not pending: rendered\"",
            "status.names: expected 2, got 1",
            "status.missing: expected true, got nothing (missing)",
            "conditions.Configured: expected \"True/Other\", got \"True/ConfigExists\"",
            "conditions.Synced: expected \"False\", got \"True/Applied\"",
            "errors[0]: expected \"an error containing \\\"boom\\\"\", got []",
        ]]
    );
}

#[test]
fn an_error_of_the_pass_not_listed_fails_errors_and_unchecked_keys_do_not() {
    let cases = format!(
        "    - name: lists no error
      {PARENT}, spec: {{names: [1]}}}}
      expect: {{errors: []}}
    - name: checks nothing
      {PARENT}, spec: {{names: [1]}}}}
      expect: {{}}
    - name: names the error
      {PARENT}, spec: {{names: [1]}}}}
      expect: {{errors: [names]}}
"
    );
    let outcome = run(&cases);
    assert_eq!(outcome[0].len(), 1, "{outcome:?}");
    assert!(
        outcome[0][0]
            .starts_with("errors: expected \"0 error(s), as listed\", got \"an error not listed: "),
        "{outcome:?}"
    );
    assert_eq!(outcome[1], Vec::<String>::new());
    assert_eq!(outcome[2], Vec::<String>::new());
}

#[test]
fn a_missing_child_says_why_it_has_no_object() {
    let outcome = run(&format!(
        "    - name: web is held back
      {PARENT}}}
      expect:
        children: {{web: {{}}, extra: {{}}}}
"
    ));
    assert_eq!(
        outcome[0],
        [
            "children.extra: expected {}, got \"no object: not rendered in this pass\"",
            "children.web: expected {}, got \"no object: pending (waiting for child \\\"config\\\": \
             ConfigMap ns/a does not exist yet)\"",
        ]
    );
}

#[test]
fn a_parent_the_rule_does_not_select_fails_the_case() {
    let rule = RULE.replace("kind: App}\n", "kind: App, namespaces: [prod]}\n");
    let set = crate::rules::testing::load_texts(&[("app.yaml", &rule)]);
    let text = suite(&format!(
        "    - name: wrong namespace\n      {PARENT}}}\n      expect: {{}}\n"
    ));
    let (suites, diags) = load_text(Path::new("t.test.yaml"), &text, &set);
    assert_eq!(diags, vec![]);
    let report = run_suites(&suites);
    let case = &report.suites[0].cases[0];
    assert_eq!(case.mismatches.len(), 1);
    assert_eq!(case.mismatches[0].path, "parent");
}

#[test]
fn wrong_test_files_are_diagnosed_with_line_and_field() {
    let d = diags(&suite(&format!(
        "    - name: one
      {PARENT}}}
      expect:
        children: {{items: {{}}, config: [], nope: {{}}}}
        conditions: {{Ready: Maybe}}
        statuz: {{}}
    - name: two
      {PARENT}}}
      expect: {{}}
    - name: two
      {PARENT}}}
      expect: {{}}
    - name: a ConfigMap
      parent: {{apiVersion: v1, kind: ConfigMap, metadata: {{name: a}}}}
      expect: {{}}
    - name: no parent
      expect: {{}}
"
    )));
    assert_eq!(
        d,
        [
            "t.test.yaml:12: error: spec.cases[0].expect.statuz: unknown field `statuz` (expected \
             one of: children, absent, pending, status, conditions, errors)",
            "t.test.yaml:10: error: spec.cases[0].expect.children.items: child `items` has forEach: \
             expect a list of its objects in item order, not a mapping",
            "t.test.yaml:10: error: spec.cases[0].expect.children.config: `config` renders one \
             object: expect a mapping (a subset of it), not a list",
            "t.test.yaml:10: error: spec.cases[0].expect.children.nope: rule `app` has no child or \
             patch `nope` (ids: config, web, items, extra)",
            "t.test.yaml:11: error: spec.cases[0].expect.conditions.Ready: `Maybe`: expected a \
             condition status (True, False, Unknown), optionally with a reason: \"False/RenderError\"",
            "t.test.yaml:16: error: spec.cases[2].name: case name `two` is used twice in this file",
            "t.test.yaml:20: error: spec.cases[3].parent: the parent is a v1/ConfigMap; rule `app` \
             takes parents of kind demo.trellis.dev/v1/App",
            "t.test.yaml:22: error: spec.cases[4]: a case needs `parent` (inline) or `parentFile`",
        ]
    );
}

#[test]
fn a_rule_or_another_kind_in_a_test_file_is_refused() {
    let d = diags(RULE);
    assert_eq!(d.len(), 1, "{d:?}");
    assert!(
        d[0].contains("a Rule belongs in the rules directory, never in a test file"),
        "{d:?}"
    );
    let d =
        diags("apiVersion: trellis.dev/v1alpha1\nkind: RuleTest\nspec:\n  rule: ap\n  cases: []\n");
    assert_eq!(
        d,
        ["t.test.yaml:4: error: spec.rule: unknown rule `ap` (rules: app)"]
    );
    let d = diags("a: [");
    assert_eq!(d.len(), 1);
    assert!(d[0].starts_with("t.test.yaml:1: error: "), "{d:?}");
}

#[test]
fn a_yaml_boolean_stands_for_a_condition_status() {
    let outcome = run(&format!(
        "    - name: booleans
      {PARENT}}}
      expect: {{conditions: {{Configured: false, Synced: False}}}}
"
    ));
    assert_eq!(outcome, vec![Vec::<String>::new()]);
}

#[test]
fn parent_and_observed_files_are_read_relative_to_the_test_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("in")).unwrap();
    std::fs::write(
        dir.path().join("parent.yaml"),
        "apiVersion: demo.trellis.dev/v1\nkind: App\nmetadata: {name: a, namespace: ns}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("observed.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, namespace: ns}\n",
    )
    .unwrap();
    let text = suite(
        "    - name: from files
      parentFile: ../parent.yaml
      observedFile: ../observed.yaml
      expect: {children: {web: {metadata: {name: a-web}}}}
    - name: a missing file
      parentFile: ../nope.yaml
      expect: {}
",
    );
    let file = dir.path().join("in/t.test.yaml");
    let (_, diags) = load_text(&file, &text, &set());
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert_eq!(diags[0].line, Some(12));
    assert!(diags[0].message.contains("nope.yaml"), "{}", diags[0]);
    let text = text
        .split("    - name: a missing")
        .next()
        .unwrap()
        .to_owned();
    let (suites, diags) = load_text(&file, &text, &set());
    assert_eq!(diags, vec![]);
    let report = run_suites(&suites);
    assert!(report.passed(), "{}", report.to_text());
}
