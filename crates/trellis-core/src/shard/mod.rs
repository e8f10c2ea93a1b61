//! Shards (`trellis run --leader-elect --shards`): the pure core of cutting
//! one rule set's parents across replicas. No I/O here: the operator feeds
//! it what the Leases say and asks it what it may write.
//!
//! ```text
//!  parent uid ──sha256──▶ bucket 0..255          (bucket_of; stable everywhere)
//!  member Leases ──leader──▶ Assignment {generation, members}   (ring)
//!                                │ rendezvous: each bucket to the member with the
//!                                ▼ highest score; a membership change moves only its share
//!  every replica computes the same owners from the published members
//!                                │
//!  Handover (per replica) ◀──────┘ lost buckets: stop writing, drain, then ack
//!        │                         gained buckets: write once every other live
//!        ▼                         member acked this generation (or its Lease expired)
//!  writable BucketSet ──▶ the write gate and the child watches' label selector
//! ```
//!
//! The assignment is published as the member list, not as 256 owners: the
//! owners follow from it by a pure function that every replica evaluates
//! the same way, so the Lease annotation stays small and cannot disagree
//! with itself.

pub mod handover;
pub mod ring;

// A parent's bucket is a label value every child carries, so the planner
// writes it; it is defined with the other labels and cut across replicas here.
pub use crate::labels::{BUCKETS, Bucket, LABEL_BUCKET, bucket_of};

/// A set of buckets (a 256-bit set).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct BucketSet([u64; 4]);

impl BucketSet {
    pub const fn empty() -> BucketSet {
        BucketSet([0; 4])
    }

    pub const fn all() -> BucketSet {
        BucketSet([u64::MAX; 4])
    }

    pub fn contains(&self, bucket: Bucket) -> bool {
        let b = bucket.0 as usize;
        self.0[b / 64] & (1 << (b % 64)) != 0
    }

    pub fn insert(&mut self, bucket: Bucket) {
        let b = bucket.0 as usize;
        self.0[b / 64] |= 1 << (b % 64);
    }

    pub fn remove(&mut self, bucket: Bucket) {
        let b = bucket.0 as usize;
        self.0[b / 64] &= !(1 << (b % 64));
    }

    pub fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    /// Buckets in this set and not in `other`.
    pub fn minus(&self, other: &BucketSet) -> BucketSet {
        BucketSet(std::array::from_fn(|i| self.0[i] & !other.0[i]))
    }

    pub fn intersection(&self, other: &BucketSet) -> BucketSet {
        BucketSet(std::array::from_fn(|i| self.0[i] & other.0[i]))
    }

    pub fn union(&self, other: &BucketSet) -> BucketSet {
        BucketSet(std::array::from_fn(|i| self.0[i] | other.0[i]))
    }

    pub fn iter(&self) -> impl Iterator<Item = Bucket> + '_ {
        (0..BUCKETS)
            .map(|b| Bucket(b as u8))
            .filter(|b| self.contains(*b))
    }

    /// The label selector that matches the children of exactly these
    /// buckets (`trellis.dev/bucket in (…)`); `None` for the empty set,
    /// which no selector can express (`in ()` is refused by the API server).
    pub fn label_selector(&self) -> Option<String> {
        if self.is_empty() {
            return None;
        }
        let values: Vec<String> = self.iter().map(|b| b.to_string()).collect();
        Some(format!("{LABEL_BUCKET} in ({})", values.join(",")))
    }
}

impl FromIterator<Bucket> for BucketSet {
    fn from_iter<I: IntoIterator<Item = Bucket>>(iter: I) -> BucketSet {
        let mut set = BucketSet::empty();
        for b in iter {
            set.insert(b);
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_is_the_same_in_every_process() {
        // Fixed values: a change of hash would move every parent to
        // another replica on upgrade, silently. These hold it.
        assert_eq!(
            bucket_of("0b4f6c2e-1f7a-4d2b-9c33-5e8a6f0d1b2c"),
            bucket_of("0b4f6c2e-1f7a-4d2b-9c33-5e8a6f0d1b2c")
        );
        assert_eq!(bucket_of(""), Bucket(0xe3));
        assert_eq!(bucket_of("abc"), Bucket(0xba));
    }

    #[test]
    fn uids_fill_the_buckets_evenly() {
        let mut counts = [0usize; BUCKETS];
        for i in 0..25_600 {
            counts[bucket_of(&format!("uid-{i}")).0 as usize] += 1;
        }
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        // 100 expected per bucket; a binomial spread stays well inside this.
        assert!(*min > 50 && *max < 150, "min {min}, max {max}");
    }

    #[test]
    fn a_bucket_set_counts_iterates_and_selects() {
        let set: BucketSet = [Bucket(0), Bucket(63), Bucket(64), Bucket(255)]
            .into_iter()
            .collect();
        assert_eq!(set.len(), 4);
        assert!(set.contains(Bucket(64)) && !set.contains(Bucket(65)));
        assert_eq!(
            set.label_selector().as_deref(),
            Some("trellis.dev/bucket in (0,63,64,255)")
        );
        assert_eq!(BucketSet::empty().label_selector(), None);
        assert_eq!(BucketSet::all().len(), BUCKETS);
        let rest = BucketSet::all().minus(&set);
        assert_eq!(rest.len(), BUCKETS - 4);
        assert_eq!(rest.union(&set), BucketSet::all());
    }
}
