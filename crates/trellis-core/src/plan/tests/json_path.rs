//! A status field's `jsonPath` when its `from:` child is not observed at
//! all: a singular query yields nothing (so the field's `default`), any
//! other query `[]`, as RULES.md says — `default` is not used for it.

use super::*;

/// Fields on `cm`: a non-singular and a singular query, both with a default.
const FIELDS: &str = "  status:\n    fields:\n      - path: keys\n        from: cm\n        jsonPath: $.data[*]\n        default: none\n      - path: v\n        from: cm\n        jsonPath: $.data.v\n        default: none\n";

fn status(p: &Plan) -> &Value {
    p.status.as_ref().unwrap()
}

#[test]
fn non_singular_json_path_on_a_child_not_created_is_an_empty_list() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}{FIELDS}"));
    let p = run(&r, &parent(json!({})), vec![]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(status(&p)["keys"], json!([]), "not its default");
    assert_eq!(status(&p)["v"], "none", "a singular query: its default");
}

#[test]
fn non_singular_json_path_is_a_list_whether_or_not_the_child_exists() {
    let r = rule(&format!("{PARENT_KIND}  children:\n{CM}{FIELDS}"));
    let without_data = live("ConfigMap", "a-cm", "cm", json!({}));
    let with_data = live("ConfigMap", "a-cm", "cm", json!({"data": {"v": "x"}}));
    for (observed, keys, v) in [
        (vec![], json!([]), json!("none")),
        (vec![without_data], json!([]), json!("none")),
        (vec![with_data], json!(["x"]), json!("x")),
    ] {
        let p = run(&r, &parent(json!({})), observed);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        assert_eq!(status(&p)["keys"], keys);
        assert_eq!(status(&p)["v"], v);
    }
}

#[test]
fn non_singular_json_path_on_an_excluded_child_is_an_empty_list() {
    let cm = CM.replace(
        "      kind: ConfigMap\n",
        "      kind: ConfigMap\n      includeWhen: spec.on\n",
    );
    let r = rule(&format!("{PARENT_KIND}  children:\n{cm}{FIELDS}"));
    let observed = live("ConfigMap", "a-cm", "cm", json!({"data": {"v": "x"}}));
    let p = run(&r, &parent(json!({"on": false})), vec![observed]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.delete.len(), 1);
    assert_eq!(status(&p)["keys"], json!([]));
    assert_eq!(status(&p)["v"], "none");
}
