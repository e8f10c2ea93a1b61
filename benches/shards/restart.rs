//! A replica restarted (SIGTERM, then started again under the same name)
//! over parents that have all converged: how high its memory goes while it
//! lists its parents and children and passes over each once, against its
//! steady size before; and, with other replicas, how high theirs go while
//! they take its buckets for a moment and give them back (their relists).
//! Nothing changed, so nothing may be written.
//!
//! Peaks are each process's VmHWM from the restart on: the survivors'
//! high-water marks are reset at the restart (`/proc/PID/clear_refs`, 5),
//! the restarted process's is its own from its start.

use std::time::{Duration, Instant};

use crate::common::{self, mib};
use crate::ring::{self, Replica};
use crate::{Phase, Settings, begin, fail, finish};

/// What one replica's memory did across the restart, in kB.
pub struct Peak {
    pub name: String,
    /// VmRSS just before the restart.
    pub before_kb: u64,
    /// VmHWM from the restart until its passes were done.
    pub peak_kb: u64,
    /// VmRSS then.
    pub after_kb: u64,
    pub restarted: bool,
}

impl Peak {
    pub fn describe(&self) -> String {
        format!(
            "{}{}: VmRSS {:.1} MiB before, VmHWM {:.1} MiB during, VmRSS {:.1} MiB after",
            self.name,
            if self.restarted { " (restarted)" } else { "" },
            mib(self.before_kb),
            mib(self.peak_kb),
            mib(self.after_kb)
        )
    }
}

/// Resets the process's VmHWM to its current VmRSS.
fn reset_peak(pid: u32) {
    if let Err(e) = std::fs::write(format!("/proc/{pid}/clear_refs"), "5") {
        eprintln!("[shards] cannot reset the peak of {pid}: {e}");
    }
}

/// The parents the replica's `/status` says it caches in full.
async fn parents_full(r: &Replica) -> Option<f64> {
    let text = crate::support::http_get(r.op.metrics, "/status")
        .await
        .ok()?;
    let status: serde_json::Value = serde_json::from_str(&text).ok()?;
    status["rules"][crate::RULE]["parents"]["full"].as_f64()
}

/// Restarts the first live replica; every parent has converged before.
pub async fn restart_one(
    replicas: &mut [Replica],
    ns: &str,
    s: &Settings,
    binary: &std::path::Path,
    rules: &std::path::Path,
) -> (Phase, Vec<Peak>) {
    let before: Vec<u64> = replicas
        .iter()
        .map(|r| common::proc_status_kb(r.op.pid(), "VmRSS").unwrap_or(0))
        .collect();
    let start = begin(replicas, s.audit).await;
    let victim = replicas
        .iter()
        .position(|r| r.alive)
        .unwrap_or_else(|| fail(replicas, "no live replica to restart"));
    let name = replicas[victim].name.clone();
    let term = replicas[victim]
        .terminate()
        .unwrap_or_else(|e| fail(replicas, &e));
    // Its log is kept beside the new one's.
    let log = replicas[victim].op.log.clone();
    let _ = std::fs::rename(&log, log.with_extension("log.before-restart"));
    for r in replicas.iter().filter(|r| r.alive) {
        reset_peak(r.op.pid());
    }
    let restarted = Instant::now();
    replicas[victim] = Replica::start(binary, rules, ns, &name);
    let (_, _) = ring::wait_settled(replicas, Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| fail(replicas, &e));
    // Its passes: one per parent it lists (each finds nothing to write);
    // passes skipped while its buckets were still listing do not count.
    loop {
        let r = &mut replicas[victim];
        r.op.check_running();
        let passes =
            r.op.metric("trellis_reconciles_total", &["result=\"ok\""])
                .await
                .unwrap_or(0.0);
        let full = parents_full(r).await.unwrap_or(f64::MAX);
        if full > 0.0 && passes >= full {
            break;
        }
        if restarted.elapsed() > s.timeout {
            fail(
                replicas,
                &format!(
                    "restart: {passes} passes for {full} parents after {:?}",
                    s.timeout
                ),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = restarted.elapsed();
    let mut phase = finish(replicas, start, ns, "restart", took, 0, String::new()).await;
    let peaks: Vec<Peak> = replicas
        .iter()
        .enumerate()
        .filter(|(_, r)| r.alive)
        .map(|(i, r)| Peak {
            name: r.name.clone(),
            before_kb: before.get(i).copied().unwrap_or(0),
            peak_kb: common::proc_status_kb(r.op.pid(), "VmHWM").unwrap_or(0),
            after_kb: common::proc_status_kb(r.op.pid(), "VmRSS").unwrap_or(0),
            restarted: i == victim,
        })
        .collect();
    phase.detail = format!(
        "SIGTERM of {name} (exited in {:.2} s), started again; its passes done {:.2} s after; {}",
        term.as_secs_f64(),
        took.as_secs_f64(),
        peaks
            .iter()
            .map(Peak::describe)
            .collect::<Vec<_>>()
            .join("; ")
    );
    (phase, peaks)
}
