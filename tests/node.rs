//! The local node of the test cluster: Pods run from images packed without a
//! registry, reach the API server the standard way (the `kubernetes` Service),
//! and no packet from the pod network leaves the machine. Also: the trellis
//! image has the Dockerfile's runtime layout, and nothing more (no shell).

mod support;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams, PostParams};
use serde_json::{Value, json};
use support::node::{APP_IMAGE, forward_drops, node};

/// A Pod that runs the app image's `dial` once and stops.
fn dial_pod(name: &str, target: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "dial",
                "image": APP_IMAGE,
                "imagePullPolicy": "Never",
                "args": ["dial", target, "3"],
                "securityContext": {
                    "runAsNonRoot": true,
                    "readOnlyRootFilesystem": true,
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}
                }
            }]
        }
    }))
    .expect("a valid Pod")
}

/// Wait until the Pod has finished; its phase (Succeeded or Failed).
async fn finished(pods: &Api<Pod>, name: &str) -> String {
    support::eventually(
        &format!("Pod {name} to finish"),
        Duration::from_secs(60),
        || async {
            let pod = pods.get(name).await.map_err(|e| e.to_string())?;
            match pod.status.and_then(|s| s.phase).as_deref() {
                Some(p @ ("Succeeded" | "Failed")) => Ok(p.to_string()),
                other => Err(format!("phase {other:?}")),
            }
        },
    )
    .await
}

#[tokio::test]
async fn a_pod_reaches_the_api_server_through_the_kubernetes_service() {
    node();
    let ns = support::namespace().await;
    let pods: Api<Pod> = ns.api();
    // The kubelet expands $(VAR) from the environment it gives the container:
    // the standard in-cluster variables, pointing at the `kubernetes` Service.
    let pod = dial_pod(
        "dial-api",
        "$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)",
    );
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let phase = finished(&pods, "dial-api").await;
    // Logs come through the API server from the kubelet, too.
    let logs = pods
        .logs("dial-api", &LogParams::default())
        .await
        .unwrap_or_else(|e| panic!("logs of dial-api: {e}"));
    assert_eq!(phase, "Succeeded", "dial-api: {logs}");
    assert!(
        logs.contains("dial 198.18.0.1:443: connected"),
        "the Pod did not dial the Service IP 198.18.0.1:443: {logs}"
    );
}

/// The host's default gateway: the first hop a packet leaving the machine takes.
fn default_gateway() -> String {
    let out = Command::new("ip")
        .args(["-4", "route", "show", "default"])
        .output()
        .expect("running ip route");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let words: Vec<&str> = text.split_whitespace().collect();
    match words.iter().position(|w| *w == "via") {
        Some(i) if i + 1 < words.len() => words[i + 1].to_string(),
        _ => panic!("no default route with a gateway: {text:?}"),
    }
}

#[tokio::test]
async fn no_packet_from_the_pod_network_leaves_the_machine() {
    node();
    let ns = support::namespace().await;
    let pods: Api<Pod> = ns.api();
    let before = forward_drops();
    let target = format!("{}:80", default_gateway());
    pods.create(&PostParams::default(), &dial_pod("dial-out", &target))
        .await
        .unwrap();
    let phase = finished(&pods, "dial-out").await;
    let logs = pods
        .logs("dial-out", &LogParams::default())
        .await
        .unwrap_or_default();
    assert_eq!(
        phase, "Failed",
        "a Pod connected to {target}, off the machine: {logs}"
    );
    let after = forward_drops();
    assert!(
        after > before,
        "the pod bridge's forward-drop rule counted no packet ({before} -> {after}): \
         the dial to {target} failed for another reason ({logs})"
    );
}

/// The final stage of the Dockerfile: (Entrypoint, Cmd, User, COPY destinations).
fn dockerfile_final_stage() -> (Value, Value, String, Vec<String>) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/Dockerfile");
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let last_from = lines
        .iter()
        .rposition(|l| l.trim_start().to_ascii_uppercase().starts_with("FROM "))
        .expect("a FROM line");
    let (mut entrypoint, mut cmd, mut user, mut copies) = (Value::Null, Value::Null, None, vec![]);
    for line in lines.iter().skip(last_from + 1) {
        let line = line.trim();
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word.to_ascii_uppercase().as_str() {
            "ENTRYPOINT" => entrypoint = serde_json::from_str(rest).expect("ENTRYPOINT [...]"),
            "CMD" => cmd = serde_json::from_str(rest).expect("CMD [...]"),
            "USER" => user = Some(rest.trim().to_string()),
            "COPY" => {
                let dest = rest.split_whitespace().last().expect("COPY SRC DEST");
                copies.push(dest.to_string());
            }
            "" => {}
            w if w.starts_with('#') => {}
            other => panic!("Dockerfile final stage: no check for {other} ({line}); add one"),
        }
    }
    (entrypoint, cmd, user.expect("a USER line"), copies)
}

/// `tar -xOf ARCHIVE MEMBER`.
fn tar_member(archive: &std::path::Path, member: &str) -> Vec<u8> {
    let out = Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg(member)
        .output()
        .expect("running tar");
    assert!(out.status.success(), "tar -xOf {member}: {out:?}");
    out.stdout
}

#[test]
fn the_trellis_image_has_the_dockerfiles_runtime_layout_and_no_shell() {
    let dir = tempfile::tempdir().unwrap();
    let build = concat!(env!("CARGO_MANIFEST_DIR"), "/images/trellis/build");
    let out = Command::new(build)
        .arg(env!("CARGO_BIN_EXE_trellis"))
        .arg(dir.path())
        .output()
        .expect("running images/trellis/build");
    assert!(out.status.success(), "images/trellis/build: {out:?}");
    let tar = dir.path().join("trellis.tar");
    let blob = |digest: &str| format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"));
    let index: Value = serde_json::from_slice(&tar_member(&tar, "index.json")).unwrap();
    let manifest: Value = serde_json::from_slice(&tar_member(
        &tar,
        &blob(index["manifests"][0]["digest"].as_str().unwrap()),
    ))
    .unwrap();
    let config: Value = serde_json::from_slice(&tar_member(
        &tar,
        &blob(manifest["config"]["digest"].as_str().unwrap()),
    ))
    .unwrap();
    let layer = dir.path().join("layer.tar");
    std::fs::write(
        &layer,
        tar_member(
            &tar,
            &blob(manifest["layers"][0]["digest"].as_str().unwrap()),
        ),
    )
    .unwrap();
    let listing = Command::new("tar").arg("-tf").arg(&layer).output().unwrap();
    let files: BTreeSet<String> = String::from_utf8_lossy(&listing.stdout)
        .lines()
        .map(|l| format!("/{}", l.trim_end_matches('/')))
        .collect();

    let (entrypoint, cmd, user, copies) = dockerfile_final_stage();
    assert_eq!(config["config"]["Entrypoint"], entrypoint, "Entrypoint");
    assert_eq!(config["config"]["Cmd"], cmd, "Cmd");
    assert_eq!(config["config"]["User"], json!(user), "User");
    assert!(
        !user.starts_with("0") && !user.starts_with("root"),
        "User {user} is root"
    );
    for dest in &copies {
        assert!(
            files.contains(dest),
            "the Dockerfile copies {dest}; the image lacks it: {files:?}"
        );
    }
    // The binary, the libraries it links, the nonroot user: nothing to run
    // a shell or install packages with.
    for file in &files {
        let name = file.rsplit('/').next().unwrap_or_default();
        assert!(
            ![
                "sh", "bash", "dash", "ash", "busybox", "apt", "apt-get", "dpkg", "env"
            ]
            .contains(&name),
            "the image holds {file}"
        );
        assert!(
            file == "/usr/local/bin/trellis"
                || file.starts_with("/lib")
                || file.starts_with("/etc/")
                || ["/etc", "/usr", "/usr/local", "/usr/local/bin"].contains(&file.as_str()),
            "unexpected file in the image: {file}"
        );
    }
    let passwd = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/images/trellis/etc/passwd"
    ))
    .unwrap();
    assert!(
        passwd.contains(":65532:65532:"),
        "no nonroot user 65532 in /etc/passwd"
    );
}
