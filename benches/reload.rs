//! Reload latency at scale: how long a template edit takes to reach every
//! child of N parents.
//!
//! ```text
//! cargo bench --bench reload                            # 1000 parents
//! TRELLIS_BENCH_PARENTS=200 cargo bench --bench reload
//! ```
//!
//! Runs against the tests' control plane (started or reused exactly as
//! `tests/support` does; `TRELLIS_TEST_CLUSTER_DIR` and friends apply). In a
//! namespace and API group of its own, it writes a rules directory in the
//! kubelet's ConfigMap-volume layout, starts `trellis run` in-process on it
//! (the command's defaults: concurrency 16, 500 ms debounce), creates N
//! parents with one ConfigMap child each and waits for every child; then it
//! swaps in a template edit as the kubelet would and waits until every
//! child carries it. Children are polled with one list call per 200 ms.
//! Target: reload latency ≤ 5 s for 1000 parents.

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
"#;

/// How long any one phase may take before the bench gives up.
const GIVE_UP: Duration = Duration::from_secs(600);

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
    let options = Options {
        instance: "bench".into(),
        ..Options::new(vec![dir], vec![ns.name().to_owned()])
    };
    eprintln!(
        "reload bench: {parents} parents, concurrency {}, debounce {:?}, namespace {}",
        options.concurrency,
        options.reload_debounce,
        ns.name()
    );
    let cancel = CancellationToken::new();
    let operator = tokio::spawn(trellis::operator::run_with(
        options,
        set,
        ns.client.clone(),
        cancel.clone(),
    ));

    let started = Instant::now();
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
    let created = started.elapsed();
    let cms: Api<ConfigMap> = ns.api();
    wait_all_at(&cms, parents, "v1").await;
    let converged = started.elapsed();

    let swapped = rules.update(&[("bench.yaml", &rule("v2"))]);
    wait_all_at(&cms, parents, "v2").await;
    let latency = swapped.elapsed();

    cancel.cancel();
    match operator.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("the operator failed: {e:#}"),
        Err(e) => panic!("the operator task panicked: {e}"),
    }
    println!("parents:             {parents}");
    println!("parents created in:  {:.2} s", created.as_secs_f64());
    println!(
        "initial convergence: {:.2} s (first create to every child present)",
        converged.as_secs_f64()
    );
    println!(
        "reload latency:      {:.2} s (..data swap to every child at the new template; target <= 5 s for 1000)",
        latency.as_secs_f64()
    );
}

/// Polls (one list per 200 ms) until `parents` children carry `version`.
async fn wait_all_at(cms: &Api<ConfigMap>, parents: usize, version: &str) {
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
        if done == parents {
            return;
        }
        assert!(
            since.elapsed() < GIVE_UP,
            "only {done} of {parents} children at {version} after {GIVE_UP:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
