//! `trellis test` throughput: the example rules' shipped suites
//! (`tests/rules/*.test.yaml`) run over and over, in cases per second, on
//! one core; and the whole command once, as CI runs it (load the rules,
//! find and read the test files, run, report).
//!
//! Run: `cargo bench --bench ruletest` (prints figures; asserts nothing
//! but that every case passes). `TRELLIS_BENCH_SECONDS` (default 5) sets
//! how long the cases run.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use trellis::offline::ruletest::{load_suites, run_suites};
use trellis::rules::RuleSet;

fn main() {
    let budget = Duration::from_secs_f64(
        std::env::var("TRELLIS_BENCH_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5.0),
    );
    let start = Instant::now();
    let set = RuleSet::load(&[PathBuf::from("rules")], Default::default())
        .unwrap_or_else(|d| panic!("rules/ must load: {d:?}"));
    let (suites, diags) = load_suites(&[PathBuf::from("tests/rules")], &set);
    assert!(diags.is_empty(), "{diags:?}");
    let first = run_suites(&suites);
    assert!(first.passed(), "{}", first.to_text());
    let once = start.elapsed();
    let cases = first.total();
    println!(
        "ruletest: {cases} cases in {} files; load + read + first run: {:.1} ms",
        suites.len(),
        once.as_secs_f64() * 1000.0
    );

    let start = Instant::now();
    let mut runs = 0u64;
    while start.elapsed() < budget {
        let report = run_suites(std::hint::black_box(&suites));
        std::hint::black_box(report.total());
        runs += 1;
    }
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "ruletest: {:.0} cases/s ({runs} runs of the {cases} cases in {seconds:.1} s; {:.1} ms per run)",
        (runs as f64 * cases as f64) / seconds,
        seconds * 1000.0 / runs as f64
    );
}
