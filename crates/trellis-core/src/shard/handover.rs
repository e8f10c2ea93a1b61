//! Handing buckets over between replicas without two of them ever writing
//! the same parent: a state machine stepped by the operator, no I/O.
//!
//! ```text
//!  assignment G seen ──▶ lost buckets: no new pass starts (at once)
//!        │                 in-flight passes in them end ──▶ ack G on our member Lease
//!        └──────────────▶ gained buckets: waiting
//!                          every other member acked ≥ G, released its Lease,
//!                          or let it expire for a full lease duration ──▶ writable
//! ```
//!
//! The barrier for a gained bucket is every other member, not only the
//! bucket's previous owner: a bucket that moved twice before anyone acted
//! (A → B → C) may still be written by A, and an ack of G by a member means
//! it has applied G and ended every pass outside its G buckets. A member
//! that joins owns nothing until the next assignment, so it acks at once.
//! A member gone silent is waited out: its Lease expired once means it has
//! stopped (its own fencing stops writes before the renew deadline), and a
//! second lease duration covers clock skew and a pass already past the
//! fence check.

use std::time::{Duration, SystemTime};

use super::ring::Assignment;
use super::{BUCKETS, Bucket, BucketSet};

/// What one replica sees of another member's Lease.
#[derive(Debug, Clone)]
pub struct MemberLease {
    pub name: String,
    /// The generation it acknowledged (annotation on its Lease); none yet: 0.
    pub acked: u64,
    /// Its last renewal, as the Lease says.
    pub renewed: Option<SystemTime>,
    pub lease_duration: Duration,
    /// It gave the Lease up (SIGTERM): it writes nothing any more.
    pub released: bool,
}

impl MemberLease {
    /// Whether this member can no longer be writing anything unless it
    /// acknowledged `generation`.
    fn cleared(&self, generation: u64, now: SystemTime) -> bool {
        if self.released || self.acked >= generation {
            return true;
        }
        match self.renewed {
            // Expired, and then a full lease duration more.
            Some(at) => at + self.lease_duration * 2 <= now,
            None => true,
        }
    }
}

/// One replica's view of its buckets.
#[derive(Debug)]
pub struct Handover {
    me: String,
    generation: u64,
    /// Assigned to us at `generation`.
    owned: BucketSet,
    /// May be written now: owned, and cleared by the barrier.
    writable: BucketSet,
    /// The generation we acknowledged (published on our Lease).
    acked: u64,
    /// Passes running per bucket.
    in_flight: Box<[u32; BUCKETS]>,
    /// Shutting down: nothing is ours any more.
    released: bool,
}

/// What changed in a step, for the operator to carry out.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Buckets that became writable (their parents must be reconciled).
    pub opened: BucketSet,
    /// Buckets that stopped being writable.
    pub closed: BucketSet,
}

impl Handover {
    pub fn new(me: impl Into<String>) -> Handover {
        Handover {
            me: me.into(),
            generation: 0,
            owned: BucketSet::empty(),
            writable: BucketSet::empty(),
            acked: 0,
            in_flight: Box::new([0; BUCKETS]),
            released: false,
        }
    }

    pub fn member(&self) -> &str {
        &self.me
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Assigned to us at the current generation (what the child watches
    /// should select, so caches are warm before the buckets open).
    pub fn owned(&self) -> BucketSet {
        self.owned
    }

    pub fn writable(&self) -> BucketSet {
        self.writable
    }

    /// A newer assignment: lost buckets close at once; gained ones wait
    /// for [`Handover::clear`]. An older or equal generation is ignored.
    pub fn assign(&mut self, assignment: &Assignment) -> Changes {
        if assignment.generation <= self.generation || self.released {
            return Changes::default();
        }
        self.generation = assignment.generation;
        self.owned = assignment.buckets_of(&self.me);
        let closed = self.writable.minus(&self.owned);
        self.writable = self.writable.minus(&closed);
        Changes {
            opened: BucketSet::empty(),
            closed,
        }
    }

    /// Opens the owned buckets once every other member has cleared the
    /// current generation.
    pub fn clear(&mut self, members: &[MemberLease], now: SystemTime) -> Changes {
        let waiting = self.owned.minus(&self.writable);
        if waiting.is_empty() || self.released {
            return Changes::default();
        }
        let barrier = members
            .iter()
            .filter(|m| m.name != self.me)
            .all(|m| m.cleared(self.generation, now));
        if !barrier {
            return Changes::default();
        }
        self.writable = self.owned;
        Changes {
            opened: waiting,
            closed: BucketSet::empty(),
        }
    }

    /// The generation last acknowledged (what the member Lease carries).
    pub fn acknowledged(&self) -> u64 {
        self.acked
    }

    /// The generation to acknowledge now, if it is new: every pass in a
    /// bucket we do not own any more has ended.
    pub fn ack_due(&self) -> Option<u64> {
        if self.generation <= self.acked {
            return None;
        }
        let draining = (0..BUCKETS)
            .map(|b| Bucket(b as u8))
            .any(|b| self.in_flight[b.0 as usize] > 0 && !self.owned.contains(b));
        (!draining).then_some(self.generation)
    }

    /// The acknowledgement of `generation` was published.
    pub fn acked(&mut self, generation: u64) {
        self.acked = self.acked.max(generation);
    }

    /// A pass of a parent in `bucket` may start only when it is writable;
    /// it must call [`Handover::end`] when it is over, however it ends.
    pub fn begin(&mut self, bucket: Bucket) -> bool {
        if !self.writable.contains(bucket) {
            return false;
        }
        self.in_flight[bucket.0 as usize] += 1;
        true
    }

    pub fn end(&mut self, bucket: Bucket) {
        let n = &mut self.in_flight[bucket.0 as usize];
        *n = n.saturating_sub(1);
    }

    /// Shutting down (SIGTERM): every bucket closes at once; once
    /// [`Handover::drained`], the operator acknowledges and releases its
    /// Lease, and the new owners take over without waiting for expiry.
    pub fn release(&mut self) -> Changes {
        self.released = true;
        let closed = self.writable;
        self.owned = BucketSet::empty();
        self.writable = BucketSet::empty();
        Changes {
            opened: BucketSet::empty(),
            closed,
        }
    }

    /// No pass is running in any bucket.
    pub fn drained(&self) -> bool {
        self.in_flight.iter().all(|n| *n == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(15);

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
    }

    fn lease(name: &str, acked: u64, renewed: u64) -> MemberLease {
        MemberLease {
            name: name.into(),
            acked,
            renewed: Some(at(renewed)),
            lease_duration: LEASE,
            released: false,
        }
    }

    fn members(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_fresh_ring_opens_once_everyone_acked_the_first_generation() {
        let g1 = Assignment::new(1, members(&["a", "b"]));
        let mut a = Handover::new("a");
        assert_eq!(a.assign(&g1), Changes::default());
        assert!(a.writable().is_empty());
        assert_eq!(a.ack_due(), Some(1));
        a.acked(1);
        assert_eq!(a.ack_due(), None);
        // b has not acked generation 1: nothing opens.
        let before = [lease("a", 1, 0), lease("b", 0, 0)];
        assert_eq!(a.clear(&before, at(1)), Changes::default());
        let after = [lease("a", 1, 0), lease("b", 1, 1)];
        let changes = a.clear(&after, at(2));
        assert_eq!(changes.opened, g1.buckets_of("a"));
        assert_eq!(a.writable(), g1.buckets_of("a"));
    }

    #[test]
    fn lost_buckets_stop_new_passes_at_once_and_the_ack_waits_for_running_ones() {
        let g1 = Assignment::new(1, members(&["a"]));
        let mut a = Handover::new("a");
        a.assign(&g1);
        a.acked(1);
        a.clear(&[lease("a", 1, 0)], at(0));
        assert_eq!(a.writable(), BucketSet::all());
        let g2 = Assignment::new(2, members(&["a", "b"]));
        let lost = g2.buckets_of("b");
        let moving = lost.iter().next().unwrap();
        assert!(a.begin(moving), "writable before the new assignment");
        let changes = a.assign(&g2);
        assert_eq!(changes.closed, lost);
        assert!(!a.begin(moving), "a lost bucket starts no new pass");
        assert_eq!(a.ack_due(), None, "a pass in a lost bucket is running");
        a.end(moving);
        assert_eq!(a.ack_due(), Some(2));
        // Kept buckets stayed writable throughout.
        assert_eq!(a.writable(), g2.buckets_of("a"));
    }

    #[test]
    fn gained_buckets_wait_for_the_old_owner_ack_or_its_expiry() {
        let g2 = Assignment::new(2, members(&["a", "b"]));
        let mut b = Handover::new("b");
        b.assign(&g2);
        // a renewed at 0 and has not acked 2: b waits...
        assert!(b.clear(&[lease("a", 1, 0)], at(10)).opened.is_empty());
        // ...past one lease duration too (a may be cut off yet still in a pass)...
        assert!(b.clear(&[lease("a", 1, 0)], at(20)).opened.is_empty());
        // ...and opens after two.
        assert_eq!(
            b.clear(&[lease("a", 1, 0)], at(30)).opened,
            g2.buckets_of("b")
        );
    }

    #[test]
    fn an_ack_opens_at_once_and_so_does_a_released_lease() {
        let g2 = Assignment::new(2, members(&["a", "b"]));
        let mut b = Handover::new("b");
        b.assign(&g2);
        assert!(!b.clear(&[lease("a", 2, 0)], at(1)).opened.is_empty());
        let mut c = Handover::new("b");
        c.assign(&g2);
        let released = MemberLease {
            released: true,
            ..lease("a", 1, 0)
        };
        assert!(!c.clear(&[released], at(1)).opened.is_empty());
    }

    #[test]
    fn every_other_member_is_waited_for_not_only_the_previous_owner() {
        // A bucket may have moved twice (a → b → c) before anyone acted.
        let g3 = Assignment::new(3, members(&["a", "b", "c"]));
        let mut c = Handover::new("c");
        c.assign(&g3);
        let seen = [lease("a", 1, 0), lease("b", 3, 0)];
        assert!(c.clear(&seen, at(5)).opened.is_empty(), "a has not acked 3");
        let seen = [lease("a", 3, 5), lease("b", 3, 0)];
        assert_eq!(c.clear(&seen, at(6)).opened, g3.buckets_of("c"));
    }

    #[test]
    fn release_closes_everything_and_acks_once_passes_end() {
        let g1 = Assignment::new(1, members(&["a"]));
        let mut a = Handover::new("a");
        a.assign(&g1);
        a.clear(&[], at(0));
        assert!(a.begin(Bucket(7)));
        let changes = a.release();
        assert_eq!(changes.closed, BucketSet::all());
        assert!(!a.begin(Bucket(8)));
        assert!(!a.drained());
        a.end(Bucket(7));
        assert!(a.drained());
        // A later assignment does not reopen a released replica.
        a.assign(&Assignment::new(2, members(&["a"])));
        assert!(a.writable().is_empty() && a.owned().is_empty());
    }

    #[test]
    fn an_old_or_repeated_assignment_changes_nothing() {
        let mut a = Handover::new("a");
        a.assign(&Assignment::new(5, members(&["a"])));
        let owned = a.owned();
        assert_eq!(
            a.assign(&Assignment::new(4, members(&["a", "b"]))),
            Changes::default()
        );
        assert_eq!(a.owned(), owned);
        assert_eq!(a.generation(), 5);
    }
}
