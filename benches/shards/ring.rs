//! The replicas of one run: `trellis run --leader-elect --shards`
//! processes on one rules directory and namespace, each read through its
//! own `/status` (ring membership, buckets, leader) and `/metrics` (the
//! writes it sent), and `/proc` (memory, CPU).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{self, OperatorProcess, Requests};

/// Short lease timings, as `tests/leader.rs` uses, so that a SIGKILLed
/// replica's buckets move in about 8 s (expiry, then a full lease
/// duration) instead of 30 s with the defaults (15 s / 10 s / 2 s).
pub const LEASE_ARGS: &[&str] = &[
    "--leader-elect-lease-duration=4s",
    "--leader-elect-renew-deadline=3s",
    "--leader-elect-retry-period=1s",
];

/// What one replica had counted at one moment.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// Its own `trellis_api_requests_total`.
    pub requests: Requests,
    /// `trellis_child_operations_total` with `op` create and update.
    pub child_creates: f64,
    pub child_updates: f64,
    /// `trellis_reconciles_total`, any result.
    pub reconciles: f64,
    /// User + system CPU seconds.
    pub cpu: f64,
}

impl Counters {
    /// What happened between `before` and `self`.
    pub fn since(&self, before: &Counters) -> Counters {
        Counters {
            requests: self.requests.since(&before.requests),
            child_creates: self.child_creates - before.child_creates,
            child_updates: self.child_updates - before.child_updates,
            reconciles: self.reconciles - before.reconciles,
            cpu: self.cpu - before.cpu,
        }
    }

    /// Write requests on the child ConfigMaps.
    pub fn child_writes(&self) -> u64 {
        self.requests.on(&["configmaps"]).writes()
    }

    /// Write requests on the parents' status.
    pub fn status_writes(&self, plural: &str) -> u64 {
        self.parent_writes(plural, true)
    }

    /// Write requests on the parents themselves (not their status): the
    /// `trellis.dev/bucket` label, once per parent.
    pub fn label_writes(&self, plural: &str) -> u64 {
        self.parent_writes(plural, false)
    }

    /// Writes on `[group/]plural[/status]`, with or without `/status`.
    fn parent_writes(&self, plural: &str, status: bool) -> u64 {
        let on = |resource: &str| {
            let parts: Vec<&str> = resource.split('/').collect();
            parts
                .iter()
                .position(|p| *p == plural)
                .is_some_and(|i| (parts.get(i + 1) == Some(&"status")) == status)
        };
        common::Requests(
            self.requests
                .0
                .iter()
                .filter(|(k, _)| on(&k.resource))
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
        )
        .writes()
    }

    pub fn event_writes(&self) -> u64 {
        self.requests.on(&["events"]).writes()
    }
}

/// Where one replica stands in the ring, by its `/status`.
#[derive(Debug, Clone)]
pub struct View {
    pub generation: u64,
    /// Buckets it writes now.
    pub buckets: Vec<u8>,
    /// Buckets assigned to it, not yet writable.
    pub waiting: usize,
    /// Live members as it sees them.
    pub members: u64,
    pub leader: bool,
}

/// One replica: its process, and its last counters (a SIGKILLed replica's
/// last word).
pub struct Replica {
    pub name: String,
    pub op: OperatorProcess,
    pub alive: bool,
    pub last: Counters,
    /// VmHWM in kB when last read (kept after a SIGKILL).
    pub hwm_kb: u64,
}

impl Replica {
    /// Starts `trellis run --leader-elect --shards` as Pod `name` (its
    /// member identity starts with it), the Leases in `ns`.
    pub fn start(binary: &Path, rules: &Path, ns: &str, name: &str) -> Replica {
        let mut args = vec!["--leader-elect", "--shards", "--leader-elect-namespace", ns];
        args.extend_from_slice(LEASE_ARGS);
        let op =
            OperatorProcess::start_with_env(binary, name, rules, ns, &args, &[("POD_NAME", name)]);
        Replica {
            name: name.to_owned(),
            op,
            alive: true,
            last: Counters::default(),
            hwm_kb: 0,
        }
    }

    /// Its `/status`, `None` while it does not answer.
    pub async fn view(&self) -> Option<View> {
        let text = crate::support::http_get(self.op.metrics, "/status")
            .await
            .ok()?;
        let status: Value = serde_json::from_str(&text).ok()?;
        let shard = status.get("shard").filter(|s| !s.is_null())?;
        let numbers = |key: &str| -> Vec<u8> {
            shard[key]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|b| b.as_u64().map(|b| b as u8))
                        .collect()
                })
                .unwrap_or_default()
        };
        Some(View {
            generation: shard["generation"].as_u64().unwrap_or(0),
            buckets: numbers("buckets"),
            waiting: numbers("waiting").len(),
            members: shard["members"].as_u64().unwrap_or(0),
            leader: status["leader"]["leader"].as_bool().unwrap_or(false),
        })
    }

    /// Reads its counters, keeping them as its last word; the last ones
    /// when it does not answer.
    pub async fn counters(&mut self) -> Counters {
        if !self.alive {
            return self.last.clone();
        }
        self.op.check_running();
        let pid = self.op.pid();
        let Ok(text) = crate::support::http_get(self.op.metrics, "/metrics").await else {
            return self.last.clone();
        };
        let counters = Counters {
            requests: Requests::parse_operator(&text),
            child_creates: sum(&text, "trellis_child_operations_total", "op=\"create\""),
            child_updates: sum(&text, "trellis_child_operations_total", "op=\"update\""),
            reconciles: sum(&text, "trellis_reconciles_total", ""),
            cpu: common::proc_cpu_seconds(pid).unwrap_or(self.last.cpu),
        };
        self.hwm_kb = common::proc_status_kb(pid, "VmHWM").unwrap_or(self.hwm_kb);
        self.last = counters.clone();
        counters
    }

    /// Reads its counters one last time, then SIGKILL: no handover.
    pub async fn kill(&mut self) -> Counters {
        let last = self.counters().await;
        let _ = self.op.child.kill();
        let _ = self.op.child.wait();
        self.alive = false;
        last
    }

    /// SIGTERM; whether it exited cleanly.
    pub fn terminate(&mut self) -> Result<Duration, String> {
        if !self.alive {
            return Ok(Duration::ZERO);
        }
        let (took, status) = self.op.terminate();
        self.alive = false;
        if status.success() {
            Ok(took)
        } else {
            Err(format!("{} exited with {status} after SIGTERM", self.name))
        }
    }
}

/// The sum of the samples of `name` whose labels hold `label`.
fn sum(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        // An empty sum is -0.0: printed as "-0".
        .sum::<f64>()
        + 0.0
}

/// The ring as the live replicas see it, once it has settled: every live
/// replica sees `live` members and the same generation, waits for nothing,
/// and their buckets are disjoint and cover all 256; one is the leader.
pub fn settled(views: &[Option<View>], live: usize) -> Result<u64, String> {
    let views: Vec<&View> = views.iter().flatten().collect();
    if views.len() != live {
        return Err(format!("{} of {live} replicas answer", views.len()));
    }
    let generation = views[0].generation;
    let mut covered = [0u8; 256];
    for v in &views {
        if v.members != live as u64 || v.generation != generation || v.waiting > 0 {
            return Err(format!(
                "a replica sees {} members at generation {} (first: {generation}), waiting for {} buckets",
                v.members, v.generation, v.waiting
            ));
        }
        for &b in &v.buckets {
            covered[b as usize] += 1;
        }
    }
    let leaders = views.iter().filter(|v| v.leader).count();
    let missing = covered.iter().filter(|&&c| c == 0).count();
    let doubled = covered.iter().filter(|&&c| c > 1).count();
    if missing > 0 || doubled > 0 || leaders != 1 {
        return Err(format!(
            "{missing} buckets unowned, {doubled} owned twice, {leaders} leaders"
        ));
    }
    Ok(generation)
}

/// Views of every replica (`None` for a dead or silent one).
pub async fn views(replicas: &[Replica]) -> Vec<Option<View>> {
    let mut out = Vec::new();
    for r in replicas {
        out.push(if r.alive { r.view().await } else { None });
    }
    out
}

/// Waits until the ring of the live replicas has settled; the time it took
/// and the views then.
pub async fn wait_settled(
    replicas: &mut [Replica],
    timeout: Duration,
) -> Result<(Duration, Vec<Option<View>>), String> {
    let started = Instant::now();
    let live = replicas.iter().filter(|r| r.alive).count();
    loop {
        for r in replicas.iter_mut().filter(|r| r.alive) {
            r.op.check_running();
        }
        let views = views(replicas).await;
        let state = settled(&views, live);
        if state.is_ok() {
            return Ok((started.elapsed(), views));
        }
        if started.elapsed() > timeout {
            return Err(format!(
                "the ring of {live} replicas did not settle in {timeout:?}: {}",
                state.unwrap_err()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until no replica's write counters on `resources` move for `quiet`
/// (at most `limit`): the passes a phase started have ended.
pub async fn wait_quiet(
    replicas: &mut [Replica],
    resources: &[&str],
    quiet: Duration,
    limit: Duration,
) {
    let started = Instant::now();
    let mut last = Vec::new();
    let mut still_since = Instant::now();
    loop {
        let mut now = Vec::new();
        for r in replicas.iter_mut() {
            now.push(r.counters().await.requests.on(resources).writes());
        }
        if now != last {
            last = now;
            still_since = Instant::now();
        } else if still_since.elapsed() >= quiet {
            return;
        }
        if started.elapsed() > limit {
            eprintln!("[shards] writes still moving after {limit:?}; counting anyway");
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
