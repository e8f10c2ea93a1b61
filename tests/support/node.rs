//! The local node of the shared test cluster: whether there is one, images
//! packed without a registry and imported into it, and reading a Pod's HTTP
//! endpoints through the API server's pod proxy (as a user outside the
//! cluster would).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use kube::Client;

use super::{Cluster, cluster, cluster_script};

/// The project's tiny web app (images/app), imported by `cluster up --node`.
pub const APP_IMAGE: &str = "trellis.test/app:v1";

/// The node's name (the kubelet runs with `--hostname-override=localhost`).
pub const NODE_NAME: &str = "localhost";

/// The cluster, which must have the local node. Panics with the reason when
/// it has none: a test that needs Pods fails without them, it never skips.
pub fn node() -> &'static Cluster {
    let cluster = cluster();
    if let Err(why) = &cluster.node {
        panic!("this test needs the local node, and there is none: {why}");
    }
    cluster
}

/// The control plane's state directory (the cluster must be local).
pub fn state_dir() -> &'static Path {
    match &node().dir {
        Some(dir) => dir,
        None => panic!("no local control plane directory"),
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Import an image archive into the node's containerd.
pub fn import_image(tar: &Path) {
    let out = Command::new(cluster_script())
        .arg("image")
        .arg(state_dir())
        .arg(tar)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running cluster image: {e}"));
    assert!(
        out.status.success(),
        "cluster image {} failed: {}",
        tar.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The trellis image for this test binary's trellis build, packed by
/// `images/trellis/build` and imported into the node once per test binary.
/// Returns its reference (tagged with the binary's digest).
pub fn trellis_image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dir = state_dir().join("images");
        let out = Command::new(repo().join("images/trellis/build"))
            .arg(env!("CARGO_BIN_EXE_trellis"))
            .arg(&dir)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running images/trellis/build: {e}"));
        assert!(
            out.status.success(),
            "images/trellis/build failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        import_image(&dir.join("trellis.tar"));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    })
}

/// GET `path` on `pod`'s `port` through the API server's pod proxy
/// (`/api/v1/namespaces/NS/pods/POD:PORT/proxy/PATH`): the body on 2xx.
pub async fn pod_proxy_get(
    client: &Client,
    ns: &str,
    pod: &str,
    port: u16,
    path: &str,
) -> Result<String, String> {
    let url = format!(
        "/api/v1/namespaces/{ns}/pods/{pod}:{port}/proxy/{}",
        path.trim_start_matches('/')
    );
    let req = http::Request::get(&url)
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    client
        .request_text(req)
        .await
        .map_err(|e| format!("GET {url}: {e}"))
}

/// The packet counter of the node's rule that drops forwarding from the pod
/// bridge to any other interface (iptables, mangle table, chain TRELLIS-NODE).
pub fn forward_drops() -> u64 {
    let out = Command::new("iptables")
        .args(["-w", "-t", "mangle", "-L", "TRELLIS-NODE", "-v", "-n", "-x"])
        .output()
        .unwrap_or_else(|e| panic!("running iptables: {e}"));
    assert!(
        out.status.success(),
        "iptables -t mangle -L TRELLIS-NODE: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("DROP"))
        .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}
