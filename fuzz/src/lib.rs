//! What the fuzz targets share: the repository's example rules and parents,
//! one planning pass as the operator runs it, and the invariants every pass
//! must keep whatever the parent holds.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;
use trellis::plan::{self, Input, LABEL_PARENT_UID, LABEL_RULE, Observed, Plan};
use trellis::rules::{CompiledRule, RuleSet};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// The example rules (`rules/`), loaded once.
pub fn example_rules() -> &'static RuleSet {
    static RULES: OnceLock<RuleSet> = OnceLock::new();
    RULES.get_or_init(|| {
        RuleSet::load(&[repo("rules")], Default::default())
            .unwrap_or_else(|diags| panic!("the example rules do not load: {diags:?}"))
    })
}

/// Each example rule with an example parent of its kind (`examples/parents/`).
pub fn examples() -> &'static [(&'static CompiledRule, Value)] {
    static EXAMPLES: OnceLock<Vec<(&'static CompiledRule, Value)>> = OnceLock::new();
    EXAMPLES.get_or_init(|| {
        let mut parents = Vec::new();
        let mut files: Vec<PathBuf> = std::fs::read_dir(repo("examples/parents"))
            .expect("examples/parents")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        files.sort();
        for file in files {
            let text = std::fs::read_to_string(&file).expect("read an example parent");
            let docs = trellis::yaml::parse_documents(&text, &trellis::yaml::Limits::FILES)
                .expect("example parents are YAML");
            parents.extend(docs.into_iter().map(|d| d.value));
        }
        example_rules()
            .rules
            .iter()
            .filter_map(|rule| {
                let parent = parents.iter().find(|p| {
                    p["kind"] == rule.parent.kind.as_str()
                        && plan::parent_matches(rule, p)
                })?;
                Some((rule.as_ref(), parent.clone()))
            })
            .collect()
    })
}

/// One pass of `rule` over `parent` and `observed`, as `trellis render` runs it.
pub fn plan_once(rule: &CompiledRule, parent: &Value, observed: &Observed) -> Plan {
    let scope = trellis::cli::offline_scope(rule);
    let input = Input {
        parent,
        observed,
        now: "2026-12-01T00:00:00Z",
        scope_of: &scope,
    };
    plan::plan(rule, &input)
}

/// What no parent can change: every child to apply is one the rule
/// declares, with the declared apiVersion and kind, carrying this rule's and
/// this parent's labels; a child without `forEach` is one object at most.
pub fn assert_contained(rule: &CompiledRule, parent: &Value, plan: &Plan) {
    let uid = parent.pointer("/metadata/uid").and_then(Value::as_str);
    for apply in &plan.apply {
        let Some(child) = rule.child(&apply.id) else {
            panic!("child {:?} is not declared by rule {}", apply.id, rule.name);
        };
        let object = &apply.object;
        assert_eq!(
            object["apiVersion"], child.spec.api_version.as_str(),
            "child {}: apiVersion changed: {object}",
            apply.id
        );
        assert_eq!(
            object["kind"], child.spec.kind.as_str(),
            "child {}: kind changed: {object}",
            apply.id
        );
        assert_eq!(apply.key.kind, child.gvk.kind, "child {}: key", apply.id);
        let labels = &object["metadata"]["labels"];
        assert_eq!(labels[LABEL_RULE], rule.name.as_str(), "child {}: {object}", apply.id);
        if let Some(uid) = uid {
            assert_eq!(labels[LABEL_PARENT_UID], uid, "child {}: {object}", apply.id);
        }
        if child.for_each.is_none() {
            let same = plan.apply.iter().filter(|a| a.id == apply.id).count();
            assert_eq!(same, 1, "child {} rendered {same} objects", apply.id);
        }
    }
}
