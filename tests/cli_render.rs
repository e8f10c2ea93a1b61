//! `trellis render`'s command-line contract, on the real binary and no
//! cluster: exit code 2 and the failing expression named in `errors` for
//! any error of the pass, `-o json` printing what the YAML prints, related
//! `selector:` entries read from `--observed` (every namespace, a selector
//! taken whole from the parent, the 1000-object cap), and the render limits
//! set by flags.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use trellis::yaml;

const NOW: &str = "2026-11-29T00:00:00Z";

/// What one `trellis render` printed.
struct Rendered {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Rendered {
    /// The printed document (YAML or JSON: JSON is YAML).
    fn doc(&self) -> Value {
        let mut docs = yaml::parse_documents(&self.stdout, &yaml::Limits::FILES)
            .unwrap_or_else(|e| panic!("stdout is not YAML: {e}\n{}", self.stdout));
        assert_eq!(docs.len(), 1, "one document:\n{}", self.stdout);
        docs.remove(0).value
    }

    fn errors(&self) -> Vec<String> {
        self.doc()["errors"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A rules directory holding `rule` and a parent file holding `parent`,
/// rendered with `observed` (a YAML stream, when given) and `args`.
fn render(rule: &str, parent: &str, observed: Option<&str>, args: &[&str]) -> Rendered {
    let dir = tempfile::tempdir().expect("temp dir");
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).expect("rules dir");
    std::fs::write(rules.join("rule.yaml"), rule).expect("write rule");
    let parent_file = dir.path().join("parent.yaml");
    std::fs::write(&parent_file, parent).expect("write parent");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trellis"));
    cmd.args(["render", "--rules"])
        .arg(&rules)
        .arg(&parent_file)
        .args(["--now", NOW])
        .args(args);
    if let Some(observed) = observed {
        let file = dir.path().join("observed.yaml");
        std::fs::write(&file, observed).expect("write observed");
        cmd.arg("--observed").arg(file);
    }
    run(cmd)
}

fn run(mut cmd: Command) -> Rendered {
    // The render limits come from flags here, never from the environment.
    for var in [
        "TRELLIS_RENDER_FUEL",
        "TRELLIS_RENDER_RECURSION",
        "TRELLIS_RENDER_MAX_BYTES",
    ] {
        cmd.env_remove(var);
    }
    let out = cmd.output().expect("run trellis render");
    Rendered {
        code: out.status.code(),
        stdout: String::from_utf8(out.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

const HEAD: &str = "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: app\nspec:\n  parent:\n    apiVersion: demo.trellis.dev/v1\n    kind: App\n";

const APP: &str = "apiVersion: demo.trellis.dev/v1\nkind: App\nmetadata: {name: web, namespace: team, uid: 0b6c2b1e-3f0a-4d8e-9a41-5c2f7d8e9f10}\nspec: {greeting: hi}\n";

/// One ConfigMap child printing `value`, and `status` (YAML under `spec`).
fn app_rule(value: &str, status: &str) -> String {
    format!(
        "{HEAD}  children:\n    - id: config\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata: {{name: {{{{ parent.metadata.name }}}}}}\n        data: {{greeting: {{{{ {value} }}}}}}\n{status}"
    )
}

#[track_caller]
fn assert_exit(out: &Rendered, code: i32) {
    assert_eq!(
        out.code,
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        out.stdout,
        out.stderr
    );
}

#[track_caller]
fn assert_error(out: &Rendered, needles: &[&str]) {
    assert_exit(out, 2);
    let errors = out.errors();
    assert!(
        errors.iter().any(|e| needles.iter().all(|n| e.contains(n))),
        "no error names {needles:?}: {errors:#?}"
    );
}

#[test]
fn render_exits_2_and_names_the_expression_when_a_template_prints_a_missing_value() {
    let out = render(&app_rule("spec.greting", ""), APP, None, &[]);
    assert_error(
        &out,
        &[
            "template of child \"config\"",
            "`spec.greting` is undefined",
        ],
    );
    assert_eq!(out.doc()["children"], json!([]), "{}", out.stdout);
}

#[test]
fn render_exits_2_and_names_the_expression_when_a_status_field_or_condition_fails() {
    let field = "  status:\n    fields:\n      - path: size\n        value: \"spec.size * 2\"\n";
    let out = render(&app_rule("spec.greeting", field), APP, None, &[]);
    assert_error(&out, &["status field `size`", "`spec.size * 2`"]);
    assert_eq!(
        out.doc()["children"][0]["data"],
        json!({"greeting": "hi"}),
        "the children still render: {}",
        out.stdout
    );

    let condition = "  status:\n    conditions:\n      - type: Big\n        when: \"spec.size > 3\"\n        reason: Large\n";
    let out = render(&app_rule("spec.greeting", condition), APP, None, &[]);
    assert_error(&out, &["`spec.size > 3`"]);

    let fine = "  status:\n    fields:\n      - path: size\n        value: \"spec.size | default(1) * 2\"\n";
    let out = render(&app_rule("spec.greeting", fine), APP, None, &[]);
    assert_eq!(out.code, Some(0), "stderr:\n{}", out.stderr);
    assert_eq!(out.doc()["status"]["size"], json!(2), "{}", out.stdout);
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `render` of a shipped example, in `format`.
fn render_example(parent: &str, observed: Option<&str>, format: &str) -> Rendered {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trellis"));
    cmd.args(["render", "--rules"])
        .arg(repo("rules"))
        .arg(repo("examples/parents").join(parent))
        .args(["--now", NOW, "-o", format]);
    if let Some(observed) = observed {
        cmd.arg("--observed")
            .arg(repo("examples/observed").join(observed));
    }
    run(cmd)
}

#[test]
fn render_json_prints_the_same_document_as_yaml() {
    for (parent, observed) in [
        ("webapp.yaml", Some("webapp-ready.yaml")),
        ("webapp-invalid.yaml", None),
        (
            "config-propagation-ca.yaml",
            Some("config-propagation-ca.yaml"),
        ),
        ("tenant-sandbox.yaml", Some("tenant-sandbox-active.yaml")),
    ] {
        let yaml_out = render_example(parent, observed, "yaml");
        let json_out = render_example(parent, observed, "json");
        assert_eq!(yaml_out.code, json_out.code, "{parent}: the same exit code");
        let parsed: Value = serde_json::from_str(&json_out.stdout)
            .unwrap_or_else(|e| panic!("{parent}: -o json is not JSON: {e}\n{}", json_out.stdout));
        assert_eq!(parsed, yaml_out.doc(), "{parent}: JSON and YAML differ");
    }
    // An error document too.
    let rule = app_rule("spec.greting", "");
    let yaml_out = render(&rule, APP, None, &[]);
    let json_out = render(&rule, APP, None, &["-o", "json"]);
    assert_eq!(json_out.code, Some(2));
    let parsed: Value = serde_json::from_str(&json_out.stdout).expect("-o json is JSON");
    assert_eq!(parsed, yaml_out.doc());
}

/// A rule reading ConfigMaps by `selector` (YAML under the related entry)
/// and listing `namespace/name` of what it read in `.status.members`.
fn selector_rule(kind: &str, selector: &str) -> String {
    format!(
        "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: fleet\nspec:\n  parent:\n    apiVersion: demo.trellis.dev/v1\n    kind: {kind}\n  related:\n    - id: members\n      apiVersion: v1\n      kind: ConfigMap\n{selector}  vars:\n    - name: members\n      template: |\n        [{{% for o in related.members %}}{{{{ o.metadata.namespace ~ '/' ~ o.metadata.name }}}}{{% if not loop.last %}}, {{% endif %}}{{% endfor %}}]\n  children: []\n  status:\n    fields:\n      - path: members\n        value: vars.members\n"
    )
}

fn config_map(namespace: &str, name: &str, labels: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: {namespace}, labels: {{{labels}}}}}\n"
    )
}

/// A cluster-scoped parent (no namespace) of kind `Fleet`.
const FLEET: &str = "apiVersion: demo.trellis.dev/v1\nkind: Fleet\nmetadata: {name: blue, uid: 7d1f0c2a-9b3e-4f5d-8a6c-1e2f3a4b5c6d}\nspec: {}\n";

const ALL_NAMESPACES: &str = "      allNamespaces: true\n      selector:\n        matchLabels: {fleet: \"{{ parent.metadata.name }}\"}\n";

#[test]
fn an_all_namespaces_selector_of_a_cluster_scoped_parent_reads_every_namespace_sorted() {
    let observed: String = [
        config_map("c", "a", "fleet: blue"),
        config_map("a", "z", "fleet: blue"),
        config_map("b", "m", "fleet: green"),
        config_map("a", "b", "fleet: blue"),
        config_map("b", "q", ""),
        config_map("b", "k", "fleet: blue, extra: x"),
    ]
    .concat();
    let out = render(
        &selector_rule("Fleet", ALL_NAMESPACES),
        FLEET,
        Some(&observed),
        &[],
    );
    assert_exit(&out, 0);
    assert_eq!(
        out.doc()["status"]["members"],
        json!(["a/b", "a/z", "b/k", "c/a"]),
        "{}",
        out.stdout
    );
}

#[test]
fn a_selector_matching_more_than_1000_objects_is_a_render_error() {
    let stream = |n: usize| -> String {
        (0..n)
            .map(|i| {
                config_map(
                    &format!("ns-{}", i % 7),
                    &format!("cm-{i:04}"),
                    "fleet: blue",
                )
            })
            .collect()
    };
    let rule = selector_rule("Fleet", ALL_NAMESPACES);
    let out = render(&rule, FLEET, Some(&stream(1000)), &[]);
    assert_eq!(out.code, Some(0), "1000 is allowed: {}", out.stderr);
    assert_eq!(
        out.doc()["status"]["members"].as_array().map(Vec::len),
        Some(1000)
    );

    let out = render(&rule, FLEET, Some(&stream(1001)), &[]);
    assert_error(
        &out,
        &[
            "related \"members\"",
            "matches 1001 objects, more than the limit of 1000",
        ],
    );
}

#[test]
fn match_expressions_can_be_one_template_yielding_the_whole_list() {
    let selector = "      selector:\n        matchExpressions: \"{{ spec.match }}\"\n";
    let parent = "apiVersion: demo.trellis.dev/v1\nkind: App\nmetadata: {name: web, namespace: team, uid: 0b6c2b1e-3f0a-4d8e-9a41-5c2f7d8e9f10}\nspec:\n  match:\n    - {key: tier, operator: In, values: [web, api]}\n    - {key: legacy, operator: DoesNotExist}\n";
    let observed: String = [
        config_map("team", "web", "tier: web"),
        config_map("team", "api", "tier: api"),
        config_map("team", "db", "tier: db"),
        config_map("team", "old", "tier: web, legacy: \"yes\""),
        config_map("other", "web", "tier: web"),
    ]
    .concat();
    let out = render(
        &selector_rule("App", selector),
        parent,
        Some(&observed),
        &[],
    );
    assert_exit(&out, 0);
    assert_eq!(
        out.doc()["status"]["members"],
        json!(["team/api", "team/web"]),
        "{}",
        out.stdout
    );

    let bad = parent.replace("  match:\n", "  match: {tier: web}\n  unused:\n");
    let out = render(&selector_rule("App", selector), &bad, Some(&observed), &[]);
    assert_error(
        &out,
        &["selector of related \"members\"", "matchExpressions"],
    );
}

#[test]
fn render_limit_flags_take_effect_and_the_error_names_the_limit() {
    let rule = app_rule("spec.greeting", "");
    let out = render(&rule, APP, None, &[]);
    assert_eq!(out.code, Some(0), "stderr:\n{}", out.stderr);

    let out = render(&rule, APP, None, &["--render-max-bytes", "10"]);
    assert_error(
        &out,
        &[
            "template of child \"config\"",
            "exceeds the limit of 10 bytes (--render-max-bytes)",
        ],
    );

    let out = render(&rule, APP, None, &["--render-fuel", "5"]);
    assert_error(
        &out,
        &[
            "template of child \"config\"",
            "the fuel limit is 5 per render (--render-fuel)",
        ],
    );
}

#[test]
fn render_recursion_flag_takes_effect_and_the_error_names_the_limit() {
    // A macro calling itself `spec.depth` times.
    let rule = format!(
        "{HEAD}  children:\n    - id: config\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        {{% macro nest(n) %}}{{% if n > 0 %}}{{{{ nest(n - 1) }}}}{{% else %}}0{{% endif %}}{{% endmacro %}}\n        metadata: {{name: {{{{ parent.metadata.name }}}}}}\n        data: {{depth: \"{{{{ nest(spec.depth) }}}}\"}}\n"
    );
    let parent = APP.replace("spec: {greeting: hi}", "spec: {depth: 2}");
    let out = render(&rule, &parent, None, &[]);
    assert_eq!(out.code, Some(0), "stderr:\n{}", out.stderr);
    assert_eq!(
        out.doc()["children"][0]["data"],
        json!({"depth": "0"}),
        "{}",
        out.stdout
    );

    let out = render(&rule, &parent, None, &["--render-recursion", "3"]);
    assert_error(
        &out,
        &[
            "template of child \"config\"",
            "recursion limit exceeded",
            "the recursion limit is 3 (--render-recursion)",
        ],
    );
}

/// `objects` (YAML flow maps) as the one List document `kubectl get -o yaml`
/// prints.
fn kubectl_list(objects: &[&str]) -> String {
    let items: String = objects.iter().map(|o| format!("  - {o}\n")).collect();
    format!("apiVersion: v1\nkind: List\nmetadata:\n  resourceVersion: \"\"\nitems:\n{items}")
}

#[test]
fn observed_and_parent_files_may_be_lists_as_kubectl_get_prints_them() {
    let rule = selector_rule("Fleet", ALL_NAMESPACES);
    let cm = |ns: &str, name: &str, fleet: &str| {
        format!(
            "{{apiVersion: v1, kind: ConfigMap, metadata: {{name: {name}, namespace: {ns}, labels: {{fleet: {fleet}}}}}}}"
        )
    };
    // `kubectl get cm -A -o yaml`, a typed list from the API whose items
    // carry no kind, and a plain document, in one stream.
    let observed = format!(
        "{}---\napiVersion: v1\nkind: ConfigMapList\nitems:\n  - metadata: {{name: z, namespace: a, labels: {{fleet: blue}}}}\n{}",
        kubectl_list(&[&cm("c", "a", "blue"), &cm("b", "m", "green")]),
        config_map("a", "b", "fleet: blue"),
    );
    // `kubectl get fleets -o yaml` finding one: FLEET, as a List.
    let parent = kubectl_list(&[
        "{apiVersion: demo.trellis.dev/v1, kind: Fleet, metadata: {name: blue, uid: 7d1f0c2a-9b3e-4f5d-8a6c-1e2f3a4b5c6d}, spec: {}}",
    ]);
    let out = render(&rule, &parent, Some(&observed), &[]);
    assert_exit(&out, 0);
    assert_eq!(
        out.doc()["status"]["members"],
        json!(["a/b", "a/z", "c/a"]),
        "{}",
        out.stdout
    );

    // A List of two parents is two parents: render takes exactly one.
    let two = format!(
        "{parent}  - {{apiVersion: demo.trellis.dev/v1, kind: Fleet, metadata: {{name: green}}}}\n"
    );
    let out = render(&rule, &two, None, &[]);
    assert_eq!(out.code, Some(1), "stderr:\n{}", out.stderr);
    assert!(
        out.stderr
            .contains("parent.yaml: expected exactly one parent object, found 2"),
        "{}",
        out.stderr
    );

    // An item that is no object is named with its line.
    let out = render(&rule, FLEET, Some("kind: List\nitems:\n  - 3\n"), &[]);
    assert_eq!(out.code, Some(1), "stderr:\n{}", out.stderr);
    assert!(
        out.stderr
            .contains("observed.yaml:3: items[0]: an item of a List must be an object"),
        "{}",
        out.stderr
    );
}

/// Issue 36: a parent outside its rule's selector was reported as "no rule
/// matches a parent of kind …", as if no rule served the kind at all.
#[test]
fn render_of_a_parent_outside_the_selector_names_the_rule_and_why() {
    let rule = app_rule("spec.greeting", "").replace(
        "    kind: App\n",
        "    kind: App\n    selector: {matchLabels: {managed: \"yes\"}}\n",
    );
    let out = render(&rule, APP, None, &[]);
    assert_ne!(out.code, Some(0), "stdout:\n{}", out.stdout);
    assert!(
        out.stderr.contains("rule app does not select this parent")
            && out.stderr.contains("parent.selector (managed=yes)"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("no rule matches"), "{}", out.stderr);
    // Selected, it renders.
    let labelled = APP.replace("metadata: {", "metadata: {labels: {managed: \"yes\"}, ");
    assert_exit(&render(&rule, &labelled, None, &[]), 0);
}
