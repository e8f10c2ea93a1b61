//! The membership loop: renews this replica's member Lease (the fence and
//! the acknowledgement), watches the ring and the leader's assignment, feeds
//! both to the handover in [`Shards`], and, on the leader, publishes the next
//! assignment. Apart from [`Shards`] because this is the part that talks to
//! the API server.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Shards;
use super::member_lease::{
    ANNOTATION_ACK, ANNOTATION_MEMBER, LABEL_RING, is_live, member_lease_name, member_of,
};
use crate::operator::leadership::leader::{Gate, Settings, epoch_millis};
use crate::operator::lock;
use crate::shard::handover::{Changes, MemberLease};
use crate::shard::ring::{ANNOTATION_ASSIGNMENT, Assignment};
use crate::telemetry::Metrics;

const FIELD_MANAGER: &str = "trellis-shards";

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
            let ack = lock(&self.shards.handover).ack_due();
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
        let mut h = lock(&self.shards.handover);
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
        let changes = lock(&self.shards.handover).release();
        self.shards.publish(&self.metrics);
        info!(
            closed = changes.closed.len(),
            "shards: leaving: stopped writing every bucket"
        );
        let drained = async {
            loop {
                let ended = self.shards.pass_ended.notified();
                if lock(&self.shards.handover).drained() {
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
        let generation = lock(&self.shards.handover).generation();
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
        let acked = ack.unwrap_or_else(|| lock(&self.shards.handover).acknowledged());
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
                    lock(&self.shards.handover).acked(g);
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
