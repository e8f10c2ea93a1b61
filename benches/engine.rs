//! Offline engine throughput: child renders per second and JSONPath
//! evaluations per second for the `webapp` example rule, on one core.
//!
//! Run: `cargo bench --bench engine` (prints figures; asserts nothing).
//!
//! Rates depend on what else runs on the machine. For a figure that does
//! not, run a fixed number of passes and count instructions, e.g. with
//! `TRELLIS_BENCH_PASSES=1200 valgrind --tool=callgrind <bench binary>` less
//! the same at 200 passes, divided by 1000 (the JSONPath phase is skipped).
//! Under valgrind SHA-256 runs without the CPU's SHA instructions, so its
//! share is overstated.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use trellis::plan::{self, Input, Observed};
use trellis::rules::{FieldSource, RuleSet};

const NOW: &str = "2026-11-29T00:00:00Z";

/// Runs `f` repeatedly for about `budget` and returns calls per second.
fn rate(budget: Duration, mut f: impl FnMut()) -> f64 {
    for _ in 0..100 {
        f();
    }
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < budget {
        for _ in 0..100 {
            f();
        }
        n += 100;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let set = RuleSet::load(&[PathBuf::from("rules")], Default::default())
        .unwrap_or_else(|d| panic!("rules/ must load: {d:?}"));
    let rule = set.get("webapp").expect("rules/webapp.yaml").clone();
    let parent = json!({
        "apiVersion": "demo.trellis.dev/v1",
        "kind": "WebApp",
        "metadata": {"name": "shop", "namespace": "team-a", "uid": "u-1", "generation": 4,
                      "labels": {"team": "a"}, "annotations": {"note": "x".repeat(200)}},
        "spec": {"image": "nginx:1.27", "replicas": 3, "greeting": "hello", "expose": true,
                 "hosts": ["shop.example.com", "www.shop.example.com"]},
    });
    // Children as the cluster holds them, so dependsOn passes and every child renders.
    let labels = |id: &str| json!({"trellis.dev/rule": "webapp", "trellis.dev/child": id, "trellis.dev/parent-uid": "u-1"});
    let observed = Observed::from_objects([
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "shop-config", "namespace": "team-a", "labels": labels("config")}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "shop", "namespace": "team-a", "generation": 2, "labels": labels("web")},
               "status": {"observedGeneration": 2, "readyReplicas": 3, "availableReplicas": 3,
                          "conditions": [{"type": "Available", "status": "True"}]}}),
    ]);
    let input = Input {
        parent: &parent,
        observed: &observed,
        now: NOW,
        scope_of: &trellis::kinds::scope,
        clusters: &trellis::clusters::Clusters::offline(),
    };
    let sample = plan::plan(&rule, &input);
    assert!(
        sample.errors.is_empty() && sample.pending.is_empty(),
        "{:?}",
        sample.errors
    );
    let children_per_pass = sample.apply.len();

    if let Some(n) = std::env::var("TRELLIS_BENCH_PASSES")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        let start = Instant::now();
        for _ in 0..n {
            black_box(plan::plan(black_box(&rule), black_box(&input)));
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{n} passes ({} child renders) in {secs:.2} s",
            n * children_per_pass as u64
        );
        return;
    }

    let budget = Duration::from_secs(3);
    let passes = rate(budget, || {
        black_box(plan::plan(black_box(&rule), black_box(&input)));
    });

    let deployment: Value = observed
        .objects
        .values()
        .find(|o| o["kind"] == "Deployment")
        .cloned()
        .unwrap_or_default();
    let field = rule
        .fields
        .iter()
        .find(|f| matches!(f.source, FieldSource::JsonPath { .. }))
        .expect("webapp maps a status field with JSONPath");
    let jsonpath = rate(budget, || {
        black_box(trellis::status::json_path_value(
            black_box(field),
            black_box(&deployment),
        ));
    });

    println!(
        "rule webapp: {children_per_pass} children per reconcile pass (render + YAML parse + enforce + readiness + status)"
    );
    println!("reconcile passes/s (plan):     {passes:>12.0}");
    println!(
        "child renders/s (one core):    {:>12.0}",
        passes * children_per_pass as f64
    );
    println!("JSONPath evaluations/s:        {jsonpath:>12.0}");
}
