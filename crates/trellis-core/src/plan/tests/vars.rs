//! `vars:` in a pass: what a failing var withholds, and what it leaves be.

use super::*;

/// A ConfigMap child `id` whose one data key prints `expr`.
fn reader(id: &str, expr: &str) -> String {
    format!(
        "    - id: {id}
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {id}
        data:
          v: {{{{ {expr} }}}}
"
    )
}

/// `good`, then `bad` (a missing value in `~`), then `after` (reads
/// neither), then `chained` (reads `bad`).
const VARS: &str = "  vars:
    - name: good
      value: \"parent.metadata.name ~ '-good'\"
    - name: bad
      value: \"spec.missing ~ '-bad'\"
    - name: after
      value: \"'after'\"
    - name: chained
      value: \"vars.bad ~ '-chained'\"
";

fn applied(plan: &Plan) -> Vec<&str> {
    plan.apply.iter().map(|a| a.id.as_str()).collect()
}

#[test]
fn a_failing_var_leaves_earlier_vars_defined() {
    let status = "  status:
    fields:
      - path: good
        value: vars.good
      - path: bad
        value: vars.bad
";
    let r = rule(&format!(
        "{PARENT_KIND}{VARS}  children:\n{}{}{status}",
        reader("uses-good", "vars.good"),
        reader("uses-bad", "vars.bad"),
    ));
    let p = run(&r, &parent(json!({})), vec![]);
    assert_eq!(applied(&p), ["uses-good"], "{:?}", p.errors);
    assert_eq!(p.apply[0].object["data"]["v"], "a-good");
    assert_eq!(p.status.as_ref().unwrap()["good"], "a-good");
    assert_eq!(
        p.errors,
        [
            "var `bad`: `spec.missing ~ '-bad'`: missing value: `spec.missing` is undefined \
             (line 1); use `| default(...)` or `is defined`",
            "child \"uses-bad\": reads var `bad`, which failed in this pass",
            "status field `bad`: reads var `bad`, which failed in this pass",
        ],
        "the failing var once, then only its readers"
    );
    assert_eq!(
        p.failure_reason,
        Some(crate::plan::FailureReason::RenderError)
    );
}

#[test]
fn a_var_after_the_failing_one_keeps_its_value_unless_it_reads_it() {
    let r = rule(&format!(
        "{PARENT_KIND}{VARS}  children:\n{}{}",
        reader("uses-after", "vars.after"),
        reader("uses-chained", "vars.chained"),
    ));
    let p = run(&r, &parent(json!({})), vec![]);
    assert_eq!(applied(&p), ["uses-after"], "{:?}", p.errors);
    assert_eq!(p.apply[0].object["data"]["v"], "after");
    assert_eq!(p.errors.len(), 2, "{:?}", p.errors);
    assert!(p.errors[0].starts_with("var `bad`: "), "{:?}", p.errors);
    assert_eq!(
        p.errors[1],
        "child \"uses-chained\": reads var `chained`, which reads var `bad`, \
         which failed in this pass",
        "`chained` did not fail on its own: it is not reported, its reader says why"
    );
}

#[test]
fn a_reader_of_a_failed_var_is_an_error_even_with_a_default() {
    let r = rule(&format!(
        "{PARENT_KIND}{VARS}  children:\n{}{}",
        reader("fallback", "vars.bad | default('fallback')"),
        reader("whole", "vars | length"),
    ));
    let p = run(&r, &parent(json!({})), vec![]);
    assert!(p.apply.is_empty(), "{:?}", p.apply);
    assert_eq!(
        &p.errors[1..],
        [
            "child \"fallback\": reads var `bad`, which failed in this pass",
            "child \"whole\": reads var `bad`, which failed in this pass",
        ],
        "`| default` would hide the failure; `vars` read whole reads every var"
    );
}

#[test]
fn a_pass_with_a_failed_var_prunes_nothing() {
    let r = rule(&format!(
        "{PARENT_KIND}{VARS}  children:\n{}    - id: gone
      apiVersion: v1
      kind: ConfigMap
      includeWhen: \"false\"
      template: |
        metadata:
          name: gone
",
        reader("uses-good", "vars.good"),
    ));
    let stale = live("ConfigMap", "gone", "gone", json!({}));
    let p = run(&r, &parent(json!({})), vec![stale]);
    assert_eq!(applied(&p), ["uses-good"]);
    assert!(p.delete.is_empty(), "{:?}", p.delete);
}

#[test]
fn a_patch_and_a_condition_reading_a_failed_var_are_errors() {
    let r = rule(&format!(
        "{PARENT_KIND}{VARS}  children:\n{}  patches:
    - id: mark
      apiVersion: v1
      kind: Namespace
      allowCrossNamespace: true
      template: |
        metadata:
          name: {{{{ vars.chained }}}}
  status:
    conditions:
      - type: Named
        when: \"vars.good is defined\"
        reason: HasName
      - type: Broken
        when: \"true\"
        reason: Never
        message: \"{{{{ vars.bad }}}}\"
",
        reader("uses-good", "vars.good"),
    ));
    let p = run(&r, &parent(json!({})), vec![]);
    assert_eq!(applied(&p), ["uses-good"]);
    assert!(p.patches.is_empty(), "{:?}", p.patches);
    assert_eq!(
        &p.errors[1..],
        [
            "patch \"mark\": reads var `chained`, which reads var `bad`, which failed in this pass",
            "condition Broken: reads var `bad`, which failed in this pass",
        ]
    );
    assert_eq!(condition(&p, "Named")["status"], "True");
}

/// `hosts` (a list built by a loop), `labels` (a map built by a loop) and
/// `maybe` (a list item behind an `if`), a ConfigMap per host, and status
/// fields reading them.
const BUILT: &str = "  vars:
    - name: hosts
      template: |
        {% for h in spec.hosts %}
        - {{ h }}
        {% endfor %}
    - name: labels
      template: |
        {% for k, v in spec.labels | items %}
        {{ k }}: {{ v }}
        {% endfor %}
    - name: maybe
      template: |
        # only when asked
        {% if spec.extra %}
        - extra
        {% endif %}
  children:
    - id: host
      apiVersion: v1
      kind: ConfigMap
      forEach: vars.hosts
      template: |
        metadata:
          name: {{ item }}
  status:
    fields:
      - path: hosts
        value: \"vars.hosts | length\"
      - path: labels
        value: vars.labels
      - path: maybe
        value: vars.maybe
";

#[test]
fn a_template_var_whose_loop_has_no_items_is_empty_not_none() {
    let r = rule(&format!("{PARENT_KIND}{BUILT}"));
    let p = run(
        &r,
        &parent(json!({"hosts": [], "labels": {}, "extra": false})),
        vec![],
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert!(p.apply.is_empty());
    let status = p.status.as_ref().unwrap();
    assert_eq!(
        (&status["hosts"], &status["labels"], &status["maybe"]),
        (&json!(0), &json!({}), &json!([]))
    );
    let p = run(
        &r,
        &parent(json!({"hosts": ["a"], "labels": {"k": "v"}, "extra": true})),
        vec![],
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let status = p.status.as_ref().unwrap();
    assert_eq!(
        (&status["hosts"], &status["labels"], &status["maybe"]),
        (&json!(1), &json!({"k": "v"}), &json!(["extra"]))
    );
}

#[test]
fn a_template_var_that_writes_null_or_a_bare_value_stays_as_written() {
    let vars = "  vars:
    - name: explicit
      template: \"~\"
    - name: bare
      template: \"{% if spec.on %}{{ 'on' }}{% endif %}\"
  status:
    fields:
      - path: explicit
        value: \"vars.explicit is none\"
      - path: bare
        value: \"vars.bare is none\"
";
    let r = rule(&format!("{PARENT_KIND}{vars}"));
    let p = run(&r, &parent(json!({"on": false})), vec![]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let status = p.status.as_ref().unwrap();
    assert_eq!(
        (&status["explicit"], &status["bare"]),
        (&json!(true), &json!(true)),
        "no block sequence or mapping to take the shape of: an empty document is null"
    );
}
