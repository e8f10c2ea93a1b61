//! `trellis run --leader-elect --shards`: this replica's membership and the
//! buckets it may write, carried out with Leases (the decisions are
//! [`crate::shard`]'s).
//!
//! ```text
//!  own member Lease ◀──renew every retry period (ack annotation)── Membership loop
//!  member Leases (label trellis.dev/ring) ──watch──▶ members seen ──▶ Handover::clear ──▶ opened
//!  leader Lease (annotation: assignment) ──watch──▶ Handover::assign ──▶ closed, owned
//!      ▲ the leader: live members changed? publish the next generation
//!  Shards: writable buckets + own-Lease fence ──▶ every per-parent write checks both
//! ```
//!
//! The fence is the leader gate's, per member: a replica whose own Lease
//! was last renewed more than the renew deadline ago writes nothing, so by
//! the time others may take its buckets (its Lease expired, then a full
//! lease duration) it has stopped.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::leader::{Gate, Settings};
use crate::shard::handover::{Changes, Handover, MemberLease};
use crate::shard::ring::{ANNOTATION_ASSIGNMENT, Assignment};
use crate::shard::{Bucket, BucketSet, bucket_of};
use crate::telemetry::Metrics;

/// Label on every member Lease: the leader Lease's name (one ring per Lease).
pub const LABEL_RING: &str = "trellis.dev/ring";
/// On a member Lease: the generation this member acknowledged.
pub const ANNOTATION_ACK: &str = "trellis.dev/shard-ack";
/// On a member Lease: the member's identity (kept after a release, which
/// clears `holderIdentity`).
pub const ANNOTATION_MEMBER: &str = "trellis.dev/shard-member";
const FIELD_MANAGER: &str = "trellis-shards";

/// One replica's buckets: what the write path asks.
pub struct Shards {
    handover: Mutex<Handover>,
    /// Milliseconds since the epoch until which our member Lease lets us write.
    fence_until: AtomicU64,
    owned: watch::Sender<BucketSet>,
    writable: watch::Sender<BucketSet>,
    /// A pass ended: an acknowledgement may be due.
    pass_ended: Notify,
    members_live: AtomicU64,
}

/// A pass in a bucket; ends (for the handover's drain) when dropped.
pub struct PassGuard {
    shards: Arc<Shards>,
    bucket: Bucket,
}

impl Drop for PassGuard {
    fn drop(&mut self) {
        let mut handover = super::lock(&self.shards.handover);
        handover.end(self.bucket);
        // Only the end of a pass in a bucket being handed over (or of any
        // pass while leaving) can make an acknowledgement due: the others
        // need not wake the membership loop, thousands of times a minute.
        let draining = !handover.owned().contains(self.bucket);
        drop(handover);
        if draining {
            self.shards.pass_ended.notify_one();
        }
    }
}

impl Shards {
    pub fn new(identity: &str) -> Arc<Shards> {
        Arc::new(Shards {
            handover: Mutex::new(Handover::new(identity)),
            fence_until: AtomicU64::new(0),
            owned: watch::channel(BucketSet::empty()).0,
            writable: watch::channel(BucketSet::empty()).0,
            pass_ended: Notify::new(),
            members_live: AtomicU64::new(0),
        })
    }

    fn fenced(&self) -> bool {
        epoch_millis(SystemTime::now()) < self.fence_until.load(Ordering::Acquire)
    }

    /// Whether a write for the parent with `uid` may go out now.
    pub fn may_write(&self, uid: &str) -> bool {
        self.fenced()
            && super::lock(&self.handover)
                .writable()
                .contains(bucket_of(uid))
    }

    /// Starts a pass of the parent with `uid`; `None` when its bucket is
    /// not ours to write (now).
    pub fn begin(self: &Arc<Self>, uid: &str) -> Option<PassGuard> {
        let bucket = bucket_of(uid);
        if !self.fenced() || !super::lock(&self.handover).begin(bucket) {
            return None;
        }
        Some(PassGuard {
            shards: self.clone(),
            bucket,
        })
    }

    /// The buckets assigned to us (what child watches select).
    pub fn owned(&self) -> watch::Receiver<BucketSet> {
        self.owned.subscribe()
    }

    /// The buckets we write now.
    pub fn writable(&self) -> watch::Receiver<BucketSet> {
        self.writable.subscribe()
    }

    /// `/status` → `shard`.
    pub fn status_json(&self) -> Value {
        let h = super::lock(&self.handover);
        let numbers = |set: BucketSet| set.iter().map(|b| b.0).collect::<Vec<u8>>();
        json!({
            "member": h.member(),
            "generation": h.generation(),
            "buckets": numbers(h.writable()),
            "waiting": numbers(h.owned().minus(&h.writable())),
            "members": self.members_live.load(Ordering::Relaxed),
        })
    }

    /// Tells the watches and the triggers what changed. A lapsed fence
    /// counts as no bucket writable, so that renewing again wakes the
    /// buckets' parents whose passes it refused meanwhile.
    fn publish(&self, metrics: &Metrics) {
        let h = super::lock(&self.handover);
        let writable = if self.fenced() {
            h.writable()
        } else {
            BucketSet::empty()
        };
        self.owned
            .send_if_modified(|o| std::mem::replace(o, h.owned()) != h.owned());
        self.writable
            .send_if_modified(|w| std::mem::replace(w, writable) != writable);
        metrics.shard_buckets.set(writable.len() as i64);
        metrics.shard_generation.set(h.generation() as i64);
        metrics
            .shard_members
            .set(self.members_live.load(Ordering::Relaxed) as i64);
    }
}

/// The member Lease name of `identity` (a DNS subdomain: lower case,
/// `[a-z0-9-.]`).
pub fn member_lease_name(lease: &str, identity: &str) -> String {
    let id: String = identity
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
            _ => '-',
        })
        .collect();
    let id = id.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let mut name = format!("{lease}-member-{id}");
    name.truncate(253);
    name
}

/// A running membership; [`Membership::release`] on shutdown.
pub struct Membership {
    task: JoinHandle<()>,
}

impl Membership {
    /// Joins the ring; leaves it when `shutdown` is cancelled (every bucket
    /// closes at once; the Lease is released once running passes end).
    pub fn start(
        client: Client,
        settings: Settings,
        shards: Arc<Shards>,
        leader: Gate,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> Membership {
        let member = Member {
            api: Api::namespaced(client, &settings.namespace),
            name: member_lease_name(&settings.lease_name, &settings.identity),
            settings,
            shards,
            leader,
            metrics,
        };
        Membership {
            task: tokio::spawn(member.run(shutdown)),
        }
    }

    /// Waits until the Lease is released (a few seconds at most).
    pub async fn release(self) {
        if tokio::time::timeout(Duration::from_secs(8), self.task)
            .await
            .is_err()
        {
            warn!(
                "shards: leaving the ring took too long; the others wait for the Lease to expire"
            );
        }
    }
}

struct Member {
    api: Api<Lease>,
    name: String,
    settings: Settings,
    shards: Arc<Shards>,
    leader: Gate,
    metrics: Arc<Metrics>,
}

/// What this replica sees of the ring.
#[derive(Default)]
struct View {
    /// Member Leases by name, as of the last complete list and the events since.
    members: BTreeMap<String, Lease>,
    /// A (re)list under way: taken as `members` once complete.
    listing: Option<BTreeMap<String, Lease>>,
    /// The member Leases were listed at least once.
    listed: bool,
    /// As last published on the leader's Lease.
    assignment: Option<Assignment>,
}

impl Member {
    async fn run(self, shutdown: CancellationToken) {
        let s = &self.settings;
        let ring = watcher::Config::default().labels(&format!("{LABEL_RING}={}", s.lease_name));
        let mut members = watcher(self.api.clone(), ring).default_backoff().boxed();
        let leader_lease =
            watcher::Config::default().fields(&format!("metadata.name={}", s.lease_name));
        let mut leader = watcher(self.api.clone(), leader_lease)
            .default_backoff()
            .boxed();
        let mut view = View::default();
        let mut tick = tokio::time::interval(s.retry_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        info!(member = %s.identity, lease = %self.name, "shards: joining the ring");
        loop {
            let mut renew = false;
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => renew = true,
                _ = self.shards.pass_ended.notified() => {}
                event = members.next() => match event {
                    Some(Ok(watcher::Event::Apply(l))) => {
                        view.members.insert(l.name_any(), l);
                    }
                    Some(Ok(watcher::Event::Delete(l))) => {
                        view.members.remove(&l.name_any());
                    }
                    // A (re)list is taken whole, never decided on halfway:
                    // a leader acting on a half-listed ring would publish
                    // an assignment without the members not listed yet.
                    Some(Ok(watcher::Event::Init)) => view.listing = Some(BTreeMap::new()),
                    Some(Ok(watcher::Event::InitApply(l))) => {
                        view.listing.get_or_insert_with(BTreeMap::new).insert(l.name_any(), l);
                    }
                    Some(Ok(watcher::Event::InitDone)) => {
                        view.members = view.listing.take().unwrap_or_default();
                        view.listed = true;
                    }
                    Some(Err(err)) => debug!("shards: watching member Leases: {err}"),
                    None => members = futures::stream::pending().boxed(),
                },
                event = leader.next() => match event {
                    Some(Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l))) => {
                        // Only forward: an event older than this leader's
                        // own last publication must not take it back.
                        if let Some(a) = published(&l)
                            && view.assignment.as_ref().is_none_or(|c| a.generation >= c.generation)
                        {
                            view.assignment = Some(a);
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(err)) => debug!("shards: watching Lease {}: {err}", s.lease_name),
                    None => leader = futures::stream::pending().boxed(),
                },
            }
            if self.leader.may_write() && view.listed && view.listing.is_none() {
                self.lead(&mut view).await;
            }
            self.step(&view);
            let ack = super::lock(&self.shards.handover).ack_due();
            if renew || ack.is_some() {
                self.renew(ack, false).await;
            }
            self.shards.publish(&self.metrics);
        }
        self.leave().await;
    }

    /// Applies what the ring says to the handover.
    fn step(&self, view: &View) {
        let now = SystemTime::now();
        let mut h = super::lock(&self.shards.handover);
        if let Some(a) = &view.assignment {
            let changes = h.assign(a);
            log_changes(&changes, h.generation(), "assigned");
        }
        let mut seen: Vec<MemberLease> = view
            .members
            .values()
            .filter_map(|l| member_of(l, self.settings.lease_duration))
            .collect();
        // A member the assignment names but whose Lease is not seen (yet)
        // may still be writing: wait for it as if it had just renewed.
        if let Some(a) = &view.assignment {
            for m in &a.members {
                if !seen.iter().any(|s| &s.name == m) {
                    seen.push(MemberLease {
                        name: m.clone(),
                        acked: 0,
                        renewed: Some(now),
                        lease_duration: self.settings.lease_duration,
                        released: false,
                    });
                }
            }
        }
        let live = seen.iter().filter(|m| is_live(m, now)).count();
        self.shards
            .members_live
            .store(live as u64, Ordering::Relaxed);
        let changes = h.clear(&seen, now);
        log_changes(&changes, h.generation(), "cleared");
    }

    /// The leader's duty: publish the next assignment when the live members
    /// changed, and delete member Leases long dead.
    async fn lead(&self, view: &mut View) {
        let now = SystemTime::now();
        // Our own renewals come back through the same watch: when the last
        // one seen is older than a lease duration, the watch lags (a loaded
        // API server) and every other member would look expired too.
        let fresh = view
            .members
            .get(&self.name)
            .and_then(|l| member_of(l, self.settings.lease_duration))
            .is_some_and(|me| is_live(&me, now));
        if !fresh {
            debug!(
                "shards: the member Leases as seen are stale (our own renewal is not in): no decision"
            );
            return;
        }
        let live: Vec<String> = view
            .members
            .values()
            .filter_map(|l| member_of(l, self.settings.lease_duration))
            .filter(|m| is_live(m, now))
            .map(|m| m.name)
            .collect();
        if live.is_empty() {
            return;
        }
        let current = view
            .assignment
            .clone()
            .unwrap_or_else(|| Assignment::new(0, Vec::new()));
        if current.next(live.clone()) != current {
            self.publish_next(view, live).await;
        }
        // A member gone for ten lease durations, and not in the assignment,
        // is only clutter: its Lease goes.
        let assigned = view.assignment.as_ref().map(|a| &a.members);
        let dead: Vec<String> = view
            .members
            .iter()
            .filter(|(_, l)| {
                member_of(l, self.settings.lease_duration).is_some_and(|m| {
                    assigned.is_none_or(|a| !a.contains(&m.name))
                        && m.renewed
                            .is_none_or(|at| at + self.settings.lease_duration * 10 <= now)
                })
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in dead {
            match self.api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => info!(lease = %name, "shards: deleted the Lease of a member long gone"),
                Err(err) => debug!("shards: deleting Lease {name}: {err}"),
            }
            view.members.remove(&name);
        }
    }

    /// SIGTERM: every bucket closes at once; once the running passes have
    /// ended (a few seconds at most) the Lease is acknowledged and released,
    /// so the new owners start without waiting for it to expire.
    async fn leave(&self) {
        let changes = super::lock(&self.shards.handover).release();
        self.shards.publish(&self.metrics);
        info!(
            closed = changes.closed.len(),
            "shards: leaving: stopped writing every bucket"
        );
        let drained = async {
            loop {
                let ended = self.shards.pass_ended.notified();
                if super::lock(&self.shards.handover).drained() {
                    return;
                }
                ended.await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(5), drained)
            .await
            .is_err()
        {
            warn!(
                "shards: passes still running after 5s; releasing the Lease anyway (they can no longer write)"
            );
        }
        let generation = super::lock(&self.shards.handover).generation();
        self.renew(Some(generation), true).await;
        info!(lease = %self.name, "shards: member Lease released: the others take over at once");
    }

    /// Publishes the next assignment over exactly the one the Lease holds:
    /// read, then written with that resourceVersion, so a generation is
    /// never published twice with different members (by a leader whose
    /// watch lags, or by two leaders in a handover). A conflict is retried
    /// on the next turn of the loop.
    async fn publish_next(&self, view: &mut View, live: Vec<String>) {
        let lease = match self.api.get(&self.settings.lease_name).await {
            Ok(lease) => lease,
            Err(err) => {
                warn!(
                    "shards: cannot read Lease {}: {err}",
                    self.settings.lease_name
                );
                return;
            }
        };
        let there = published(&lease).unwrap_or_else(|| Assignment::new(0, Vec::new()));
        let next = there.next(live);
        if next == there {
            view.assignment = Some(there);
            return;
        }
        let patch = json!({"metadata": {
            "resourceVersion": lease.resource_version(),
            "annotations": {ANNOTATION_ASSIGNMENT: next.to_annotation()},
        }});
        match self
            .api
            .patch(
                &self.settings.lease_name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {
                info!(
                    generation = next.generation,
                    members = %next.members.join(","),
                    "shards: published a new assignment"
                );
                view.assignment = Some(next);
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                debug!("shards: the Lease changed while publishing the assignment; trying again")
            }
            Err(err) => warn!("shards: cannot publish the assignment: {err}"),
        }
    }

    /// Renews our member Lease (and publishes `ack`); `released` gives it up.
    async fn renew(&self, ack: Option<u64>, released: bool) {
        let acked = ack.unwrap_or_else(|| super::lock(&self.shards.handover).acknowledged());
        let sent = SystemTime::now();
        let holder = (!released).then_some(self.settings.identity.as_str());
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "labels": {LABEL_RING: self.settings.lease_name},
                "annotations": {
                    ANNOTATION_ACK: acked.to_string(),
                    ANNOTATION_MEMBER: self.settings.identity,
                },
            },
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": self.settings.lease_duration.as_secs(),
                "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::try_from(sent).unwrap_or_default()),
            },
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        match self
            .api
            .patch(&self.name, &params, &Patch::Apply(&lease))
            .await
        {
            Ok(_) => {
                if !released {
                    let until = sent + self.settings.renew_deadline;
                    self.shards
                        .fence_until
                        .store(epoch_millis(until), Ordering::Release);
                }
                if let Some(g) = ack {
                    super::lock(&self.shards.handover).acked(g);
                    info!(generation = g, "shards: acknowledged generation {g}");
                }
            }
            Err(err) => warn!(lease = %self.name, "shards: cannot renew the member Lease: {err}"),
        }
    }
}

/// The assignment a leader Lease carries, if any (a bad one is logged).
fn published(lease: &Lease) -> Option<Assignment> {
    let text = lease.annotations().get(ANNOTATION_ASSIGNMENT)?;
    match Assignment::from_annotation(text) {
        Ok(a) => Some(a),
        Err(err) => {
            warn!("shards: Lease {}: {err}", lease.name_any());
            None
        }
    }
}

/// What the handover needs of a member Lease.
fn member_of(lease: &Lease, default_duration: Duration) -> Option<MemberLease> {
    let spec = lease.spec.as_ref();
    let holder = spec
        .and_then(|s| s.holder_identity.clone())
        .filter(|h| !h.is_empty());
    let name = lease
        .annotations()
        .get(ANNOTATION_MEMBER)
        .cloned()
        .or_else(|| holder.clone())?;
    Some(MemberLease {
        name,
        acked: lease
            .annotations()
            .get(ANNOTATION_ACK)
            .and_then(|a| a.parse().ok())
            .unwrap_or(0),
        renewed: spec
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| SystemTime::from(t.0)),
        lease_duration: spec
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|d| u64::try_from(d).ok())
            .map_or(default_duration, Duration::from_secs),
        released: holder.is_none(),
    })
}

/// Holds its Lease now: renewed within its duration and not released.
fn is_live(m: &MemberLease, now: SystemTime) -> bool {
    !m.released && m.renewed.is_some_and(|at| at + m.lease_duration > now)
}

fn log_changes(changes: &Changes, generation: u64, why: &str) {
    if !changes.closed.is_empty() {
        info!(
            generation,
            closed = changes.closed.len(),
            "shards: generation {generation}: stopped writing {} buckets ({why})",
            changes.closed.len()
        );
    }
    if !changes.opened.is_empty() {
        info!(
            generation,
            opened = changes.opened.len(),
            "shards: generation {generation}: writing {} more buckets ({why})",
            changes.opened.len()
        );
    }
}

fn epoch_millis(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use kube::api::ObjectMeta;

    fn lease(holder: Option<&str>, member: Option<&str>, ack: &str, renewed_ago: u64) -> Lease {
        let renewed = SystemTime::now() - Duration::from_secs(renewed_ago);
        Lease {
            metadata: ObjectMeta {
                name: Some("trellis-member-x".into()),
                annotations: Some(
                    [
                        (ANNOTATION_ACK.to_owned(), ack.to_owned()),
                        (
                            ANNOTATION_MEMBER.to_owned(),
                            member.unwrap_or_default().to_owned(),
                        ),
                    ]
                    .into_iter()
                    .filter(|(_, v)| !v.is_empty())
                    .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: Some(4),
                renew_time: Some(MicroTime(
                    k8s_openapi::jiff::Timestamp::try_from(renewed).expect("a valid time"),
                )),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn member_lease_names_are_dns_subdomains() {
        assert_eq!(
            member_lease_name("trellis", "trellis-7d9f_0a1b2c3d"),
            "trellis-member-trellis-7d9f-0a1b2c3d"
        );
        assert_eq!(member_lease_name("t", "_Host.Name_"), "t-member-host.name");
        assert!(member_lease_name("t", &"x".repeat(400)).len() <= 253);
    }

    #[test]
    fn a_member_lease_reads_as_its_identity_ack_renewal_and_release() {
        let live = member_of(
            &lease(Some("a_1"), Some("a_1"), "7", 1),
            Duration::from_secs(15),
        )
        .expect("a member");
        assert_eq!(live.name, "a_1");
        assert_eq!(live.acked, 7);
        assert_eq!(
            live.lease_duration,
            Duration::from_secs(4),
            "its own duration"
        );
        assert!(!live.released);
        assert!(is_live(&live, SystemTime::now()));

        // Released on SIGTERM: holderIdentity cleared, the identity kept.
        let gone = member_of(&lease(None, Some("a_1"), "7", 1), Duration::from_secs(15))
            .expect("a member");
        assert_eq!(gone.name, "a_1");
        assert!(gone.released && !is_live(&gone, SystemTime::now()));

        // Not renewed for longer than its duration: not live any more.
        let silent = member_of(&lease(Some("b_2"), None, "x", 5), Duration::from_secs(15))
            .expect("named by its holder");
        assert_eq!((silent.name.as_str(), silent.acked), ("b_2", 0));
        assert!(!is_live(&silent, SystemTime::now()));

        // Neither a holder nor a member annotation: not a member at all.
        assert!(member_of(&lease(None, None, "1", 0), Duration::from_secs(15)).is_none());
    }

    #[test]
    fn a_pass_counts_until_dropped_and_only_in_a_writable_bucket_while_fenced() {
        let shards = Shards::new("a");
        let uid = "some-uid";
        assert!(shards.begin(uid).is_none(), "nothing assigned yet");
        {
            let mut h = lock_handover(&shards);
            h.assign(&Assignment::new(1, vec!["a".to_owned()]));
            h.clear(&[], SystemTime::now());
        }
        assert!(shards.begin(uid).is_none(), "fence not yet renewed");
        assert!(!shards.may_write(uid));
        shards.fence_until.store(
            epoch_millis(SystemTime::now() + Duration::from_secs(60)),
            Ordering::Release,
        );
        assert!(shards.may_write(uid));
        let pass = shards.begin(uid).expect("writable and fenced");
        lock_handover(&shards).assign(&Assignment::new(2, vec!["b".to_owned()]));
        assert!(!shards.may_write(uid), "a lost bucket stops writes at once");
        assert_eq!(lock_handover(&shards).ack_due(), None, "a pass is running");
        drop(pass);
        assert_eq!(lock_handover(&shards).ack_due(), Some(2));
    }

    fn lock_handover(shards: &Shards) -> std::sync::MutexGuard<'_, Handover> {
        super::super::lock(&shards.handover)
    }
}
