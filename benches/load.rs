//! Load benchmark of the real operator: N parents of one custom kind, each
//! owning a ConfigMap, a Secret and a Service, reconciled by the release
//! `trellis run` binary in a process of its own against the shared test
//! control plane (see `tests/support/mod.rs`).
//!
//! Run: `cargo bench --bench load` (prints figures; fails only when the
//! operator does not converge, exits non-zero or leaves a bad status).
//!
//! Environment:
//! * `TRELLIS_BENCH_PARENTS`: number of parents (default 200).
//! * `TRELLIS_BENCH_TIMEOUT`: seconds allowed for convergence (default 300).
//! * `TRELLIS_CONCURRENCY`, `RUST_LOG`: passed through to the operator.
//!
//! The operator log (JSON lines) is kept in `target/tmp/bench-load-operator.log`.
//! * The cluster is chosen as for the tests (`TRELLIS_TEST_KUBECONFIG`, ...).
//!
//! What is timed: from the first parent create to the first poll (every
//! 200 ms: one list per child kind by label `trellis.dev/rule`, one list of
//! parents) that sees every parent with its 3 children, `Synced=True`,
//! `status.observedGeneration` equal to its generation ("all synced"), and
//! then also `Ready=True` with every status field mapped from the children
//! ("all ready", the convergence figure). Before that, one probe parent must
//! converge, so the operator's start-up (discovery, watches, caches) is
//! reported apart. The operator's memory comes from `/proc/<pid>/status`:
//! `VmHWM` (peak resident set), VmRSS sampled every 200 ms, and its CPU time
//! from `/proc/<pid>/stat`.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use kube::core::{ObjectList, PartialObjectMeta};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use support::operator::{Cleanup, TestKind};

const RULE: &str = "load";
const KIND: &str = "LoadApp";
const POLL: Duration = Duration::from_millis(200);
const CREATE_CONCURRENCY: usize = 32;

fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{name}={v:?}: not a number: {e}")),
        Err(_) => default,
    }
}

fn main() {
    let parents = env_number("TRELLIS_BENCH_PARENTS", 200) as usize;
    let timeout = Duration::from_secs(env_number("TRELLIS_BENCH_TIMEOUT", 300));
    assert!(parents > 0, "TRELLIS_BENCH_PARENTS must be at least 1");

    let binary = build_operator();
    // The shared control plane (started here if need be) and its kubeconfig.
    let cluster = support::cluster();
    eprintln!("[load] cluster: {}", cluster.source);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(bench(&binary, parents, timeout));
}

/// `cargo build --release --bin trellis`, returning the binary's path.
fn build_operator() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("[load] building the operator: cargo build --release --bin trellis");
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

/// The operator process; killed (SIGKILL) if still running when dropped.
struct Operator {
    child: Child,
    log: PathBuf,
}

impl Operator {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails with `what`, the operator's state and its log's tail.
    fn fail(&mut self, what: &str) -> ! {
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

    fn check_running(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            self.fail("the operator exited early");
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // The temp dir goes; keep the log (also after a failure) for a look.
        let kept = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-load-operator.log");
        match std::fs::copy(&self.log, &kept) {
            Ok(_) => eprintln!("[load] operator log kept in {}", kept.display()),
            Err(e) => eprintln!("[load] could not keep the operator log: {e}"),
        }
    }
}

fn log_tail(path: &Path, lines: usize) -> String {
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
fn proc_status_kb(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

/// User + system CPU time of `pid`, in clock ticks.
fn proc_cpu_ticks(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command: state is field 3, utime 14, stime 15.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn clock_ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100.0)
}

fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// Samples VmRSS of `pid` every 200 ms on a thread of its own; `max_kb`
/// holds the highest value seen.
struct RssSampler {
    stop: Arc<AtomicBool>,
    max_kb: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    fn start(pid: u32) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let max_kb = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, max_kb) = (stop.clone(), max_kb.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(kb) = proc_status_kb(pid, "VmRSS") {
                        max_kb.fetch_max(kb, Ordering::Relaxed);
                    }
                    std::thread::sleep(POLL);
                }
            })
        };
        RssSampler {
            stop,
            max_kb,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.max_kb.load(Ordering::Relaxed)
    }
}

/// The local control plane's processes (name, pid), from `DIR/pids`;
/// empty for another cluster.
fn control_plane_pids(local: bool) -> Vec<(String, u32)> {
    if !local {
        return Vec::new();
    }
    let text = std::fs::read_to_string(support::cluster_dir().join("pids")).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (name, pid) = line.split_once(' ')?;
            Some((name.to_string(), pid.trim().parse().ok()?))
        })
        .collect()
}

fn cpu_ticks_of(pids: &[(String, u32)]) -> Vec<u64> {
    pids.iter()
        .map(|(_, pid)| proc_cpu_ticks(*pid).unwrap_or(0))
        .collect()
}

/// The rule under load: three small children per parent and status fields
/// read from each of them; default readiness everywhere.
fn rule(group: &str) -> String {
    format!(
        r#"apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: {RULE}
spec:
  parent:
    apiVersion: {group}/v1
    kind: {KIND}
  schema:
    type: object
    required: [greeting, user, token, ports]
    properties:
      greeting: {{type: string}}
      user: {{type: string}}
      token: {{type: string}}
      settings: {{type: object}}
      ports:
        type: array
        minItems: 1
        items:
          type: object
          required: [name, port]
          properties:
            name: {{type: string}}
            port: {{type: integer}}
            targetPort: {{type: integer}}
  defaults:
    settings: {{logLevel: info}}
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{{{ parent.metadata.name ~ "-config" }}}}
        data:
          greeting: {{{{ spec.greeting }}}}
          log-level: {{{{ spec.settings.logLevel | default("info") }}}}
          settings.yaml: {{{{ spec.settings | toyaml }}}}
    - id: credentials
      apiVersion: v1
      kind: Secret
      template: |
        metadata:
          name: {{{{ parent.metadata.name ~ "-credentials" }}}}
        type: Opaque
        stringData:
          username: {{{{ spec.user }}}}
          token: {{{{ spec.token }}}}
          url: {{{{ "https://" ~ spec.user ~ "@" ~ parent.metadata.name ~ "." ~ metadata.namespace ~ ".svc" }}}}
    - id: service
      apiVersion: v1
      kind: Service
      template: |
        metadata:
          name: {{{{ parent.metadata.name }}}}
          labels:
            app.kubernetes.io/name: loadapp
            app.kubernetes.io/instance: {{{{ parent.metadata.name }}}}
        spec:
          # Headless: the test cluster's service range has only 254 addresses.
          clusterIP: None
          selector:
            app.kubernetes.io/name: loadapp
            app.kubernetes.io/instance: {{{{ parent.metadata.name }}}}
          ports:
          {{%- for p in spec.ports %}}
            - name: {{{{ p.name }}}}
              port: {{{{ p.port }}}}
              targetPort: {{{{ p.targetPort | default(p.port) }}}}
              protocol: TCP
          {{%- endfor %}}
  status:
    fields:
      - path: configMap
        from: config
        jsonPath: $.metadata.name
      - path: secretName
        from: credentials
        jsonPath: $.metadata.name
      - path: service.name
        from: service
        jsonPath: $.metadata.name
      - path: service.port
        from: service
        jsonPath: $.spec.ports[0].port
        default: 0
      - path: url
        value: "'http://' ~ metadata.name ~ '.' ~ metadata.namespace ~ '.svc:' ~ (spec.ports | first).port"
"#
    )
}

fn parent(resource: &ApiResource, ns: &str, name: &str, i: usize) -> DynamicObject {
    let mut obj = DynamicObject::new(name, resource).within(ns).data(json!({
        "spec": {
            "greeting": format!("hello from parent {i}"),
            "user": format!("app{i}"),
            "token": format!("t0k3n-{i:06}-{}", "x".repeat(24)),
            "settings": {"logLevel": if i.is_multiple_of(2) { "info" } else { "debug" },
                         "features": ["search", "export"], "maxConnections": 100 + i},
            "ports": [
                {"name": "http", "port": 8080},
                {"name": "metrics", "port": 9090, "targetPort": 9100}
            ]
        }
    }));
    obj.metadata.labels = Some([("bench".to_string(), "load".to_string())].into());
    obj
}

fn condition_true(obj: &DynamicObject, type_: &str) -> bool {
    obj.data["status"]["conditions"]
        .as_array()
        .is_some_and(|conds| {
            conds
                .iter()
                .any(|c| c["type"] == json!(type_) && c["status"] == json!("True"))
        })
}

/// The operator has caught up with the parent's spec: `Synced=True` and
/// `status.observedGeneration` equal to `metadata.generation`.
fn parent_synced(obj: &DynamicObject) -> bool {
    let observed = obj.data["status"]["observedGeneration"].as_i64();
    condition_true(obj, "Synced") && observed.is_some() && observed == obj.metadata.generation
}

/// The parent's status reflects its observed children: `Ready=True` and
/// every status field the rule maps from them.
fn parent_ready(obj: &DynamicObject) -> bool {
    let name = obj.name_any();
    let s = &obj.data["status"];
    condition_true(obj, "Ready")
        && s["configMap"] == json!(format!("{name}-config"))
        && s["secretName"] == json!(format!("{name}-credentials"))
        && s["service"]["name"] == json!(name)
        && s["service"]["port"] == json!(8080)
}

/// One poll over the parents named `names`.
struct Progress {
    /// Parents with their 3 children, `Synced=True` and observedGeneration.
    synced: usize,
    /// Of those, parents also `Ready=True` with every mapped status field.
    ready: usize,
    /// Children of each kind (config, credentials, service).
    children: [usize; 3],
    /// One parent not ready yet, with its status, for failure messages.
    laggard: Option<String>,
}

/// The `trellis.dev/parent-uid` labels of a list of children.
fn parent_uids<K: Clone>(list: ObjectList<PartialObjectMeta<K>>) -> HashSet<String> {
    list.items
        .into_iter()
        .filter_map(|o| o.metadata.labels?.remove("trellis.dev/parent-uid"))
        .collect()
}

async fn poll(
    client: &Client,
    ns: &str,
    resource: &ApiResource,
    names: &HashSet<String>,
) -> Result<Progress, kube::Error> {
    let by_rule = ListParams::default().labels(&format!("trellis.dev/rule={RULE}"));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let parents: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, resource);
    let all = ListParams::default();
    let (cm, secret, service, parent_list) = tokio::try_join!(
        cms.list_metadata(&by_rule),
        secrets.list_metadata(&by_rule),
        services.list_metadata(&by_rule),
        parents.list(&all),
    )?;
    let (cm, secret, service) = (parent_uids(cm), parent_uids(secret), parent_uids(service));
    let mut progress = Progress {
        synced: 0,
        ready: 0,
        children: [cm.len(), secret.len(), service.len()],
        laggard: None,
    };
    for obj in parent_list.items {
        if !names.contains(&obj.name_any()) {
            continue;
        }
        let uid = obj.metadata.uid.clone().unwrap_or_default();
        let has_children = cm.contains(&uid) && secret.contains(&uid) && service.contains(&uid);
        let synced = has_children && parent_synced(&obj);
        let ready = synced && parent_ready(&obj);
        progress.synced += usize::from(synced);
        progress.ready += usize::from(ready);
        if !ready && progress.laggard.is_none() {
            progress.laggard = Some(format!(
                "{} (children: config={} credentials={} service={}; status: {})",
                obj.name_any(),
                cm.contains(&uid),
                secret.contains(&uid),
                service.contains(&uid),
                obj.data.get("status").unwrap_or(&Value::Null)
            ));
        }
    }
    Ok(progress)
}

/// Counts of the operator's JSON log lines by level, and by message for
/// the per-child messages and for every warning or error.
fn summarize_log(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut levels: BTreeMap<String, usize> = BTreeMap::new();
    let mut messages: BTreeMap<String, usize> = BTreeMap::new();
    let mut unparsed = 0;
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            unparsed += 1;
            continue;
        };
        let level = v["level"].as_str().unwrap_or("?").to_string();
        let message = v["fields"]["message"].as_str().unwrap_or("?");
        // Messages quoting object names would not group: keep the first words.
        let short: String = message.chars().take(100).collect();
        if level != "INFO" || matches!(message, "created" | "applied" | "deleted") {
            *messages.entry(format!("{level} {short}")).or_default() += 1;
        }
        *levels.entry(level).or_default() += 1;
    }
    let mut out = format!("log lines by level: {levels:?}");
    if unparsed > 0 {
        out += &format!(", {unparsed} not JSON");
    }
    let mut top: Vec<_> = messages.into_iter().collect();
    top.sort_by_key(|entry| std::cmp::Reverse(entry.1));
    for (message, count) in top.into_iter().take(12) {
        out += &format!("\n  {count:>6} x {message}");
    }
    out
}

async fn bench(binary: &Path, n: usize, timeout: Duration) {
    let cluster = support::cluster();

    // A fresh namespace, deleted when `ns` drops (also on panic).
    let ns = support::namespace_for("bench-load").await;
    let client = ns.client.clone();
    let ns_name = ns.name.clone();

    let group = format!("{}.bench.trellis.test", support::unique_name("load"));
    let kind = TestKind::in_group(&group, KIND);
    // Deletes the CRD when dropped (also on panic).
    let crd_cleanup = Cleanup::crds(&[&kind]);
    kind.install(&client).await;
    let resource = kind.resource.clone();

    // The probe parent exists before the operator starts: the first write of
    // a new CRD's objects can be slow (the API server warming up), and that
    // is not the operator's start-up.
    let parents: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns.name(), &resource);
    let probe_start = Instant::now();
    parents
        .create(
            &PostParams::default(),
            &parent(&resource, ns.name(), "probe", 0),
        )
        .await
        .unwrap_or_else(|e| panic!("creating the probe parent: {e}"));
    let first_create = probe_start.elapsed();

    let dir = tempfile::Builder::new()
        .prefix("trellis-bench-load-")
        .tempdir()
        .expect("temp dir");
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).expect("rules dir");
    std::fs::write(rules.join("load.yaml"), rule(&group)).expect("writing the rule");
    let log = dir.path().join("operator.log");
    let log_file = File::create(&log).expect("operator log file");

    let mut command = Command::new(binary);
    command
        .arg("run")
        .arg("--rules")
        .arg(&rules)
        .args(["--namespace", ns.name()])
        .args(["--metrics-addr", "off", "--log-format", "json"])
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().expect("log file"))
        .stderr(log_file);
    if let Some(path) = &cluster.kubeconfig_path {
        command.env("KUBECONFIG", path);
    }
    let spawned = Instant::now();
    let mut operator = Operator {
        child: command
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display())),
        log: log.clone(),
    };
    let pid = operator.pid();
    let sampler = RssSampler::start(pid);
    eprintln!(
        "[load] operator pid {pid}, namespace {}, group {group}, log {}",
        ns.name(),
        log.display()
    );

    // Start-up: one probe parent must converge before timing starts.
    let probe = HashSet::from(["probe".to_string()]);
    loop {
        operator.check_running();
        match poll(&client, ns.name(), &resource, &probe).await {
            Ok(p) if p.ready == 1 => break,
            Ok(p) if spawned.elapsed() > Duration::from_secs(60) => operator.fail(&format!(
                "the probe parent did not converge within 60 s of the operator's start: {}",
                p.laggard.unwrap_or_default()
            )),
            Err(e) if spawned.elapsed() > Duration::from_secs(60) => {
                operator.fail(&format!("polling the probe: {e}"))
            }
            _ => tokio::time::sleep(POLL).await,
        }
    }
    let startup = spawned.elapsed();
    let rss_after_startup = proc_status_kb(pid, "VmRSS").unwrap_or(0);
    let cpu_before = proc_cpu_ticks(pid).unwrap_or(0);
    let control_plane = control_plane_pids(cluster.local);
    let control_plane_before = cpu_ticks_of(&control_plane);
    eprintln!(
        "[load] operator ready after {:.2} s (probe parent converged); creating {n} parents",
        startup.as_secs_f64()
    );

    // The load: N parents, 32 creates in flight.
    let names: HashSet<String> = (0..n).map(|i| format!("app-{i:05}")).collect();
    let start = Instant::now();
    let created: Vec<()> = futures::stream::iter(0..n)
        .map(|i| {
            let parents = parents.clone();
            let obj = parent(&resource, ns.name(), &format!("app-{i:05}"), i);
            async move {
                parents
                    .create(&PostParams::default(), &obj)
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect()
        .await
        .unwrap_or_else(|e| operator.fail(&format!("creating parents: {e}")));
    assert_eq!(created.len(), n);
    let create_time = start.elapsed();
    eprintln!(
        "[load] created {n} parents in {:.2} s",
        create_time.as_secs_f64()
    );

    let mut last_report = Instant::now();
    let mut half: Option<Duration> = None;
    let mut synced_in: Option<Duration> = None;
    let mut polls = 0u32;
    let ready_in = loop {
        operator.check_running();
        let progress = match poll(&client, ns.name(), &resource, &names).await {
            Ok(p) => p,
            Err(e) if start.elapsed() > timeout => {
                operator.fail(&format!("timed out; last poll failed: {e}"))
            }
            Err(e) => {
                eprintln!("[load] poll failed (retrying): {e}");
                tokio::time::sleep(POLL).await;
                continue;
            }
        };
        polls += 1;
        if half.is_none() && progress.ready * 2 >= n {
            half = Some(start.elapsed());
        }
        if synced_in.is_none() && progress.synced == n {
            synced_in = Some(start.elapsed());
        }
        if progress.ready == n {
            break start.elapsed();
        }
        if start.elapsed() > timeout {
            operator.fail(&format!(
                "timed out after {timeout:?}: {}/{n} parents ready, {} synced, children \
                 config={} credentials={} service={}; e.g. {}",
                progress.ready,
                progress.synced,
                progress.children[0],
                progress.children[1],
                progress.children[2],
                progress.laggard.unwrap_or_default()
            ));
        }
        if last_report.elapsed() >= Duration::from_secs(5) {
            last_report = Instant::now();
            eprintln!(
                "[load] {:>6.1} s: {}/{n} ready, {} synced, children {:?}, RSS {:.1} MiB",
                start.elapsed().as_secs_f64(),
                progress.ready,
                progress.synced,
                progress.children,
                mib(proc_status_kb(pid, "VmRSS").unwrap_or(0))
            );
        }
        tokio::time::sleep(POLL).await;
    };
    let synced_in = synced_in.unwrap_or(ready_in);
    let cpu_ticks = proc_cpu_ticks(pid).unwrap_or(0).saturating_sub(cpu_before);
    let control_plane_cpu: Vec<(String, u64)> = control_plane
        .iter()
        .zip(
            cpu_ticks_of(&control_plane)
                .iter()
                .zip(&control_plane_before),
        )
        .map(|((name, _), (after, before))| (name.clone(), after.saturating_sub(*before)))
        .collect();

    // Let the operator settle, then read its memory.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let hwm = proc_status_kb(pid, "VmHWM").unwrap_or(0);
    let rss = proc_status_kb(pid, "VmRSS").unwrap_or(0);
    let sampled = sampler.finish();
    // Nothing may have regressed meanwhile.
    let settled = poll(&client, ns.name(), &resource, &names)
        .await
        .unwrap_or_else(|e| operator.fail(&format!("final poll: {e}")));
    if settled.ready != n {
        operator.fail(&format!(
            "2 s after convergence only {}/{n} parents are ready; e.g. {}",
            settled.ready,
            settled.laggard.unwrap_or_default()
        ));
    }

    // Shutdown: SIGTERM, then wait for a clean exit.
    let term = Instant::now();
    let killed = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("running kill");
    assert!(killed.success(), "kill -TERM {pid} failed");
    let exit = loop {
        match operator.child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if term.elapsed() > Duration::from_secs(30) => {
                operator.fail("the operator did not exit within 30 s of SIGTERM")
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => operator.fail(&format!("waiting for the operator: {e}")),
        }
    };
    let shutdown = term.elapsed();
    let log_summary = summarize_log(&log);

    let secs = ready_in.as_secs_f64();
    let ticks = clock_ticks_per_second();
    println!();
    println!("trellis load benchmark (release operator, separate process)");
    println!("  parents                 {n}");
    println!("  children                {} (3 per parent)", 3 * n);
    println!(
        "  operator start-up       {:.2} s (spawn to the probe parent ready)",
        startup.as_secs_f64()
    );
    println!(
        "  first create of the CRD {:.2} s (API server warm-up, before the operator starts)",
        first_create.as_secs_f64()
    );
    println!(
        "  parent creates          {:.2} s ({:.0} creates/s, {CREATE_CONCURRENCY} in flight)",
        create_time.as_secs_f64(),
        n as f64 / create_time.as_secs_f64()
    );
    if let Some(half) = half {
        println!(
            "  half ready              {:.2} s after the first create",
            half.as_secs_f64()
        );
    }
    println!(
        "  all synced              {:.2} s after the first create (children, Synced=True, \
         observedGeneration)",
        synced_in.as_secs_f64()
    );
    println!(
        "  all ready (convergence) {secs:.2} s after the first create (also Ready=True and \
         status fields; {polls} polls)"
    );
    println!(
        "  throughput              {:.1} parents/s, {:.1} children/s",
        n as f64 / secs,
        3.0 * n as f64 / secs
    );
    println!(
        "  operator CPU            {:.2} s during the load ({:.0}% of one core)",
        cpu_ticks as f64 / ticks,
        100.0 * cpu_ticks as f64 / ticks / secs
    );
    for (name, ticks_used) in &control_plane_cpu {
        println!(
            "  {:<23} {:.2} s CPU during the load ({:.0}% of one core; shared cluster)",
            name,
            *ticks_used as f64 / ticks,
            100.0 * *ticks_used as f64 / ticks / secs
        );
    }
    println!("  peak RSS (VmHWM)        {:.1} MiB", mib(hwm));
    println!("  peak RSS (sampled)      {:.1} MiB", mib(sampled));
    println!(
        "  RSS after start-up      {:.1} MiB",
        mib(rss_after_startup)
    );
    println!("  final RSS               {:.1} MiB", mib(rss));
    println!(
        "  shutdown (SIGTERM)      {:.3} s, {exit}",
        shutdown.as_secs_f64()
    );
    println!("  operator log            {log_summary}");

    if !exit.success() {
        operator.fail(&format!("the operator exited with {exit} after SIGTERM"));
    }
    // Cleanup: the operator is gone; delete the namespace, then the CRD.
    drop(operator);
    drop(ns);
    drop(crd_cleanup);
    drop(dir);
    eprintln!(
        "[load] deleted namespace {ns_name} and CRD {}",
        kind.crd_name()
    );
}
