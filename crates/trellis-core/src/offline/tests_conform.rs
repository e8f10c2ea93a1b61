//! The child-schema check (`crate::conform`) through `check`'s own
//! pipeline: rule files on disk, every diagnostic as `check` prints it.

use std::path::PathBuf;

use crate::crd::offline::OfflineCrds;
use crate::offline::check::{Inputs, diagnostics};
use crate::render::Limits;
use crate::rules::load::disk;

/// A rules directory holding `files` (name, text), kept while it lives.
pub(super) struct Dir(tempfile::TempDir);

impl Dir {
    pub(super) fn new(files: &[(&str, &str)]) -> Dir {
        let dir = tempfile::tempdir().expect("temp dir");
        for (name, text) in files {
            let path = dir.path().join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).expect("mkdir");
            }
            std::fs::write(path, text).expect("write");
        }
        Dir(dir)
    }

    fn path(&self) -> PathBuf {
        self.0.path().to_path_buf()
    }

    /// What `check` prints, one line each, with the directory left out.
    fn check_with(&self, inputs: &Inputs) -> Vec<String> {
        let checked = diagnostics(&[self.path()], Limits::default(), &disk(), inputs);
        let prefix = format!("{}/", self.0.path().display());
        checked
            .diagnostics
            .iter()
            .map(|d| d.to_string().replace(&prefix, ""))
            .collect()
    }

    pub(super) fn check(&self) -> Vec<String> {
        self.check_with(&Inputs::default())
    }
}

/// A rule `app` of a custom parent kind with a schema and defaults, and the
/// given children (YAML list items, indented four spaces).
pub(super) fn rule(children: &str) -> String {
    format!(
        "apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: app
spec:
  parent:
    apiVersion: demo.example.com/v1
    kind: App
  schema:
    type: object
    properties:
      replicas: {{type: integer, minimum: 0}}
      image: {{type: string}}
      debug: {{type: boolean}}
  defaults:
    replicas: 2
    image: nginx
    debug: false
  children:
{children}"
    )
}

pub(super) const DEPLOYMENT_OK: &str = "    - id: web
      apiVersion: apps/v1
      kind: Deployment
      template: |
        metadata:
          name: {{ parent.metadata.name }}
        spec:
          replicas: {{ spec.replicas }}
          selector:
            matchLabels: {app: web}
          template:
            metadata:
              labels: {app: web}
            spec:
              containers:
                - name: web
                  image: {{ spec.image }}
                  ports:
                    - containerPort: 8080
                  resources:
                    limits: {cpu: 1, memory: 64Mi}
";

#[test]
fn a_correct_rule_is_clean() {
    let dir = Dir::new(&[("app.yaml", &rule(DEPLOYMENT_OK))]);
    assert_eq!(dir.check(), Vec::<String>::new());
}

#[test]
fn a_misspelt_field_of_a_built_in_kind_is_named_on_its_template_line() {
    let text = rule(&DEPLOYMENT_OK.replace("          replicas: {{", "          replica: {{"));
    let dir = Dir::new(&[("app.yaml", &text)]);
    let line = text
        .lines()
        .position(|l| l.contains("replica: {{"))
        .expect("the line")
        + 1;
    assert_eq!(
        dir.check(),
        [format!(
            "app.yaml:{line}: warning: children[0] (web) Deployment: spec.replica: unknown field \
             (did you mean replicas?)"
        )]
    );
}

#[test]
fn a_wrong_type_in_a_built_in_kind_and_a_swapped_letter_deep_down() {
    let text = rule(
        &DEPLOYMENT_OK
            .replace("containerPort: 8080", "containerPort: \"8080\"")
            .replace("                  image:", "                  imgae:"),
    );
    let dir = Dir::new(&[("app.yaml", &text)]);
    let line_of = |needle: &str| text.lines().position(|l| l.contains(needle)).expect("line") + 1;
    assert_eq!(
        dir.check(),
        [
            format!(
                "app.yaml:{}: warning: children[0] (web) Deployment: \
                 spec.template.spec.containers[0].imgae: unknown field (did you mean image?)",
                line_of("imgae:")
            ),
            format!(
                "app.yaml:{}: warning: children[0] (web) Deployment: \
                 spec.template.spec.containers[0].ports[0].containerPort: wrong type: a string \
                 (\"8080\"), the schema wants an integer",
                line_of("containerPort")
            ),
        ]
    );
}

/// A second rule whose parent kind is `Database` (with `crd:`): its CRD
/// is the schema of `app`'s Database child.
const DATABASE_RULE: &str = "apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: database
spec:
  parent:
    apiVersion: demo.example.com/v1
    kind: Database
  crd: {}
  schema:
    type: object
    properties:
      engine: {type: string}
      storageGB: {type: integer}
  children: []
";

const DATABASE_CHILD: &str = "    - id: db
      apiVersion: demo.example.com/v1
      kind: Database
      template: |
        metadata:
          name: {{ parent.metadata.name }}
        spec:
          engine: postgres
          storageGB: 10
";

#[test]
fn a_custom_kind_from_a_rules_crd_block_misspelt_and_mistyped() {
    let child = DATABASE_CHILD
        .replace("engine: postgres", "engnie: postgres")
        .replace("storageGB: 10", "storageGB: ten");
    let text = rule(&child);
    let dir = Dir::new(&[("app.yaml", &text), ("database.yaml", DATABASE_RULE)]);
    let line_of = |needle: &str| text.lines().position(|l| l.contains(needle)).expect("line") + 1;
    assert_eq!(
        dir.check(),
        [
            format!(
                "app.yaml:{}: warning: children[0] (db) Database: spec.engnie: unknown field \
                 (did you mean engine?)",
                line_of("engnie")
            ),
            format!(
                "app.yaml:{}: warning: children[0] (db) Database: spec.storageGB: wrong type: \
                 a string (\"ten\"), the schema wants an integer",
                line_of("storageGB")
            ),
        ]
    );
    // Written right, the same child is clean.
    let dir = Dir::new(&[
        ("app.yaml", &rule(DATABASE_CHILD)),
        ("database.yaml", DATABASE_RULE),
    ]);
    assert_eq!(dir.check(), Vec::<String>::new());
}

#[test]
fn a_custom_kind_from_crds_and_strict_makes_it_an_error() {
    let crd = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: databases.demo.example.com}
spec:
  group: demo.example.com
  scope: Namespaced
  names: {kind: Database, plural: databases, singular: database, listKind: DatabaseList}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                engine: {type: string}
                storageGB: {type: integer}
                options: {type: object, x-kubernetes-preserve-unknown-fields: true}
";
    let child = DATABASE_CHILD.replace(
        "storageGB: 10",
        "storageGB: 10\n          size: 3\n          options: {anything: 1}",
    );
    let dir = Dir::new(&[("app.yaml", &rule(&child))]);
    // Without a schema for the kind nothing is said.
    assert_eq!(dir.check(), Vec::<String>::new());
    let crds_dir = Dir::new(&[("db-crd.yaml", crd)]);
    let crds = OfflineCrds::load(&crds_dir.path()).expect("CRDs load");
    let found = dir.check_with(&Inputs {
        crds: Some(crds.clone()),
        ..Inputs::default()
    });
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("warning: children[0] (db) Database: spec.size: unknown field"),
        "{found:?}"
    );
    let strict = dir.check_with(&Inputs {
        crds: Some(crds),
        strict: true,
        ..Inputs::default()
    });
    assert!(
        strict[0].contains(": error: children[0] (db)"),
        "{strict:?}"
    );
}

#[test]
fn branches_the_sample_cannot_reach_are_not_reported() {
    // `spec.tier` is not in the schema, so the sample has none; the child
    // reading a related object that is not there fails to render.
    let children = "    - id: web
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name }}
        {%- if spec.tier is defined %}
        dta: {a: b}
        {%- endif %}
    - id: other
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ related.missing.metadata.name }}
        dta: {a: b}
";
    let text = rule(children).replace(
        "  children:\n",
        "  related:\n    - {id: missing, apiVersion: v1, kind: Secret, name: x}\n  children:\n",
    );
    let dir = Dir::new(&[("app.yaml", &text)]);
    assert_eq!(dir.check(), Vec::<String>::new());
    // The same mistake where the sample goes is reported: the sample takes
    // every boolean as true, whatever `defaults` says.
    let reached = text.replace("spec.tier is defined", "spec.debug");
    let dir = Dir::new(&[("app.yaml", &reached)]);
    let found = dir.check();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("children[0] (web) ConfigMap: dta: unknown field (did you mean data?)"),
        "{found:?}"
    );
}

#[test]
fn a_template_file_finding_names_its_line_and_an_unfound_key_the_first_line() {
    let children = "    - id: web
      apiVersion: v1
      kind: ConfigMap
      templateFile: templates/cm.yaml.j2
";
    let template = "# a config map
metadata:
  name: {{ parent.metadata.name }}
{%- for k in ['dtaa'] %}
{{ k }}: {a: b}
{%- endfor %}
immutable: yes please
";
    let dir = Dir::new(&[
        ("app.yaml", &rule(children)),
        ("templates/cm.yaml.j2", template),
    ]);
    assert_eq!(
        dir.check(),
        [
            // `{{ k }}:` writes the key: not found, so the template's first line.
            "templates/cm.yaml.j2:1: warning: children[0] (web) ConfigMap: dtaa: unknown field \
             (did you mean data?)",
            "templates/cm.yaml.j2:7: warning: children[0] (web) ConfigMap: immutable: wrong type: \
             a string (\"yes please\"), the schema wants a boolean",
        ]
    );
}

#[test]
fn a_patch_body_is_checked_against_its_targets_kind() {
    let patch = "  patches:
    - id: scale
      apiVersion: apps/v1
      kind: Deployment
      template: |
        metadata:
          name: {{ parent.metadata.name ~ \"-web\" }}
        spec:
          replicas: {{ spec.replicas }}
          paused: \"no\"
";
    let text = rule(DEPLOYMENT_OK).replace("  children:\n", &format!("{patch}  children:\n"));
    let dir = Dir::new(&[("app.yaml", &text)]);
    let line = text
        .lines()
        .position(|l| l.contains("paused"))
        .expect("line")
        + 1;
    assert_eq!(
        dir.check(),
        [format!(
            "app.yaml:{line}: warning: patches[0] (scale) Deployment: spec.paused: wrong type: \
             a string (\"no\"), the schema wants a boolean"
        )]
    );
    // Written right, it is clean (its target missing offline changes nothing).
    let dir = Dir::new(&[("app.yaml", &text.replace("paused: \"no\"", "paused: false"))]);
    assert_eq!(dir.check(), Vec::<String>::new());
}

#[test]
fn a_built_in_parent_kind_is_sampled_from_its_own_schema() {
    let text = "apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: expose
spec:
  parent:
    apiVersion: apps/v1
    kind: Deployment
  children:
    - id: svc
      apiVersion: v1
      kind: Service
      includeWhen: \"parent.spec.replicas > 1\"
      template: |
        metadata:
          name: {{ parent.metadata.name }}
        spec:
          selector: {{ parent.spec.selector.matchLabels }}
          ports:
          {%- for c in parent.spec.template.spec.containers %}
            - port: {{ c.ports[0].containerPort }}
              nmae: {{ c.name }}
          {%- endfor %}
";
    let dir = Dir::new(&[("expose.yaml", text)]);
    assert_eq!(
        dir.check(),
        [
            "expose.yaml:22: warning: children[0] (svc) Service: spec.ports[0].nmae: unknown field \
          (did you mean name?)"
        ]
    );
}

#[test]
fn a_child_that_cannot_be_an_object_is_a_warning_but_a_value_the_sample_lacks_is_not() {
    let children = "    - id: web
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadat:
          name: {{ parent.metadata.name }}
";
    let dir = Dir::new(&[("app.yaml", &rule(children))]);
    let found = dir.check();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains(
            "warning: children[0] (web) ConfigMap: cannot be applied as it renders for the \
             sample parent: template of child \"web\": metadata.name must be set"
        ),
        "{found:?}"
    );
    // A name from a value the sample lacks fails too, and is not reported.
    let lacking = children
        .replace("metadat:", "metadata:")
        .replace("parent.metadata.name", "parent.metadata.annotations.owner");
    let dir = Dir::new(&[("app.yaml", &rule(&lacking))]);
    assert_eq!(dir.check(), Vec::<String>::new());
}

/// A rule `hosts` with a list in its spec, and the given `vars:` and
/// `children:` blocks.
fn hosts_rule(vars: &str, children: &str) -> String {
    format!(
        "apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: hosts
spec:
  parent:
    apiVersion: demo.example.com/v1
    kind: Site
  schema:
    type: object
    properties:
      hosts: {{type: array, items: {{type: string}}}}
      ports: {{type: array, minItems: 1, items: {{type: integer}}}}
  defaults: {{hosts: [], ports: [80]}}
{vars}  children:
{children}"
    )
}

#[test]
fn check_warns_about_a_template_that_breaks_when_a_list_is_empty() {
    let children = "    - id: front
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name }}
        data:
          first: {{ spec.hosts[0] }}
          port: {{ spec.ports[0] | string }}
";
    let text = hosts_rule("", children);
    let dir = Dir::new(&[("hosts.yaml", &text)]);
    let line = text
        .lines()
        .position(|l| l.contains("template: |"))
        .expect("line")
        + 2;
    assert_eq!(
        dir.check(),
        [format!(
            "hosts.yaml:{line}: warning: children[0] (front) ConfigMap: fails for the sample \
             parent with every list empty (`[]`): template of child \"front\": missing value: \
             `spec.hosts[0]` is undefined (line 4); use `| default(...)` or `is defined`"
        )],
        "`ports` has `minItems: 1`: only `hosts` may be empty"
    );
    let guarded = text.replace(
        "spec.hosts[0] }}",
        "spec.hosts | first | default('none') }}",
    );
    let dir = Dir::new(&[("hosts.yaml", &guarded)]);
    assert_eq!(dir.check(), Vec::<String>::new());
}

#[test]
fn check_warns_about_a_var_that_fails_when_a_list_is_empty_not_its_readers() {
    let vars = "  vars:
    - name: first
      value: \"spec.hosts | first\"
    - name: all
      template: |
        {% for h in spec.hosts %}
        - {{ h }}
        {% endfor %}
";
    let children = "    - id: each
      apiVersion: v1
      kind: ConfigMap
      forEach: vars.all
      template: |
        metadata:
          name: {{ item }}
    - id: front
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ vars.first }}
";
    let text = hosts_rule(vars, children);
    let dir = Dir::new(&[("hosts.yaml", &text)]);
    let line = text
        .lines()
        .position(|l| l.contains("spec.hosts | first"))
        .expect("line")
        + 1;
    assert_eq!(
        dir.check(),
        [format!(
            "hosts.yaml:{line}: warning: spec.vars[0].value: fails for the sample parent with \
             every list empty (`[]`): var `first`: `spec.hosts | first` evaluated to a missing \
             value; use `| default(...)` or `is defined`"
        )],
        "`all` is [] with no hosts, so `each` renders nothing and is fine"
    );
}

#[test]
fn check_warns_about_a_patch_that_breaks_when_a_list_is_empty() {
    let text = hosts_rule(
        "",
        "    - id: front
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name }}
  patches:
    - id: mark
      apiVersion: v1
      kind: Namespace
      allowCrossNamespace: true
      template: |
        metadata:
          name: {{ spec.hosts[0] | dns_label }}
          labels: {marked: \"yes\"}
",
    );
    let dir = Dir::new(&[("hosts.yaml", &text)]);
    let found = dir.check();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains(
            "warning: patches[0] (mark) Namespace: fails for the sample parent with every list \
             empty (`[]`): template of patch \"mark\""
        ),
        "{found:?}"
    );
}
