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
            "{:<17} {:>9} {:>7} {:>8} {:>5} {:>5} {:>7} {:>7} {:>7} {:>7}  {:<24} {:<30} load before -> after",
            "phase",
            "time",
            "child-w",
            "expected",
            "extra",
            "dup",
            "refused",
            "status",
            "labels",
            "events",
            "child-w per replica",
            "CPU s per replica",
        );
        for p in &self.phases {
            let (extra, dup) = p.duplicates();
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
            let labels: u64 = p.done.iter().map(|(_, c)| c.label_writes(PLURAL)).sum();
            let events: u64 = p.done.iter().map(|(_, c)| c.event_writes()).sum();
            let _ = writeln!(
                out,
                "{:<17} {:>8.2}s {:>7} {:>8} {:>5} {:>5} {:>7} {:>7} {:>7} {:>7}  {:<24} {:<30} {} -> {}",
                p.what,
                p.took.as_secs_f64(),
                p.operator_child_writes(),
                p.expected,
                extra,
                dup.map_or("-".to_owned(), |d| d.to_string()),
                p.audit
                    .as_ref()
                    .map_or("-".to_owned(), |a| a.refused.to_string()),
                status,
                labels,
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
                let per_pass = if c.reconciles > 0.0 {
                    format!("{:.2} ms", c.cpu * 1000.0 / c.reconciles)
                } else {
                    "-".to_owned()
                };
                let _ = writeln!(
                    out,
                    "    {name}: {} creates + {} updates by its child counter; {} passes, CPU {:.2} s ({per_pass} per pass); {}",
                    c.child_creates,
                    c.child_updates,
                    c.reconciles,
                    c.cpu,
                    c.requests.on(RESOURCES).describe()
                );
            }
        }
        let _ = writeln!(
            out,
            "{:<26} {:>8} {:>16} {:>16} {:>12}",
            "replica", "buckets", "VmRSS settled", "VmHWM converge", "VmHWM end"
        );
        let shown = |kb: Option<u64>| kb.map_or("-".to_owned(), |kb| format!("{:.1} MiB", mib(kb)));
        for m in &self.memory {
            let _ = writeln!(
                out,
                "{:<26} {:>8} {:>16} {:>16} {:>8.1} MiB",
                m.name,
                m.buckets,
                shown(m.settled_kb),
                shown(m.converge_kb),
                mib(m.end_kb)
            );
        }
        let _ = writeln!(
            out,
            "(child-w: write requests on the ConfigMaps by the replicas' own counts; expected: one per changed child; \
             extra: child-w - expected; dup: writes the API server accepted beyond one per changed child (audit log); \
             refused: child writes it refused (a SIGKILLed replica's in flight: 504); status/events: writes on \
             the parents' status and Events; labels: writes on the parents themselves, the `trellis.dev/bucket` label \
             written once per parent; a SIGKILLed replica's counts are its last read before the kill)"
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
            .map(|m| format!("{:.1}", mib(m.end_kb)))
            .collect();
        // The audit log's count when there is one, else the replicas' own.
        let dups: i64 = r
            .phases
            .iter()
            .map(|p| match p.duplicates() {
                (_, Some(dup)) => dup as i64,
                (extra, None) => extra,
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
