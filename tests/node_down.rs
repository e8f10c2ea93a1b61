//! `cluster down` of a control plane with a node leaves nothing behind on the
//! host: no process, mount, network namespace, bridge, veth, iptables chain,
//! cgroup or fixed path of the node's, and `net.ipv4.ip_forward` restored.
//!
//! This takes down the shared test cluster (under its lock, so no other test
//! binary starts it meanwhile) and starts it again with its node afterwards.
//! Its own test binary: no other test may use the cluster while it runs.

mod support;

use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};

use support::node::node;

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {cmd}: {e}"));
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// KUBE-* and TRELLIS-* chains in an iptables-save listing.
fn chains(save: &str) -> Vec<String> {
    save.lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| c.starts_with("KUBE-") || c.starts_with("TRELLIS-"))
        .map(str::to_string)
        .collect()
}

/// Every process whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = vec![];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat.rsplit(") ").next().is_some_and(|s| s.starts_with('Z'));
        if cmdline.contains(needle)
            && !zombie
            && entry.file_name() != *std::process::id().to_string()
        {
            found.push(format!(
                "{}: {cmdline}",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    found
}

#[test]
fn down_leaves_nothing_of_the_node_behind() {
    let dir = node().dir.clone().expect("a local control plane");
    let script = support::cluster_script();
    let lock_path = dir.with_extension("lock");
    let lock = File::create(&lock_path).unwrap();
    lock.lock().unwrap();

    let nd = dir.join("node");
    let ip_forward = read(&nd.join("ip_forward.orig"));
    let chains4 = read(&nd.join("iptables-chains.orig"));
    let chains6 = read(&nd.join("ip6tables-chains.orig"));
    let created = read(&nd.join("created-paths"));
    assert!(
        !processes_mentioning(&dir.to_string_lossy()).is_empty(),
        "no process of the cluster runs before down: the test would prove nothing"
    );

    let out = Command::new(&script)
        .arg("down")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "cluster down: {out:?}");

    let mut left = vec![];
    // Shims name the node's containerd socket, not DIR.
    for needle in [
        dir.to_string_lossy().to_string(),
        "/run/trellis-node".to_string(),
    ] {
        left.extend(processes_mentioning(&needle));
    }
    let links = run("ip", &["-o", "link"]);
    for link in links.lines() {
        if link.contains("trellis-cni0") || link.contains("veth") {
            left.push(format!("link: {link}"));
        }
    }
    for mount in run("findmnt", &["-rn", "-o", "TARGET"]).lines() {
        if mount.starts_with(&*dir.to_string_lossy())
            || mount.starts_with("/run/trellis-node")
            || mount.starts_with("/run/netns/cni-")
        {
            left.push(format!("mount: {mount}"));
        }
    }
    for (tool, orig) in [("iptables-save", &chains4), ("ip6tables-save", &chains6)] {
        for chain in chains(&run(tool, &[])) {
            if !orig.lines().any(|c| c == chain) {
                left.push(format!("{tool}: chain {chain}"));
            }
        }
    }
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        for group in ["kubepods", "k8s.io"] {
            let path = hierarchy.path().join(group);
            if path.exists() {
                left.push(format!("cgroup: {}", path.display()));
            }
        }
    }
    for path in created.lines().chain(["/run/trellis-node"]) {
        if !path.is_empty() && Path::new(path).exists() {
            left.push(format!("path: {path}"));
        }
    }
    let now = read(Path::new("/proc/sys/net/ipv4/ip_forward"));
    if now.trim() != ip_forward.trim() {
        left.push(format!(
            "net.ipv4.ip_forward is {} (was {})",
            now.trim(),
            ip_forward.trim()
        ));
    }
    if dir.exists() {
        left.push(format!("{} still exists", dir.display()));
    }

    // Leave the shared cluster as it was found, for the next test binary.
    let up = Command::new(&script)
        .arg("up")
        .arg(&dir)
        .arg("--node")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    drop(lock);
    assert!(
        left.is_empty(),
        "cluster down left behind:\n{}",
        left.join("\n")
    );
    assert!(up.status.success(), "cluster up --node after down: {up:?}");
}
