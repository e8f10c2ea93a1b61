//! The disruptions of the run with the most replicas: a replica SIGKILLed
//! mid-edit, then a replica added mid-edit. Either way every ConfigMap must
//! carry the edit, each written once.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::observe::Observer;
use crate::ring::{self, Replica};
use crate::{Phase, Settings, begin, fail, finish, wait_carrying};

/// An edit during which one replica is SIGKILLed once a quarter of the
/// ConfigMaps carry it: every ConfigMap must still carry it, each written
/// once, the dead replica's buckets taken over after its Lease expires.
pub async fn kill_mid_edit(
    replicas: &mut [Replica],
    observer: &Observer,
    ns: &str,
    s: &Settings,
    write_rule: &dyn Fn(u32),
) -> Phase {
    let n = s.parents;
    let views = ring::views(replicas).await;
    let victim = (0..replicas.len())
        .rev()
        .find(|&i| {
            replicas[i].alive && views[i].as_ref().is_some_and(|v| v.leader == s.kill_leader)
        })
        .unwrap_or_else(|| fail(replicas, "no replica to kill"));
    let start = begin(replicas, s.audit).await;
    write_rule(2);
    let at_kill = wait_carrying(replicas, observer, 2, n.div_ceil(4), start.at, s.timeout).await;
    let done_at_kill = observer.carrying("2");
    let killed = Instant::now();
    replicas[victim].kill().await;
    let role = if s.kill_leader {
        "the leader"
    } else {
        "a member, not the leader"
    };
    eprintln!(
        "[shards] SIGKILL {} ({role}) {:.2} s after the edit, {done_at_kill}/{n} done",
        replicas[victim].name,
        at_kill.as_secs_f64()
    );
    let took = wait_carrying(replicas, observer, 2, n, start.at, s.timeout).await;
    let after_kill = killed.elapsed();
    let (_, views) = ring::wait_settled(replicas, Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| fail(replicas, &e));
    let handover = killed.elapsed();
    let generation =
        ring::settled(&views, replicas.iter().filter(|r| r.alive).count()).unwrap_or(0);
    let detail = format!(
        "SIGKILL of {} ({role}) {:.2} s after the edit with {done_at_kill}/{n} ConfigMaps done; \
         the rest done {:.2} s after the kill; ring settled without it (generation {generation}) \
         {:.2} s after the kill",
        replicas[victim].name,
        at_kill.as_secs_f64(),
        after_kill.as_secs_f64(),
        handover.as_secs_f64()
    );
    finish(
        replicas,
        start,
        ns,
        "SIGKILL mid-edit",
        took,
        n as u64,
        detail,
    )
    .await
}

/// An edit during which a new replica starts once a tenth of the
/// ConfigMaps carry it: it takes its share with no child written twice.
#[allow(clippy::too_many_arguments)]
pub async fn join_mid_edit(
    replicas: &mut Vec<Replica>,
    observer: &Observer,
    ns: &str,
    s: &Settings,
    write_rule: &dyn Fn(u32),
    binary: &Path,
    rules: &Path,
    name: &str,
) -> Phase {
    let n = s.parents;
    let start = begin(replicas, s.audit).await;
    write_rule(3);
    let at_join = wait_carrying(replicas, observer, 3, n.div_ceil(10), start.at, s.timeout).await;
    let done_at_join = observer.carrying("3");
    let joined = Instant::now();
    replicas.push(Replica::start(binary, rules, ns, name));
    eprintln!(
        "[shards] {name} started {:.2} s after the edit, {done_at_join}/{n} done",
        at_join.as_secs_f64()
    );
    let took = wait_carrying(replicas, observer, 3, n, start.at, s.timeout).await;
    let (_, views) = ring::wait_settled(replicas, Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| fail(replicas, &e));
    let settled = joined.elapsed();
    let live = replicas.iter().filter(|r| r.alive).count();
    let generation = ring::settled(&views, live).unwrap_or(0);
    let theirs = views
        .last()
        .and_then(|v| v.as_ref())
        .map_or(0, |v| v.buckets.len());
    let detail = format!(
        "{name} started {:.2} s after the edit with {done_at_join}/{n} ConfigMaps done; \
         the edit done {:.2} s after the start; ring settled with it ({theirs} buckets, \
         generation {generation}) {:.2} s after its start",
        at_join.as_secs_f64(),
        (took.saturating_sub(at_join)).as_secs_f64(),
        settled.as_secs_f64()
    );
    finish(replicas, start, ns, "join mid-edit", took, n as u64, detail).await
}
