//! The fuzz targets' bodies and what they share: the repository's example
//! rules and parents, one planning pass as the operator runs it, and the
//! invariants every pass must keep whatever the parent holds.
//!
//! The bodies ([`load`], [`render`], [`plan`]) are plain functions so that
//! two drivers run them: `cargo fuzz` (`fuzz_targets/*.rs`, libFuzzer,
//! nightly) and the main crate's `tests/fuzz.rs` (stable `cargo test`: the
//! committed corpus plus a bounded run of seeded mutations), which includes
//! this file as a module. A body panics when an invariant breaks.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::{Value, json};
use trellis::plan::{self, Input, LABEL_PARENT_UID, LABEL_RULE, Observed, Plan};
use trellis::rules::{CompiledRule, Loaded, RuleSet};

/// A path in the repository: this file is compiled from `fuzz/` (the fuzz
/// crate) and from the repository's root (`tests/fuzz.rs`).
pub fn repo(path: &str) -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = if manifest.join("fuzz_targets").is_dir() {
        manifest.join("..")
    } else {
        manifest.to_path_buf()
    };
    root.join(path)
}

/// The committed seeds of a target (`fuzz/corpus/<target>/`), sorted.
pub fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = repo("fuzz/corpus").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let data = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, data)
        })
        .collect()
}

/// The rule loader: any text as a rule file gives a rule set or diagnostics
/// (each naming the file), never a panic; a reload's partition of it too.
pub fn load(data: &[u8]) {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let dir = DIR.get_or_init(|| tempfile::tempdir().expect("a temp dir"));
    // One file per thread: the stable driver may run tests in parallel.
    let sub = dir
        .path()
        .join(format!("{:?}", std::thread::current().id()).replace(['(', ')'], ""));
    if std::fs::create_dir_all(&sub).is_err() {
        return;
    }
    let file = sub.join("rule.yaml");
    if std::fs::write(&file, data).is_err() {
        return;
    }
    let dirs = [sub.clone()];
    let loaded = Loaded::read(&dirs, Default::default());
    for d in loaded.diagnostics() {
        assert!(d.file.starts_with(&sub), "diagnostic without its file: {d}");
        let _ = d.to_string();
    }
    let partition = trellis::reload::partition(example_rules(), loaded);
    let _ = trellis::reload::diff(&RuleSet::default(), &partition.set);
}

/// The planner on any parent and observed objects: the input, when it is
/// JSON, is `{"parent": ..., "observed": [...]}` (or a bare parent), planned
/// with every example rule. Never a panic, and every child to apply stays
/// what its rule declares.
pub fn plan(data: &[u8]) {
    let Ok(input) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let (parent, observed) = match input.get("parent") {
        Some(parent) => (parent.clone(), input.get("observed").cloned()),
        None => (input, None),
    };
    let observed = match observed {
        Some(Value::Array(objects)) => Observed::from_objects(objects),
        _ => Observed::default(),
    };
    for rule in &example_rules().rules {
        let plan = plan_once(rule, &parent, &observed);
        assert_contained(rule, &parent, &plan);
        assert_patches_contained(rule, &parent, &observed, &plan);
    }
}

/// Deepest spec nesting the operator decodes (serde_json refuses 128).
const MAX_DEPTH: usize = 120;

/// Replaces every string under `value` with `text`.
fn replace_strings(value: &mut Value, text: &str) {
    match value {
        Value::String(s) => *s = text.to_owned(),
        Value::Array(items) => items.iter_mut().for_each(|v| replace_strings(v, text)),
        Value::Object(map) => map.values_mut().for_each(|v| replace_strings(v, text)),
        _ => {}
    }
}

/// The renderer under hostile parent values: the example rules' templates
/// fed a parent whose values are the fuzzer's text (`{{ }}`, `{% %}`,
/// `---`, newlines, quotes, ...), deep nesting or a whole spec of its
/// choosing. Never a panic, never an injected object: every child rendered
/// is one the rule declares, with its declared apiVersion and kind, and one
/// object per child.
pub fn render(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let examples = examples();
    let (rule, example) = &examples[pick as usize % examples.len()];
    let text = String::from_utf8_lossy(rest).into_owned();
    let mut parent = example.clone();
    match (pick as usize / examples.len()) % 5 {
        // Every value of the example spec is the text.
        0 => replace_strings(&mut parent["spec"], &text),
        // The text as a whole spec, when it is JSON.
        1 => match serde_json::from_str::<Value>(&text) {
            Ok(spec) => parent["spec"] = spec,
            Err(_) => replace_strings(&mut parent["spec"], &text),
        },
        // Every spec value nested deep, the text at the bottom.
        2 => {
            let depth = rest.len() % MAX_DEPTH;
            let mut deep = Value::String(text.clone());
            for _ in 0..depth {
                deep = json!({ "a": deep });
            }
            if let Some(spec) = parent["spec"].as_object_mut() {
                for v in spec.values_mut() {
                    *v = deep.clone();
                }
            }
        }
        // The text in labels and annotations the templates may read.
        3 => {
            parent["metadata"]["labels"] = json!({ "app": text, "tier": text });
            parent["metadata"]["annotations"] = json!({ "note": text });
            replace_strings(&mut parent["spec"], &text);
        }
        // A huge value: the text repeated up to 64 KiB.
        _ => {
            let times = (64 * 1024) / text.len().max(1);
            replace_strings(&mut parent["spec"], &text.repeat(times.clamp(1, 4096)));
        }
    }
    let observed = Observed::default();
    let plan = plan_once(rule, &parent, &observed);
    assert_contained(rule, &parent, &plan);
    assert_patches_contained(rule, &parent, &observed, &plan);
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
                    p["kind"] == rule.parent.kind.as_str() && plan::parent_matches(rule, p)
                })?;
                Some((rule.as_ref(), parent.clone()))
            })
            .collect()
    })
}

/// One pass of `rule` over `parent` and `observed`, as `trellis render` runs it.
pub fn plan_once(rule: &CompiledRule, parent: &Value, observed: &Observed) -> Plan {
    let scope = trellis::plan::offline_input::offline_scope(rule);
    let input = Input {
        parent,
        observed,
        now: "2026-12-01T00:00:00Z",
        scope_of: &scope,
        clusters: &trellis::clusters::Clusters::offline(),
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
            object["apiVersion"],
            child.spec.api_version.as_str(),
            "child {}: apiVersion changed: {object}",
            apply.id
        );
        assert_eq!(
            object["kind"],
            child.spec.kind.as_str(),
            "child {}: kind changed: {object}",
            apply.id
        );
        assert_eq!(apply.key.kind, child.gvk.kind, "child {}: key", apply.id);
        let labels = &object["metadata"]["labels"];
        assert_eq!(
            labels[LABEL_RULE],
            rule.name.as_str(),
            "child {}: {object}",
            apply.id
        );
        if let Some(uid) = uid {
            assert_eq!(
                labels[LABEL_PARENT_UID], uid,
                "child {}: {object}",
                apply.id
            );
        }
        if child.for_each.is_none() {
            let same = plan.apply.iter().filter(|a| a.id == apply.id).count();
            assert_eq!(same, 1, "child {} rendered {same} objects", apply.id);
        }
    }
}

/// What no parent can change about `patches:`: every contribution is one
/// the rule declares, to its declared kind, holding nothing of trellis's
/// (no trellis label or annotation, no ownerReference); it is never a
/// create: one is sent (has a uid) only to a target observed with that
/// very uid; and only objects observed under this parent's own field
/// manager are ever released.
pub fn assert_patches_contained(
    rule: &CompiledRule,
    parent: &Value,
    observed: &Observed,
    plan: &Plan,
) {
    for patch in &plan.patches {
        let Some(declared) = rule.patch(&patch.id) else {
            panic!("patch {:?} is not declared by rule {}", patch.id, rule.name);
        };
        let object = &patch.object;
        assert_eq!(
            object["apiVersion"],
            declared.spec.api_version.as_str(),
            "{object}"
        );
        assert_eq!(object["kind"], declared.spec.kind.as_str(), "{object}");
        assert_eq!(patch.key.kind, declared.gvk.kind, "patch {}", patch.id);
        let meta = &object["metadata"];
        assert!(meta.get("ownerReferences").is_none(), "owned: {object}");
        for map in ["labels", "annotations"] {
            if let Some(m) = meta.get(map).and_then(Value::as_object) {
                assert!(
                    m.keys()
                        .all(|k| !k.starts_with("trellis.dev/")
                            && k != "app.kubernetes.io/managed-by"),
                    "patch {} carries a trellis mark: {object}",
                    patch.id
                );
            }
        }
        match &patch.uid {
            None => assert!(meta.get("uid").is_none(), "{object}"),
            Some(uid) => {
                assert_eq!(meta["uid"], uid.as_str(), "{object}");
                let target = observed.objects.get(&patch.key);
                assert_eq!(
                    target.and_then(|t| t.pointer("/metadata/uid")),
                    Some(&Value::String(uid.clone())),
                    "patch {} would be sent to {} that is not observed with uid {uid}",
                    patch.id,
                    patch.key
                );
            }
        }
        if declared.for_each.is_none() {
            let same = plan.patches.iter().filter(|p| p.id == patch.id).count();
            assert_eq!(same, 1, "patch {} rendered {same} objects", patch.id);
        }
    }
    let uid = parent
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or(plan::PLACEHOLDER_UID);
    let manager = plan::field_manager(&rule.name, uid);
    for release in &plan.release {
        let target = observed.objects.get(&release.key);
        assert!(
            target.is_some_and(|t| plan::has_manager(t, &manager)),
            "{} released without this parent's manager {manager} on it",
            release.key
        );
        assert!(
            plan.patches.iter().all(|p| p.key != release.key),
            "{} is both contributed to and released",
            release.key
        );
    }
}
