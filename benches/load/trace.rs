//! The latency trace of one run (`TRELLIS_BENCH_TRACE=1`): where a
//! parent's time goes from its create to its status, per phase, as
//! medians over the run's parents. For the bare client, timed here around
//! each of its requests; for trellis, from the operator's own per-pass
//! lines (`trellis::pass::trace`, see `src/operator/pass/trace.rs`) joined
//! with the create times and the status times this bench's watch saw.

use std::collections::HashMap;
use std::fmt::Write;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde_json::Value;

/// The operator's log filter for a traced run.
pub const OPERATOR_LOG: &str = "info,trellis::pass::trace=debug";

/// Phase name → one duration per parent.
#[derive(Default)]
pub struct Phases {
    order: Vec<&'static str>,
    values: HashMap<&'static str, Vec<Duration>>,
}

impl Phases {
    pub fn add(&mut self, phase: &'static str, d: Duration) {
        if !self.values.contains_key(phase) {
            self.order.push(phase);
        }
        self.values.entry(phase).or_default().push(d);
    }

    /// `phase  median  p90  mean  (count)` per phase.
    pub fn table(&self, title: &str) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "  {title}");
        let _ = writeln!(
            out,
            "    {:<34} {:>9} {:>9} {:>9} {:>6}",
            "phase (ms per parent)", "median", "p90", "mean", "n"
        );
        for phase in &self.order {
            let mut v = self.values[phase].clone();
            v.sort();
            let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
            let mean = v.iter().sum::<Duration>() / v.len() as u32;
            let _ = writeln!(
                out,
                "    {:<34} {:>9.2} {:>9.2} {:>9.2} {:>6}",
                phase,
                ms(at(0.5)),
                ms(at(0.9)),
                ms(mean),
                v.len()
            );
        }
        out
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn since(later: SystemTime, earlier: SystemTime) -> Duration {
    later.duration_since(earlier).unwrap_or_default()
}

/// One bare parent: when its create returned, when a slot took it, each
/// request's round trip (3 applies, the status patch).
pub struct BareTimes {
    pub created: SystemTime,
    pub started: SystemTime,
    pub requests: [Duration; 4],
}

pub fn bare(times: &[BareTimes]) -> String {
    let mut p = Phases::default();
    for t in times {
        p.add("queue (create -> slot)", since(t.started, t.created));
        for (phase, d) in ["apply config", "apply web", "apply service", "status patch"]
            .into_iter()
            .zip(t.requests)
        {
            p.add(phase, d);
        }
        let done = t.started + t.requests.iter().sum::<Duration>();
        p.add("create -> status written", since(done, t.created));
    }
    p.table("bare client, per parent")
}

/// One pass line of the operator's log.
struct PassLine {
    end: SystemTime,
    fields: Value,
}

impl PassLine {
    fn ms(&self, field: &str) -> Duration {
        Duration::from_secs_f64(self.fields[field].as_f64().unwrap_or(0.0) / 1000.0)
    }

    fn start(&self) -> SystemTime {
        self.end - self.ms("total_ms")
    }

    fn wrote(&self) -> bool {
        self.fields["status_written"] == Value::Bool(true)
            || self.fields["children"]
                .as_str()
                .is_some_and(|c| c.contains('*'))
    }

    /// `config=3.10*,web=0.02` → (id, duration).
    fn children(&self) -> Vec<(String, Duration)> {
        self.fields["children"]
            .as_str()
            .unwrap_or_default()
            .split(',')
            .filter_map(|c| {
                let (id, v) = c.split_once('=')?;
                let v: f64 = v.trim_end_matches('*').parse().ok()?;
                Some((id.to_owned(), Duration::from_secs_f64(v / 1000.0)))
            })
            .collect()
    }
}

/// The pass lines of `log`, by parent name (without its namespace).
fn pass_lines(log: &Path) -> HashMap<String, Vec<PassLine>> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut by_parent: HashMap<String, Vec<PassLine>> = HashMap::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if v["target"] != "trellis::pass::trace" {
            continue;
        }
        let Some(end) = v["timestamp"]
            .as_str()
            .and_then(|t| humantime::parse_rfc3339(t).ok())
        else {
            continue;
        };
        let fields = v["fields"].clone();
        let parent = fields["parent"].as_str().unwrap_or_default();
        let name = parent.rsplit('/').next().unwrap_or_default().to_owned();
        by_parent
            .entry(name)
            .or_default()
            .push(PassLine { end, fields });
    }
    by_parent
}

/// The trellis trace: per parent, its first pass that wrote (its phases),
/// the wait before it, the watch's delay after it, and its passes.
pub fn trellis(
    log: &Path,
    created: &HashMap<String, SystemTime>,
    synced: &HashMap<String, SystemTime>,
) -> String {
    let lines = pass_lines(log);
    let mut p = Phases::default();
    let mut passes = Vec::new();
    for (name, created_at) in created {
        let Some(passes_of) = lines.get(name) else {
            continue;
        };
        passes.push(passes_of.len());
        let Some(first) = passes_of.iter().min_by_key(|l| l.start()) else {
            continue;
        };
        p.add(
            "queue (create -> first pass)",
            since(first.start(), *created_at),
        );
        let Some(writer) = passes_of.iter().find(|l| l.wrote()) else {
            continue;
        };
        p.add("  permit (caches, --concurrency)", writer.ms("permit_ms"));
        p.add("  prepare (parse, entry checks)", writer.ms("prepare_ms"));
        p.add("  plan (every round)", writer.ms("plan_ms"));
        for (id, d) in writer.children() {
            let phase: &'static str = match id.as_str() {
                "config" => "  apply config",
                "web" => "  apply web",
                "service" => "  apply service",
                _ => "  apply (other)",
            };
            p.add(phase, d);
        }
        p.add("  status write", writer.ms("status_ms"));
        p.add(
            "  other (bookkeeping, Event hand-off)",
            writer.ms("other_ms"),
        );
        p.add("  pass total", writer.ms("total_ms"));
        if let Some(seen) = synced.get(name) {
            p.add("pass end -> status seen by watch", since(*seen, writer.end));
            p.add("create -> status seen by watch", since(*seen, *created_at));
        }
    }
    let mut out = p.table("trellis, per parent (the pass that wrote)");
    let total: usize = passes.iter().sum();
    let _ = writeln!(
        out,
        "    planned passes per parent until the log was read: {:.2} ({} parents)",
        total as f64 / passes.len().max(1) as f64,
        passes.len()
    );
    out
}
