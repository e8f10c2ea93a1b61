//! A staged rollout at scale: N parents (default 1000), a rule edit moving
//! them with steps 10/50/100 and 2 s pauses.
//!
//! ```text
//! cargo bench --bench rollout                            # 1000 parents
//! TRELLIS_BENCH_PARENTS=200 cargo bench --bench rollout
//! ```
//!
//! Runs against the tests' control plane, like `benches/reload.rs`: an
//! in-process `trellis run` (its namespace is also the operator's, where the
//! revision ConfigMaps go), N parents with one ConfigMap child each; then a
//! template edit, and the time until 10%, 50% and 100% of the children carry
//! it. Prints time per step, the writes the operator counted per parent
//! moved (child updates and status writes; target: one apply per changed
//! child, plus the status that names the new revision), and the process's
//! VmHWM/VmRSS with two versions live (the bench's own client included).

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "../tests/support/configmap_dir.rs"]
mod configmap_dir;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use trellis::operator::Options;
use trellis::rules::RuleSet;

use configmap_dir::ConfigMapDir;
use support::operator::install_kind;

const RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: bench
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
          index: {{ spec.index | string }}
          version: "@VERSION@"
  rollout:
    steps:
      - {percent: 10, pause: 2s}
      - {percent: 50, pause: 2s}
"#;

/// How long any one phase may take before the bench gives up.
const GIVE_UP: Duration = Duration::from_secs(900);

fn main() {
    let parents: usize = match std::env::var("TRELLIS_BENCH_PARENTS") {
        Ok(n) => n
            .parse()
            .unwrap_or_else(|e| panic!("TRELLIS_BENCH_PARENTS={n}: {e}")),
        Err(_) => 1000,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(bench(parents));
}

async fn bench(parents: usize) {
    let ns = support::namespace().await;
    let (kind, _cleanup) = install_kind(&ns, "Bench").await;
    let rule = |version: &str| kind.rule(RULE).replace("@VERSION@", version);
    let mut rules = ConfigMapDir::new(&[("bench.yaml", &rule("v1"))]);
    let dir: PathBuf = rules.path();
    let set = RuleSet::load(std::slice::from_ref(&dir), Default::default())
        .unwrap_or_else(|diags| panic!("bench rule does not load: {diags:?}"));
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let options = Options {
        instance: "bench".into(),
        metrics_addr: Some(addr),
        operator_namespace: ns.name().to_owned(),
        ..Options::new(vec![dir], vec![ns.name().to_owned()])
    };
    eprintln!(
        "rollout bench: {parents} parents, concurrency {}, namespace {}",
        options.concurrency,
        ns.name()
    );
    let cancel = CancellationToken::new();
    let operator = tokio::spawn(trellis::operator::run_with(
        options,
        set,
        ns.client.clone(),
        cancel.clone(),
    ));

    futures::stream::iter(0..parents)
        .map(|i| {
            let (kind, ns) = (&kind, &ns);
            async move {
                kind.create(ns, &format!("p{i}"), json!({ "index": i }), &[])
                    .await
            }
        })
        .buffer_unordered(32)
        .for_each(|_| async {})
        .await;
    let cms: Api<ConfigMap> = ns.api();
    wait_at_least(&cms, parents, "v1").await;
    // The first version is recorded (Complete) before the edit.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = writes(addr).await;

    let swapped = rules.update(&[("bench.yaml", &rule("v2"))]);
    let mut marks = Vec::new();
    for percent in [10usize, 50, 100] {
        let due = (percent * parents).div_ceil(100);
        wait_at_least(&cms, due, "v2").await;
        marks.push((percent, due, swapped.elapsed()));
    }
    // Let the last statuses land before counting.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = writes(addr).await;
    let memory = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let vm = |key: &str| {
        memory
            .lines()
            .find(|l| l.starts_with(key))
            .map(|l| l.trim_start_matches(key).trim().to_owned())
            .unwrap_or_default()
    };

    cancel.cancel();
    match operator.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("the operator failed: {e:#}"),
        Err(e) => panic!("the operator task panicked: {e}"),
    }
    println!("parents:              {parents}");
    let mut last = Duration::ZERO;
    for (percent, due, at) in &marks {
        println!(
            "step {percent:>3}%:           {due} parents on the new version {:.2} s after the edit ({:.2} s after the step before, pauses of 2 s included)",
            at.as_secs_f64(),
            (*at - last).as_secs_f64()
        );
        last = *at;
    }
    let (updates, statuses) = (after.0 - before.0, after.1 - before.1);
    println!(
        "writes per moved parent: {:.2} child updates, {:.2} status writes ({updates} and {statuses} for {parents})",
        updates / parents as f64,
        statuses / parents as f64
    );
    println!(
        "process VmHWM / VmRSS: {} / {} (bench harness included)",
        vm("VmHWM:"),
        vm("VmRSS:")
    );
}

/// (child updates, status writes) the operator counted.
async fn writes(addr: std::net::SocketAddr) -> (f64, f64) {
    let text = support::http_get(addr, "/metrics")
        .await
        .unwrap_or_else(|e| panic!("GET /metrics: {e}"));
    let sum = |prefix: &str, filter: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(prefix) && l.contains(filter))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    (
        sum("trellis_child_operations_total", "op=\"update\""),
        sum("trellis_status_writes_total", ""),
    )
}

/// Polls (one list per 200 ms) until at least `n` children carry `version`.
async fn wait_at_least(cms: &Api<ConfigMap>, n: usize, version: &str) {
    let since = Instant::now();
    let params = ListParams::default().labels("trellis.dev/rule=bench");
    loop {
        let list = cms.list(&params).await.expect("list children");
        let done = list
            .items
            .iter()
            .filter(|cm| {
                cm.data
                    .as_ref()
                    .and_then(|d| d.get("version"))
                    .is_some_and(|v| v == version)
            })
            .count();
        if done >= n {
            return;
        }
        assert!(
            since.elapsed() < GIVE_UP,
            "only {done} of {n} children at {version} after {GIVE_UP:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
