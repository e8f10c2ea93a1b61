//! Operator memory while it deals with hostile parents (the cases of
//! `tests/faults_hostile.rs`): a spec nested 200 deep, a 1 MiB string, a
//! `forEach` of 5,000 items and template/YAML syntax in values. The release
//! `trellis run` binary runs in a process of its own against the tests'
//! shared control plane; each hostile parent is created in turn and waited
//! for until its condition says what became of it, and the operator's peak
//! resident set is read meanwhile (VmRSS sampled every 100 ms per phase,
//! and VmHWM, the kernel's exact peak, overall).
//!
//! Run: `cargo bench --bench hostile` (prints a table; fails only when a
//! parent does not reach its condition within 60 s or the operator exits).
//! The correctness of each outcome is asserted by the test, not here.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::{OperatorProcess, RssSampler, mib};
use support::hostile::{ECHO_RULE, nested};
use support::operator::{Cleanup, TestKind};

/// The parent's `Synced` condition as `status/reason`, read from its raw
/// JSON (the deep one does not decode whole).
async fn synced(client: &kube::Client, kind: &TestKind, ns: &str, name: &str) -> Option<String> {
    let url = format!("/apis/{}/v1/namespaces/{ns}/{}", kind.group, kind.plural);
    let req = kube::core::Request::new(url)
        .get(name, &Default::default())
        .ok()?;
    let text = client.request_text(req).await.ok()?;
    // Past serde_json's depth limit: the status sits beside the spec.
    let top: std::collections::BTreeMap<String, Box<serde_json::value::RawValue>> =
        serde_json::from_str(&text).ok()?;
    let status: Value = serde_json::from_str(top.get("status")?.get()).ok()?;
    let c = status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Synced")?;
    Some(format!(
        "{}/{}",
        c["status"].as_str().unwrap_or("?"),
        c["reason"].as_str().unwrap_or("?")
    ))
}

struct Phase {
    what: &'static str,
    outcome: String,
    took: Duration,
    peak_kb: u64,
    after_kb: u64,
}

fn main() {
    let binary = common::build_operator();
    let cluster = support::cluster();
    eprintln!("[hostile] cluster: {}", cluster.source);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let ns = support::namespace_for("bench-hostile").await;
        let client = ns.client.clone();
        let kind = TestKind::new("Echo");
        let _crd = Cleanup::crds(&[&kind]);
        kind.install(&client).await;
        let dir = tempfile::tempdir().expect("temp dir");
        let rules = dir.path().join("rules");
        std::fs::create_dir(&rules).expect("rules dir");
        std::fs::write(rules.join("echo.yaml"), kind.rule(ECHO_RULE)).expect("rule");
        let mut op = OperatorProcess::start(&binary, "hostile", &rules, ns.name(), &[]);
        let pid = op.pid();

        let items: Vec<Value> = (0..5000).map(|i| json!(format!("i{i}"))).collect();
        let sneaky = "{{ 7*7 }} {% if true %}x{% endif %}\n---\napiVersion: v1\nkind: Secret\n\"quoted\": 'yes'";
        let cases: Vec<(&'static str, &'static str, Value, &'static str)> = vec![
            ("a plain parent (baseline)", "plain", json!({"text": "hi"}), "True/"),
            ("spec nested 200 deep", "deep", json!({"text": "x", "blob": nested(200)}), "False/Undecodable"),
            ("a 1 MiB string", "huge", json!({"text": "y".repeat(1024 * 1024)}), "False/RenderError"),
            ("forEach of 5,000 items", "many", json!({"items": items}), "False/RenderError"),
            ("{{ }}, {% %}, ---, quotes in values", "sneaky", json!({"text": sneaky, "items": [sneaky]}), "True/"),
        ];
        let mut phases = Vec::new();
        for (what, name, spec, want) in cases {
            let sampler = RssSampler::start(pid);
            let start = Instant::now();
            kind.create_raw(&client, ns.name(), name, spec, &[]).await;
            let outcome = loop {
                op.check_running();
                if let Some(s) = synced(&client, &kind, ns.name(), name).await
                    && s.starts_with(want)
                {
                    break s;
                }
                if start.elapsed() > Duration::from_secs(60) {
                    let got = synced(&client, &kind, ns.name(), name).await;
                    op.fail(&format!("{what}: no Synced={want} within 60 s (now {got:?})"));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            let took = start.elapsed();
            // Whatever the pass does after writing the condition (Events, retries).
            tokio::time::sleep(Duration::from_secs(3)).await;
            let peak_kb = sampler.finish();
            let after_kb = common::proc_status_kb(pid, "VmRSS").unwrap_or(0);
            eprintln!("[hostile] {what}: {outcome} after {took:.2?}, peak {:.1} MiB", mib(peak_kb));
            phases.push(Phase { what, outcome, took, peak_kb, after_kb });
        }
        // All of them at once, from a restart (the initial LIST holds them all).
        let hwm_first = common::proc_status_kb(pid, "VmHWM");
        let (_, exit) = op.terminate();
        assert!(exit.success(), "the operator exited with {exit} after SIGTERM");
        drop(op);
        let mut op = OperatorProcess::start(&binary, "hostile-restart", &rules, ns.name(), &[]);
        let pid2 = op.pid();
        let sampler = RssSampler::start(pid2);
        let start = Instant::now();
        let plain = loop {
            op.check_running();
            // One pass each for the four that decode (the deep one is skipped).
            if let Some(done) = op.metric("trellis_reconciles", &[]).await
                && done >= 4.0
            {
                break start.elapsed();
            }
            if start.elapsed() > Duration::from_secs(60) {
                op.fail("the restarted operator did not pass over the five parents");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        tokio::time::sleep(Duration::from_secs(3)).await;
        let restart_peak = sampler.finish();
        let restart_hwm = common::proc_status_kb(pid2, "VmHWM").unwrap_or(0);
        let (_, exit) = op.terminate();
        assert!(exit.success(), "the restarted operator exited with {exit} after SIGTERM");
        drop(op);

        println!("\ntrellis under hostile parents (release operator, separate process)");
        println!(
            "{:<38} {:>20} {:>8} {:>11} {:>11}",
            "parent", "Synced", "took", "peak RSS", "RSS after"
        );
        for p in &phases {
            println!(
                "{:<38} {:>20} {:>7.2}s {:>7.1} MiB {:>7.1} MiB",
                p.what,
                p.outcome,
                p.took.as_secs_f64(),
                mib(p.peak_kb),
                mib(p.after_kb)
            );
        }
        println!(
            "whole run: VmHWM {} ; restart with all five in the initial LIST: every parent passed after {:.2} s, peak RSS {:.1} MiB sampled, VmHWM {:.1} MiB",
            hwm_first.map(|kb| format!("{:.1} MiB", mib(kb))).unwrap_or_else(|| "(process gone)".into()),
            plain.as_secs_f64(),
            mib(restart_peak),
            mib(restart_hwm)
        );
    });
}
