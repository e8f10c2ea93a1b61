//! Children in other clusters under load: N parents (default 1000) of one
//! custom kind, each with one ConfigMap at home and one more ConfigMap,
//! reconciled by the release `trellis run` binary in a process of its own.
//! Runs, one after the other, each in a fresh namespace of the hub (the
//! tests' shared control plane, see `tests/support/mod.rs`) with a fresh
//! operator:
//! * `local`: the rule without `cluster:`, both ConfigMaps in the hub (what
//!   a user has without the feature: the baseline);
//! * `spoke`: the same rule with `cluster: spec.region` on the second
//!   ConfigMap and every parent's `region` the spoke's name: it is made in
//!   a spoke, a fresh control plane of its own (`tests/cluster/cluster up`,
//!   node-less), registered by a Secret holding its admin kubeconfig;
//! * `region-local` (only when asked for): the `spoke` rule with `region:
//!   local` and no spoke: what `cluster:` itself costs.
//!
//! Run: `cargo bench --bench clusters` (prints a table; fails only when
//! something does not converge or the operator misbehaves).
//!
//! Environment:
//! * `TRELLIS_BENCH_PARENTS`: parents per run (default 1000).
//! * `TRELLIS_BENCH_RUNS`: the runs, in order (default `local,spoke`;
//!   `region-local` may be added).
//! * `TRELLIS_BENCH_STEADY`: seconds of the idle window after converge
//!   (default 30): requests per minute per cluster with nothing changing.
//! * `TRELLIS_BENCH_TIMEOUT`: seconds allowed for each phase (default 600).
//! * `TRELLIS_BENCH_BINARY`: an operator binary instead of building this
//!   checkout's.
//! * The hub is chosen as for the tests (`TRELLIS_TEST_KUBECONFIG`, ...).
//!
//! What is measured, per run:
//! * **converge**: from the first parent create (32 at a time) to every
//!   parent having its two ConfigMaps where the rule places them and a
//!   status for its generation (`Synced=True`, `observedGeneration`, and
//!   `remoteV` mapped back from the second ConfigMap), seen through the
//!   bench's own watches on both clusters (no polling).
//! * **requests per cluster**: each API server's own
//!   `apiserver_request_total`, by verb and resource, before and after the
//!   phase, on the resources the operator touches (ConfigMaps, Events, the
//!   parent kind and its status, Secrets); the bench's own parent creates
//!   and deletion are taken away. Each cluster's count of every request is
//!   printed beside it (its controller manager's, the bench's watches).
//! * **steady**: requests per minute per cluster while nothing changes.
//! * **delete**: every parent deleted at once (one deletecollection) →
//!   parents and both clusters' ConfigMaps gone: in the hub the garbage
//!   collector deletes by ownerReference, in the spoke trellis's finalizer
//!   does (no ownerReference can point across clusters).
//! * **CPU, peak RSS**: the operator's, from `/proc/<pid>` (VmHWM at
//!   converge and at the end).
//!
//! The machine's load average is printed beside each phase.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

#[path = "clusters/observe.rs"]
mod observe;

use std::path::Path;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use common::{OperatorProcess, Requests, env_number, load_average, mib};
use observe::Observer;
use support::faults::PrivateCluster;
use support::operator::TestKind;

const RULE: &str = "fleet";
const KIND: &str = "FleetApp";
const PLURAL: &str = "fleetapps";
const SPOKE: &str = "spoke-1";
const CREATE_CONCURRENCY: usize = 32;
/// Resources whose requests are counted.
const RESOURCES: &[&str] = &["configmaps", "events", PLURAL, "secrets"];

/// A ConfigMap at home and a second one (`remote`), placed by
/// `spec.region` when `placed`; the status maps the second one's data.
fn rule(group: &str, placed: bool) -> String {
    let cluster = if placed {
        "\n      cluster: spec.region"
    } else {
        ""
    };
    format!(
        r#"apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: {RULE}
spec:
  parent:
    apiVersion: {group}/v1
    kind: {KIND}
  children:
    - id: home
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{{{ parent.metadata.name ~ "-home" }}}}
        data:
          v: {{{{ spec.v }}}}
    - id: remote
      apiVersion: v1
      kind: ConfigMap{cluster}
      template: |
        metadata:
          name: {{{{ parent.metadata.name ~ "-remote" }}}}
        data:
          v: {{{{ spec.v }}}}
  status:
    fields:
      - path: remoteV
        from: remote
        jsonPath: $.data.v
"#
    )
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Local,
    Spoke,
    RegionLocal,
}

impl Mode {
    fn parse(text: &str) -> Mode {
        match text {
            "local" => Mode::Local,
            "spoke" => Mode::Spoke,
            "region-local" => Mode::RegionLocal,
            other => panic!("TRELLIS_BENCH_RUNS: {other:?}: local, spoke or region-local"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Local => "local",
            Mode::Spoke => "spoke",
            Mode::RegionLocal => "region-local",
        }
    }

    fn region(self) -> &'static str {
        match self {
            Mode::Spoke => SPOKE,
            _ => "local",
        }
    }
}

struct Settings {
    parents: usize,
    runs: Vec<Mode>,
    steady: Duration,
    timeout: Duration,
}

fn settings() -> Settings {
    let runs = std::env::var("TRELLIS_BENCH_RUNS").unwrap_or_else(|_| "local,spoke".to_owned());
    Settings {
        parents: env_number("TRELLIS_BENCH_PARENTS", 1000) as usize,
        runs: runs
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(Mode::parse)
            .collect(),
        steady: Duration::from_secs(env_number("TRELLIS_BENCH_STEADY", 30)),
        timeout: Duration::from_secs(env_number("TRELLIS_BENCH_TIMEOUT", 600)),
    }
}

fn main() {
    let settings = settings();
    let binary = common::build_operator();
    let rows = common::on_a_kind("clusters", KIND, PLURAL, |client, kind| async move {
        let mut rows = Vec::new();
        for &mode in &settings.runs {
            let row = run(&binary, &client, &kind, &settings, mode).await;
            println!("{}", row.report());
            rows.push(row);
        }
        rows
    });
    println!("{}", summary(&rows));
}

/// Requests on one cluster during one phase.
#[derive(Default)]
struct Counted {
    /// The API server's count on [`RESOURCES`], the bench's own requests
    /// taken away. In the hub this holds the garbage collector's too (its
    /// owner checks: GETs of the parent kind, and the deletes by
    /// ownerReference): see `own`.
    server: Requests,
    /// Every request the API server counted.
    all: Requests,
    /// In the hub: the operator's own `trellis_api_requests_total` (its
    /// requests to the hub only; its spoke clients are not counted there).
    own: Option<Requests>,
}

impl Counted {
    fn describe(&self) -> String {
        let own = match &self.own {
            Some(own) => format!(
                "operator's own count: {} writes, {} requests ({}); ",
                own.writes(),
                own.total(),
                own.describe()
            ),
            None => String::new(),
        };
        format!(
            "{own}API server: {} writes, {} requests ({}); every request: {}",
            self.server.writes(),
            self.server.total(),
            self.server.describe(),
            by_verb(&self.all)
        )
    }

    /// What the operator sent: its own count in the hub, the API server's
    /// in the spoke (nothing else writes there).
    fn operator(&self) -> &Requests {
        self.own.as_ref().unwrap_or(&self.server)
    }
}

/// `GET=12, WATCH=3, ...`.
fn by_verb(r: &Requests) -> String {
    let mut verbs = std::collections::BTreeMap::<&str, u64>::new();
    for (k, v) in &r.0 {
        *verbs.entry(k.verb.as_str()).or_default() += v;
    }
    verbs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Each cluster's counts at one moment: the hub's, the spoke's, and the
/// operator's own (of its requests to the hub).
struct Mark(Requests, Option<Requests>, Option<Requests>);

async fn mark(op: &OperatorProcess, hub: &Client, spoke: Option<&Client>) -> Mark {
    let spoke = match spoke {
        Some(c) => Some(Requests::scrape(c).await),
        None => None,
    };
    Mark(Requests::scrape(hub).await, spoke, op.requests().await)
}

/// What each cluster counted between `from` and `to`, less the bench's own
/// `creates` parent creates and `deletes` deletecollections.
fn between(from: &Mark, to: &Mark, creates: u64, deletes: u64) -> [Option<Counted>; 2] {
    let count = |a: &Requests, b: &Requests, bench: bool| {
        let all = b.since(a);
        let mut server = all.on(RESOURCES);
        if bench {
            server.minus("POST", PLURAL, creates);
            server.minus("DELETECOLLECTION", PLURAL, deletes);
        }
        Counted {
            server,
            all,
            own: None,
        }
    };
    let spoke = match (&from.1, &to.1) {
        (Some(a), Some(b)) => Some(count(a, b, false)),
        _ => None,
    };
    let mut hub = count(&from.0, &to.0, true);
    if let (Some(a), Some(b)) = (&from.2, &to.2) {
        hub.own = Some(b.since(a));
    }
    [Some(hub), spoke]
}

/// One phase's figures.
struct Phase {
    what: &'static str,
    took: Duration,
    load: (String, String),
    requests: [Option<Counted>; 2],
}

/// One run's figures.
struct Row {
    mode: Mode,
    parents: usize,
    phases: Vec<Phase>,
    cpu_converge: f64,
    hwm_converge_kb: u64,
    hwm_end_kb: u64,
    started_kb: u64,
}

impl Row {
    fn report(&self) -> String {
        let mut out = format!(
            "\n== {} parents, run `{}` (the remote ConfigMap in {}) ==\n",
            self.parents,
            self.mode.name(),
            if self.mode == Mode::Spoke {
                "the spoke"
            } else {
                "the hub"
            }
        );
        for p in &self.phases {
            out.push_str(&format!(
                "{}: {:.2} s (load {} -> {})\n",
                p.what,
                p.took.as_secs_f64(),
                p.load.0,
                p.load.1
            ));
            for (name, c) in ["hub", "spoke"].iter().zip(&p.requests) {
                if let Some(c) = c {
                    out.push_str(&format!("  {name}: {}\n", c.describe()));
                }
            }
        }
        out.push_str(&format!(
            "operator: CPU {:.2} s until converge; VmRSS at start {:.1} MiB, VmHWM at converge {:.1} MiB, at the end {:.1} MiB\n",
            self.cpu_converge,
            mib(self.started_kb),
            mib(self.hwm_converge_kb),
            mib(self.hwm_end_kb)
        ));
        out
    }

    fn phase(&self, what: &str) -> Option<&Phase> {
        self.phases.iter().find(|p| p.what == what)
    }
}

fn summary(rows: &[Row]) -> String {
    let mut out = String::from(
        "\n| run | parents | converge | hub writes / requests (converge, the operator's own count) | spoke writes / requests (converge, the spoke API server's count) | steady req/min hub / spoke | delete | CPU s | VmHWM |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    let pair = |c: &Option<Counted>| match c {
        Some(c) => format!("{} / {}", c.operator().writes(), c.operator().total()),
        None => "-".to_owned(),
    };
    for r in rows {
        let converge = r.phase("converge");
        let steady = r.phase("steady");
        let per_minute = |c: &Option<Counted>, took: Duration| match c {
            Some(c) => format!(
                "{:.0}",
                c.operator().total() as f64 * 60.0 / took.as_secs_f64().max(1.0)
            ),
            None => "-".to_owned(),
        };
        out.push_str(&format!(
            "| {} | {} | {:.2} s | {} | {} | {} | {} | {:.2} | {:.1} MiB |\n",
            r.mode.name(),
            r.parents,
            converge.map_or(0.0, |p| p.took.as_secs_f64()),
            converge.map_or("-".into(), |p| pair(&p.requests[0])),
            converge.map_or("-".into(), |p| pair(&p.requests[1])),
            steady.map_or("-".into(), |p| format!(
                "{} / {}",
                per_minute(&p.requests[0], p.took),
                per_minute(&p.requests[1], p.took)
            )),
            r.phase("delete")
                .map_or("-".into(), |p| format!("{:.2} s", p.took.as_secs_f64())),
            r.cpu_converge,
            mib(r.hwm_end_kb)
        ));
    }
    out
}

/// The spoke: a fresh control plane, a namespace named like the hub's, and
/// the Secret registering it in the hub's (the operator's) namespace.
async fn spoke_for(hub_ns: &support::TestNamespace) -> (PrivateCluster, Client) {
    let spoke = PrivateCluster::start("bench-clusters-spoke").await;
    let client = spoke.client().await;
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": hub_ns.name()}})).expect("namespace");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace in the spoke");
    // JSON is YAML: what a kubeconfig Secret holds either way.
    let text = serde_json::to_string(&spoke.kubeconfig).expect("kubeconfig text");
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "spoke-1-kubeconfig", "labels": {"trellis.dev/cluster": SPOKE}},
        "stringData": {"kubeconfig": text},
    }))
    .expect("secret");
    Api::<Secret>::namespaced(hub_ns.client.clone(), hub_ns.name())
        .patch(
            "spoke-1-kubeconfig",
            &PatchParams::apply("bench-clusters").force(),
            &Patch::Apply(&secret),
        )
        .await
        .expect("cluster Secret");
    (spoke, client)
}

/// Waits until the operator's `/status` shows the rule running and, with a
/// spoke, the spoke reachable.
async fn operator_ready(op: &mut OperatorProcess, spoke: bool, timeout: Duration) {
    let started = Instant::now();
    loop {
        op.check_running();
        let status: Value = support::http_get(op.metrics, "/status")
            .await
            .ok()
            .and_then(|b| serde_json::from_str(&b).ok())
            .unwrap_or(Value::Null);
        let running = status["rules"][RULE]["state"] == "Running";
        let reachable = !spoke || status["clusters"][SPOKE]["reachable"] == true;
        if running && reachable {
            return;
        }
        if started.elapsed() > timeout {
            op.fail(&format!("the operator not ready: {status}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn create_parents(
    api: &Api<DynamicObject>,
    resource: &ApiResource,
    ns: &str,
    names: &[String],
    region: &str,
) {
    futures::stream::iter(names.iter().enumerate())
        .map(|(i, name)| {
            let obj = DynamicObject::new(name, resource)
                .within(ns)
                .data(json!({"spec": {"v": format!("p{i}"), "region": region}}));
            async move { api.create(&PostParams::default(), &obj).await }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await
        .unwrap_or_else(|e| panic!("creating parents: {e}"));
}

/// Waits until `done` holds of the observer's view, printing progress.
async fn wait_until(
    op: &mut OperatorProcess,
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> Result<(), String>,
) -> Duration {
    let started = Instant::now();
    let mut reported = Instant::now();
    loop {
        let state = done();
        if state.is_ok() {
            return started.elapsed();
        }
        op.check_running();
        let why = state.err().unwrap_or_default();
        if started.elapsed() > timeout {
            op.fail(&format!("{what}: not done after {timeout:?}: {why}"));
        }
        if reported.elapsed() > Duration::from_secs(5) {
            reported = Instant::now();
            eprintln!(
                "[clusters] {:>6.1} s: {what}: {why}",
                started.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn run(binary: &Path, hub: &Client, kind: &TestKind, s: &Settings, mode: Mode) -> Row {
    let n = s.parents;
    eprintln!("[clusters] {n} parents, run {}", mode.name());
    let ns = support::namespace_for("bench-clusters").await;
    let ns_name = ns.name.clone();
    let resource = &kind.resource;
    let spoke = match mode {
        Mode::Spoke => Some(spoke_for(&ns).await),
        _ => None,
    };
    let spoke_client = spoke.as_ref().map(|(_, c)| c.clone());
    let dir = tempfile::Builder::new()
        .prefix("trellis-bench-clusters-")
        .tempdir()
        .expect("temp dir");
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).expect("rules dir");
    std::fs::write(
        rules.join("fleet.yaml"),
        rule(&kind.group, mode != Mode::Local),
    )
    .expect("writing the rule");
    let observer = Observer::start(hub, spoke_client.as_ref(), &ns_name, resource, RULE).await;
    let mut op = OperatorProcess::start(
        binary,
        &format!("clusters-{n}-{}", mode.name()),
        &rules,
        &ns_name,
        &["--operator-namespace", &ns_name, "--cluster-name", "hub"],
    );
    operator_ready(&mut op, spoke.is_some(), Duration::from_secs(120)).await;
    let started_kb = common::proc_status_kb(op.pid(), "VmRSS").unwrap_or(0);
    let cpu_start = common::proc_cpu_seconds(op.pid()).unwrap_or(0.0);

    // Converge.
    let names: Vec<String> = (0..n).map(|i| format!("app-{i:05}")).collect();
    let parents: Api<DynamicObject> = Api::namespaced_with(hub.clone(), &ns_name, resource);
    let load = load_average();
    let before = mark(&op, hub, spoke_client.as_ref()).await;
    let started = Instant::now();
    create_parents(&parents, resource, &ns_name, &names, mode.region()).await;
    let in_spoke = mode == Mode::Spoke;
    let rest = wait_until(&mut op, "converge", s.timeout, || {
        let p = observer.progress(&names, in_spoke);
        if p.synced == n {
            Ok(())
        } else {
            Err(format!(
                "{}/{n} synced, ConfigMaps {} in the hub, {} in the spoke; e.g. {}",
                p.synced,
                p.children[0],
                p.children[1],
                p.laggard.unwrap_or_default()
            ))
        }
    })
    .await;
    let converge = started.elapsed().max(rest);
    let hwm_converge_kb = common::proc_status_kb(op.pid(), "VmHWM").unwrap_or(0);
    let cpu_converge = common::proc_cpu_seconds(op.pid()).unwrap_or(0.0) - cpu_start;
    // Writes still on their way (the last Events) land in this phase.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let converged = mark(&op, hub, spoke_client.as_ref()).await;
    let mut phases = vec![Phase {
        what: "converge",
        took: converge,
        load: (load, load_average()),
        requests: between(&before, &converged, n as u64, 0),
    }];

    // Steady: nothing changes.
    let load = load_average();
    tokio::time::sleep(s.steady).await;
    let idle = mark(&op, hub, spoke_client.as_ref()).await;
    phases.push(Phase {
        what: "steady",
        took: s.steady,
        load: (load, load_average()),
        requests: between(&converged, &idle, 0, 0),
    });

    // Delete: every parent at once.
    let load = load_average();
    let started = Instant::now();
    parents
        .delete_collection(&DeleteParams::default(), &Default::default())
        .await
        .expect("delete the parents");
    wait_until(&mut op, "delete", s.timeout, || {
        let p = observer.progress(&names, in_spoke);
        if p.parents == 0 && p.children == [0, 0] {
            Ok(())
        } else {
            Err(format!(
                "{} parents, ConfigMaps {} in the hub, {} in the spoke",
                p.parents, p.children[0], p.children[1]
            ))
        }
    })
    .await;
    let deleted = started.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let gone = mark(&op, hub, spoke_client.as_ref()).await;
    phases.push(Phase {
        what: "delete",
        took: deleted,
        load: (load, load_average()),
        requests: between(&idle, &gone, 0, 1),
    });
    let hwm_end_kb = common::proc_status_kb(op.pid(), "VmHWM").unwrap_or(0);
    let (_, status) = op.terminate();
    assert!(status.success(), "the operator exited with {status}");
    drop(op);
    drop(observer);
    drop(spoke);
    common::delete_namespace(hub, ns).await;
    Row {
        mode,
        parents: n,
        phases,
        cpu_converge,
        hwm_converge_kb,
        hwm_end_kb,
        started_kb,
    }
}
