//! The fuzz targets on stable, as part of `cargo test`: each target's body
//! (`fuzz/src/lib.rs`) over its committed corpus (`fuzz/corpus/<target>/`),
//! then over seeded mutations of it for a bounded time. `cargo fuzz`
//! (nightly, libFuzzer, `fuzz/run`) explores far more; this run keeps every
//! seed and a few thousand of its neighbours passing on every CI run, where
//! the nightly toolchain may not be.
//!
//! Environment: `TRELLIS_FUZZ_SECONDS` (per target, default 10),
//! `TRELLIS_FUZZ_SEED` (default fixed, so a CI failure reproduces; set it to
//! explore elsewhere). An input that panics is written to
//! `target/tmp/fuzz-<target>-crash-<n>` and named in the failure; feed it to
//! the body again with `cargo fuzz run <target> <file>` or add it to the corpus.

#[allow(dead_code)]
#[path = "../fuzz/src/lib.rs"]
mod trellis_fuzz;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Fragments a mutation may insert: template, YAML and JSON syntax, deep
/// openers, odd numbers and escapes.
const TOKENS: &[&str] = &[
    "{{",
    "}}",
    "{%",
    "%}",
    "{#",
    "#}",
    "---\n",
    "...\n",
    "\n",
    "\r\n",
    "\t",
    "\"",
    "'",
    "\\",
    ":",
    ": ",
    "- ",
    "[",
    "]",
    "{",
    "}",
    ",",
    "&a ",
    "*a",
    "!!str ",
    "!!binary ",
    "? ",
    "|\n  ",
    ">-\n  ",
    "~",
    "null",
    "true",
    "1e999",
    "-0",
    "0x10",
    "0o17",
    "9223372036854775808",
    "NaN",
    "\u{0}",
    "\u{feff}",
    "é",
    "{{ parent }}",
    "{% for x in spec %}",
    "{% endfor %}",
    "{{ 7*7 }}",
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
    "{\"a\":{\"a\":{\"a\":{\"a\":",
    "apiVersion: v1\nkind: Secret\n",
    "forEach: ",
    "includeWhen: ",
    "dependsOn: [",
    "template: |\n  ",
    "${x}",
];

fn seconds() -> Duration {
    let secs = std::env::var("TRELLIS_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .unwrap_or(10.0);
    Duration::from_secs_f64(secs)
}

fn seed() -> u64 {
    std::env::var("TRELLIS_FUZZ_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0x7e11_15f0_22ed)
}

/// One mutation of `input` (or a splice with `other`).
fn mutate(rng: &mut StdRng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    let rounds = rng.random_range(1..=4);
    for _ in 0..rounds {
        let at = if out.is_empty() {
            0
        } else {
            rng.random_range(0..=out.len())
        };
        match rng.random_range(0..6) {
            0 if !out.is_empty() => {
                let i = rng.random_range(0..out.len());
                out[i] ^= 1 << rng.random_range(0..8);
            }
            1 => {
                let token = TOKENS[rng.random_range(0..TOKENS.len())].as_bytes();
                out.splice(at..at, token.iter().copied());
            }
            2 if !out.is_empty() => {
                let end = (at + rng.random_range(1..=16)).min(out.len());
                out.drain(at.min(end)..end);
            }
            3 if !out.is_empty() => {
                let start = rng.random_range(0..out.len());
                let end = (start + rng.random_range(1..=64)).min(out.len());
                let copy: Vec<u8> = out[start..end].to_vec();
                out.splice(at..at, copy);
            }
            4 if !other.is_empty() => {
                let start = rng.random_range(0..other.len());
                let end = (start + rng.random_range(1..=256)).min(other.len());
                out.splice(at..at, other[start..end].iter().copied());
            }
            _ => {
                let b: u8 = rng.random();
                out.insert(at, b);
            }
        }
    }
    out.truncate(128 * 1024);
    out
}

/// Runs `body` on every seed of `target`, then on mutations until the time
/// is up; fails naming the first input that panicked.
fn drive(target: &str, body: fn(&[u8])) {
    let seeds = trellis_fuzz::corpus(target);
    assert!(!seeds.is_empty(), "no committed corpus for {target}");
    let crash_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let mut crashes: Vec<String> = Vec::new();
    let run = |crashes: &mut Vec<String>, data: &[u8], what: String| {
        if catch_unwind(AssertUnwindSafe(|| body(data))).is_err() {
            let file = crash_dir.join(format!("fuzz-{target}-crash-{}", crashes.len()));
            let _ = std::fs::write(&file, data);
            crashes.push(format!("{what} -> {}", file.display()));
        }
    };
    for (path, data) in &seeds {
        run(&mut crashes, data, format!("seed {}", path.display()));
    }
    let mut rng = StdRng::seed_from_u64(seed() ^ target.len() as u64);
    let budget = seconds();
    let start = Instant::now();
    let mut runs = 0u64;
    while start.elapsed() < budget && crashes.len() < 5 {
        let (_, input) = &seeds[rng.random_range(0..seeds.len())];
        let (_, other) = &seeds[rng.random_range(0..seeds.len())];
        let data = mutate(&mut rng, input, other);
        run(&mut crashes, &data, format!("mutation {runs}"));
        runs += 1;
    }
    eprintln!(
        "[fuzz] {target}: {} seeds and {runs} mutations in {:.1} s (seed {})",
        seeds.len(),
        start.elapsed().as_secs_f64(),
        seed()
    );
    assert!(
        crashes.is_empty(),
        "{target}: inputs that panicked:\n{}",
        crashes.join("\n")
    );
}

#[test]
fn the_rule_loader_survives_its_corpus_and_mutations_of_it() {
    drive("load", trellis_fuzz::load);
}

#[test]
fn the_renderer_keeps_hostile_values_contained() {
    drive("render", trellis_fuzz::render);
}

#[test]
fn the_planner_keeps_any_parent_and_observed_state_contained() {
    drive("plan", trellis_fuzz::plan);
}

/// The planner's patch invariants are not vacuous: the Team seed has a
/// contribution sent to an observed target and one released.
#[test]
fn the_team_seed_plans_a_contribution_and_a_release() {
    let seed = std::fs::read(trellis_fuzz::repo("fuzz/corpus/plan/seed-team.json")).unwrap();
    let input: serde_json::Value = serde_json::from_slice(&seed).unwrap();
    let observed = trellis::plan::Observed::from_objects(
        input["observed"].as_array().unwrap().iter().cloned(),
    );
    let rule = trellis_fuzz::example_rules()
        .rules
        .iter()
        .find(|r| r.name == "team")
        .expect("rules/team.yaml");
    let plan = trellis_fuzz::plan_once(rule, &input["parent"], &observed);
    assert_eq!(plan.patches.len(), 1, "{:?}", plan.errors);
    assert_eq!(plan.patches[0].uid.as_deref(), Some("ns-1"));
    assert_eq!(plan.release.len(), 1, "{:?}", plan.release);
    assert_eq!(plan.release[0].key.name, "old");
    trellis_fuzz::assert_patches_contained(rule, &input["parent"], &observed, &plan);
}
