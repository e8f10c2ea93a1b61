//! Where one pass's time goes, phase by phase: one debug line per pass
//! (target `trellis::pass::trace`), the latency trace of
//! `docs/benchmarks.md`. A few clock reads per pass; the line is formatted
//! only when that target is enabled (`RUST_LOG=info,trellis::pass::trace=debug`).

use std::time::{Duration, Instant};

use tracing::debug;

/// The target the trace logs under.
pub(super) const TARGET: &str = "trellis::pass::trace";

/// The clock of one pass.
pub(super) struct Trace {
    started: Instant,
    /// When the last phase ended.
    mark: Instant,
    /// Waiting for the caches and a permit (`--concurrency`).
    pub permit: Duration,
    /// From the permit to the first plan: the parent parsed, entry checks.
    pub prepare: Duration,
    /// Every plan of the pass (one per round).
    pub plan: Duration,
    /// Each child sent or skipped, in order: its id and how long it took
    /// (a round trip when it was written).
    pub children: Vec<(String, Duration, bool)>,
    /// The status write (its round trip, when one is sent).
    pub status: Duration,
    pub status_written: bool,
}

impl Trace {
    pub fn start() -> Trace {
        let now = Instant::now();
        Trace {
            started: now,
            mark: now,
            permit: Duration::ZERO,
            prepare: Duration::ZERO,
            plan: Duration::ZERO,
            children: Vec::new(),
            status: Duration::ZERO,
            status_written: false,
        }
    }

    /// The time since the last phase ended; starts the next.
    pub fn lap(&mut self) -> Duration {
        let now = Instant::now();
        let lap = now - self.mark;
        self.mark = now;
        lap
    }

    /// The pass's line. `other_ms` is what no phase took: patches, prune,
    /// the Event hand-off, the rounds' bookkeeping.
    pub fn log(&self, rule: &str, parent: &str) {
        if !tracing::enabled!(target: TARGET, tracing::Level::DEBUG) {
            return;
        }
        let total = self.started.elapsed();
        let phases = self.permit
            + self.prepare
            + self.plan
            + self.status
            + self.children.iter().map(|c| c.1).sum::<Duration>();
        debug!(
            target: TARGET,
            rule,
            parent,
            total_ms = ms(total),
            permit_ms = ms(self.permit),
            prepare_ms = ms(self.prepare),
            plan_ms = ms(self.plan),
            children = %self.children_text(),
            other_ms = ms(total.saturating_sub(phases)),
            status_ms = ms(self.status),
            status_written = self.status_written,
            "pass"
        );
    }

    /// `id=ms` per child, `*` after one written: `config=3.10*,web=0.02`.
    fn children_text(&self) -> String {
        self.children
            .iter()
            .map(|(id, d, wrote)| format!("{id}={:.2}{}", ms(*d), if *wrote { "*" } else { "" }))
            .collect::<Vec<_>>()
            .join(",")
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
