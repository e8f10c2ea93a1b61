//! `children.<id>` of a child without `forEach` whose `includeWhen` is
//! false: absent, as before it was created, once its `includeWhen` has
//! decided — its object is about to be pruned.

use super::*;

/// `cm` with `includeWhen: spec.on`, observed as `a-cm`.
fn optional_cm() -> String {
    CM.replace(
        "      kind: ConfigMap\n",
        "      kind: ConfigMap\n      includeWhen: spec.on\n",
    )
}

fn cm_live() -> Value {
    live(
        "ConfigMap",
        "a-cm",
        "cm",
        json!({"data": {"v": "x"}, "status": {"n": 1}}),
    )
}

/// A child reading `children.cm`: rendered after it.
const READER: &str = "    - id: reader\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata:\n          name: reader\n        data:\n          seen: {{ 'yes' if children.cm is defined else 'no' }}\n";

/// Status reading `children.cm` through an expression, a condition and a
/// singular `jsonPath`.
const SEEN: &str = "  status:\n    fields:\n      - path: seen\n        value: \"children.cm is defined\"\n      - path: v\n        from: cm\n        jsonPath: $.data.v\n        default: gone\n    conditions:\n      - type: HasConfig\n        when: \"children.cm is defined\"\n        reason: ConfigObserved\n        message: \"{{ children.cm.data.v | default('none') }}\"\n";

fn status(p: &Plan) -> &Value {
    p.status.as_ref().unwrap()
}

fn reader_seen(p: &Plan) -> &Value {
    &p.apply.iter().find(|a| a.id == "reader").unwrap().object["data"]["seen"]
}

#[test]
fn included_child_is_its_observed_object() {
    let r = rule(&format!(
        "{PARENT_KIND}  children:\n{}{READER}{SEEN}",
        optional_cm()
    ));
    let p = run(&r, &parent(json!({"on": true})), vec![cm_live()]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(reader_seen(&p), "yes");
    assert_eq!(status(&p)["seen"], true);
    assert_eq!(status(&p)["v"], "x");
    assert_eq!(condition(&p, "HasConfig")["status"], "True");
    assert_eq!(condition(&p, "HasConfig")["message"], "x");
}

#[test]
fn excluded_child_is_absent_for_templates_read_after_it() {
    let r = rule(&format!(
        "{PARENT_KIND}  children:\n{}{READER}",
        optional_cm()
    ));
    let p = run(&r, &parent(json!({"on": false})), vec![cm_live()]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.delete.len(), 1, "a-cm is pruned");
    assert_eq!(reader_seen(&p), "no");
}

#[test]
fn excluded_child_is_absent_for_status_fields_and_conditions() {
    let r = rule(&format!(
        "{PARENT_KIND}  children:\n{}{SEEN}",
        optional_cm()
    ));
    let p = run(&r, &parent(json!({"on": false})), vec![cm_live()]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.delete.len(), 1, "a-cm is pruned");
    assert_eq!(status(&p)["seen"], false);
    assert_eq!(status(&p)["v"], "gone", "a singular jsonPath's default");
    let has_config = condition(&p, "HasConfig");
    assert_eq!(has_config["status"], "False");
    assert_eq!(has_config["reason"], "NotConfigObserved");
    assert_eq!(has_config["message"], "none");
}

#[test]
fn excluded_child_reads_the_same_as_one_never_created() {
    let r = rule(&format!(
        "{PARENT_KIND}  children:\n{}{READER}{SEEN}",
        optional_cm()
    ));
    let excluded = run(&r, &parent(json!({"on": false})), vec![cm_live()]);
    let never = run(&r, &parent(json!({"on": false})), vec![]);
    assert_eq!(excluded.status, never.status);
    assert_eq!(reader_seen(&excluded), reader_seen(&never));
}

#[test]
fn vars_and_its_own_include_when_still_see_the_observed_object() {
    // Decided before the child's `includeWhen`: what is observed.
    let vars = "  vars:\n    - name: had\n      value: \"children.cm is defined\"\n";
    let cm = CM.replace(
        "      kind: ConfigMap\n",
        "      kind: ConfigMap\n      includeWhen: \"spec.on and children.cm is defined\"\n",
    );
    let had = "  status:\n    fields:\n      - path: had\n        value: vars.had\n      - path: seen\n        value: \"children.cm is defined\"\n";
    let r = rule(&format!("{PARENT_KIND}{vars}  children:\n{cm}{had}"));
    let p = run(&r, &parent(json!({"on": true})), vec![cm_live()]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.apply.len(), 1, "its includeWhen saw a-cm");
    assert_eq!(status(&p)["seen"], true);

    let p = run(&r, &parent(json!({"on": false})), vec![cm_live()]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(
        status(&p)["had"],
        true,
        "vars are computed before any child"
    );
    assert_eq!(status(&p)["seen"], false);
}

#[test]
fn a_child_held_back_keeps_its_observed_object() {
    // Held back by a missing related object: its `includeWhen` is never
    // evaluated, nothing of it is pruned, and it stays visible.
    let related =
        "  related:\n    - id: src\n      apiVersion: v1\n      kind: Secret\n      name: src\n";
    let cm = optional_cm().replace(
        "      includeWhen: spec.on\n",
        "      includeWhen: spec.on\n      dependsOn: [src]\n",
    );
    let seen =
        "  status:\n    fields:\n      - path: seen\n        value: \"children.cm is defined\"\n";
    let r = rule(&format!("{PARENT_KIND}{related}  children:\n{cm}{seen}"));
    let p = run(&r, &parent(json!({"on": false})), vec![cm_live()]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert!(p.delete.is_empty());
    assert_eq!(status(&p)["seen"], true);
}
