//! What the benchmarks that run the real operator share: building the
//! release binary, running it as a process of its own, reading its memory
//! and CPU from `/proc`, and counting API requests from the API server's own
//! metrics (`apiserver_request_total`), so the figures do not rest on the
//! operator's word about itself.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client};

pub mod audit;

/// Runs `body` on a two-thread runtime with a client of the bench's
/// cluster and a custom kind `kind` (plural `plural`) of its own, installed
/// for the run and removed after it. `label` prefixes the log line and
/// names the kind's group.
pub fn on_a_kind<R, Fut>(
    label: &str,
    kind: &str,
    plural: &str,
    body: impl FnOnce(Client, super::support::operator::TestKind) -> Fut,
) -> R
where
    Fut: std::future::Future<Output = R>,
{
    use super::support::{self, operator::Cleanup, operator::TestKind};
    eprintln!("[{label}] cluster: {}", support::cluster().source);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let client = support::client().await;
        let group = format!("{}.bench.trellis.test", support::unique_name(label));
        let kind = TestKind::in_group(&group, kind);
        assert_eq!(kind.plural, plural);
        let _crd = Cleanup::crds(&[&kind]);
        kind.install(&client).await;
        body(client, kind).await
    })
}

/// A number from the environment, or `default`.
pub fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{name}={v:?}: not a number: {e}")),
        Err(_) => default,
    }
}

/// The load average over the last minute, five and fifteen minutes, as
/// `/proc/loadavg` says (`5.31 5.25 3.85`): printed beside each figure, the
/// machine being shared.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "?".to_owned())
}

/// Deletes the namespace and waits until it is gone, so that its deletion
/// is not counted in the next run: at 10,000 parents with Deployments the
/// namespace controller and the garbage collector take many minutes, and a
/// run started beside them measures them too. Waits up to
/// `TRELLIS_BENCH_CLEANUP` seconds (default 1800), then goes on and says so.
pub async fn delete_namespace(client: &Client, ns: super::support::TestNamespace) {
    let name = ns.name.clone();
    drop(ns);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let limit = Duration::from_secs(env_number("TRELLIS_BENCH_CLEANUP", 1800));
    let start = Instant::now();
    let mut reported = Instant::now();
    while start.elapsed() < limit {
        match namespaces.get_opt(&name).await {
            Ok(None) => {
                eprintln!(
                    "[bench] namespace {name} gone after {:.1} s",
                    start.elapsed().as_secs_f64()
                );
                return;
            }
            _ => {
                if reported.elapsed() > Duration::from_secs(60) {
                    reported = Instant::now();
                    eprintln!(
                        "[bench] namespace {name} still being deleted after {:.0} s",
                        start.elapsed().as_secs_f64()
                    );
                }
                tokio::time::sleep(Duration::from_millis(500)).await
            }
        }
    }
    eprintln!(
        "[bench] namespace {name} still there after {} s; going on: the next run shares the API server with its deletion and is NOT comparable",
        limit.as_secs()
    );
}

/// `cargo build --release --bin trellis`, returning the binary's path; or
/// the binary `TRELLIS_BENCH_BINARY` names (another build to compare with).
pub fn build_operator() -> PathBuf {
    if let Some(binary) = std::env::var_os("TRELLIS_BENCH_BINARY") {
        let binary = PathBuf::from(binary);
        assert!(
            binary.is_file(),
            "TRELLIS_BENCH_BINARY={}: no such file",
            binary.display()
        );
        eprintln!("[bench] operator: {}", binary.display());
        return binary;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("[bench] building the operator: cargo build --release --bin trellis");
    let mut command = Command::new(cargo);
    // Cargo gives this process its package's variables (CARGO_PKG_NAME,
    // CARGO_MANIFEST_DIR, OUT_DIR, ...). Build scripts (ring's) rerun when
    // those change, so passing them on would rebuild dependencies here and
    // again on the next `cargo bench`.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_CFG_"]
            .iter()
            .any(|prefix| name.starts_with(prefix))
            || [
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_RUSTC_CURRENT_DIR",
                "OUT_DIR",
            ]
            .contains(&name.as_ref())
        {
            command.env_remove(name.as_ref());
        }
    }
    let status = command
        .args(["build", "--release", "--bin", "trellis"])
        .current_dir(manifest)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .expect("running cargo build");
    assert!(
        status.success(),
        "cargo build --release --bin trellis failed ({status})"
    );
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => manifest.join(dir), // join keeps an absolute dir as is
        None => manifest.join("target"),
    };
    let binary = target.join("release").join("trellis");
    assert!(
        binary.is_file(),
        "{} missing after cargo build",
        binary.display()
    );
    binary
}

/// `trellis run` in a process of its own, metrics on a loopback port;
/// killed (SIGKILL) if still running when dropped, its log then kept in
/// `target/tmp/bench-<name>.log`.
pub struct OperatorProcess {
    pub child: Child,
    pub log: PathBuf,
    pub metrics: SocketAddr,
    name: String,
}

impl OperatorProcess {
    /// Starts `binary run --rules RULES --namespace NS` plus `args`.
    pub fn start(binary: &Path, name: &str, rules: &Path, ns: &str, args: &[&str]) -> Self {
        Self::start_with_env(binary, name, rules, ns, args, &[])
    }

    /// [`OperatorProcess::start`] with extra environment variables (such as
    /// `RUST_LOG`) for the operator.
    pub fn start_with_env(
        binary: &Path,
        name: &str,
        rules: &Path,
        ns: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port");
        let log = rules.parent().unwrap_or(rules).join(format!("{name}.log"));
        let log_file = File::create(&log).expect("operator log file");
        let mut command = Command::new(binary);
        command
            .arg("run")
            .arg("--rules")
            .arg(rules)
            .args(["--namespace", ns])
            .args(["--metrics-addr", &metrics.to_string()])
            .args(["--log-format", "json"])
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log file"))
            .stderr(log_file);
        if let Some(path) = &super::support::cluster().kubeconfig_path {
            command.env("KUBECONFIG", path);
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        OperatorProcess {
            child,
            log,
            metrics,
            name: name.to_owned(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails with `what`, the operator's state and its log's tail.
    pub fn fail(&mut self, what: &str) -> ! {
        let state = match self.child.try_wait() {
            Ok(Some(status)) => format!("operator exited: {status}"),
            Ok(None) => "operator still running".to_string(),
            Err(e) => format!("operator state unknown: {e}"),
        };
        panic!(
            "{what}\n{state}; last lines of {}:\n{}",
            self.log.display(),
            log_tail(&self.log, 25)
        );
    }

    pub fn check_running(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            self.fail("the operator exited early");
        }
    }

    /// A sum of the operator's own counter (see `support::faults::try_metric`).
    pub async fn metric(&self, name: &str, labels: &[&str]) -> Option<f64> {
        super::support::faults::try_metric(&self.metrics.to_string(), name, labels).await
    }

    /// Every request the operator has sent so far, by its own
    /// `trellis_api_requests_total`, in the API server's words (see
    /// [`Requests::parse_operator`]); `None` when its metrics do not answer.
    pub async fn requests(&self) -> Option<Requests> {
        let text = super::support::http_get(self.metrics, "/metrics")
            .await
            .ok()?;
        Some(Requests::parse_operator(&text))
    }

    /// SIGTERM, then waits up to 30 s for the exit: how long it took.
    pub fn terminate(&mut self) -> (Duration, ExitStatus) {
        let term = Instant::now();
        let pid = self.pid().to_string();
        let killed = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("running kill");
        assert!(killed.success(), "kill -TERM {pid} failed");
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return (term.elapsed(), status),
                Ok(None) if term.elapsed() > Duration::from_secs(30) => {
                    self.fail("the operator did not exit within 30 s of SIGTERM")
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => self.fail(&format!("waiting for the operator: {e}")),
            }
        }
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let kept = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("bench-{}.log", self.name));
        if let Err(e) = std::fs::copy(&self.log, &kept) {
            eprintln!("[bench] could not keep the operator log: {e}");
        }
    }
}

pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| format!("(unreadable: {e})"));
    let all: Vec<&str> = text.lines().collect();
    // JSON log lines are long: keep the start of each.
    all[all.len().saturating_sub(lines)..]
        .iter()
        .map(|line| line.chars().take(600).collect::<String>())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A field of `/proc/<pid>/status` in kB, e.g. `VmHWM`.
pub fn proc_status_kb(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

/// User + system CPU time of `pid`, in seconds.
pub fn proc_cpu_seconds(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command: state is field 3, utime 14, stime 15.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / clock_ticks_per_second())
}

fn clock_ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok()?.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

pub fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// Samples VmRSS of `pid` every 100 ms on a thread of its own; `finish`
/// gives the highest value seen (VmHWM is the kernel's exact peak; this one
/// can be reset between phases by starting a new sampler).
pub struct RssSampler {
    stop: Arc<AtomicBool>,
    max_kb: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    pub fn start(pid: u32) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let max_kb = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, max_kb) = (stop.clone(), max_kb.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(kb) = proc_status_kb(pid, "VmRSS") {
                        max_kb.fetch_max(kb, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        RssSampler {
            stop,
            max_kb,
            thread: Some(thread),
        }
    }

    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.max_kb.load(Ordering::Relaxed)
    }
}

/// One row of `apiserver_request_total`: verb and resource (with
/// `/subresource` when there is one).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKey {
    pub verb: String,
    pub resource: String,
}

/// Request counts by verb and resource, as the API server counted them.
#[derive(Debug, Clone, Default)]
pub struct Requests(pub BTreeMap<RequestKey, u64>);

/// Verbs that change something.
pub const WRITE_VERBS: &[&str] = &[
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

impl Requests {
    /// The API server's `/metrics`, summed over codes, groups and versions.
    pub async fn scrape(client: &Client) -> Requests {
        let req = http::Request::get("/metrics")
            .body(Vec::new())
            .expect("a GET request");
        let text = client
            .request_text(req)
            .await
            .unwrap_or_else(|e| panic!("reading the API server's /metrics: {e}"));
        Requests::parse(&text)
    }

    pub fn parse(text: &str) -> Requests {
        let mut out = BTreeMap::new();
        for (labels, value) in samples(text, "apiserver_request_total") {
            let get = |k: &str| labels.get(k).map(String::as_str).unwrap_or_default();
            let resource = match get("subresource") {
                "" => get("resource").to_owned(),
                sub => format!("{}/{sub}", get("resource")),
            };
            let key = RequestKey {
                verb: get("verb").to_owned(),
                resource,
            };
            *out.entry(key).or_default() += value as u64;
        }
        Requests(out)
    }

    /// The operator's own `trellis_api_requests_total{verb,resource}`,
    /// named as the API server names them (`apply` is `APPLY`, `create`
    /// `POST`, `apps/deployments` `deployments`), so the two counts compare
    /// row by row. Only the operator's requests: not the namespace
    /// controller's, the garbage collector's or this program's.
    pub fn parse_operator(text: &str) -> Requests {
        let mut out = BTreeMap::new();
        for (labels, value) in samples(text, "trellis_api_requests_total") {
            let get = |k: &str| labels.get(k).map(String::as_str).unwrap_or_default();
            let verb = match get("verb") {
                "create" => "POST",
                "apply" => "APPLY",
                "patch" => "PATCH",
                "update" => "PUT",
                "delete" => "DELETE",
                "deletecollection" => "DELETECOLLECTION",
                "get" => "GET",
                "list" => "LIST",
                "watch" => "WATCH",
                other => other,
            };
            // `group/resource[/sub]` without the group; the core group has
            // none. A group holds a dot or is one of the built-in dotless
            // ones; a core `resource/sub` has neither.
            let resource = get("resource");
            let resource = match resource.split_once('/') {
                Some((group, rest))
                    if group.contains('.')
                        || ["apps", "batch", "policy", "autoscaling"].contains(&group) =>
                {
                    rest
                }
                _ => resource,
            };
            let key = RequestKey {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
            };
            *out.entry(key).or_default() += value as u64;
        }
        Requests(out)
    }

    /// What happened between `before` and `self`.
    pub fn since(&self, before: &Requests) -> Requests {
        let mut out = BTreeMap::new();
        for (key, after) in &self.0 {
            let delta = after.saturating_sub(before.0.get(key).copied().unwrap_or(0));
            if delta > 0 {
                out.insert(key.clone(), delta);
            }
        }
        Requests(out)
    }

    /// Keeps the requests on the given resources (`configmaps`, `events`, ...;
    /// a subresource counts as its resource).
    pub fn on(&self, resources: &[&str]) -> Requests {
        Requests(
            self.0
                .iter()
                .filter(|(k, _)| {
                    let base = k.resource.split('/').next().unwrap_or_default();
                    resources.contains(&base)
                })
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
        )
    }

    /// Takes away requests made by someone else whose count is known.
    pub fn minus(&mut self, verb: &str, resource: &str, n: u64) {
        let key = RequestKey {
            verb: verb.to_owned(),
            resource: resource.to_owned(),
        };
        if let Some(v) = self.0.get_mut(&key) {
            *v = v.saturating_sub(n);
            if *v == 0 {
                self.0.remove(&key);
            }
        }
    }

    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    pub fn writes(&self) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| WRITE_VERBS.contains(&k.verb.as_str()))
            .map(|(_, v)| v)
            .sum()
    }

    pub fn of_verb(&self, verb: &str) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| k.verb == verb)
            .map(|(_, v)| v)
            .sum()
    }

    /// `verb resource=count` pairs, e.g. `APPLY configmaps=200, POST events=3`.
    pub fn describe(&self) -> String {
        if self.0.is_empty() {
            return "none".to_owned();
        }
        self.0
            .iter()
            .map(|(k, v)| format!("{} {}={v}", k.verb, k.resource))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// `a="x",b="y"` into a map (values may hold escaped quotes).
/// The labelled samples of metric `name` in a Prometheus text exposition.
fn samples<'a>(
    text: &'a str,
    name: &'a str,
) -> impl Iterator<Item = (BTreeMap<String, String>, f64)> + 'a {
    text.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?.strip_prefix('{')?;
        let (labels, value) = rest.rsplit_once("} ")?;
        Some((parse_labels(labels), value.trim().parse::<f64>().ok()?))
    })
}

fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = text;
    while let Some((name, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, escaped)) = chars.next() {
                        value.push(escaped);
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.insert(name.trim_start_matches(',').trim().to_owned(), value);
        rest = &after[end..];
    }
    out
}
