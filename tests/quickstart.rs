//! The README's first command, `examples/quickstart.sh`, run as written:
//! its own control plane (etcd, kube-apiserver, kube-controller-manager from
//! `tests/cluster/cluster`), the example CRDs, `trellis check` of `rules/`,
//! every sample parent applied, trellis running on them. Without a node
//! (`TRELLIS_QUICKSTART_NODE=0`): the machine has one node at most and the
//! shared test cluster holds it; the deploy path into the node is
//! `tests/deploy.rs`'s. The binary is the one cargo built for this run
//! (`TRELLIS_QUICKSTART_BINARY`), not a nested `cargo build`.
//!
//! It failed for a whole session without anyone noticing: a sample parent
//! added in a namespace the script did not create stopped it at
//! `namespaces "payments" not found`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Stops what the script started (the operator process, the control
/// plane), whatever the test's outcome.
struct Started {
    dir: PathBuf,
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("trellis.pid")) {
            let _ = Command::new("kill").arg(pid.trim()).status();
        }
        let _ = Command::new(root().join("tests/cluster/cluster"))
            .arg("down")
            .arg(&self.dir)
            .output();
    }
}

fn kubectl(dir: &Path, args: &[&str]) -> std::process::Output {
    let bin = Command::new(root().join("tests/cluster/cluster"))
        .arg("bin")
        .output()
        .expect("tests/cluster/cluster bin");
    let bin = String::from_utf8_lossy(&bin.stdout).trim().to_owned();
    Command::new(Path::new(&bin).join("kubectl"))
        .env("KUBECONFIG", dir.join("kubeconfig"))
        .args(args)
        .output()
        .expect("kubectl")
}

/// (kind, namespace, name) of every sample parent the script applies.
fn sample_parents() -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root().join("examples/parents")).expect("examples/parents") {
        let path = entry.expect("entry").path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if !name.ends_with(".yaml") || name.ends_with("-invalid.yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("parent file");
        let value = trellis::yaml::parse_value(&text, &trellis::yaml::Limits::FILES)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let field = |p: &str| value.pointer(p).and_then(|v| v.as_str()).unwrap_or("");
        let group = field("/apiVersion").split('/').next().unwrap_or("");
        out.push((
            format!("{}.{group}", field("/kind").to_lowercase()),
            field("/metadata/namespace").to_owned(),
            field("/metadata/name").to_owned(),
        ));
    }
    out
}

#[test]
fn the_quickstart_runs_to_the_end_and_trellis_writes_every_sample_parents_status() {
    let dir = tempfile::Builder::new()
        .prefix("trellis-quickstart-test-")
        .tempdir()
        .expect("temp dir");
    let state = dir.path().join("cluster");
    let _started = Started { dir: state.clone() };
    let out = Command::new(root().join("examples/quickstart.sh"))
        .env("TRELLIS_QUICKSTART_NODE", "0")
        // `cluster up` would start a node with it set, beside the shared one.
        .env("TRELLIS_CLUSTER_NODE", "0")
        .env("TRELLIS_QUICKSTART_DIR", &state)
        .env("TRELLIS_QUICKSTART_BINARY", env!("CARGO_BIN_EXE_trellis"))
        .output()
        .expect("run examples/quickstart.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "examples/quickstart.sh failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("Done: trellis runs as a LOCAL PROCESS"),
        "the script did not say what it did:\n{stdout}"
    );
    // Its last step: every sample parent's `trellis tree`, and which cannot
    // be Ready here (without a node: the webapps, whose Pods never run).
    let parents = sample_parents();
    for (kind, ns, name) in &parents {
        let kind = kind.split('.').next().unwrap_or_default();
        let namespace = if ns.is_empty() {
            String::new()
        } else {
            format!(" -n {ns}")
        };
        let shown = format!("$ trellis tree --rules rules {kind}/{name}{namespace}\nrule ");
        assert!(
            stdout.contains(&shown),
            "no tree of {kind}/{name}:\n{stdout}"
        );
    }
    for needle in [
        "Not Ready here, as expected: webapp/shop: no node: its Deployment's Pods never run.",
        "Not Ready here, as expected: database/orders: ",
        "Every sample parent that can be Ready here is Ready.",
    ] {
        assert!(stdout.contains(needle), "no {needle:?} in:\n{stdout}");
    }

    // Every sample parent gets a status from trellis for its generation.
    assert!(parents.len() >= 5, "sample parents: {parents:?}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut missing = Vec::new();
        for (kind, ns, name) in &parents {
            let got = kubectl(
                &state,
                &[
                    "get",
                    kind,
                    "-n",
                    ns,
                    name,
                    "-o",
                    "jsonpath={.metadata.generation} {.status.observedGeneration}",
                ],
            );
            let text = String::from_utf8_lossy(&got.stdout).to_string();
            let mut parts = text.split(' ');
            let (generation, observed) = (parts.next(), parts.next());
            if !got.status.success() || generation.is_none() || generation != observed {
                missing.push(format!(
                    "{kind} {ns}/{name}: {text:?} {}",
                    String::from_utf8_lossy(&got.stderr).trim()
                ));
            }
        }
        if missing.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(state.join("trellis.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            panic!(
                "no status for its generation after 60 s: {missing:#?}\ntrellis.log (last lines, newest first):\n{}",
                tail.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let synced = kubectl(
        &state,
        &[
            "get",
            "webapp.demo.trellis.dev",
            "-n",
            "team-a",
            "shop",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Synced\")].status}",
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&synced.stdout),
        "True",
        "webapp team-a/shop: Synced"
    );

    // The local process converts: the WebApp read at v2alpha1 (its hosts under
    // `ingress`), through the webhook on loopback whose CA it wrote.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let at_v2 = kubectl(
            &state,
            &[
                "get",
                "webapps.v2alpha1.demo.trellis.dev",
                "-n",
                "team-a",
                "shop",
                "-o",
                "jsonpath={.apiVersion} {.spec.ingress.hosts[0]}",
            ],
        );
        let text = String::from_utf8_lossy(&at_v2.stdout).to_string();
        if text == "demo.trellis.dev/v2alpha1 shop.example.com" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "webapp team-a/shop at v2alpha1: {text:?} {}",
            String::from_utf8_lossy(&at_v2.stderr)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
