//! The quickstart's last step on the node: `examples/samples.sh`, with
//! trellis deployed from examples/deploy (as `examples/quickstart.sh` does
//! on a machine with a node). Every sample parent that can be Ready on this
//! machine ends Ready — a Deployment parent's own Pods Available too — and
//! the two that cannot (a registry image, cert-manager) are named with why.

use std::path::PathBuf;
use std::process::Command;

use super::support;
use super::{DEPLOY, deploy, kubectl, repo};

/// The sample parent files the script applies.
fn sample_parents() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(repo().join("examples/parents"))
        .expect("examples/parents")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.ends_with(".yaml") && !name.ends_with("-invalid.yaml")
        })
        .collect();
    out.sort();
    out
}

/// What the sample Team keeps on purpose when it goes (`deletionPolicy:
/// retain`): released, it is nobody's, and a Team made again (the next run
/// of this test on the same cluster) would be refused it as someone else's.
fn delete_retained() {
    let _ = kubectl(
        &[
            "delete",
            "--ignore-not-found",
            "--wait=false",
            "-n",
            "payments",
            "persistentvolumeclaim",
            "payments-shared-data",
        ],
        None,
    );
}

/// Deletes the sample parents when the test ends, whatever its outcome:
/// their Pods would otherwise hold the node's resources for the next tests.
struct Samples;

impl Drop for Samples {
    fn drop(&mut self) {
        for parent in sample_parents() {
            let _ = kubectl(
                &[
                    "delete",
                    "--ignore-not-found",
                    "--wait=false",
                    "-f",
                    &parent.to_string_lossy(),
                ],
                None,
            );
        }
        delete_retained();
    }
}

#[tokio::test]
async fn every_sample_parent_that_can_be_ready_on_this_machine_ends_ready_on_the_node() {
    let _turn = DEPLOY.lock().await;
    let client = support::client().await;
    deploy(&client).await;
    // A run before this one on the same cluster left the Team's claim.
    delete_retained();
    // Every example CRD, as the quickstart installs them (deploy() installs three).
    for crd in std::fs::read_dir(repo().join("examples/crds")).expect("examples/crds") {
        let path = crd.expect("entry").path();
        kubectl(
            &["apply", "--server-side", "-f", &path.to_string_lossy()],
            None,
        )
        .unwrap();
    }
    kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=60s",
        ],
        None,
    )
    .unwrap();

    let cluster = support::node::node();
    let bin = Command::new(support::cluster_script())
        .arg("bin")
        .output()
        .expect("tests/cluster/cluster bin");
    let kubectl_bin = PathBuf::from(String::from_utf8_lossy(&bin.stdout).trim()).join("kubectl");
    let _samples = Samples;
    let out = Command::new(repo().join("examples/samples.sh"))
        .arg(&kubectl_bin)
        .arg(env!("CARGO_BIN_EXE_trellis"))
        .arg("cluster")
        .env(
            "KUBECONFIG",
            cluster.kubeconfig_path.clone().expect("a kubeconfig file"),
        )
        .output()
        .expect("run examples/samples.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "examples/samples.sh failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    let parents = sample_parents().len();
    for needle in [
        format!("Ready: {} of {parents} sample parents.", parents - 2),
        "Not Ready here, as expected: database/orders: its StatefulSet runs postgres:16".into(),
        "Not Ready here, as expected: tlsservice/storefront: it reads a cert-manager Certificate"
            .into(),
        "Every sample parent that can be Ready here is Ready.".into(),
    ] {
        assert!(stdout.contains(&needle), "no {needle:?} in:\n{stdout}");
    }

    // Seen without the script: the Deployment parent's own Pods run (every
    // container image swapped, each container on its own port), and the
    // webapps' Deployments are Available.
    let get = |args: &[&str]| kubectl(args, None).unwrap();
    assert_eq!(
        get(&[
            "get",
            "deployment",
            "-n",
            "team-b",
            "api",
            "-o",
            "jsonpath={.status.availableReplicas}"
        ]),
        "3"
    );
    for (ns, name) in [("team-a", "shop"), ("team-b", "blog")] {
        let ready = get(&[
            "get",
            "webapp.demo.trellis.dev",
            "-n",
            ns,
            name,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ]);
        assert_eq!(ready, "True", "webapp {ns}/{name}");
    }
}
