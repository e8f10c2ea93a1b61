//! Load benchmark of the real operator against the physical limit: N
//! parents of one custom kind, each owning a ConfigMap, a Deployment and a
//! Service (the webapp-like rule below), reconciled by the release `trellis
//! run` binary in a process of its own, side by side with a **bare client**
//! (this program, kube client only) that does exactly the necessary writes:
//! one server-side apply per child and one status patch per parent, at
//! concurrency 1, 16 and 64. All runs share one control plane (the tests'
//! shared one, see `tests/support/mod.rs`), one after the other, each in a
//! fresh namespace that is gone before the next run starts.
//!
//! Run: `cargo bench --bench load` (prints a table; fails only when
//! something does not converge or the operator misbehaves).
//!
//! Environment:
//! * `TRELLIS_BENCH_SIZES`: parent counts, comma-separated (default
//!   `200,1000`); `TRELLIS_BENCH_10K=1` adds 10000 (slow here).
//!   `TRELLIS_BENCH_PARENTS=N` runs N alone.
//! * `TRELLIS_BENCH_BARE`: bare client concurrencies (default `1,16,64`;
//!   empty: none).
//! * `TRELLIS_BENCH_TRELLIS`: operator settings, `default` or a
//!   `--concurrency` value (default `default,64`; empty: none), each with an
//!   optional `@/path/to/trellis` binary to run instead of this checkout's
//!   (`64@/work/bin/trellis-old,64`: two builds in one run, A/B).
//! * `TRELLIS_BENCH_ROUNDS`: how many times the runs of each size repeat,
//!   in order (default 1): bare, trellis, bare, trellis... alternate on one
//!   control plane, so a busy machine weighs on both alike.
//! * `TRELLIS_BENCH_CONVERGE_ONLY=1`: a trellis run stops at converge (no
//!   Ready wait, steady state, restart nor rule edit).
//!   A bare concurrency with `+event` (`64+event`): the bare client also
//!   publishes one Event per parent, as trellis does (kube's `Recorder`, in
//!   the background once the status is written): what that one request
//!   more costs.
//! * `TRELLIS_BENCH_TRACE=1`: the latency trace of each run: per parent,
//!   from its create to its status, phase by phase (queue, each apply's
//!   round trip, the status write, the watch), medians; for trellis from
//!   its own per-pass log lines (`trellis::pass::trace` at debug).
//! * `TRELLIS_BENCH_STEADY`: seconds of the steady-state window (default 60).
//! * `TRELLIS_BENCH_TIMEOUT`: seconds allowed for each convergence (default 600).
//! * `TRELLIS_BENCH_BINARY`: the operator binary to run instead of building
//!   this checkout's (to compare two builds on one control plane).
//! * The cluster is chosen as for the tests (`TRELLIS_TEST_KUBECONFIG`, ...).
//!
//! What is measured, per run:
//! * **converge**: from the first parent create to every parent having its
//!   3 children (by `trellis.dev/parent-uid` label) and a status written for
//!   its generation (`Synced=True`, `observedGeneration`, the status fields
//!   mapped from the children). For trellis this is seen through watches
//!   (the bench's own, started before the run: no polling, so the API
//!   server carries the same load in trellis's runs as in the bare
//!   client's); for the bare client it is when its last write returns.
//!   Parents are created 32 at a time in both cases, and the bare client
//!   starts on each parent as soon as its create returns. The rule's
//!   Deployments have `replicas: 0`: no Pod is made, with or without a node.
//! * **requests**: for trellis, its own `trellis_api_requests_total` (only
//!   the operator's requests: not the namespace controller's cleaning up an
//!   earlier run's namespace, not the garbage collector's owner checks),
//!   in two phases: until converge, and from converge until every parent is
//!   `Ready` (the controller manager marks the Deployments available; one
//!   more status write and one `Ready` Event per parent). The API server's
//!   `apiserver_request_total` over the same window is printed beside it as
//!   a cross-check. For the bare client, the API server's count less this
//!   program's parent creates.
//! * **CPU, peak RSS**: the operator's, from `/proc/<pid>` (VmHWM).
//! * For trellis also: **steady state** (nothing changes for
//!   `TRELLIS_BENCH_STEADY` s: the operator's requests per minute),
//!   **restart** (SIGTERM, a new process: time until it has passed over
//!   every parent, per its own `trellis_reconciles_total`, and every request
//!   it sent until 5 s after that; the target is 0 writes) and a **rule
//!   edit** touching every parent (a new ConfigMap key: time until every
//!   ConfigMap carries it, seen by the watch).
//!
//! Operator logs (JSON lines) are kept in `target/tmp/bench-<run>.log`.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;
#[path = "load/trace.rs"]
mod trace;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};

use common::{OperatorProcess, Requests, RssSampler, delete_namespace, env_number, mib};
use support::operator::{Cleanup, TestKind};

const RULE: &str = "load";
const KIND: &str = "LoadApp";
const CREATE_CONCURRENCY: usize = 32;
/// Resources whose requests are counted.
const RESOURCES: &[&str] = &["configmaps", "services", "deployments", "events", PLURAL];
const PLURAL: &str = "loadapps";

/// The rule under load, webapp-like: a ConfigMap, a Deployment reading it
/// and a ClusterIP Service; status fields mapped from the children. With
/// `edition`, the ConfigMap carries one key more (the rule edit).
fn rule(group: &str, edition: Option<u32>) -> String {
    let edition = edition
        .map(|e| format!("\n          edition: \"{e}\""))
        .unwrap_or_default();
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
    required: [image]
    properties:
      image: {{type: string}}
      replicas: {{type: integer}}
      port: {{type: integer}}
      greeting: {{type: string}}
  defaults:
    replicas: 0
    port: 8080
    greeting: hello
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{{{ parent.metadata.name ~ "-config" }}}}
        data:
          greeting: {{{{ spec.greeting }}}}{edition}
    - id: web
      apiVersion: apps/v1
      kind: Deployment
      template: |
        metadata:
          name: {{{{ parent.metadata.name }}}}
        spec:
          replicas: {{{{ spec.replicas }}}}
          selector:
            matchLabels:
              app.kubernetes.io/name: loadapp
              app.kubernetes.io/instance: {{{{ parent.metadata.name }}}}
          template:
            metadata:
              labels:
                app.kubernetes.io/name: loadapp
                app.kubernetes.io/instance: {{{{ parent.metadata.name }}}}
            spec:
              containers:
                - name: web
                  image: {{{{ spec.image }}}}
                  ports:
                    - name: http
                      containerPort: {{{{ spec.port }}}}
                  envFrom:
                    - configMapRef:
                        name: {{{{ parent.metadata.name ~ "-config" }}}}
      readyWhen: >-
        self.status.observedGeneration | default(0) >= self.metadata.generation | default(1)
        and self.status.updatedReplicas | default(0) >= spec.replicas
    - id: service
      apiVersion: v1
      kind: Service
      template: |
        metadata:
          name: {{{{ parent.metadata.name }}}}
        spec:
          selector:
            app.kubernetes.io/name: loadapp
            app.kubernetes.io/instance: {{{{ parent.metadata.name }}}}
          ports:
            - name: http
              port: 80
              targetPort: http
  status:
    fields:
      - path: configMap
        from: config
        jsonPath: $.metadata.name
      - path: service
        from: service
        jsonPath: $.metadata.name
      - path: replicas.desired
        value: "spec.replicas"
      - path: url
        value: "'http://' ~ metadata.name ~ '.' ~ metadata.namespace ~ '.svc'"
"#
    )
}

fn parent(resource: &ApiResource, ns: &str, name: &str, i: usize) -> DynamicObject {
    DynamicObject::new(name, resource).within(ns).data(json!({
        "spec": {
            "image": "nginx:1.27",
            "greeting": format!("hello from parent {i}"),
        }
    }))
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("app-{i:05}")).collect()
}

/// What one run measured.
struct Row {
    label: String,
    /// The bare client's run (the ratio's reference).
    bare: bool,
    converge: Duration,
    /// trellis's passes per parent until converge (every result of its
    /// `trellis_reconciles_total`).
    passes: Option<f64>,
    /// Requests until convergence: the operator's own (its
    /// `trellis_api_requests_total`); for the bare client the API server's
    /// less this program's parent creates.
    requests: Requests,
    /// The API server's count over the same window (trellis runs only), a
    /// cross-check: it also holds the controller manager's requests.
    server: Option<Requests>,
    /// Operator CPU during convergence (the bare client: this process's).
    cpu: f64,
    /// Operator peak RSS, kB (none for the bare client).
    peak_kb: Option<u64>,
    extra: Option<Extra>,
}

/// What only the operator runs measure.
struct Extra {
    startup: Duration,
    ready: Duration,
    /// The operator's requests from convergence until every parent is Ready.
    ready_transition: Requests,
    steady_secs: u64,
    steady: Requests,
    steady_server: Requests,
    steady_cpu: f64,
    shutdown: Duration,
    restart: Duration,
    restart_requests: Requests,
    edit: Duration,
    edit_requests: Requests,
    restart_peak_kb: u64,
}

fn main() {
    let sizes: Vec<usize> = match std::env::var("TRELLIS_BENCH_PARENTS") {
        Ok(_) => vec![env_number("TRELLIS_BENCH_PARENTS", 200) as usize],
        Err(_) => {
            let mut sizes = list("TRELLIS_BENCH_SIZES", "200,1000");
            if std::env::var("TRELLIS_BENCH_10K").as_deref() == Ok("1") {
                sizes.push("10000".to_owned());
            }
            sizes.iter().map(|s| s.parse().expect("a size")).collect()
        }
    };
    assert!(sizes.iter().all(|&n| n > 0), "sizes must be at least 1");
    let bare: Vec<(usize, bool)> = list("TRELLIS_BENCH_BARE", "1,16,64")
        .iter()
        .map(|c| {
            let (c, event) = match c.strip_suffix("+event") {
                Some(c) => (c, true),
                None => (c.as_str(), false),
            };
            (c.parse().expect("TRELLIS_BENCH_BARE: numbers"), event)
        })
        .collect();
    let settings: Vec<Setting> = list("TRELLIS_BENCH_TRELLIS", "default,64")
        .iter()
        .map(|s| Setting::parse(s))
        .collect();
    let rounds = env_number("TRELLIS_BENCH_ROUNDS", 1);
    let timeout = Duration::from_secs(env_number("TRELLIS_BENCH_TIMEOUT", 600));
    let steady = env_number("TRELLIS_BENCH_STEADY", 60);

    let binary = settings
        .iter()
        .any(|s| s.binary.is_none())
        .then(common::build_operator);
    let cluster = support::cluster();
    eprintln!("[load] cluster: {}", cluster.source);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let client = support::client().await;
        let group = format!("{}.bench.trellis.test", support::unique_name("load"));
        let kind = TestKind::in_group(&group, KIND);
        assert_eq!(kind.plural, PLURAL);
        let _crd = Cleanup::crds(&[&kind]);
        kind.install(&client).await;
        let mut tables = Vec::new();
        for &n in &sizes {
            let mut rows = Vec::new();
            for _ in 0..rounds {
                for &(c, event) in &bare {
                    rows.push(run_bare(&client, &kind, n, c, event).await);
                }
                for setting in &settings {
                    let binary = setting
                        .binary
                        .as_deref()
                        .or(binary.as_deref())
                        .expect("built");
                    rows.push(
                        run_trellis(binary, &client, &kind, n, setting, steady, timeout).await,
                    );
                }
            }
            let table = table(n, &rows, bare.len() + settings.len());
            println!("{table}");
            tables.push(table);
        }
        if tables.len() > 1 {
            println!("\n==== all sizes ====");
            for t in &tables {
                println!("{t}");
            }
        }
    });
}

/// One operator setting of `TRELLIS_BENCH_TRELLIS`.
struct Setting {
    /// `default` or a `--concurrency` value.
    concurrency: String,
    binary: Option<std::path::PathBuf>,
}

impl Setting {
    /// `64`, `default`, `64@/path/to/trellis`.
    fn parse(text: &str) -> Setting {
        let (concurrency, binary) = match text.split_once('@') {
            Some((c, b)) => (c, Some(std::path::PathBuf::from(b))),
            None => (text, None),
        };
        Setting {
            concurrency: concurrency.to_owned(),
            binary,
        }
    }

    /// The run's label and the operator's arguments.
    fn label_and_args(&self) -> (String, Vec<String>) {
        let binary = self
            .binary
            .as_ref()
            .and_then(|b| b.file_name())
            .map(|b| format!(" [{}]", b.to_string_lossy()))
            .unwrap_or_default();
        match self.concurrency.as_str() {
            "default" => (format!("trellis (defaults){binary}"), vec![]),
            c => (
                format!("trellis --concurrency {c}{binary}"),
                vec!["--concurrency".into(), c.into()],
            ),
        }
    }
}

fn list(var: &str, default: &str) -> Vec<String> {
    std::env::var(var)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// A created parent: its name, uid, and when its create returned.
type Created = (String, String, SystemTime);

/// Creates the parents `names` 32 at a time; each created parent goes to
/// `created`.
async fn create_parents(
    api: &Api<DynamicObject>,
    resource: &ApiResource,
    ns: &str,
    names: &[String],
    created: Option<tokio::sync::mpsc::UnboundedSender<Created>>,
) -> Result<(), kube::Error> {
    futures::stream::iter(names.iter().enumerate())
        .map(|(i, name)| {
            let obj = parent(resource, ns, name, i);
            let created = created.clone();
            async move {
                let made = api.create(&PostParams::default(), &obj).await?;
                if let Some(tx) = created {
                    let _ = tx.send((
                        made.name_any(),
                        made.uid().unwrap_or_default(),
                        SystemTime::now(),
                    ));
                }
                Ok::<_, kube::Error>(())
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await
        .map(|_| ())
}

/// Whether runs are traced (`TRELLIS_BENCH_TRACE=1`).
fn tracing() -> bool {
    std::env::var("TRELLIS_BENCH_TRACE").as_deref() == Ok("1")
}

// ---------------------------------------------------------------- bare client

/// The children a parent needs, as this workload's rule renders them.
fn bare_children(kind: &TestKind, ns: &str, name: &str, uid: &str) -> [(Value, &'static str); 3] {
    let owner = json!([{
        "apiVersion": kind.api_version(), "kind": KIND, "name": name, "uid": uid,
        "controller": true, "blockOwnerDeletion": true,
    }]);
    let meta = |child_name: String| {
        json!({"name": child_name, "namespace": ns, "ownerReferences": owner,
               "labels": {"app.kubernetes.io/managed-by": "bench-bare",
                          // As trellis labels its children: the bench's
                          // watches see the same events in both runs.
                          "trellis.dev/rule": RULE, "trellis.dev/parent-uid": uid}})
    };
    let labels = json!({"app.kubernetes.io/name": "loadapp", "app.kubernetes.io/instance": name});
    [
        (
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(format!("{name}-config")),
                   "data": {"greeting": format!("hello from {name}")}}),
            "config",
        ),
        (
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(name.to_owned()),
                   "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{
                                "name": "web", "image": "nginx:1.27",
                                "ports": [{"name": "http", "containerPort": 8080}],
                                "envFrom": [{"configMapRef": {"name": format!("{name}-config")}}]}]}}}}),
            "web",
        ),
        (
            json!({"apiVersion": "v1", "kind": "Service", "metadata": meta(name.to_owned()),
                   "spec": {"selector": labels,
                            "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}),
            "service",
        ),
    ]
}

/// One parent, the bare way: three applies, one status patch (and with
/// `event`, an Event sent in the background); each request's round trip.
async fn bare_parent(
    client: &Client,
    kind: &TestKind,
    ns: &str,
    name: String,
    uid: String,
    event: bool,
) -> Result<[Duration; 4], kube::Error> {
    let mut times = [Duration::ZERO; 4];
    let mut lap = Instant::now();
    let mut timed = |i: usize| {
        times[i] = lap.elapsed();
        lap = Instant::now();
    };
    let params = PatchParams::apply("bench-bare").force();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let [(cm, _), (deployment, _), (service, _)] = bare_children(kind, ns, &name, &uid);
    cms.patch(&format!("{name}-config"), &params, &Patch::Apply(&cm))
        .await?;
    timed(0);
    deployments
        .patch(&name, &params, &Patch::Apply(&deployment))
        .await?;
    timed(1);
    services
        .patch(&name, &params, &Patch::Apply(&service))
        .await?;
    timed(2);
    let parents: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &kind.resource);
    let now = "2026-12-01T00:00:00Z";
    let status = json!({"status": {
        "observedGeneration": 1,
        "configMap": format!("{name}-config"),
        "service": name,
        "replicas": {"desired": 0},
        "url": format!("http://{name}.{ns}.svc"),
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "ChildrenReady", "lastTransitionTime": now, "observedGeneration": 1},
            {"type": "Synced", "status": "True", "reason": "Synced", "lastTransitionTime": now, "observedGeneration": 1},
        ],
    }});
    let written = parents
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    timed(3);
    if event {
        let recorder = kube::runtime::events::Recorder::new(
            client.clone(),
            kube::runtime::events::Reporter {
                controller: "bench-bare".into(),
                instance: None,
            },
        );
        let reference = written.object_ref(&kind.resource);
        tokio::spawn(async move {
            let event = kube::runtime::events::Event {
                type_: kube::runtime::events::EventType::Normal,
                reason: "Created".into(),
                note: Some("created 3 objects".into()),
                action: "Reconcile".into(),
                secondary: None,
            };
            if let Err(e) = recorder.publish(&event, &reference).await {
                eprintln!("[load] bare event: {e}");
            }
        });
    }
    Ok(times)
}

async fn run_bare(
    client: &Client,
    kind: &TestKind,
    n: usize,
    concurrency: usize,
    event: bool,
) -> Row {
    let label = format!(
        "bare client c={concurrency}{}",
        if event { " + Event" } else { "" }
    );
    eprintln!("[load] {n} parents: {label}");
    let ns = support::namespace_for("bench-bare").await;
    let ns_name = ns.name.clone();
    let parents: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns_name, &kind.resource);
    let all = names(n);
    // The same watches as in trellis's runs, so that the API server serves
    // the same watchers in both.
    let observer = Observer::start(client, &ns_name, &kind.resource).await;
    let before = Requests::scrape(client).await;
    let cpu_before = common::proc_cpu_seconds(std::process::id()).unwrap_or(0.0);
    let start = Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let creating = create_parents(&parents, &kind.resource, &ns_name, &all, Some(tx));
    let created = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let working = created
        .map(|(name, uid, created)| {
            let ns = &ns_name;
            async move {
                let started = SystemTime::now();
                let requests = bare_parent(client, kind, ns, name, uid, event).await?;
                Ok::<_, kube::Error>(trace::BareTimes {
                    created,
                    started,
                    requests,
                })
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<trace::BareTimes>>();
    let (made, worked) = tokio::join!(creating, working);
    made.unwrap_or_else(|e| panic!("{label}: creating parents: {e}"));
    let worked = worked.unwrap_or_else(|e| panic!("{label}: {e}"));
    assert_eq!(worked.len(), n, "{label}: every parent handled");
    let converge = start.elapsed();
    let cpu = common::proc_cpu_seconds(std::process::id()).unwrap_or(0.0) - cpu_before;
    let wanted: HashSet<String> = all.iter().cloned().collect();
    let seen = observer.progress(&wanted);
    eprintln!(
        "[load] {label}: the watches saw {} of {n} parents synced when the last write returned",
        seen.synced
    );
    drop(observer);
    let mut requests = Requests::scrape(client).await.since(&before).on(RESOURCES);
    requests.minus("POST", PLURAL, n as u64);
    eprintln!(
        "[load] {label}: {:.2} s; {}",
        converge.as_secs_f64(),
        requests.describe()
    );
    if tracing() {
        eprintln!("{}", trace::bare(&worked));
    }
    delete_namespace(client, ns).await;
    Row {
        label,
        bare: !event,
        converge,
        passes: None,
        requests,
        server: None,
        cpu,
        peak_kb: None,
        extra: None,
    }
}

// -------------------------------------------------------------------- trellis

/// Where the parents of one run stand, as the bench's watches see them.
struct Progress {
    /// Parents with their 3 children and a status for their generation.
    synced: usize,
    /// Of those, parents also `Ready=True`.
    ready: usize,
    children: [usize; 3],
    laggard: Option<String>,
}

/// One parent as last seen.
struct ParentSeen {
    uid: String,
    synced: bool,
    ready: bool,
    status: Value,
}

/// What the bench's watches have seen in the run's namespace. Watches, not
/// polls: LISTing every child kind every 200 ms loads the API server during
/// trellis's runs only (the bare client needs no polling), and at 1,000
/// parents that load is no longer small. A watch is served from the API
/// server's watch cache and costs about what trellis's own watches cost.
#[derive(Default)]
struct Seen {
    parents: HashMap<String, ParentSeen>,
    /// Per child kind (config, web, service): child name → the parent uid
    /// its `trellis.dev/parent-uid` label names.
    children: [HashMap<String, String>; 3],
    /// ConfigMap name → its `edition` key (the rule edit).
    editions: HashMap<String, String>,
    /// Parent name → when its watch first showed it synced (the trace).
    synced_at: HashMap<String, SystemTime>,
}

/// The watches feeding a [`Seen`]; stopped when dropped.
struct Observer {
    seen: Arc<Mutex<Seen>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Observer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn parent_uid_label(meta: &kube::core::ObjectMeta) -> String {
    meta.labels
        .as_ref()
        .and_then(|l| l.get("trellis.dev/parent-uid"))
        .cloned()
        .unwrap_or_default()
}

/// Runs one watch, calling `seen_apply` / `seen_delete` on each event; the
/// first complete list is reported on `listed`.
fn spawn_watch<K>(
    api: Api<K>,
    config: watcher::Config,
    seen: Arc<Mutex<Seen>>,
    listed: tokio::sync::mpsc::UnboundedSender<()>,
    on_apply: fn(&mut Seen, K),
    on_delete: fn(&mut Seen, K),
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, config).default_backoff());
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    on_apply(&mut seen.lock().expect("seen"), o)
                }
                Ok(watcher::Event::Delete(o)) => on_delete(&mut seen.lock().expect("seen"), o),
                Ok(watcher::Event::InitDone) => {
                    let _ = listed.send(());
                }
                Ok(watcher::Event::Init) => {}
                Err(e) => eprintln!("[load] watch failed (retrying): {e}"),
            }
        }
    })
}

fn child_apply<const I: usize, K: kube::Resource>(seen: &mut Seen, o: K) {
    let name = o.meta().name.clone().unwrap_or_default();
    seen.children[I].insert(name, parent_uid_label(o.meta()));
}

fn child_delete<const I: usize, K: kube::Resource>(seen: &mut Seen, o: K) {
    seen.children[I].remove(o.meta().name.as_deref().unwrap_or_default());
}

impl Observer {
    /// Starts the watches on `ns` and returns once each has listed.
    async fn start(client: &Client, ns: &str, resource: &ApiResource) -> Observer {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (tx, mut listed) = tokio::sync::mpsc::unbounded_channel();
        let by_rule = watcher::Config::default().labels(&format!("trellis.dev/rule={RULE}"));
        let parents: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, resource);
        let parent_watch = {
            let (seen, tx) = (seen.clone(), tx.clone());
            tokio::spawn(async move {
                let mut events =
                    std::pin::pin!(watcher(parents, watcher::Config::default()).default_backoff());
                while let Some(event) = events.next().await {
                    match event {
                        Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                            let synced = parent_synced(&o);
                            let mut seen = seen.lock().expect("seen");
                            if synced {
                                seen.synced_at
                                    .entry(o.name_any())
                                    .or_insert_with(SystemTime::now);
                            }
                            let state = ParentSeen {
                                uid: o.metadata.uid.clone().unwrap_or_default(),
                                synced,
                                ready: synced && condition_true(&o, "Ready"),
                                status: o.data.get("status").cloned().unwrap_or(Value::Null),
                            };
                            seen.parents.insert(o.name_any(), state);
                        }
                        Ok(watcher::Event::Delete(o)) => {
                            seen.lock().expect("seen").parents.remove(&o.name_any());
                        }
                        Ok(watcher::Event::InitDone) => {
                            let _ = tx.send(());
                        }
                        Ok(watcher::Event::Init) => {}
                        Err(e) => eprintln!("[load] parent watch failed (retrying): {e}"),
                    }
                }
            })
        };
        let config = spawn_watch(
            Api::<ConfigMap>::namespaced(client.clone(), ns),
            by_rule.clone(),
            seen.clone(),
            tx.clone(),
            |seen, cm: ConfigMap| {
                let name = cm.name_any();
                if let Some(e) = cm.data.as_ref().and_then(|d| d.get("edition")) {
                    seen.editions.insert(name.clone(), e.clone());
                }
                seen.children[0].insert(name, parent_uid_label(&cm.metadata));
            },
            child_delete::<0, ConfigMap>,
        );
        let web = spawn_watch(
            Api::<Deployment>::namespaced(client.clone(), ns),
            by_rule.clone(),
            seen.clone(),
            tx.clone(),
            child_apply::<1, Deployment>,
            child_delete::<1, Deployment>,
        );
        let service = spawn_watch(
            Api::<Service>::namespaced(client.clone(), ns),
            by_rule,
            seen.clone(),
            tx,
            child_apply::<2, Service>,
            child_delete::<2, Service>,
        );
        for _ in 0..4 {
            listed.recv().await;
        }
        Observer {
            seen,
            tasks: vec![parent_watch, config, web, service],
        }
    }

    fn progress(&self, names: &HashSet<String>) -> Progress {
        let seen = self.seen.lock().expect("seen");
        let uids: Vec<HashSet<&str>> = seen
            .children
            .iter()
            .map(|c| c.values().map(String::as_str).collect())
            .collect();
        let mut progress = Progress {
            synced: 0,
            ready: 0,
            children: [uids[0].len(), uids[1].len(), uids[2].len()],
            laggard: None,
        };
        for name in names {
            let Some(p) = seen.parents.get(name) else {
                if progress.laggard.is_none() {
                    progress.laggard = Some(format!("{name} (not seen)"));
                }
                continue;
            };
            let has = |i: usize| uids[i].contains(p.uid.as_str());
            let synced = p.synced && has(0) && has(1) && has(2);
            let ready = synced && p.ready;
            progress.synced += usize::from(synced);
            progress.ready += usize::from(ready);
            if !ready && progress.laggard.is_none() {
                progress.laggard = Some(format!(
                    "{name} (children: config={} web={} service={}; status: {})",
                    has(0),
                    has(1),
                    has(2),
                    p.status
                ));
            }
        }
        progress
    }

    /// ConfigMaps whose `edition` key is `edition`.
    fn carrying(&self, edition: &str) -> usize {
        let seen = self.seen.lock().expect("seen");
        seen.editions.values().filter(|e| *e == edition).count()
    }
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

fn parent_synced(obj: &DynamicObject) -> bool {
    let name = obj.name_any();
    let s = &obj.data["status"];
    let observed = s["observedGeneration"].as_i64();
    condition_true(obj, "Synced")
        && observed.is_some()
        && observed == obj.metadata.generation
        && s["configMap"] == json!(format!("{name}-config"))
        && s["service"] == json!(name)
}

/// Requests counted at one moment: the operator's own and the API server's.
#[derive(Clone)]
struct Counts {
    operator: Requests,
    server: Requests,
}

impl Counts {
    async fn take(op: &OperatorProcess, client: &Client) -> Counts {
        Counts {
            operator: op.requests().await.unwrap_or_default(),
            server: Requests::scrape(client).await,
        }
    }

    /// What happened between `before` and `self`, on the workload's resources.
    fn since(&self, before: &Counts) -> Counts {
        Counts {
            operator: self.operator.since(&before.operator).on(RESOURCES),
            server: self.server.since(&before.server).on(RESOURCES),
        }
    }
}

/// Waits until every parent of `names` is synced, then ready, counting
/// requests at both moments: the times since `start` and the counts since
/// `before`.
#[allow(clippy::too_many_arguments)]
async fn converge(
    op: &mut OperatorProcess,
    client: &Client,
    observer: &Observer,
    names: &HashSet<String>,
    start: Instant,
    timeout: Duration,
    before: &Counts,
    until_ready: bool,
) -> (Duration, Counts, Duration, Counts) {
    let n = names.len();
    let mut synced: Option<(Duration, Counts)> = None;
    let mut last_report = Instant::now();
    loop {
        op.check_running();
        let progress = observer.progress(names);
        if synced.is_none() && progress.synced == n {
            let at = start.elapsed();
            let counts = Counts::take(op, client).await.since(before);
            if !until_ready {
                return (at, counts.clone(), at, counts);
            }
            synced = Some((at, counts));
        }
        if progress.ready == n {
            let at = start.elapsed();
            let counts = Counts::take(op, client).await.since(before);
            let (synced_at, synced_counts) = synced.unwrap_or_else(|| (at, counts.clone()));
            return (synced_at, synced_counts, at, counts);
        }
        if start.elapsed() > timeout {
            op.fail(&format!(
                "timed out after {timeout:?}: {}/{n} synced, {} ready, children {:?}; e.g. {}",
                progress.synced,
                progress.ready,
                progress.children,
                progress.laggard.unwrap_or_default()
            ));
        }
        if last_report.elapsed() >= Duration::from_secs(5) {
            last_report = Instant::now();
            eprintln!(
                "[load] {:>6.1} s: {}/{n} synced, {} ready, children {:?}, RSS {:.1} MiB",
                start.elapsed().as_secs_f64(),
                progress.synced,
                progress.ready,
                progress.children,
                mib(common::proc_status_kb(op.pid(), "VmRSS").unwrap_or(0))
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_trellis(
    binary: &Path,
    client: &Client,
    kind: &TestKind,
    n: usize,
    setting: &Setting,
    steady_secs: u64,
    timeout: Duration,
) -> Row {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let (label, args) = setting.label_and_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let run_name = format!("load-{n}-{}-{run}", setting.concurrency);
    let converge_only = std::env::var("TRELLIS_BENCH_CONVERGE_ONLY").as_deref() == Ok("1");
    let env: &[(&str, &str)] = if tracing() {
        &[("RUST_LOG", trace::OPERATOR_LOG)]
    } else {
        &[]
    };
    eprintln!("[load] {n} parents: {label}");
    let ns = support::namespace_for("bench-trellis").await;
    let ns_name = ns.name.clone();
    let resource = &kind.resource;
    let parents: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns_name, resource);
    let dir = tempfile::Builder::new()
        .prefix("trellis-bench-load-")
        .tempdir()
        .expect("temp dir");
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).expect("rules dir");
    let rule_file = rules.join("load.yaml");
    std::fs::write(&rule_file, rule(&kind.group, None)).expect("writing the rule");
    let observer = Observer::start(client, &ns_name, resource).await;

    // A probe parent converges before timing starts: the operator's
    // start-up (discovery, watches, caches) is not the load.
    parents
        .create(
            &PostParams::default(),
            &parent(resource, &ns_name, "probe", 0),
        )
        .await
        .unwrap_or_else(|e| panic!("creating the probe parent: {e}"));
    let spawned = Instant::now();
    let mut op = OperatorProcess::start_with_env(binary, &run_name, &rules, &ns_name, &args, env);
    let pid = op.pid();
    let probe = HashSet::from(["probe".to_owned()]);
    let zero = Counts {
        operator: Requests::default(),
        server: Requests::default(),
    };
    converge(
        &mut op,
        client,
        &observer,
        &probe,
        spawned,
        Duration::from_secs(60),
        &zero,
        true,
    )
    .await;
    let startup = spawned.elapsed();

    // The load.
    let all = names(n);
    let wanted: HashSet<String> = all.iter().cloned().collect();
    let before = Counts::take(&op, client).await;
    let passes_before = reconciles(&op).await;
    let cpu_before = common::proc_cpu_seconds(pid).unwrap_or(0.0);
    let start = Instant::now();
    let (created_tx, mut created_rx) = tokio::sync::mpsc::unbounded_channel();
    if let Err(e) = create_parents(&parents, resource, &ns_name, &all, Some(created_tx)).await {
        op.fail(&format!("creating parents: {e}"));
    }
    let (synced, mut at_synced, ready, mut at_ready) = converge(
        &mut op,
        client,
        &observer,
        &wanted,
        start,
        timeout,
        &before,
        !converge_only,
    )
    .await;
    let cpu = common::proc_cpu_seconds(pid).unwrap_or(0.0) - cpu_before;
    let passes = (reconciles(&op).await - passes_before) / n as f64;
    let mut created = HashMap::new();
    while let Ok((name, _, at)) = created_rx.try_recv() {
        created.insert(name, at);
    }
    at_synced.server.minus("POST", PLURAL, n as u64);
    at_ready.server.minus("POST", PLURAL, n as u64);
    let peak_kb = common::proc_status_kb(pid, "VmHWM").unwrap_or(0);
    eprintln!(
        "[load] {label}: synced {:.2} s, ready {:.2} s; operator to synced: {}; API server to synced: {}",
        synced.as_secs_f64(),
        ready.as_secs_f64(),
        at_synced.operator.describe(),
        at_synced.server.describe(),
    );
    let ready_transition = at_ready.operator.since(&at_synced.operator);
    if tracing() {
        // The last pass lines reach the log file.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let synced_at = observer.seen.lock().expect("seen").synced_at.clone();
        eprintln!("{}", trace::trellis(&op.log, &created, &synced_at));
    }
    let row = Row {
        label: label.clone(),
        bare: false,
        converge: synced,
        passes: Some(passes),
        requests: at_synced.operator,
        server: Some(at_synced.server),
        cpu,
        peak_kb: Some(peak_kb),
        extra: None,
    };
    if converge_only {
        let (_, exit) = op.terminate();
        if !exit.success() {
            op.fail(&format!("the operator exited with {exit} after SIGTERM"));
        }
        drop(op);
        drop(observer);
        delete_namespace(client, ns).await;
        return row;
    }

    // Steady state: nothing changes.
    let steady_before = Counts::take(&op, client).await;
    let steady_cpu_before = common::proc_cpu_seconds(pid).unwrap_or(0.0);
    tokio::time::sleep(Duration::from_secs(steady_secs)).await;
    op.check_running();
    let steady_cpu = common::proc_cpu_seconds(pid).unwrap_or(0.0) - steady_cpu_before;
    let steady = Counts::take(&op, client).await.since(&steady_before);
    eprintln!(
        "[load] {label}: steady {steady_secs} s: operator {}; API server {}",
        steady.operator.describe(),
        steady.server.describe()
    );

    // Restart: everything is converged; a new process should find nothing to do.
    let (shutdown, exit) = op.terminate();
    if !exit.success() {
        op.fail(&format!("the operator exited with {exit} after SIGTERM"));
    }
    drop(op);
    let restarted = Instant::now();
    let mut op = OperatorProcess::start(
        binary,
        &format!("{run_name}-restart"),
        &rules,
        &ns_name,
        &args,
    );
    let sampler = RssSampler::start(op.pid());
    let passes = (n + 1) as f64;
    let restart = loop {
        op.check_running();
        if op
            .metric("trellis_reconciles", &["result=\"ok\""])
            .await
            .is_some_and(|done| done >= passes)
        {
            break restarted.elapsed();
        }
        if restarted.elapsed() > timeout {
            op.fail("the restarted operator did not pass over every parent");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    // A new process: its counters hold everything it sent.
    let restart_requests = op.requests().await.unwrap_or_default().on(RESOURCES);
    eprintln!(
        "[load] {label}: restart {:.2} s; {}",
        restart.as_secs_f64(),
        restart_requests.describe()
    );

    // A rule edit that touches every parent's ConfigMap.
    let before_edit = Counts::take(&op, client).await;
    let edited = Instant::now();
    std::fs::write(&rule_file, rule(&kind.group, Some(2))).expect("editing the rule");
    let edit = loop {
        op.check_running();
        let done = observer.carrying("2");
        if done == n + 1 {
            break edited.elapsed();
        }
        if edited.elapsed() > timeout {
            op.fail(&format!(
                "after the rule edit only {done}/{} ConfigMaps carry it",
                n + 1
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The status writes and Events that follow the edit, too.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let edit_requests = Counts::take(&op, client).await.since(&before_edit).operator;
    eprintln!(
        "[load] {label}: rule edit {:.2} s; {}",
        edit.as_secs_f64(),
        edit_requests.describe()
    );
    let (_, exit) = op.terminate();
    if !exit.success() {
        op.fail(&format!(
            "the restarted operator exited with {exit} after SIGTERM"
        ));
    }
    let restart_peak_kb = sampler.finish();
    drop(op);
    drop(observer);
    delete_namespace(client, ns).await;
    Row {
        extra: Some(Extra {
            startup,
            ready,
            ready_transition,
            steady_secs,
            steady: steady.operator,
            steady_server: steady.server,
            steady_cpu,
            shutdown,
            restart,
            restart_requests,
            edit,
            edit_requests,
            restart_peak_kb,
        }),
        ..row
    }
}

/// Every pass the operator has run, whatever its result.
async fn reconciles(op: &OperatorProcess) -> f64 {
    op.metric("trellis_reconciles", &[]).await.unwrap_or(0.0)
}

// ---------------------------------------------------------------------- table

/// Child writes, status writes and Event writes in `q`.
fn writes(q: &Requests) -> (u64, u64, u64) {
    let children = q.on(&["configmaps", "services", "deployments"]);
    let child = children.of_verb("POST") + children.of_verb("APPLY") + children.of_verb("PATCH");
    let status = q.on(&[PLURAL]);
    let status = status.of_verb("PATCH") + status.of_verb("APPLY") + status.of_verb("PUT");
    let events = q.on(&["events"]);
    let events = events.of_verb("POST") + events.of_verb("PATCH");
    (child, status, events)
}

/// The table of one size; `round` rows make one round (xbare compares a
/// row with the best bare client of its own round).
fn table(n: usize, rows: &[Row], round: usize) -> String {
    use std::fmt::Write;
    let best_of_round = |i: usize| {
        let start = i / round.max(1) * round.max(1);
        rows[start..rows.len().min(start + round.max(1))]
            .iter()
            .filter(|r| r.bare)
            .map(|r| r.converge)
            .min()
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{n} parents x 3 children (ConfigMap, Deployment, Service, replicas 0); trellis's requests from its own trellis_api_requests_total, the bare client's from the API server's metrics"
    );
    let _ = writeln!(
        out,
        "{:<40} {:>9} {:>6} {:>8} {:>7} {:>7} {:>6} {:>5} {:>5} {:>14} {:>7} {:>9}",
        "run",
        "converge",
        "xbare",
        "passes/p",
        "child-w",
        "status",
        "events",
        "GET",
        "LIST",
        "Ready +st/+ev",
        "CPU s",
        "peak RSS"
    );
    for (i, r) in rows.iter().enumerate() {
        let ratio = best_of_round(i)
            .map(|b| format!("{:.2}", r.converge.as_secs_f64() / b.as_secs_f64()))
            .unwrap_or_else(|| "-".into());
        let q = &r.requests;
        let (child_writes, status_writes, event_writes) = writes(q);
        let ready = r
            .extra
            .as_ref()
            .map(|x| {
                let (_, s, e) = writes(&x.ready_transition);
                format!("+{s}/+{e} {:.0}s", x.ready.as_secs_f64())
            })
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "{:<40} {:>8.2}s {:>6} {:>8} {:>7} {:>7} {:>6} {:>5} {:>5} {:>14} {:>7.2} {:>9}",
            r.label,
            r.converge.as_secs_f64(),
            ratio,
            r.passes
                .map(|p| format!("{p:.2}"))
                .unwrap_or_else(|| "-".into()),
            child_writes,
            status_writes,
            event_writes,
            q.of_verb("GET"),
            q.of_verb("LIST"),
            ready,
            r.cpu,
            r.peak_kb
                .map(|kb| format!("{:.1} MiB", mib(kb)))
                .unwrap_or_else(|| "-".into()),
        );
    }
    let _ = writeln!(
        out,
        "(converge: every parent has its children and a status for its generation; child-w: POST/APPLY/PATCH on \
         ConfigMaps, Deployments, Services; status: writes on the parents; events: Event writes; all until converge. \
         Ready +st/+ev: status and Event writes after converge until every parent is Ready (the controller manager \
         marks the Deployments available), and when that was. The bare client writes Ready at once. \
         xbare: converge / the best bare client's of the same round. passes/p: trellis's passes per parent until converge.)"
    );
    let _ = writeln!(out, "requests until converge, by verb and resource:");
    for r in rows {
        let _ = writeln!(out, "  {:<40} {}", r.label, r.requests.describe());
        if let Some(server) = &r.server {
            let _ = writeln!(
                out,
                "  {:<40} {}",
                "  (API server's count)",
                server.describe()
            );
        }
    }
    for r in rows {
        let Some(x) = &r.extra else { continue };
        let per_minute = x.steady.total() as f64 * 60.0 / x.steady_secs as f64;
        let _ = writeln!(out, "{}:", r.label);
        let _ = writeln!(
            out,
            "  start-up {:.2} s (spawn to a probe parent synced); all Ready=True {:.2} s after the first create; Ready transition: {}",
            x.startup.as_secs_f64(),
            x.ready.as_secs_f64(),
            x.ready_transition.describe()
        );
        let _ = writeln!(
            out,
            "  steady state {} s: {:.1} requests/min ({} writes), operator CPU {:.2} s: {}; the API server counted {} (others' included)",
            x.steady_secs,
            per_minute,
            x.steady.writes(),
            x.steady_cpu,
            x.steady.describe(),
            x.steady_server.describe()
        );
        let _ = writeln!(
            out,
            "  restart: SIGTERM exit {:.2} s; new process passed every parent after {:.2} s; {} writes, {} requests: {}",
            x.shutdown.as_secs_f64(),
            x.restart.as_secs_f64(),
            x.restart_requests.writes(),
            x.restart_requests.total(),
            x.restart_requests.describe()
        );
        let _ = writeln!(
            out,
            "  rule edit: every ConfigMap carries it after {:.2} s; {} writes: {}",
            x.edit.as_secs_f64(),
            x.edit_requests.writes(),
            x.edit_requests.describe()
        );
        let _ = writeln!(
            out,
            "  restarted process peak RSS (sampled) {:.1} MiB",
            mib(x.restart_peak_kb)
        );
    }
    out
}
