//! `examples/fleet/run.sh`, run as written: two control planes of its own
//! (a hub and the spoke eu-west), the spoke registered by the steps of
//! docs/operations.md (a ServiceAccount with the ClusterRole `trellis rbac
//! --cluster` prints, its token in a kubeconfig, that in a Secret), trellis
//! on the hub, the sample Workspace Ready with its Namespace and ConfigMap
//! in the spoke. Then the script's "Try:" lines, as it prints them: drift in
//! the spoke restored, a parent edit followed there, the spoke's API server
//! killed (`ClusterUnreachable`) and started again, the parent deleted (its
//! spoke children first). The binary is the one cargo built for this run
//! (`TRELLIS_FLEET_BINARY`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn cluster_script() -> PathBuf {
    root().join("tests/cluster/cluster")
}

/// Stops what the script started (the operator, both control planes),
/// whatever the test's outcome.
struct Started {
    dir: PathBuf,
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("trellis.pid")) {
            let _ = Command::new("kill").arg(pid.trim()).status();
        }
        for plane in ["hub", "spoke"] {
            let _ = Command::new(cluster_script())
                .arg("down")
                .arg(self.dir.join(plane))
                .output();
        }
    }
}

/// kubectl against the `plane` (hub or spoke) the script started.
fn kubectl(dir: &Path, plane: &str, args: &[&str]) -> Output {
    let bin = Command::new(cluster_script())
        .arg("bin")
        .output()
        .expect("tests/cluster/cluster bin");
    let bin = String::from_utf8_lossy(&bin.stdout).trim().to_owned();
    Command::new(Path::new(&bin).join("kubectl"))
        .env("KUBECONFIG", dir.join(plane).join("kubeconfig"))
        .args(args)
        .output()
        .expect("kubectl")
}

/// The object as JSON, or why not.
fn get(dir: &Path, plane: &str, args: &[&str]) -> Result<Value, String> {
    let mut all = vec!["get", "-o", "json"];
    all.extend_from_slice(args);
    let out = kubectl(dir, plane, &all);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
}

/// Polls `check` every half second for up to a minute.
fn eventually(what: &str, mut check: impl FnMut() -> Result<(), String>) {
    let started = Instant::now();
    loop {
        match check() {
            Ok(()) => return,
            Err(why) if started.elapsed() > Duration::from_secs(60) => {
                panic!("{what}: not within 60 s: {why}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

fn workspace(dir: &Path) -> Result<Value, String> {
    get(dir, "hub", &["-n", "platform", "workspace", "payments"])
}

fn condition(ws: &Value, type_: &str) -> Value {
    ws["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .cloned()
        .unwrap_or(Value::Null)
}

fn settings(dir: &Path) -> Result<Value, String> {
    get(
        dir,
        "spoke",
        &["-n", "ws-payments", "configmap", "workspace-settings"],
    )
}

#[test]
fn the_fleet_example_places_a_workspace_in_its_spoke_and_its_try_lines_work() {
    let dir = tempfile::Builder::new()
        .prefix("trellis-fleet-test-")
        .tempdir()
        .expect("temp dir");
    let dir = dir.path().to_path_buf();
    let _started = Started { dir: dir.clone() };
    let out = Command::new(root().join("examples/fleet/run.sh"))
        .env("TRELLIS_FLEET_DIR", &dir)
        .env("TRELLIS_FLEET_BINARY", env!("CARGO_BIN_EXE_trellis"))
        .output()
        .expect("run examples/fleet/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "examples/fleet/run.sh failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // The hub's account in the spoke holds the rule's rights, not more.
    assert!(
        stdout.contains("may create ConfigMaps: yes") && stdout.contains("read Secrets: no"),
        "{stdout}"
    );
    assert!(stdout.contains("\"reachable\": true"), "{stdout}");

    // What the script ended on: Ready, the Namespace's phase read back from
    // the spoke, its children there with this hub's labels and no owner.
    let ws = workspace(&dir).expect("the Workspace");
    assert_eq!(condition(&ws, "Ready")["status"], "True", "{ws:#}");
    assert_eq!(ws["status"]["namespace"], "ws-payments");
    assert_eq!(ws["status"]["phase"], "Active");
    let ns = get(&dir, "spoke", &["namespace", "ws-payments"]).expect("the spoke's Namespace");
    assert_eq!(ns["metadata"]["labels"]["trellis.dev/hub"], "hub");
    assert_eq!(
        ns["metadata"]["labels"]["trellis.dev/parent-uid"],
        ws["metadata"]["uid"]
    );
    assert!(ns["metadata"]["ownerReferences"].is_null(), "{ns:#}");
    let cm = settings(&dir).expect("the spoke's ConfigMap");
    assert_eq!(cm["data"]["tier"], "gold");
    assert_eq!(cm["data"]["team"], "payments");
    assert!(
        get(
            &dir,
            "hub",
            &["-n", "platform", "configmap", "payments-workspace"]
        )
        .is_ok(),
        "the summary ConfigMap at home"
    );

    // Try: drift in the spoke is restored.
    let deleted = kubectl(
        &dir,
        "spoke",
        &[
            "-n",
            "ws-payments",
            "delete",
            "configmap",
            "workspace-settings",
        ],
    );
    assert!(deleted.status.success(), "{deleted:?}");
    eventually("the deleted ConfigMap made again in the spoke", || {
        settings(&dir).map(|_| ())
    });

    // Try: a parent edit reaches the spoke.
    let patched = kubectl(
        &dir,
        "hub",
        &[
            "-n",
            "platform",
            "patch",
            "workspace",
            "payments",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"settings":{"tier":"platinum"}}}"#,
        ],
    );
    assert!(patched.status.success(), "{patched:?}");
    eventually("the edit in the spoke", || {
        let cm = settings(&dir)?;
        (cm["data"]["tier"] == "platinum")
            .then_some(())
            .ok_or(cm["data"].to_string())
    });

    // Try: the spoke's API server killed, then started again.
    let spoke = dir.join("spoke");
    let spoke = spoke.to_string_lossy();
    let killed = Command::new(cluster_script())
        .args(["kill", &spoke, "kube-apiserver", "KILL"])
        .output()
        .expect("cluster kill");
    assert!(killed.status.success(), "{killed:?}");
    eventually("ClusterUnreachable on the Workspace", || {
        let synced = condition(&workspace(&dir)?, "Synced");
        (synced["reason"] == "ClusterUnreachable"
            && synced["message"]
                .as_str()
                .is_some_and(|m| m.contains("eu-west")))
        .then_some(())
        .ok_or(synced.to_string())
    });
    let started = Command::new(cluster_script())
        .args(["start", &spoke, "kube-apiserver"])
        .output()
        .expect("cluster start");
    assert!(started.status.success(), "{started:?}");
    eventually("Synced again once the spoke answers", || {
        let synced = condition(&workspace(&dir)?, "Synced");
        (synced["status"] == "True")
            .then_some(())
            .ok_or(synced.to_string())
    });

    // Try: the parent deleted; its spoke children go first.
    let deleted = kubectl(
        &dir,
        "hub",
        &[
            "-n",
            "platform",
            "delete",
            "workspace",
            "payments",
            "--wait=false",
        ],
    );
    assert!(deleted.status.success(), "{deleted:?}");
    eventually(
        "the Workspace gone, its Namespace in the spoke going",
        || {
            if workspace(&dir).is_ok() {
                return Err("the Workspace is still there".into());
            }
            match get(&dir, "spoke", &["namespace", "ws-payments"]) {
                Ok(ns) if ns["metadata"]["deletionTimestamp"].is_null() => {
                    Err("the Namespace is not being deleted".into())
                }
                _ => Ok(()),
            }
        },
    );
}
