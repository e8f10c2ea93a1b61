//! `trellis run` as a separate process, for tests that kill, pause or
//! terminate it (leader election, crash recovery): its log goes to a file,
//! its `/metrics` and `/status` are read over HTTP.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::TestNamespace;
use super::operator::WAIT;

/// The rule of the multi-process tests (leader election, shards).
/// One ConfigMap per parent, carrying the parent's `spec.v`; status mirrors it.
pub const RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: app
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-config" }}
        data:
          v: {{ spec.v }}
  status:
    fields:
      - path: v
        value: "spec.v"
"#;

/// Short lease timings for tests that wait for a Lease to expire.
pub const FAST: &[&str] = &[
    "--leader-elect-lease-duration=4s",
    "--leader-elect-renew-deadline=3s",
    "--leader-elect-retry-period=1s",
];

/// A `trellis run` process, killed when dropped.
pub struct Replica {
    pub name: String,
    child: Option<Child>,
    pub addr: SocketAddr,
    log: PathBuf,
    /// Its name in [`super::logs`].
    logged_as: String,
}

impl Replica {
    /// Starts `trellis run` on `rules` in `ns` (Lease in `ns` too), as Pod `name`.
    pub fn start(name: &str, ns: &TestNamespace, rules: &Path, args: &[&str]) -> Replica {
        Replica::start_with_kubeconfig(name, ns, rules, args, None)
    }

    /// [`Replica::start`] with its own kubeconfig (e.g. one that impersonates
    /// a user of its own, so the API server's audit log tells replicas apart).
    pub fn start_with_kubeconfig(
        name: &str,
        ns: &TestNamespace,
        rules: &Path,
        args: &[&str],
        kubeconfig: Option<&Path>,
    ) -> Replica {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port");
        let log = rules.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).expect("log file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_trellis"));
        cmd.arg("run")
            .arg("--rules")
            .arg(rules.join("rules"))
            .args(["--namespace", ns.name()])
            .args(["--metrics-addr", &addr.to_string()])
            .args(args)
            .env("POD_NAME", name)
            .env("POD_NAMESPACE", ns.name())
            .env("RUST_LOG", "info,trellis=debug,kube_lease_manager=info")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out);
        if let Some(path) = kubeconfig.or(super::cluster().kubeconfig_path.as_deref()) {
            cmd.env("KUBECONFIG", path);
        }
        let child = cmd.spawn().expect("start trellis run");
        // Its log tail goes into the message of a wait that times out.
        let logged_as = format!("{}/{name}", ns.name());
        super::logs::register_file(&logged_as, log.clone());
        Replica {
            logged_as,
            name: name.to_owned(),
            child: Some(child),
            addr,
            log,
        }
    }

    pub fn pid(&self) -> String {
        self.child
            .as_ref()
            .map(|c| c.id().to_string())
            .unwrap_or_default()
    }

    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([signal, &self.pid()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {signal} {}", self.name);
    }

    /// Waits for the process to exit after a signal; its exit status.
    pub async fn exited(&mut self, within: Duration) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("a running replica");
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status;
            }
            if started.elapsed() > within {
                let _ = child.kill();
                panic!(
                    "{} did not exit within {within:?}:\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The whole log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    pub async fn status(&self) -> Result<Value, String> {
        let body = super::http_get(self.addr, "/status").await?;
        serde_json::from_str(&body).map_err(|e| e.to_string())
    }

    /// Every write this process made, by its own counters: child creates,
    /// updates and deletes, and status writes.
    pub async fn writes(&self) -> u64 {
        let text = super::http_get(self.addr, "/metrics")
            .await
            .unwrap_or_else(|e| panic!("{} metrics: {e}\n{}", self.name, self.log_tail()));
        count_writes(&text)
    }

    /// Waits until `/status` shows the rule running and this replica's role.
    pub async fn wait_role(&self, leading: bool) -> Value {
        let what = format!(
            "{} {}",
            self.name,
            if leading { "leading" } else { "standing by" }
        );
        super::eventually(&what, WAIT, || async {
            let status = self.status().await?;
            let running = status["rules"].as_object().is_some_and(|rules| {
                !rules.is_empty() && rules.values().all(|r| r["state"] == "Running")
            });
            if running && status["leader"]["leader"] == leading {
                Ok(status)
            } else {
                Err(status.to_string())
            }
        })
        .await
    }

    pub async fn identity(&self) -> String {
        let status = super::eventually("a /status", WAIT, || self.status()).await;
        status["leader"]["identity"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        super::logs::forget_file(&self.logged_as);
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Sum of write counters in a `/metrics` text.
pub fn count_writes(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| {
            (l.starts_with("trellis_child_operations_total{")
                && ["create", "update", "delete"]
                    .iter()
                    .any(|op| l.contains(&format!("op=\"{op}\""))))
                || l.starts_with("trellis_status_writes_total{")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}
