//! Sharded replicas under load: `trellis run --leader-elect --shards` with
//! 1, 2, 3... replicas (release binary, processes of their own) on N
//! parents of one custom kind, each owning one ConfigMap. Per run: the
//! time until the ring settles, converge time (first create → every parent
//! has its ConfigMap and a status for its generation), a rule edit touching
//! every ConfigMap, and per replica the buckets it holds, its peak RSS
//! (VmHWM), CPU and the writes it sent. With the most replicas, two
//! disruptions follow: a replica SIGKILLed mid-edit, and a replica added
//! mid-edit.
//!
//! Run: `cargo bench --bench shards` (prints tables; fails only when
//! something does not converge, a replica misbehaves, or a child is
//! written more than once for one change).
//!
//! Environment:
//! * `TRELLIS_BENCH_PARENTS`: parents per run (default 1000).
//! * `TRELLIS_BENCH_REPLICAS`: replica counts, one run each (default `1,2,3`).
//! * `TRELLIS_BENCH_DISRUPT`: the replica count whose run also does the
//!   SIGKILL and join edits (default: the largest of `TRELLIS_BENCH_REPLICAS`
//!   when at least 2; `0`: none).
//! * `TRELLIS_BENCH_KILL`: `member` (default: a replica that is not the
//!   leader) or `leader`.
//! * `TRELLIS_BENCH_TIMEOUT`: seconds allowed for each phase (default 600).
//! * `TRELLIS_BENCH_EDIT=0`: converge only (no rule edit, no disruption):
//!   for sizes where one phase is all the time there is (100,000 parents).
//! * `TRELLIS_BENCH_RESTART=0`: no restart phase. By default every run
//!   ends by restarting its first replica over the converged parents
//!   (SIGTERM, started again): the peak of its initial list and passes, and
//!   of the other replicas' relists, against the steady size before; no
//!   write expected.
//! * `TRELLIS_BENCH_AUDIT=0`: count writes by the replicas' own counters
//!   only. The test cluster's audit log rotates at 200 MB keeping one
//!   backup, so a phase of several hundred thousand writes (100,000
//!   parents) outgrows what it keeps and would be undercounted.
//! * `TRELLIS_BENCH_BINARY`: an operator binary instead of building this
//!   checkout's.
//!
//! Writes are counted twice: by each replica's own
//! `trellis_api_requests_total` (a SIGKILLed replica's as read just before
//! the kill), and by the API server's audit log (`tests/cluster/cluster`
//! keeps one when the cluster has a node), per ConfigMap, which also holds
//! requests in flight when a replica was killed. A **duplicate** is a write
//! the API server accepted beyond one per changed child (two replicas wrote
//! the same parent, or one wrote twice): it is printed and fails the bench.
//! A write refused because its sender was killed mid-request (504) is
//! counted apart. Without an audit log, any write beyond one per changed
//! child by the replicas' own counts fails the bench.
//! Lease timings are short (4 s / 3 s / 1 s, as the tests use) so that a
//! SIGKILL's handover takes seconds; the defaults would take about 30 s.
//! The machine's load average is printed beside each phase.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

#[path = "shards/disrupt.rs"]
mod disrupt;
#[path = "shards/observe.rs"]
mod observe;
#[path = "shards/report.rs"]
mod report;
#[path = "shards/restart.rs"]
mod restart;
#[path = "shards/ring.rs"]
mod ring;

use std::path::Path;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::json;

use common::{audit, delete_namespace, env_number, load_average, mib};
use observe::Observer;
use ring::{Counters, Replica};
use support::operator::TestKind;

const RULE: &str = "shards";
const KIND: &str = "ShardApp";
const PLURAL: &str = "shardapps";
const CREATE_CONCURRENCY: usize = 32;
/// Resources whose writes are counted.
const RESOURCES: &[&str] = &["configmaps", "events", PLURAL];

/// One ConfigMap per parent carrying the parent's `spec.v` and the rule's
/// `edition` (what an edit changes); the status mirrors `spec.v`.
fn rule(group: &str, edition: u32) -> String {
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
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{{{ parent.metadata.name ~ "-config" }}}}
        data:
          v: {{{{ spec.v }}}}
          edition: "{edition}"
  status:
    fields:
      - path: v
        value: "spec.v"
"#
    )
}

struct Settings {
    parents: usize,
    replicas: Vec<usize>,
    disrupt: usize,
    kill_leader: bool,
    timeout: Duration,
    edit: bool,
    audit: bool,
    restart: bool,
}

fn settings() -> Settings {
    let replicas: Vec<usize> = std::env::var("TRELLIS_BENCH_REPLICAS")
        .unwrap_or_else(|_| "1,2,3".to_owned())
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse()
                .unwrap_or_else(|e| panic!("TRELLIS_BENCH_REPLICAS: {s:?}: {e}"))
        })
        .collect();
    assert!(
        !replicas.is_empty() && replicas.iter().all(|&r| r > 0),
        "TRELLIS_BENCH_REPLICAS: replica counts of at least 1"
    );
    let largest = replicas.iter().copied().max().unwrap_or(1);
    let disrupt = env_number(
        "TRELLIS_BENCH_DISRUPT",
        if largest >= 2 { largest as u64 } else { 0 },
    ) as usize;
    assert!(
        disrupt == 0 || (disrupt >= 2 && replicas.contains(&disrupt)),
        "TRELLIS_BENCH_DISRUPT={disrupt}: 0, or one of TRELLIS_BENCH_REPLICAS of at least 2"
    );
    let kill_leader = match std::env::var("TRELLIS_BENCH_KILL").as_deref() {
        Ok("leader") => true,
        Ok("member") | Err(_) => false,
        Ok(other) => panic!("TRELLIS_BENCH_KILL={other:?}: member or leader"),
    };
    Settings {
        parents: env_number("TRELLIS_BENCH_PARENTS", 1000) as usize,
        replicas,
        disrupt,
        kill_leader,
        timeout: Duration::from_secs(env_number("TRELLIS_BENCH_TIMEOUT", 600)),
        edit: env_number("TRELLIS_BENCH_EDIT", 1) != 0,
        audit: env_number("TRELLIS_BENCH_AUDIT", 1) != 0,
        restart: env_number("TRELLIS_BENCH_RESTART", 1) != 0,
    }
}

fn main() {
    let settings = settings();
    let binary = common::build_operator();
    let runs = common::on_a_kind("shards", KIND, PLURAL, |client, kind| async move {
        let mut runs = Vec::new();
        for &r in &settings.replicas {
            let run = run(&binary, &client, &kind, &settings, r).await;
            println!("{}", run.report());
            runs.push(run);
        }
        runs
    });
    println!("{}", report::summary(&runs));
    let problems: Vec<String> = runs
        .iter()
        .flat_map(|r| {
            r.problems
                .iter()
                .map(move |p| format!("{} replicas: {p}", r.replicas))
        })
        .collect();
    assert!(
        problems.is_empty(),
        "the sharded runs misbehaved:\n{}",
        problems.join("\n")
    );
}

// ------------------------------------------------------------------ phases

/// One phase's figures.
struct Phase {
    what: &'static str,
    took: Duration,
    /// What else happened (the kill, the join), in words.
    detail: String,
    load_before: String,
    load_after: String,
    /// Per replica: name and what it did during the phase.
    done: Vec<(String, Counters)>,
    /// Children whose content changed: one write each.
    expected: u64,
    audit: Option<audit::Writes>,
}

impl Phase {
    fn operator_child_writes(&self) -> u64 {
        self.done.iter().map(|(_, c)| c.child_writes()).sum()
    }

    /// Writes beyond one per changed child by the replicas' own counts
    /// (these include writes a SIGKILLed replica had in flight, which the API
    /// server may have refused), and the **duplicates**: children the API
    /// server accepted more than one write for, by its audit log (when
    /// there is one).
    fn duplicates(&self) -> (i64, Option<u64>) {
        let extra = self.operator_child_writes() as i64 - self.expected as i64;
        (extra, self.audit.as_ref().map(audit::Writes::repeated))
    }

    fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let (extra, repeated) = self.duplicates();
        match (repeated, &self.audit) {
            (Some(n), Some(a)) if n > 0 => {
                let twice: Vec<String> = a
                    .ok_by_name
                    .iter()
                    .filter(|(_, c)| **c > 1)
                    .take(5)
                    .map(|(name, c)| format!("{name} x{c}"))
                    .collect();
                out.push(format!(
                    "{}: the API server accepted {n} writes beyond one per changed child \
                     ({} writes on {} ConfigMaps for {} changed children, {} refused; e.g. {})",
                    self.what,
                    a.total(),
                    a.by_name.len(),
                    self.expected,
                    a.refused,
                    twice.join(", ")
                ));
            }
            // Without an audit log, the replicas' own count is all there is.
            (None, _) if extra != 0 => out.push(format!(
                "{}: the replicas counted {} child writes for {} changed children",
                self.what,
                self.operator_child_writes(),
                self.expected
            )),
            _ => {}
        }
        out
    }
}

/// Counters and marks at a phase's start.
struct Start {
    at: Instant,
    counters: Vec<Counters>,
    audit: Option<audit::Mark>,
    load: String,
}

async fn begin(replicas: &mut [Replica], audit: bool) -> Start {
    let mut counters = Vec::new();
    for r in replicas.iter_mut() {
        counters.push(r.counters().await);
    }
    Start {
        at: Instant::now(),
        counters,
        audit: if audit { audit::mark() } else { None },
        load: load_average(),
    }
}

/// Ends a phase once the replicas' writes have stopped moving (and the
/// audit log has caught up).
async fn finish(
    replicas: &mut [Replica],
    start: Start,
    ns: &str,
    what: &'static str,
    took: Duration,
    expected: u64,
    detail: String,
) -> Phase {
    let load_after = load_average();
    ring::wait_quiet(
        replicas,
        RESOURCES,
        Duration::from_secs(3),
        Duration::from_secs(60),
    )
    .await;
    let mut done = Vec::new();
    for (i, r) in replicas.iter_mut().enumerate() {
        let before = start.counters.get(i).cloned().unwrap_or_default();
        done.push((r.name.clone(), r.counters().await.since(&before)));
    }
    let audit = start
        .audit
        .as_ref()
        .map(|m| audit::writes_since(m, ns, "configmaps", |name| name.ends_with("-config")));
    Phase {
        what,
        took,
        detail,
        load_before: start.load,
        load_after,
        done,
        expected,
        audit,
    }
}

/// Fails the run with `what` and the first replica's log tail.
fn fail(replicas: &mut [Replica], what: &str) -> ! {
    match replicas.iter_mut().find(|r| r.alive) {
        Some(r) => r.op.fail(what),
        None => panic!("{what}"),
    }
}

/// Waits until at least `want` ConfigMaps carry `edition`.
async fn wait_carrying(
    replicas: &mut [Replica],
    observer: &Observer,
    edition: u32,
    want: usize,
    since: Instant,
    timeout: Duration,
) -> Duration {
    let edition = edition.to_string();
    let mut reported = Instant::now();
    loop {
        let done = observer.carrying(&edition);
        if done >= want {
            return since.elapsed();
        }
        for r in replicas.iter_mut().filter(|r| r.alive) {
            r.op.check_running();
        }
        if since.elapsed() > timeout {
            let laggard = observer.not_carrying(&edition).unwrap_or_default();
            fail(
                replicas,
                &format!(
                    "edition {edition}: {done}/{want} ConfigMaps after {timeout:?}; e.g. {laggard}"
                ),
            );
        }
        if reported.elapsed() > Duration::from_secs(5) {
            reported = Instant::now();
            eprintln!(
                "[shards] {:>6.1} s: {done}/{want} ConfigMaps carry edition {edition}",
                since.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// --------------------------------------------------------------------- runs

/// One replica count's run.
struct Run {
    parents: usize,
    replicas: usize,
    settle: Duration,
    generation: u64,
    phases: Vec<Phase>,
    memory: Vec<Memory>,
    load_start: String,
    problems: Vec<String>,
}

/// One replica's memory, in kB.
struct Memory {
    name: String,
    /// Buckets it held once the ring first settled (none for the joiner).
    buckets: usize,
    /// VmRSS once the ring settled, before any parent: the base.
    settled_kb: Option<u64>,
    /// VmHWM when every parent had converged.
    converge_kb: Option<u64>,
    /// VmHWM at the end of the run (when killed, just before).
    end_kb: u64,
}

fn parent(resource: &ApiResource, ns: &str, name: &str, i: usize) -> DynamicObject {
    DynamicObject::new(name, resource)
        .within(ns)
        .data(json!({"spec": {"v": format!("p{i}")}}))
}

async fn create_parents(
    api: &Api<DynamicObject>,
    resource: &ApiResource,
    ns: &str,
    names: &[String],
) {
    futures::stream::iter(names.iter().enumerate())
        .map(|(i, name)| {
            let obj = parent(resource, ns, name, i);
            async move { api.create(&PostParams::default(), &obj).await }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await
        .unwrap_or_else(|e| panic!("creating parents: {e}"));
}

async fn run(binary: &Path, client: &Client, kind: &TestKind, s: &Settings, count: usize) -> Run {
    let n = s.parents;
    eprintln!("[shards] {n} parents, {count} replicas");
    let load_start = load_average();
    let ns = support::namespace_for("bench-shards").await;
    let ns_name = ns.name.clone();
    let resource = &kind.resource;
    let dir = tempfile::Builder::new()
        .prefix("trellis-bench-shards-")
        .tempdir()
        .expect("temp dir");
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).expect("rules dir");
    let rule_file = rules.join("shards.yaml");
    let write_rule = |edition: u32| {
        std::fs::write(&rule_file, rule(&kind.group, edition)).expect("writing the rule")
    };
    write_rule(0);
    let observer = Observer::start(client, &ns_name, resource, RULE).await;

    let spawned = Instant::now();
    let mut replicas: Vec<Replica> = (0..count)
        .map(|i| {
            Replica::start(
                binary,
                &rules,
                &ns_name,
                &format!("shards-{n}-r{count}-{i}"),
            )
        })
        .collect();
    let (_, views) = ring::wait_settled(&mut replicas, Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| fail(&mut replicas, &e));
    let settle = spawned.elapsed();
    let generation = ring::settled(&views, count).unwrap_or_default();
    let buckets: Vec<usize> = views
        .iter()
        .map(|v| v.as_ref().map_or(0, |v| v.buckets.len()))
        .collect();
    let rss_settled: Vec<u64> = replicas
        .iter()
        .map(|r| common::proc_status_kb(r.op.pid(), "VmRSS").unwrap_or(0))
        .collect();
    eprintln!(
        "[shards] ring settled {:.2} s after spawn: generation {generation}, buckets {buckets:?}",
        settle.as_secs_f64()
    );

    // Converge: every parent created, 32 at a time, from the first create.
    let names: Vec<String> = (0..n).map(|i| format!("app-{i:05}")).collect();
    let parents: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns_name, resource);
    let start = begin(&mut replicas, s.audit).await;
    create_parents(&parents, resource, &ns_name, &names).await;
    let mut reported = Instant::now();
    let converge = loop {
        let progress = observer.progress(&names);
        if progress.synced == n {
            break start.at.elapsed();
        }
        for r in replicas.iter_mut() {
            r.op.check_running();
        }
        if start.at.elapsed() > s.timeout {
            fail(
                &mut replicas,
                &format!(
                    "converge: {}/{n} parents synced after {:?}; e.g. {}",
                    progress.synced,
                    s.timeout,
                    progress.laggard.unwrap_or_default()
                ),
            );
        }
        if reported.elapsed() > Duration::from_secs(5) {
            reported = Instant::now();
            let rss: Vec<String> = replicas
                .iter()
                .map(|r| {
                    let kb = common::proc_status_kb(r.op.pid(), "VmRSS").unwrap_or(0);
                    format!("{:.1}", mib(kb))
                })
                .collect();
            eprintln!(
                "[shards] {:>6.1} s: {}/{n} synced, {} ConfigMaps; RSS MiB {}",
                start.at.elapsed().as_secs_f64(),
                progress.synced,
                progress.children,
                rss.join(" / ")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let hwm_converge: Vec<u64> = replicas
        .iter()
        .map(|r| common::proc_status_kb(r.op.pid(), "VmHWM").unwrap_or(0))
        .collect();
    let mut phases = vec![
        finish(
            &mut replicas,
            start,
            &ns_name,
            "converge",
            converge,
            n as u64,
            String::new(),
        )
        .await,
    ];

    // A rule edit that changes every ConfigMap.
    if s.edit {
        let start = begin(&mut replicas, s.audit).await;
        write_rule(1);
        let took = wait_carrying(&mut replicas, &observer, 1, n, start.at, s.timeout).await;
        phases.push(
            finish(
                &mut replicas,
                start,
                &ns_name,
                "rule edit",
                took,
                n as u64,
                String::new(),
            )
            .await,
        );
    }

    if s.edit && count == s.disrupt {
        phases
            .push(disrupt::kill_mid_edit(&mut replicas, &observer, &ns_name, s, &write_rule).await);
        phases.push(
            disrupt::join_mid_edit(
                &mut replicas,
                &observer,
                &ns_name,
                s,
                &write_rule,
                binary,
                &rules,
                &format!("shards-{n}-r{count}-join"),
            )
            .await,
        );
    }

    if s.restart {
        let (phase, _) = restart::restart_one(&mut replicas, &ns_name, s, binary, &rules).await;
        eprintln!("[shards] {}", phase.detail);
        phases.push(phase);
    }

    let mut problems: Vec<String> = phases.iter().flat_map(Phase::problems).collect();
    let progress = observer.progress(&names);
    if progress.synced != n {
        problems.push(format!(
            "at the end {}/{n} parents synced; e.g. {}",
            progress.synced,
            progress.laggard.unwrap_or_default()
        ));
    }
    if observer.unlabelled() > 0 {
        problems.push(format!(
            "{} ConfigMaps without trellis.dev/bucket",
            observer.unlabelled()
        ));
    }
    let mut memory = Vec::new();
    for (i, r) in replicas.iter_mut().enumerate() {
        r.counters().await;
        memory.push(Memory {
            name: r.name.clone(),
            buckets: buckets.get(i).copied().unwrap_or(0),
            settled_kb: rss_settled.get(i).copied(),
            converge_kb: hwm_converge.get(i).copied(),
            end_kb: r.hwm_kb,
        });
    }
    for r in replicas.iter_mut() {
        if let Err(e) = r.terminate() {
            problems.push(e);
        }
    }
    drop(replicas);
    drop(observer);
    delete_namespace(client, ns).await;
    Run {
        parents: n,
        replicas: count,
        settle,
        generation,
        phases,
        memory,
        load_start,
        problems,
    }
}
