//! Shared harness for integration tests that need a Kubernetes API server.
//!
//! Put `mod support;` at the top of a test file, then:
//!
//! ```ignore
//! #[tokio::test]
//! async fn something_happens() {
//!     let ns = support::namespace().await; // fresh namespace, deleted on drop
//!     let cms: Api<ConfigMap> = ns.api();
//!     // ...
//! }
//! ```
//!
//! # Which cluster
//!
//! * `TRELLIS_TEST_KUBECONFIG=/path/to/kubeconfig`: use that cluster.
//! * `TRELLIS_TEST_USE_KUBECONFIG=1`: use the cluster that `KUBECONFIG` (or
//!   `~/.kube/config`) points at.
//! * Otherwise (the normal case) a local control plane built by
//!   `tests/cluster/cluster` (etcd, kube-apiserver, kube-controller-manager;
//!   no nodes) is used. Its state lives in `target/test-cluster`
//!   (`TRELLIS_TEST_CLUSTER_DIR` overrides) and is **shared by every test
//!   binary and every `cargo test` run**: the first test that needs it takes
//!   the lock file `target/test-cluster.lock`, starts the control plane if it
//!   is not already healthy, and leaves it running for the next binary or
//!   run. Stop it with `tests/cluster/cluster down target/test-cluster` (CI
//!   does this after `cargo test`).
//!
//! If the control plane cannot be built or started, every test that asks for
//! it panics with the reason and the component logs' tails; nothing is skipped.
//!
//! # The node
//!
//! The shared control plane is started with one real node (`cluster up
//! --node`: containerd, kubelet, kube-proxy, kube-scheduler; see
//! `tests/cluster/README.md`), so Pods run. Only one node can exist per
//! machine: set `TRELLIS_TEST_NO_NODE=1` to start the shared control plane
//! without one (when another worktree's cluster has it). If no node is
//! possible (not root, packages missing, another worktree's node), the control
//! plane starts without one and says why; tests that need a node call
//! [`node::node`], which panics with that reason: they fail, never skip.
//!
//! # Isolation
//!
//! Each test gets its own namespace ([`namespace`]), named after the test and
//! labelled `trellis.dev/test=true`. Dropping the guard deletes it, also when
//! the test panics; set `TRELLIS_TEST_KEEP_NAMESPACES=1` to keep them for
//! debugging. Cluster-scoped objects (CRDs, ...) are shared by all tests, so
//! give them names that no other test uses, or make their creation idempotent
//! (server-side apply of an identical manifest).
#![allow(dead_code)]

use std::fmt::Debug;
use std::fs::File;
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, Config};

pub mod audit;
pub mod converge;
pub mod faults;
pub mod hostile;
pub mod logs;
pub mod node;
pub mod operator;
pub mod process;

/// The label put on every namespace made by [`namespace`].
pub const TEST_LABEL: &str = "trellis.dev/test";

/// Path of the control-plane script.
pub fn cluster_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cluster/cluster")
}

/// Where the shared local control plane keeps its state.
pub fn cluster_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TRELLIS_TEST_CLUSTER_DIR") {
        return PathBuf::from(dir);
    }
    // CARGO_TARGET_TMPDIR is <target>/tmp; the cluster lives next to it.
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).join("test-cluster")
}

/// The cluster the tests talk to.
#[derive(Clone)]
pub struct Cluster {
    /// Kubeconfig with cluster-admin rights.
    pub kubeconfig: Kubeconfig,
    /// The kubeconfig file, when there is exactly one.
    pub kubeconfig_path: Option<PathBuf>,
    /// Human-readable description of where it came from.
    pub source: String,
    /// True for the local control plane built from `tests/cluster`.
    pub local: bool,
    /// The local control plane's state directory, when `local`.
    pub dir: Option<PathBuf>,
    /// `Ok` when the cluster has the local node; otherwise why not.
    pub node: Result<(), String>,
}

/// The cluster for this test binary; starts (or reuses) it on first call.
///
/// Panics with the reason if there is no cluster to be had.
pub fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
    match CLUSTER.get_or_init(find_or_start_cluster) {
        Ok(cluster) => cluster,
        Err(e) => panic!("no Kubernetes cluster for the tests:\n{e}"),
    }
}

fn find_or_start_cluster() -> Result<Cluster, String> {
    if let Some(path) = std::env::var_os("TRELLIS_TEST_KUBECONFIG") {
        let path = PathBuf::from(path);
        let kubeconfig = Kubeconfig::read_from(&path)
            .map_err(|e| format!("TRELLIS_TEST_KUBECONFIG={}: {e}", path.display()))?;
        return Ok(Cluster {
            kubeconfig,
            source: format!("TRELLIS_TEST_KUBECONFIG={}", path.display()),
            kubeconfig_path: Some(path),
            local: false,
            dir: None,
            node: Err("TRELLIS_TEST_KUBECONFIG: not the local control plane".into()),
        });
    }
    if std::env::var("TRELLIS_TEST_USE_KUBECONFIG").as_deref() == Ok("1") {
        let kubeconfig =
            Kubeconfig::read().map_err(|e| format!("TRELLIS_TEST_USE_KUBECONFIG=1: {e}"))?;
        return Ok(Cluster {
            kubeconfig,
            kubeconfig_path: None,
            source: "KUBECONFIG (TRELLIS_TEST_USE_KUBECONFIG=1)".into(),
            local: false,
            dir: None,
            node: Err("TRELLIS_TEST_USE_KUBECONFIG=1: not the local control plane".into()),
        });
    }
    start_local_cluster()
}

/// Start the shared local control plane under a file lock, or reuse it.
fn start_local_cluster() -> Result<Cluster, String> {
    let dir = cluster_dir();
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
    let lock_path = dir.with_extension("lock");
    let lock = File::create(&lock_path).map_err(|e| format!("{}: {e}", lock_path.display()))?;
    lock.lock()
        .map_err(|e| format!("locking {}: {e}", lock_path.display()))?;

    let script = cluster_script();
    let healthy = dir.join("kubeconfig").is_file()
        && Command::new(&script)
            .arg("status")
            .arg(&dir)
            .stdin(Stdio::null())
            .output()
            .is_ok_and(|out| out.status.success());
    if !healthy {
        // A cold build takes many minutes: let its progress reach the terminal.
        let status = Command::new(&script)
            .arg("build")
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .status()
            .map_err(|e| format!("running {} build: {e}", script.display()))?;
        if !status.success() {
            return Err(format!(
                "`{} build` failed ({status}); see its output above",
                script.display()
            ));
        }
        let want_node = std::env::var("TRELLIS_TEST_NO_NODE").as_deref() != Ok("1");
        let no_node_reason = dir.join("no-node-reason");
        let _ = std::fs::remove_file(&no_node_reason);
        let mut out = cluster_up(&script, &dir, want_node)?;
        if want_node && out.status.code() == Some(3) {
            // No node is possible here (exit 3: nothing was started): go on
            // without one; tests that need it fail with this reason.
            let reason = String::from_utf8_lossy(&out.stderr).trim().to_string();
            let _ = writeln!(
                std::io::stderr(),
                "[support] starting the control plane without a node: {reason}"
            );
            out = cluster_up(&script, &dir, false)?;
            let _ = std::fs::write(&no_node_reason, &reason);
        } else if !want_node {
            let _ = std::fs::write(&no_node_reason, "TRELLIS_TEST_NO_NODE=1 is set");
        }
        if !out.status.success() {
            return Err(format!(
                "`{} up {}` failed ({}):\n{}{}",
                script.display(),
                dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        // Straight to stderr, past libtest's output capture: a control plane
        // left running for later test binaries should not go unnoticed.
        let _ = writeln!(
            std::io::stderr(),
            "[support] started a local control plane in {0}; it stays up for later test \
             runs (stop it with `{1} down {0}`)",
            dir.display(),
            script.display(),
        );
    }
    drop(lock);

    let path = dir.join("kubeconfig");
    let kubeconfig =
        Kubeconfig::read_from(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let node = if dir.join("node/up").is_file() {
        Ok(())
    } else {
        let why = std::fs::read_to_string(dir.join("no-node-reason"))
            .unwrap_or_else(|_| "it was started without one".into());
        Err(format!(
            "the shared control plane in {} has no node: {why} (restart it with `{} down {0}`)",
            dir.display(),
            script.display()
        ))
    };
    Ok(Cluster {
        kubeconfig,
        source: format!("local control plane in {}", dir.display()),
        kubeconfig_path: Some(path),
        local: true,
        dir: Some(dir),
        node,
    })
}

/// `cluster up DIR [--node]`, its output captured.
fn cluster_up(script: &Path, dir: &Path, node: bool) -> Result<std::process::Output, String> {
    let mut cmd = Command::new(script);
    cmd.arg("up").arg(dir).stdin(Stdio::null());
    cmd.arg(if node { "--node" } else { "--no-node" });
    cmd.output()
        .map_err(|e| format!("running {} up: {e}", script.display()))
}

/// A client for the test cluster with cluster-admin rights.
///
/// Call it inside the test's runtime: a client belongs to the runtime it was
/// made in.
pub async fn client() -> Client {
    let cluster = cluster();
    make_client(cluster.kubeconfig.clone())
        .await
        .unwrap_or_else(|e| panic!("client for {}: {e}", cluster.source))
}

async fn make_client(kubeconfig: Kubeconfig) -> Result<Client, String> {
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    Client::try_from(config).map_err(|e| e.to_string())
}

/// A namespace of one test's own, deleted when dropped.
pub struct TestNamespace {
    /// Client for the test cluster (cluster-admin).
    pub client: Client,
    /// The namespace's name.
    pub name: String,
}

impl TestNamespace {
    /// An `Api` for a namespaced kind in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::env::var("TRELLIS_TEST_KEEP_NAMESPACES").as_deref() == Ok("1") {
            eprintln!("[support] keeping namespace {}", self.name);
            return;
        }
        // The test's runtime may be unwinding or blocked on us, so delete from
        // a thread with a runtime and a client of its own.
        let name = self.name.clone();
        let kubeconfig = cluster().kubeconfig.clone();
        let result = std::thread::spawn(move || -> Result<(), String> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                let client = make_client(kubeconfig).await?;
                match Api::<Namespace>::all(client)
                    .delete(&name, &DeleteParams::background())
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    Err(e) => Err(e.to_string()),
                }
            })
        })
        .join();
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("[support] could not delete namespace {}: {e}", self.name),
            Err(_) => eprintln!("[support] namespace {} cleanup panicked", self.name),
        }
    }
}

/// A fresh namespace for the calling test, named after it.
pub async fn namespace() -> TestNamespace {
    let test = std::thread::current()
        .name()
        .unwrap_or("test")
        .rsplit("::")
        .next()
        .unwrap_or("test")
        .to_string();
    namespace_for(&test).await
}

/// Namespaces made by [`namespace_for`], by the name of the thread that
/// made them (a test's thread is named after the test).
fn namespaces_by_thread()
-> std::sync::MutexGuard<'static, std::collections::HashMap<String, String>> {
    static MADE: OnceLock<std::sync::Mutex<std::collections::HashMap<String, String>>> =
        OnceLock::new();
    MADE.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The namespace the calling test made last, if it made one: the log lines
/// naming it are the test's own.
pub fn test_namespace() -> Option<String> {
    let thread = std::thread::current().name()?.to_owned();
    namespaces_by_thread().get(&thread).cloned()
}

/// A fresh namespace for `test`, named after it.
pub async fn namespace_for(test: &str) -> TestNamespace {
    let client = client().await;
    let name = unique_name(test);
    if let Some(thread) = std::thread::current().name() {
        namespaces_by_thread().insert(thread.to_owned(), name.clone());
    }
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some([(TEST_LABEL.to_string(), "true".to_string())].into()),
            annotations: Some([("trellis.dev/test-name".to_string(), test.to_string())].into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap_or_else(|e| panic!("creating namespace {name} for test {test}: {e}"));
    TestNamespace { client, name }
}

/// `prefix` made into a DNS label and extended with a suffix unique to this
/// process and call, e.g. `gc-removes-dependents-1a2b3c`.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let mut base: String = prefix
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    base.truncate(48);
    let base = base.trim_matches('-');
    let base = if base.is_empty() { "test" } else { base };
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let salt = nanos ^ std::process::id().rotate_left(16) ^ n.wrapping_mul(0x9E37_79B9);
    format!("{base}-{:06x}", salt & 0xff_ffff)
}

/// Poll `check` every 100 ms until it returns `Ok`, and return that value.
/// Panics after `timeout` with `what` and the last error.
pub async fn eventually<T, E, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    E: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let start = Instant::now();
    loop {
        match check().await {
            Ok(value) => return value,
            Err(e) if start.elapsed() >= timeout => {
                panic!(
                    "timed out after {timeout:?} waiting for {what}; last result: {e:?}{}",
                    logs::tail(test_namespace().as_deref(), 40)
                )
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Server-side apply a CRD and wait until the API server reports it
/// Established (its REST endpoints are then served).
pub async fn apply_crd(client: &Client, crd: &CustomResourceDefinition) {
    let name = crd
        .metadata
        .name
        .clone()
        .expect("CRD manifest needs metadata.name");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        &name,
        &PatchParams::apply("trellis-tests").force(),
        &Patch::Apply(crd),
    )
    .await
    .unwrap_or_else(|e| panic!("applying CRD {name}: {e}"));
    let established = await_condition(crds, &name, conditions::is_crd_established());
    match tokio::time::timeout(Duration::from_secs(30), established).await {
        Ok(Ok(Some(_))) => {}
        Ok(Ok(None)) => panic!("CRD {name} disappeared while waiting for it"),
        Ok(Err(e)) => panic!("watching CRD {name}: {e}"),
        Err(_) => panic!("CRD {name} not Established within 30s"),
    }
}

/// `GET path` over plain HTTP/1.0: the body of a 200 response.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .await
        .map_err(|e| e.to_string())?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("not an HTTP response: {response}"))?;
    if !head.starts_with("HTTP/1.") || !head.contains(" 200 ") {
        return Err(format!("GET {path}: {head}"));
    }
    Ok(body.to_owned())
}
