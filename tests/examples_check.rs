//! The shipped examples hold together, without a cluster: `rules/` passes
//! `check`, every CRD in `examples/crds/` is a well-formed
//! apiextensions.k8s.io/v1 CRD that keeps every status field its rule writes,
//! and every sample parent and observed stream is usable with `render`.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use trellis::offline::render::rule_for;
use trellis::render::Limits;
use trellis::rules::RuleSet;
use trellis::yaml;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rule_set() -> RuleSet {
    match RuleSet::load(&[root().join("rules")], Limits::default()) {
        Ok(set) => set,
        Err(diags) => panic!(
            "rules/ fails check:\n{}",
            diags
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        ),
    }
}

/// `*.yaml` files of an examples directory, sorted.
fn yaml_files(dir: &str) -> Vec<PathBuf> {
    let dir = root().join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} holds no YAML files", dir.display());
    files
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    yaml::parse_documents(&text, &yaml::Limits::FILES)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .map(|d| d.value)
        .collect()
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

struct Crd {
    file: PathBuf,
    doc: Value,
}

impl Crd {
    fn group(&self) -> &str {
        str_at(&self.doc, "/spec/group")
    }
    fn kind(&self) -> &str {
        str_at(&self.doc, "/spec/names/kind")
    }
    fn versions(&self) -> &[Value] {
        self.doc
            .pointer("/spec/versions")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }
    fn version(&self, name: &str) -> Option<&Value> {
        self.versions().iter().find(|v| str_at(v, "/name") == name)
    }
}

fn crds() -> Vec<Crd> {
    yaml_files("examples/crds")
        .into_iter()
        .flat_map(|file| {
            documents(&file).into_iter().map(move |doc| Crd {
                file: file.clone(),
                doc,
            })
        })
        .collect()
}

/// The CRD that serves a rule's parent kind, if any.
fn crd_for<'a>(crds: &'a [Crd], api_version: &str, kind: &str) -> Option<(&'a Crd, &'a Value)> {
    let (group, version) = api_version.split_once('/')?;
    crds.iter()
        .filter(|c| c.group() == group && c.kind() == kind)
        .find_map(|c| c.version(version).map(|v| (c, v)))
}

#[test]
fn rules_pass_check_without_errors_or_warnings() {
    let set = rule_set();
    assert!(
        set.warnings.is_empty(),
        "rules/ has warnings:\n{}",
        set.warnings
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let mut names: Vec<&str> = set.rules.iter().map(|r| r.name.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "config-propagation",
            "database",
            "db-user",
            "deployment-expose",
            "shards",
            "team",
            "tenant",
            "tls-service",
            "webapp"
        ]
    );
}

#[test]
fn every_crd_is_a_v1_crd_with_status_subresource_and_ready_column() {
    for crd in crds() {
        let file = crd.file.display();
        assert_eq!(
            str_at(&crd.doc, "/apiVersion"),
            "apiextensions.k8s.io/v1",
            "{file}"
        );
        assert_eq!(
            str_at(&crd.doc, "/kind"),
            "CustomResourceDefinition",
            "{file}"
        );
        let plural = str_at(&crd.doc, "/spec/names/plural");
        assert_eq!(
            str_at(&crd.doc, "/metadata/name"),
            format!("{plural}.{}", crd.group()),
            "{file}: metadata.name must be <plural>.<group>"
        );
        assert!(
            matches!(str_at(&crd.doc, "/spec/scope"), "Namespaced" | "Cluster"),
            "{file}: spec.scope"
        );
        assert!(!crd.versions().is_empty(), "{file}: no versions");
        for v in crd.versions() {
            let name = str_at(v, "/name");
            assert!(
                v.pointer("/subresources/status")
                    .is_some_and(Value::is_object),
                "{file}: version {name} lacks the status subresource"
            );
            let columns = v
                .get("additionalPrinterColumns")
                .and_then(Value::as_array)
                .unwrap_or_else(|| panic!("{file}: version {name} has no printer columns"));
            assert!(
                columns.iter().any(|c| str_at(c, "/name") == "Ready"
                    && str_at(c, "/jsonPath")
                        == r#".status.conditions[?(@.type=="Ready")].status"#),
                "{file}: version {name} has no Ready printer column"
            );
            let schema = v
                .pointer("/schema/openAPIV3Schema")
                .unwrap_or_else(|| panic!("{file}: version {name} has no openAPIV3Schema"));
            assert_eq!(str_at(schema, "/type"), "object", "{file}: root type");
            for part in ["spec", "status"] {
                assert_eq!(
                    str_at(schema, &format!("/properties/{part}/type")),
                    "object",
                    "{file}: version {name} needs a structural `{part}` schema"
                );
            }
            jsonschema::draft202012::new(schema)
                .unwrap_or_else(|e| panic!("{file}: version {name}: schema does not compile: {e}"));
        }
    }
}

/// Follows a dotted status path through `properties`; an object that
/// preserves unknown fields or has `additionalProperties` keeps anything below.
fn schema_keeps(mut schema: &Value, path: &[&str]) -> bool {
    for seg in path {
        if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
            || schema
                .get("additionalProperties")
                .is_some_and(Value::is_object)
        {
            return true;
        }
        match schema.pointer(&format!("/properties/{seg}")) {
            Some(next) => schema = next,
            None => return false,
        }
    }
    true
}

#[test]
fn every_custom_parent_kind_has_a_crd_that_keeps_its_status() {
    let set = rule_set();
    let crds = crds();
    for rule in &set.rules {
        let parent = &rule.rule.spec.parent;
        if rule.parent.is_builtin() {
            continue;
        }
        let (crd, version) =
            crd_for(&crds, &parent.api_version, &parent.kind).unwrap_or_else(|| {
                panic!(
                    "rule {}: no CRD in examples/crds serves {}/{}",
                    rule.name, parent.api_version, parent.kind
                )
            });
        let file = crd.file.display();
        if let Some(scope) = parent.scope {
            assert_eq!(
                str_at(&crd.doc, "/spec/scope"),
                format!("{scope:?}"),
                "{file}: scope differs from rule {}'s spec.parent.scope",
                rule.name
            );
        }
        let status = version
            .pointer("/schema/openAPIV3Schema/properties/status")
            .expect("checked by every_crd_is_a_v1_crd…");
        let mut paths = vec!["observedGeneration".to_owned(), "conditions".to_owned()];
        if let Some(s) = &rule.rule.spec.status {
            paths.extend(s.fields.iter().map(|f| f.path.clone()));
            if s.inventory {
                paths.extend(["children".to_owned(), "childrenTruncated".to_owned()]);
            }
        }
        for path in paths {
            let segs: Vec<&str> = path.split('.').collect();
            assert!(
                schema_keeps(status, &segs),
                "{file}: the status schema would prune `.status.{path}`, which rule {} writes",
                rule.name
            );
        }
        let conditions = status
            .pointer("/properties/conditions/items/properties")
            .expect("conditions items");
        for field in [
            "type",
            "status",
            "reason",
            "message",
            "lastTransitionTime",
            "observedGeneration",
        ] {
            assert!(
                conditions.get(field).is_some(),
                "{file}: conditions[].{field} would be pruned"
            );
        }
    }
}

#[test]
fn every_sample_parent_has_exactly_one_matching_rule() {
    let set = rule_set();
    for file in yaml_files("examples/parents") {
        let docs = documents(&file);
        let [parent] = docs.as_slice() else {
            panic!("{}: a parent file holds exactly one object", file.display());
        };
        if let Err(e) = rule_for(&set, parent) {
            panic!("{}: {e}", file.display());
        }
    }
}

/// Fills in `default:` values as the API server does at admission: a missing
/// property with a default gets it, then defaults apply inside it.
fn default_like_the_api_server(schema: &Value, value: &mut Value) {
    if let (Some(props), Some(obj)) = (
        schema.get("properties").and_then(Value::as_object),
        value.as_object_mut(),
    ) {
        for (name, prop) in props {
            if !obj.contains_key(name)
                && let Some(d) = prop.get("default")
            {
                obj.insert(name.clone(), d.clone());
            }
            if let Some(v) = obj.get_mut(name) {
                default_like_the_api_server(prop, v);
            }
        }
    }
    if let (Some(items), Some(list)) = (schema.get("items"), value.as_array_mut()) {
        for v in list {
            default_like_the_api_server(items, v);
        }
    }
}

/// The CRD's own schema (with its defaults) accepts every sample parent's
/// spec, except the one meant to be refused.
#[test]
fn sample_parents_of_custom_kinds_pass_their_crd_schema() {
    let crds = crds();
    for file in yaml_files("examples/parents") {
        let docs = documents(&file);
        let parent = &docs[0];
        let Some((_, version)) = crd_for(
            &crds,
            str_at(parent, "/apiVersion"),
            str_at(parent, "/kind"),
        ) else {
            continue;
        };
        let schema = version
            .pointer("/schema/openAPIV3Schema/properties/spec")
            .expect("spec schema");
        let validator = jsonschema::draft202012::new(schema).expect("compiles");
        let mut spec = parent
            .get("spec")
            .cloned()
            .unwrap_or(Value::Object(Default::default()));
        default_like_the_api_server(schema, &mut spec);
        let errors: Vec<String> = validator
            .iter_errors(&spec)
            .map(|e| e.to_string())
            .collect();
        let meant_invalid = file.to_string_lossy().ends_with("-invalid.yaml");
        assert_eq!(
            errors.is_empty(),
            !meant_invalid,
            "{}: CRD schema says {errors:?}",
            file.display()
        );
    }
}

#[test]
fn every_observed_stream_holds_named_objects() {
    for file in yaml_files("examples/observed") {
        let docs = documents(&file);
        assert!(!docs.is_empty(), "{}: empty", file.display());
        for doc in &docs {
            for pointer in ["/apiVersion", "/kind", "/metadata/name"] {
                assert!(
                    !str_at(doc, pointer).is_empty(),
                    "{}: an object lacks {pointer}",
                    file.display()
                );
            }
        }
    }
}

#[test]
fn deploy_roles_are_what_trellis_rbac_prints_for_the_rules() {
    let path = root().join("examples/deploy/rbac.yaml");
    let committed = documents(&path);
    let set = rule_set();
    // examples/deploy runs with --manage-crds.
    let generated = vec![
        trellis::rbac::cluster_role_with(&set, "trellis", true),
        trellis::rbac::namespaced_role(&set, "trellis", "trellis-system"),
    ];
    assert_eq!(
        committed, generated,
        "examples/deploy/rbac.yaml is stale: regenerate it with charts/regenerate"
    );
    // The Role is bound in the namespace trellis runs in.
    let docs = documents(&root().join("examples/deploy/trellis.yaml"));
    let binding = docs
        .iter()
        .find(|d| d["kind"] == "RoleBinding")
        .expect("a RoleBinding");
    assert_eq!(binding["metadata"]["namespace"], "trellis-system");
    assert_eq!(
        binding["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "trellis"})
    );
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "trellis", "namespace": "trellis-system"}])
    );
}

#[test]
fn deploy_manifests_parse_and_mount_the_rules() {
    let docs = documents(&root().join("examples/deploy/trellis.yaml"));
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment");
    let args = &deployment["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(
        args.as_array()
            .is_some_and(|a| a.iter().any(|x| x == "--rules=/etc/trellis/rules")),
        "{args}"
    );
}

/// `examples/crds/<rule>.yaml` is exactly what `trellis crd --rules rules`
/// prints for that rule, and nothing else lives there. After an intended
/// change: `TRELLIS_UPDATE_GOLDEN=1 cargo test --test examples_check`.
#[test]
fn example_crds_are_what_trellis_crd_prints_for_the_rules() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(["crd", "--rules"])
        .arg(root().join("rules"))
        .output()
        .expect("run trellis crd");
    assert!(
        output.status.success(),
        "trellis crd failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("UTF-8");
    let generated: Vec<Value> = yaml::parse_documents(&text, &yaml::Limits::FILES)
        .expect("trellis crd prints YAML")
        .into_iter()
        .map(|d| d.value)
        .collect();
    let update = std::env::var_os("TRELLIS_UPDATE_GOLDEN").is_some();
    let mut expected_files = Vec::new();
    for crd in &generated {
        let rule = str_at(crd, "/metadata/labels/trellis.dev~1rule");
        assert!(!rule.is_empty(), "a generated CRD names its rule: {crd}");
        let path = root().join(format!("examples/crds/{rule}.yaml"));
        expected_files.push(path.clone());
        if update {
            let body = yaml::to_string(crd).expect("serialize");
            let header = format!(
                "# Generated from rules/{rule}.yaml by `trellis crd --rules rules`; do not edit.\n\
                 # Regenerate: TRELLIS_UPDATE_GOLDEN=1 cargo test --test examples_check\n"
            );
            std::fs::write(&path, header + &body).expect("write example CRD");
            continue;
        }
        assert_eq!(
            documents(&path),
            vec![crd.clone()],
            "{} is stale: regenerate it with TRELLIS_UPDATE_GOLDEN=1 cargo test --test examples_check",
            path.display()
        );
    }
    assert_eq!(
        yaml_files("examples/crds"),
        expected_files,
        "examples/crds holds exactly one generated CRD per rule with `crd:`"
    );
    // Deterministic: a second run prints the same bytes.
    let again = std::process::Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(["crd", "--rules"])
        .arg(root().join("rules"))
        .output()
        .expect("run trellis crd");
    assert_eq!(String::from_utf8_lossy(&again.stdout), text);
}

/// The quickstart creates every sample parent at once: two parents must
/// never render a child of the same kind, namespace and name, or the
/// second is refused (`ApplyError`: trellis never takes over another
/// parent's child) and never becomes Ready. It happened: TlsService `shop`
/// and WebApp `shop` both made Service team-a/shop.
#[test]
fn sample_parents_never_render_the_same_child() {
    use std::collections::BTreeMap;
    use trellis::plan::{self, Input, Observed};

    let set = rule_set();
    let none = Observed::from_objects([]);
    let mut made_by: BTreeMap<String, String> = BTreeMap::new();
    for file in yaml_files("examples/parents") {
        if file.to_string_lossy().ends_with("-invalid.yaml") {
            continue;
        }
        let [parent] = documents(&file).try_into().expect("one parent per file");
        let rule = rule_for(&set, &parent).expect("a matching rule");
        let input = Input {
            parent: &parent,
            observed: &none,
            now: "2026-12-01T00:00:00Z",
            scope_of: &trellis::kinds::scope,
            clusters: &trellis::clusters::Clusters::offline(),
        };
        // With nothing observed, children waiting on others or on related
        // objects are pending: what renders is checked.
        for apply in plan::plan(rule, &input).apply {
            let key = apply.key.to_string();
            if let Some(other) = made_by.insert(key.clone(), file.display().to_string()) {
                panic!("{key} is rendered by both {other} and {}", file.display());
            }
        }
    }
}
