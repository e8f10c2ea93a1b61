//! Fault injection for the fault suite: a private control plane whose
//! components a test may kill and restart, and a loopback TCP proxy between
//! the operator and the API server whose connections a test may sever.
//!
//! A private control plane is started with `tests/cluster/cluster up DIR`
//! (no node) and stopped with `down` when dropped; killing the shared
//! cluster's API server would fail every other test. Private control planes
//! are started one at a time per test binary ([`PrivateCluster::start`]
//! holds a lock for the test's life) to bound the machine's load.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, MutexGuard, Notify};

/// A control plane of one test's own.
pub struct PrivateCluster {
    pub dir: PathBuf,
    pub kubeconfig: Kubeconfig,
    _turn: MutexGuard<'static, ()>,
}

static TURN: Mutex<()> = Mutex::const_new(());

fn script(args: &[&str]) -> Result<String, String> {
    let out = Command::new(super::cluster_script())
        .args(args)
        .output()
        .map_err(|e| format!("cluster {args:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "cluster {args:?} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

impl PrivateCluster {
    /// Starts a control plane under `target/fault-clusters/NAME`.
    pub async fn start(name: &str) -> PrivateCluster {
        let turn = TURN.lock().await;
        let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
        let dir = tmp
            .parent()
            .unwrap_or(tmp)
            .join("fault-clusters")
            .join(name);
        let d = dir.to_string_lossy().into_owned();
        // A leftover from an interrupted run.
        let _ = script(&["down", &d]);
        let up = {
            let d = d.clone();
            tokio::task::spawn_blocking(move || script(&["up", &d]))
                .await
                .expect("cluster up task")
        };
        if let Err(e) = up {
            panic!("private control plane {name}: {e}");
        }
        let kubeconfig = Kubeconfig::read_from(dir.join("kubeconfig"))
            .unwrap_or_else(|e| panic!("kubeconfig of {d}: {e}"));
        PrivateCluster {
            dir,
            kubeconfig,
            _turn: turn,
        }
    }

    fn dir_str(&self) -> String {
        self.dir.to_string_lossy().into_owned()
    }

    /// A client straight to the API server.
    pub async fn client(&self) -> Client {
        client_for(self.kubeconfig.clone(), None).await
    }

    /// The API server's address (`127.0.0.1:PORT`).
    pub async fn api_address(&self) -> String {
        let config =
            Config::from_custom_kubeconfig(self.kubeconfig.clone(), &KubeConfigOptions::default())
                .await
                .expect("config");
        let url = config.cluster_url;
        format!(
            "{}:{}",
            url.host().unwrap_or("127.0.0.1"),
            url.port_u16().unwrap_or(443)
        )
    }

    /// Sends SIGNAL to one component and waits until it has exited.
    pub async fn kill(&self, component: &str, signal: &str) {
        let (d, c, s) = (self.dir_str(), component.to_owned(), signal.to_owned());
        tokio::task::spawn_blocking(move || script(&["kill", &d, &c, &s]))
            .await
            .expect("kill task")
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Starts a killed component again and waits until it is healthy.
    pub async fn restart(&self, component: &str) {
        let (d, c) = (self.dir_str(), component.to_owned());
        tokio::task::spawn_blocking(move || script(&["start", &d, &c]))
            .await
            .expect("start task")
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        if std::env::var("TRELLIS_TEST_KEEP_FAULT_CLUSTERS").as_deref() == Ok("1") {
            eprintln!("[faults] keeping {}", self.dir.display());
            return;
        }
        if let Err(e) = script(&["down", &self.dir_str()]) {
            eprintln!("[faults] {e}");
        }
    }
}

/// A client for `kubeconfig`, optionally pointed at `via` (a proxy on
/// 127.0.0.1, which the API server's certificate covers).
pub async fn client_for(kubeconfig: Kubeconfig, via: Option<&str>) -> Client {
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("config from kubeconfig");
    if let Some(addr) = via {
        config.cluster_url = format!("https://{addr}").parse().expect("proxy url");
    }
    Client::try_from(config).expect("client")
}

/// A TCP proxy on 127.0.0.1 to `upstream`. While severed, every connection
/// through it is cut and new ones are refused (closed at once), as a broken
/// network would.
pub struct Proxy {
    pub address: String,
    severed: Arc<AtomicBool>,
    cut: Arc<Notify>,
    /// Connections accepted so far.
    pub connections: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let address = listener.local_addr().expect("proxy address").to_string();
        let severed = Arc::new(AtomicBool::new(false));
        let cut = Arc::new(Notify::new());
        let connections = Arc::new(AtomicU64::new(0));
        let task = {
            let (severed, cut, connections) = (severed.clone(), cut.clone(), connections.clone());
            tokio::spawn(async move {
                loop {
                    let Ok((mut inbound, _)) = listener.accept().await else {
                        return;
                    };
                    if severed.load(Ordering::SeqCst) {
                        drop(inbound);
                        continue;
                    }
                    connections.fetch_add(1, Ordering::SeqCst);
                    let (upstream, cut) = (upstream.clone(), cut.clone());
                    tokio::spawn(async move {
                        let Ok(mut outbound) = TcpStream::connect(&upstream).await else {
                            return;
                        };
                        tokio::select! {
                            _ = copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = cut.notified() => {}
                        }
                    });
                }
            })
        };
        Proxy {
            address,
            severed,
            cut,
            connections,
            task,
        }
    }

    /// Cuts every open connection and refuses new ones until [`Proxy::restore`].
    pub fn sever(&self) {
        self.severed.store(true, Ordering::SeqCst);
        self.cut.notify_waiters();
    }

    pub fn restore(&self) {
        self.severed.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Scrapes the operator's `/metrics` at `addr` and sums the samples of
/// `name` whose labels contain every `key="value"` in `labels`; `None` while
/// the endpoint does not answer.
pub async fn try_metric(addr: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let socket: std::net::SocketAddr = addr.parse().ok()?;
    let text = super::http_get(socket, "/metrics").await.ok()?;
    Some(
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| {
                l.split(['{', ' '])
                    .next()
                    .is_some_and(|n| n == name || n == format!("{name}_total"))
            })
            .filter(|l| labels.iter().all(|want| l.contains(want)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum(),
    )
}

/// [`try_metric`] of an endpoint that must answer.
pub async fn metric(addr: &str, name: &str, labels: &[&str]) -> f64 {
    try_metric(addr, name, labels)
        .await
        .unwrap_or_else(|| panic!("the operator's /metrics at {addr} does not answer"))
}

/// A free loopback address for the operator's metrics endpoint.
pub fn free_address() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("address")
}

/// Waits `timeout` at most for `check` to return `Ok`; the time it took,
/// for the figures in the log. On timeout, fails with what `check` last
/// said (say what is left undone, not only that something is) and the tail
/// of the operator's log.
pub async fn timed<F, Fut>(what: &str, timeout: Duration, check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let started = std::time::Instant::now();
    let mut check = check;
    loop {
        let last = match check().await {
            Ok(()) => {
                let took = started.elapsed();
                eprintln!("[faults] {what}: {took:.2?}");
                return took;
            }
            Err(last) => last,
        };
        if started.elapsed() >= timeout {
            panic!(
                "{what}: not within {timeout:?}; last check: {last}{}",
                super::logs::tail(None, 40)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The operator's log on the test's stderr, filtered by `RUST_LOG`
/// (nothing unless it is set): the fault tests are the ones to debug.
/// Every line is kept for a timeout's message either way ([`super::logs`]).
pub fn logs() {
    let _ = super::logs::Logs::get();
}
