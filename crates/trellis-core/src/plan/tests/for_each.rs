//! `children.<id>` of a `forEach` child, and a status `jsonPath` on it:
//! item order, `[]` when nothing is observed.

use super::*;

/// Items `b`, `a`: item order (a-b, a-a) is not name order (a-a, a-b).
const ITEMS: &[&str] = &["b", "a"];

fn each_live(item: &str) -> Value {
    live("ConfigMap", &format!("a-{item}"), "each", json!({}))
}

/// A child reading `children.each`: rendered after it, once it is ready.
const SUMMARY: &str = "    - id: summary\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata:\n          name: summary\n        data:\n          names: {{ children.each | map(attribute='metadata.name') | join(',') }}\n";

const NAMES: &str = "  status:\n    fields:\n      - path: names\n        value: \"children.each | map(attribute='metadata.name') | list\"\n      - path: viaPath\n        from: each\n        jsonPath: $[*].metadata.name\n      - path: first\n        from: each\n        jsonPath: $[0].metadata.name\n        default: none\n    conditions:\n      - type: Empty\n        when: \"children.each | length == 0\"\n        reason: NoItems\n";

fn status(p: &Plan) -> &Value {
    p.status.as_ref().unwrap()
}

#[test]
fn for_each_child_is_a_list_in_item_order_not_name_order() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{EACH}{SUMMARY}{NAMES}"));
    let p = run(
        &r,
        &parent(json!({"items": ITEMS})),
        vec![each_live("a"), each_live("b")],
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let summary = p.apply.iter().find(|a| a.id == "summary").unwrap();
    assert_eq!(summary.object["data"]["names"], "a-b,a-a");
    assert_eq!(status(&p)["names"], json!(["a-b", "a-a"]));
}

#[test]
fn status_json_path_on_a_for_each_child_has_its_items_in_item_order_as_root() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{EACH}{NAMES}"));
    let p = run(
        &r,
        &parent(json!({"items": ITEMS})),
        vec![each_live("a"), each_live("b")],
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(status(&p)["viaPath"], json!(["a-b", "a-a"]));
    assert_eq!(status(&p)["first"], "a-b");
}

#[test]
fn objects_of_items_no_longer_rendered_are_left_out() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{EACH}{NAMES}"));
    let p = run(
        &r,
        &parent(json!({"items": ["b"]})),
        vec![each_live("a"), each_live("b")],
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.delete.len(), 1, "a-a is pruned");
    assert_eq!(status(&p)["names"], json!(["a-b"]));
    assert_eq!(status(&p)["viaPath"], json!(["a-b"]));
}

#[test]
fn for_each_child_with_nothing_observed_is_an_empty_list() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{EACH}{NAMES}"));
    for items in [json!([]), json!(ITEMS)] {
        let p = run(&r, &parent(json!({"items": items})), vec![]);
        assert!(p.errors.is_empty(), "{items}: {:?}", p.errors);
        assert_eq!(status(&p)["names"], json!([]), "{items}");
        // A non-singular query yields [] when nothing matches; a singular
        // one yields nothing, so its default.
        assert_eq!(status(&p)["viaPath"], json!([]), "{items}");
        assert_eq!(status(&p)["first"], "none", "{items}");
        assert_eq!(condition(&p, "Empty")["status"], "True", "{items}");
    }
}

#[test]
fn excluded_for_each_child_is_an_empty_list() {
    let each = EACH.replace(
        "      forEach: spec.items\n",
        "      forEach: spec.items\n      includeWhen: spec.on\n",
    );
    let r = rule(&format!("{PARENT_KIND}  children:\n{each}{NAMES}"));
    let p = run(
        &r,
        &parent(json!({"items": ITEMS, "on": false})),
        vec![each_live("a"), each_live("b")],
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.delete.len(), 2);
    assert_eq!(status(&p)["names"], json!([]));
}

#[test]
fn for_each_child_that_failed_to_render_is_in_name_order() {
    let each = EACH.replace("'-' ~ item", "'-' ~ item.n");
    let r = rule(&format!("{PARENT_KIND}  children:\n{each}{NAMES}"));
    let p = run(
        &r,
        &parent(json!({"items": [{"n": "b"}, {}]})),
        vec![each_live("b"), each_live("a")],
    );
    assert!(
        p.errors.iter().any(|e| e.contains("child \"each\"")),
        "{:?}",
        p.errors
    );
    assert!(p.delete.is_empty());
    assert_eq!(status(&p)["names"], json!(["a-a", "a-b"]));
    assert_eq!(status(&p)["viaPath"], json!(["a-a", "a-b"]));
}

#[test]
fn vars_see_a_for_each_child_before_it_renders_in_name_order() {
    let vars = "  vars:\n    - name: seen\n      value: \"children.each | map(attribute='metadata.name') | list\"\n";
    let seen = "  status:\n    fields:\n      - path: seen\n        value: vars.seen\n";
    let r = rule(&format!("{PARENT_KIND}{vars}  children:\n{EACH}{seen}"));
    let p = run(
        &r,
        &parent(json!({"items": ITEMS})),
        vec![each_live("b"), each_live("a")],
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(status(&p)["seen"], json!(["a-a", "a-b"]));
}
