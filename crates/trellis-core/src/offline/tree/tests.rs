use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::kinds;
use crate::plan::{self, Input, LABEL_CHILD, LABEL_PARENT_UID, LABEL_RULE, Observed};
use crate::rules::CompiledRule;

const UID: &str = "uid-1";
const PARENT_KIND: &str = "  parent: {apiVersion: demo.trellis.dev/v1, kind: App}\n";

fn rule(spec: &str) -> Arc<CompiledRule> {
    crate::rules::testing::rule_with_spec(spec)
}

fn parent(spec: Value) -> Value {
    json!({
        "apiVersion": "demo.trellis.dev/v1",
        "kind": "App",
        "metadata": {"name": "a", "namespace": "ns", "uid": UID, "generation": 1},
        "spec": spec,
    })
}

/// The tree of `parent` with `observed` live, planned as the operator does.
fn tree(rule: &CompiledRule, parent: &Value, observed: Vec<Value>) -> Tree {
    let observed = Observed::from_objects(observed);
    let plan = plan::plan(
        rule,
        &Input {
            parent,
            observed: &observed,
            now: "2026-12-05T00:00:00Z",
            scope_of: &kinds::scope,
            clusters: &crate::clusters::Clusters::offline(),
        },
    );
    build(rule, parent, &observed, &plan, None)
}

/// A ConfigMap child as the cluster holds it (no hash: not synced).
fn live_cm(name: &str, id: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
            "labels": {LABEL_RULE: "app", LABEL_CHILD: id, LABEL_PARENT_UID: UID}},
    })
}

/// What the operator applied for `id`, as the cluster would hold it.
fn applied(rule: &CompiledRule, parent: &Value, id: &str) -> Vec<Value> {
    let observed = Observed::default();
    let plan = plan::plan(
        rule,
        &Input {
            parent,
            observed: &observed,
            now: "2026-12-05T00:00:00Z",
            scope_of: &kinds::scope,
            clusters: &crate::clusters::Clusters::offline(),
        },
    );
    plan.apply
        .iter()
        .filter(|a| a.id == id)
        .map(|a| a.object.clone())
        .collect()
}

fn cm(id: &str, extra: &str) -> String {
    format!(
        "    - id: {id}\n      apiVersion: v1\n      kind: ConfigMap\n{extra}      template: |\n        metadata:\n          name: {{{{ parent.metadata.name ~ '-{id}' }}}}\n"
    )
}

fn line<'t>(tree: &'t Tree, id: &str) -> &'t Line {
    tree.lines
        .iter()
        .find(|l| l.id == id)
        .unwrap_or_else(|| panic!("no line {id}: {:#?}", tree.lines))
}

fn ids_and_depths(tree: &Tree) -> Vec<(String, usize)> {
    tree.lines.iter().map(|l| (l.id.clone(), l.depth)).collect()
}

#[test]
fn nests_each_entry_under_what_it_depends_on_in_dependency_order() {
    // b after a; c after a and b (nested under b, printed last); d alone.
    let r = rule(&format!(
        "{PARENT_KIND}  children:\n{}{}{}{}",
        cm("a", ""),
        cm("b", "      dependsOn: [a]\n"),
        cm("c", "      dependsOn: [a, b]\n"),
        cm("d", ""),
    ));
    let p = parent(json!({}));
    let t = tree(&r, &p, vec![]);
    assert_eq!(
        ids_and_depths(&t),
        [("a", 1), ("b", 2), ("c", 3), ("d", 1)].map(|(i, d)| (i.to_owned(), d))
    );
    assert_eq!(line(&t, "c").after, ["a"]);
    assert!(line(&t, "b").after.is_empty());
}

#[test]
fn a_child_rendered_but_not_there_is_missing_and_what_waits_for_it_is_held_back() {
    let r = rule(&format!(
        "{PARENT_KIND}  children:\n{}{}",
        cm("a", ""),
        cm("b", "      dependsOn: [a]\n"),
    ));
    let t = tree(&r, &parent(json!({})), vec![]);
    let a = line(&t, "a");
    assert_eq!(a.state, State::Missing);
    assert_eq!((a.ready, a.synced), (Some(false), Some(false)));
    assert_eq!(a.name.as_deref(), Some("a-a"));
    let b = line(&t, "b");
    assert_eq!(b.state, State::Pending);
    let why = b.reason.as_deref().unwrap_or_default();
    assert!(why.contains("child \"a\""), "{why}");
    assert!(!t.ready(), "no Ready condition: not ready");
}

#[test]
fn a_child_whose_include_when_is_false_is_listed_as_excluded() {
    let r = rule(&format!(
        "{PARENT_KIND}  children:\n{}",
        cm("a", "      includeWhen: \"spec.on\"\n"),
    ));
    let t = tree(&r, &parent(json!({"on": false})), vec![]);
    let a = line(&t, "a");
    assert_eq!(a.state, State::Excluded);
    assert_eq!((a.ready, a.synced, a.name.as_deref()), (None, None, None));
    let t = tree(&r, &parent(json!({"on": true})), vec![]);
    assert_eq!(line(&t, "a").state, State::Missing);
}

#[test]
fn synced_means_the_live_object_holds_this_rendering_and_its_hash() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{}", cm("a", "")));
    let p = parent(json!({}));
    let live = applied(&r, &p, "a");
    let t = tree(&r, &p, live.clone());
    let a = line(&t, "a");
    assert_eq!(
        (a.state, a.ready, a.synced),
        (State::Present, Some(true), Some(true))
    );
    // Someone changed a field trellis sets.
    let mut drifted = live[0].clone();
    drifted["metadata"]["labels"][LABEL_CHILD] = json!("a");
    drifted["metadata"]["name"] = json!("a-a");
    drifted["data"] = json!({"x": "1"});
    let mut hashless = live[0].clone();
    hashless["metadata"]["annotations"] = json!({});
    let t = tree(&r, &p, vec![hashless]);
    assert_eq!(line(&t, "a").synced, Some(false));
    // An object no longer rendered is listed as pruned.
    let t = tree(&r, &p, vec![live[0].clone(), live_cm("old", "gone")]);
    let gone = line(&t, "gone");
    assert_eq!(
        (gone.state, gone.name.as_deref()),
        (State::Pruning, Some("old"))
    );
}

#[test]
fn for_each_objects_get_a_line_each_and_the_first_not_ready_one_says_why() {
    let r = rule(&format!(
        "{PARENT_KIND}  children:\n    - id: item\n      apiVersion: apps/v1\n      kind: Deployment\n      forEach: \"spec.names\"\n      template: |\n        metadata:\n          name: {{{{ item }}}}\n        spec: {{}}\n"
    ));
    let p = parent(json!({"names": ["x", "y", "z"]}));
    let mut live = applied(&r, &p, "item");
    live[1]["status"] =
        json!({"conditions": [{"type": "Available", "status": "False", "message": "no pods"}]});
    live[2]["status"] = json!({"conditions": [{"type": "Available", "status": "False"}]});
    let t = tree(&r, &p, live);
    let rows: Vec<_> = t
        .lines
        .iter()
        .map(|l| (l.name.clone().unwrap_or_default(), l.ready))
        .collect();
    assert_eq!(
        rows,
        [("x", Some(true)), ("y", Some(false)), ("z", Some(false))].map(|(n, r)| (n.to_owned(), r))
    );
    // The row names the object: the reason does not repeat it.
    let why = t.lines[1].reason.as_deref().unwrap_or_default();
    assert_eq!(why, "condition Available is False: no pods");
}

#[test]
fn a_failing_ready_when_leaves_readiness_unknown_and_says_why() {
    let r = rule(&format!(
        "{PARENT_KIND}  children:\n{}",
        cm("a", "      readyWhen: \"self.status.count > 0\"\n"),
    ));
    let p = parent(json!({}));
    let t = tree(&r, &p, applied(&r, &p, "a"));
    let a = line(&t, "a");
    assert_eq!((a.state, a.ready), (State::Present, None));
    let why = a.reason.as_deref().unwrap_or_default();
    assert!(why.contains("readyWhen of child \"a\""), "{why}");
    assert!(!t.errors.is_empty());
}

#[test]
fn a_missing_related_object_is_missing_and_holds_back_its_reader_nested_under_it() {
    let r = rule(&format!(
        "{PARENT_KIND}  related:\n    - id: src\n      apiVersion: v1\n      kind: Secret\n      name: \"{{{{ spec.from }}}}\"\n  children:\n{}",
        cm("copy", "      dependsOn: [src]\n"),
    ));
    let t = tree(&r, &parent(json!({"from": "creds"})), vec![]);
    assert_eq!(
        ids_and_depths(&t),
        [("src".to_owned(), 1), ("copy".to_owned(), 2)]
    );
    let src = line(&t, "src");
    assert_eq!((src.role, src.state), (Role::Related, State::Missing));
    assert_eq!(
        (src.namespace.as_deref(), src.name.as_deref()),
        (Some("ns"), Some("creds"))
    );
    assert!(
        src.reason
            .as_deref()
            .unwrap_or_default()
            .starts_with("RelatedNotFound")
    );
    let copy = line(&t, "copy");
    assert_eq!(copy.state, State::Pending);
    assert!(
        copy.reason
            .as_deref()
            .unwrap_or_default()
            .contains("RelatedNotFound")
    );
    // Once it exists, it is read and ready; its reader renders.
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "creds", "namespace": "ns", "uid": "s"}});
    let t = tree(&r, &parent(json!({"from": "creds"})), vec![secret]);
    let src = line(&t, "src");
    assert_eq!(
        (src.state, src.ready, src.synced),
        (State::Present, Some(true), None)
    );
    assert_eq!(line(&t, "copy").state, State::Missing);
}

#[test]
fn a_patch_whose_target_does_not_exist_is_missing_and_one_that_exists_is_synced_when_held() {
    let r = rule(&format!(
        "{PARENT_KIND}  patches:\n    - id: label\n      apiVersion: v1\n      kind: Namespace\n      allowCrossNamespace: true\n      template: |\n        metadata:\n          name: {{{{ spec.ns }}}}\n          labels: {{team: {{{{ spec.team }}}}}}\n"
    ));
    let p = parent(json!({"ns": "target", "team": "red"}));
    let t = tree(&r, &p, vec![]);
    let l = line(&t, "label");
    assert_eq!((l.role, l.state), (Role::Patch, State::Missing));
    assert!(
        l.reason
            .as_deref()
            .unwrap_or_default()
            .contains("TargetNotFound"),
        "{l:?}"
    );
    let target = |team: &str| {
        json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "target", "uid": "ns-uid", "labels": {"team": team}}})
    };
    let l = line(&tree(&r, &p, vec![target("red")]), "label").clone();
    assert_eq!(
        (l.state, l.ready, l.synced),
        (State::Present, Some(true), Some(true))
    );
    let l = line(&tree(&r, &p, vec![target("blue")]), "label").clone();
    assert_eq!(l.synced, Some(false));
}

#[test]
fn the_parent_is_ready_by_its_ready_condition_and_a_built_in_one_by_its_children() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{}", cm("a", "")));
    let mut p = parent(json!({}));
    p["status"] = json!({"conditions": [
        {"type": "Ready", "status": "True", "reason": "Ready", "message": ""},
        {"type": "Synced", "status": "True", "reason": "Applied"}]});
    let t = tree(&r, &p, vec![]);
    assert!(t.ready());
    assert_eq!(t.parent.ready_from, ReadyFrom::Condition);
    assert_eq!(t.parent.conditions[1].reason.as_deref(), Some("Applied"));
    assert_eq!(t.parent.conditions[0].message, None);

    let deco = rule(&format!(
        "  parent: {{apiVersion: apps/v1, kind: Deployment}}\n  children:\n{}",
        cm("a", "")
    ));
    let mut dep = parent(json!({}));
    dep["apiVersion"] = json!("apps/v1");
    dep["kind"] = json!("Deployment");
    let t = tree(&deco, &dep, vec![]);
    assert_eq!(
        (t.ready(), t.parent.ready_from),
        (false, ReadyFrom::Children)
    );
    let live = applied(&deco, &dep, "a");
    assert!(tree(&deco, &dep, live.clone()).ready());
    // Its own conditions count too, as a child's would.
    dep["status"] = json!({"conditions": [{"type": "Available", "status": "False"}]});
    assert!(!tree(&deco, &dep, live).ready());
}

#[test]
fn a_skipped_parent_has_no_lines() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{}", cm("a", "")));
    let p = parent(json!({}));
    let t = build(
        &r,
        &p,
        &Observed::default(),
        &plan::Plan::default(),
        Some("paused".into()),
    );
    assert!(t.lines.is_empty());
    assert!(text::print(&[t]).contains("skipped: paused"));
}

#[test]
fn text_draws_the_tree_under_the_parent_with_one_row_per_line() {
    let r = rule(&format!(
        "{PARENT_KIND}  children:\n{}{}{}",
        cm("a", ""),
        cm("b", "      dependsOn: [a]\n"),
        cm("c", "      includeWhen: \"false\"\n"),
    ));
    let mut p = parent(json!({}));
    p["status"] = json!({"conditions": [
        {"type": "Ready", "status": "False", "reason": "DependencyNotReady", "message": "waiting\nfor a"}]});
    let out = text::print(&[tree(&r, &p, vec![])]);
    let rows: Vec<&str> = out.lines().collect();
    assert_eq!(rows[0], "rule app: App ns/a");
    assert_eq!(rows[1], "  Ready=False  DependencyNotReady  waiting for a");
    let table: Vec<Vec<&str>> = rows[3..]
        .iter()
        .map(|r| {
            r.split("  ")
                .filter(|c| !c.is_empty())
                .map(str::trim)
                .collect()
        })
        .collect();
    assert_eq!(
        table[0],
        ["ENTRY", "KIND", "OBJECT", "READY", "SYNCED", "STATUS"]
    );
    assert_eq!(
        table[1],
        ["App/a", "App", "ns/a", "False", "-", "DependencyNotReady"]
    );
    assert_eq!(
        table[2],
        [
            "├─ a",
            "ConfigMap",
            "ns/a-a",
            "False",
            "False",
            "missing: does not exist yet"
        ]
    );
    assert!(rows[6].starts_with("│  └─ b "), "{out}");
    assert!(
        rows[6]
            .ends_with("  held back: waiting for child \"a\": ConfigMap ns/a-a does not exist yet"),
        "{out}"
    );
    assert_eq!(
        table[4],
        [
            "└─ c",
            "ConfigMap",
            "-",
            "-",
            "-",
            "excluded: includeWhen is false for this parent"
        ]
    );
}

#[test]
fn json_names_states_and_roles_in_camel_case() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{}", cm("a", "")));
    let t = tree(&r, &parent(json!({})), vec![]);
    let doc = to_json(std::slice::from_ref(&t));
    assert_eq!(doc["ready"], false);
    let v = &doc["trees"][0];
    assert_eq!(v["rule"], "app");
    assert_eq!(v["parent"]["readyFrom"], "condition");
    assert_eq!(v["lines"][0]["state"], "missing");
    assert_eq!(v["lines"][0]["role"], "child");
    assert_eq!(v["lines"][0]["apiVersion"], "v1");
    assert_eq!(v["lines"][0]["depth"], 1);
}
