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
//!
//! Files: this one holds [`Shards`], what the write path asks;
//! `membership.rs` the loop that keeps it current (and, on the leader,
//! publishes the assignment); `member_lease.rs` what a member Lease looks like;
//! `labeller.rs` the bucket label on parents, by which each replica lists
//! only its own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde_json::{Value, json};
use tokio::sync::{Notify, watch};

use super::leader::epoch_millis;
use crate::operator::lock;
use crate::shard::handover::Handover;
use crate::shard::{Bucket, BucketSet, bucket_of};
use crate::telemetry::Metrics;

pub mod labeller;
mod member_lease;
mod membership;

pub use member_lease::{ANNOTATION_ACK, ANNOTATION_MEMBER, LABEL_RING, member_lease_name};
pub use membership::Membership;

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
        let mut handover = lock(&self.shards.handover);
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
        self.fenced() && lock(&self.handover).writable().contains(bucket_of(uid))
    }

    /// Whether a write for the parent with `uid` is refused only because
    /// our member Lease's renewal is late (its bucket is ours): the pass is
    /// worth trying again shortly. Nothing else would wake it: the renewal
    /// that lifts the fence may come before anyone looks at the fence, so
    /// the buckets never show as closed meanwhile.
    pub fn fenced_out(&self, uid: &str) -> bool {
        !self.fenced() && lock(&self.handover).writable().contains(bucket_of(uid))
    }

    /// Starts a pass of the parent with `uid`; `None` when its bucket is
    /// not ours to write (now).
    pub fn begin(self: &Arc<Self>, uid: &str) -> Option<PassGuard> {
        let bucket = bucket_of(uid);
        if !self.fenced() || !lock(&self.handover).begin(bucket) {
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
        let h = lock(&self.handover);
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
        let h = lock(&self.handover);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::ring::Assignment;
    use std::time::Duration;

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
        assert!(shards.fenced_out(uid), "ours, refused only by the fence");
        shards.fence_until.store(
            epoch_millis(SystemTime::now() + Duration::from_secs(60)),
            Ordering::Release,
        );
        assert!(shards.may_write(uid));
        assert!(!shards.fenced_out(uid));
        let pass = shards.begin(uid).expect("writable and fenced");
        lock_handover(&shards).assign(&Assignment::new(2, vec!["b".to_owned()]));
        assert!(!shards.may_write(uid), "a lost bucket stops writes at once");
        assert!(!shards.fenced_out(uid), "not ours: nothing to try again");
        assert_eq!(lock_handover(&shards).ack_due(), None, "a pass is running");
        drop(pass);
        assert_eq!(lock_handover(&shards).ack_due(), Some(2));
    }

    fn lock_handover(shards: &Shards) -> std::sync::MutexGuard<'_, Handover> {
        lock(&shards.handover)
    }
}
