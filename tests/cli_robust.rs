//! The binary as a production user meets it, no cluster needed: a metrics
//! address that cannot be bound is a startup error, printing commands end
//! quietly when their reader goes away (`trellis rbac | head`), `check`
//! refuses a rule that can never apply, `run` refuses a set in which
//! nothing validates, and `rbac --from-cluster` fails plainly, printing no
//! partial roles, when it cannot reach a cluster.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn trellis() -> Command {
    Command::new(env!("CARGO_BIN_EXE_trellis"))
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Runs `cmd` to its end, killing it after `limit` (then failing the test).
fn run_within(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start trellis");
    let started = Instant::now();
    loop {
        if child.try_wait().expect("wait for trellis").is_some() {
            return child.wait_with_output().expect("trellis output");
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("trellis output");
            panic!(
                "trellis still running after {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A kubeconfig for a server that is never contacted: building a client
/// needs one, and the failures tested here come before any request.
fn unused_kubeconfig(dir: &Path) -> PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:9'}\nusers:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
    )
    .expect("write kubeconfig");
    path
}

#[test]
fn a_metrics_address_in_use_is_a_startup_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let addr = taken.local_addr().expect("local addr");
    let mut cmd = trellis();
    cmd.args(["run", "--rules"])
        .arg(repo("rules"))
        .args(["--metrics-addr", &addr.to_string()])
        .env("KUBECONFIG", unused_kubeconfig(dir.path()))
        .env_remove("TRELLIS_RULES");
    let out = run_within(cmd, Duration::from_secs(20));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr:\n{stderr}");
    assert!(
        stderr.contains(&format!("--metrics-addr {addr}: cannot listen")),
        "stderr:\n{stderr}"
    );
}

/// Runs `args` with stdout a pipe whose reader is already gone, so the
/// first write fails with a broken pipe whatever the timing.
fn with_closed_stdout(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let mut child = trellis()
        .args(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start trellis");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    let status = child.wait().expect("wait for trellis");
    Output {
        status,
        stdout: Vec::new(),
        stderr: stderr.into_bytes(),
    }
}

#[test]
fn printing_commands_end_quietly_when_the_reader_goes_away() {
    let rules = repo("rules").display().to_string();
    let parent = repo("examples/parents/webapp.yaml").display().to_string();
    let cases: Vec<Vec<&str>> = vec![
        vec!["rbac", "--rules", &rules],
        vec!["schema"],
        vec!["crd", "--rules", &rules],
        vec!["render", "--rules", &rules, &parent],
    ];
    for args in cases {
        let out = with_closed_stdout(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("panicked"),
            "trellis {args:?} panicked:\n{stderr}"
        );
        assert_eq!(out.status.code(), Some(0), "trellis {args:?}:\n{stderr}");
    }
}

/// `trellis check` on one rule file holding `text`: (exit code, stderr, file).
fn check(text: &str) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("team.yaml");
    std::fs::write(&file, text).expect("write rule");
    let out = trellis()
        .args(["check", "--rules"])
        .arg(dir.path())
        .output()
        .expect("run trellis check");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code(), stderr, file.display().to_string())
}

/// A rule with three cluster-scoped children (by kind, by `scope:`, and one
/// allowed by `allowCrossNamespace`) of the parent `PARENT`.
const SCOPED: &str = "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: ns\nspec:\n  parent: PARENT\n  children:\n    - id: space\n      apiVersion: v1\n      kind: Namespace\n      template: 'metadata: {name: x}'\n    - id: role\n      apiVersion: demo.trellis.dev/v1\n      kind: Thing\n      scope: Cluster\n      template: 'metadata: {name: x}'\n    - id: allowed\n      apiVersion: rbac.authorization.k8s.io/v1\n      kind: ClusterRole\n      allowCrossNamespace: true\n      template: 'metadata: {name: x}'\n";

#[test]
fn check_rejects_a_cluster_scoped_child_of_a_namespaced_parent() {
    for parent in [
        "{apiVersion: demo.trellis.dev/v1, kind: Team, scope: Namespaced}",
        "{apiVersion: apps/v1, kind: Deployment}",
    ] {
        let (code, stderr, file) = check(&SCOPED.replace("PARENT", parent));
        assert_eq!(code, Some(1), "{parent}: stderr:\n{stderr}");
        assert!(
            stderr.contains(&format!(
                "{file}:10: error: spec.children[0].kind: `Namespace` is cluster-scoped and the parent is namespaced"
            )),
            "{parent}: stderr:\n{stderr}"
        );
        assert!(
            stderr.contains(&format!("{file}:14: error: spec.children[1].kind: `Thing`")),
            "a child declared `scope: Cluster` counts too; {parent}: stderr:\n{stderr}"
        );
        assert!(
            !stderr.contains("spec.children[2]"),
            "allowCrossNamespace allows it; stderr:\n{stderr}"
        );
    }
}

#[test]
fn check_warns_of_a_cluster_scoped_child_when_the_parent_scope_is_unknown() {
    let (code, stderr, file) =
        check(&SCOPED.replace("PARENT", "{apiVersion: demo.trellis.dev/v1, kind: Team}"));
    assert_eq!(code, Some(0), "stderr:\n{stderr}");
    assert!(
        stderr.contains(&format!("{file}:10: warning: spec.children[0].kind:")),
        "stderr:\n{stderr}"
    );
    let (code, stderr, _) = check(&SCOPED.replace(
        "PARENT",
        "{apiVersion: demo.trellis.dev/v1, kind: Team, scope: Cluster}",
    ));
    assert_eq!(code, Some(0), "stderr:\n{stderr}");
    assert!(!stderr.contains("spec.children"), "stderr:\n{stderr}");
}

/// `trellis check --crds` on one rule file and a CRD of `demo.trellis.dev`
/// `Team` of scope `scope`: (exit code, stderr, rule file).
fn check_with_crd(text: &str, scope: &str) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).expect("rules dir");
    let file = rules.join("team.yaml");
    std::fs::write(&file, text).expect("write rule");
    let crd = dir.path().join("crd.yaml");
    std::fs::write(
        &crd,
        format!(
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {{name: teams.demo.trellis.dev}}\nspec:\n  group: demo.trellis.dev\n  scope: {scope}\n  names: {{plural: teams, singular: team, kind: Team}}\n  versions:\n    - name: v1\n      served: true\n      storage: true\n      schema: {{openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}}}\n"
        ),
    )
    .expect("write CRD");
    let out = trellis()
        .args(["check", "--rules"])
        .arg(&rules)
        .arg("--crds")
        .arg(&crd)
        .output()
        .expect("run trellis check");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code(), stderr, file.display().to_string())
}

#[test]
fn check_with_the_parents_crd_decides_what_the_rule_leaves_open() {
    let rule = SCOPED.replace("PARENT", "{apiVersion: demo.trellis.dev/v1, kind: Team}");
    let (code, stderr, file) = check_with_crd(&rule, "Namespaced");
    assert_eq!(code, Some(1), "a namespaced CRD: stderr:\n{stderr}");
    assert!(
        stderr.contains(&format!(
            "{file}:10: error: spec.children[0].kind: `Namespace` is cluster-scoped and the parent is namespaced"
        )),
        "stderr:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("{file}:14: error: spec.children[1].kind: `Thing`")),
        "stderr:\n{stderr}"
    );
    assert!(
        !stderr.contains("warning: spec.children"),
        "settled, not warned: {stderr}"
    );
    assert!(!stderr.contains("spec.children[2]"), "allowed: {stderr}");

    let (code, stderr, _) = check_with_crd(&rule, "Cluster");
    assert_eq!(code, Some(0), "a cluster-scoped CRD: stderr:\n{stderr}");
    assert!(!stderr.contains("spec.children"), "stderr:\n{stderr}");
}

#[test]
fn run_refuses_a_set_in_which_nothing_validates() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).expect("rules dir");
    std::fs::write(rules.join("bad.yaml"), "metadata: {name: [oops\n").expect("write rule");
    let mut cmd = trellis();
    cmd.args(["run", "--rules"])
        .arg(&rules)
        .env("KUBECONFIG", unused_kubeconfig(dir.path()))
        .env_remove("TRELLIS_RULES");
    let out = run_within(cmd, Duration::from_secs(20));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr:\n{stderr}");
    assert!(stderr.contains("bad.yaml:"), "stderr:\n{stderr}");
    assert!(
        stderr.contains("no rule in the rule set validates"),
        "stderr:\n{stderr}"
    );
}

/// A rule with `rollout:`, so `rbac --from-cluster` has revisions to read.
const STAGED: &str = "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: staged\nspec:\n  parent:\n    apiVersion: demo.trellis.dev/v1\n    kind: App\n  children:\n    - id: s\n      apiVersion: v1\n      kind: Secret\n      template: 'metadata: {name: x}'\n  rollout:\n    steps:\n      - percent: 50\n        pause: manual\n";

#[test]
fn rbac_from_cluster_without_a_reachable_cluster_is_an_error_and_prints_no_roles() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).expect("rules dir");
    std::fs::write(rules.join("staged.yaml"), STAGED).expect("write rule");
    // A port nobody listens on: the connection is refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let refused = dir.path().join("refused");
    std::fs::write(
        &refused,
        format!("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'https://127.0.0.1:{port}'}}\nusers:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"),
    )
    .expect("write kubeconfig");
    let cases = [
        (
            refused,
            "error: --from-cluster: cannot list the revision ConfigMaps of rule staged in namespace ops",
        ),
        (
            dir.path().join("missing"),
            "error: --from-cluster: cannot build a Kubernetes client (KUBECONFIG or in-cluster config)",
        ),
    ];
    for (kubeconfig, want) in cases {
        let mut cmd = trellis();
        cmd.args([
            "rbac",
            "--from-cluster",
            "--operator-namespace",
            "ops",
            "--rules",
        ])
        .arg(&rules)
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST");
        let out = run_within(cmd, Duration::from_secs(20));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{kubeconfig:?}: stderr:\n{stderr}"
        );
        assert!(
            stderr.contains(want),
            "{kubeconfig:?}: want {want:?} in:\n{stderr}"
        );
        assert!(!stderr.contains("panicked"), "stderr:\n{stderr}");
        // Roles that leave out a live version must not reach `kubectl apply`.
        assert!(
            out.stdout.is_empty(),
            "{kubeconfig:?}: printed\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}
