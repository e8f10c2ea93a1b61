//! The printed figures of the sharded runs: one block per run, then a
//! summary line per run.

use crate::common::mib;
use crate::{PLURAL, RESOURCES, Run};

impl Run {
    pub fn report(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\n==== {} parents x 1 ConfigMap, {} replicas (--leader-elect --shards, lease 4s/3s/1s); load at start {} ====",
            self.parents, self.replicas, self.load_start
        );
        let _ = writeln!(
            out,
            "ring settled {:.2} s after the processes started (generation {})",
            self.settle.as_secs_f64(),
            self.generation
        );
        let _ = writeln!(
            out,
            "{:<17} {:>9} {:>7} {:>8} {:>5} {:>5} {:>7} {:>7}  {:<24} {:<30} load before -> after",
            "phase",
            "time",
            "child-w",
            "expected",
            "dup",
            "audit",
            "status",
            "events",
            "child-w per replica",
            "CPU s per replica",
        );
        for p in &self.phases {
            let (dup, audited) = p.duplicates();
            let per: Vec<String> = p
                .done
                .iter()
                .map(|(_, c)| c.child_writes().to_string())
                .collect();
            let cpu: Vec<String> = p
                .done
                .iter()
                .map(|(_, c)| format!("{:.1}", c.cpu))
                .collect();
            let status: u64 = p.done.iter().map(|(_, c)| c.status_writes(PLURAL)).sum();
            let events: u64 = p.done.iter().map(|(_, c)| c.event_writes()).sum();
            let _ = writeln!(
                out,
                "{:<17} {:>8.2}s {:>7} {:>8} {:>5} {:>5} {:>7} {:>7}  {:<24} {:<30} {} -> {}",
                p.what,
                p.took.as_secs_f64(),
                p.operator_child_writes(),
                p.expected,
                dup,
                audited.map_or("-".to_owned(), |a| a.to_string()),
                status,
                events,
                per.join(" / "),
                cpu.join(" / "),
                p.load_before,
                p.load_after
            );
            if !p.detail.is_empty() {
                let _ = writeln!(out, "    {}", p.detail);
            }
            for (name, c) in &p.done {
                let passes = c.reconciles.max(1.0);
                let _ = writeln!(
                    out,
                    "    {name}: {} creates + {} updates by its child counter; {} passes, {:.2} ms CPU per pass; {}",
                    c.child_creates,
                    c.child_updates,
                    c.reconciles,
                    c.cpu * 1000.0 / passes,
                    c.requests.on(RESOURCES).describe()
                );
            }
        }
        let _ = writeln!(
            out,
            "{:<26} {:>8} {:>16} {:>12}",
            "replica", "buckets", "VmHWM converge", "VmHWM end"
        );
        for (name, buckets, at_converge, end) in &self.memory {
            let _ = writeln!(
                out,
                "{name:<26} {buckets:>8} {:>12.1} MiB {:>8.1} MiB",
                mib(*at_converge),
                mib(*end)
            );
        }
        let _ = writeln!(
            out,
            "(child-w: write requests on the ConfigMaps by the replicas' own counts; expected: one per changed child; \
             dup: child-w - expected; audit: the API server's audit log's count - expected; status/events: writes on \
             the parents' status and Events; a SIGKILLed replica's counts are its last read before the kill)"
        );
        for p in &self.problems {
            let _ = writeln!(out, "PROBLEM: {p}");
        }
        out
    }
}

pub fn summary(runs: &[Run]) -> String {
    use std::fmt::Write;
    let mut out = String::from("\n==== summary ====\n");
    let _ = writeln!(
        out,
        "{:>7} {:>8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>28} duplicates",
        "parents",
        "replicas",
        "settle",
        "converge",
        "edit",
        "kill-edit",
        "join-edit",
        "VmHWM per replica (MiB)",
    );
    for r in runs {
        let time = |what: &str| {
            r.phases
                .iter()
                .find(|p| p.what == what)
                .map_or("-".to_owned(), |p| format!("{:.2}s", p.took.as_secs_f64()))
        };
        let hwm: Vec<String> = r
            .memory
            .iter()
            .map(|(_, _, _, end)| format!("{:.1}", mib(*end)))
            .collect();
        let dups: i64 = r
            .phases
            .iter()
            .map(|p| {
                let (own, audited) = p.duplicates();
                own.max(audited.unwrap_or(0))
            })
            .sum();
        let _ = writeln!(
            out,
            "{:>7} {:>8} {:>6.2}s {:>9} {:>9} {:>9} {:>9} {:>28} {}",
            r.parents,
            r.replicas,
            r.settle.as_secs_f64(),
            time("converge"),
            time("rule edit"),
            time("SIGKILL mid-edit"),
            time("join mid-edit"),
            hwm.join(" / "),
            dups
        );
    }
    out
}
