//! Which member owns which bucket: rendezvous (highest random weight)
//! hashing over the members the leader publishes.
//!
//! Each bucket goes to the member with the highest score
//! sha256(member, bucket). A member added takes from each other member
//! only the buckets where it now scores highest (about 1/n of them); a
//! member removed gives away only its own. Nothing else moves, so a
//! membership change hands over as little as it can.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{BUCKETS, Bucket, BucketSet};

/// Annotation on the leader's Lease holding the published [`Assignment`].
pub const ANNOTATION_ASSIGNMENT: &str = "trellis.dev/shard-assignment";

/// What the leader publishes: the live members at a generation. The
/// generation grows by one with every change of the member list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub generation: u64,
    /// Member names, sorted and without duplicates.
    pub members: Vec<String>,
}

/// A Lease annotation that does not read as an [`Assignment`].
#[derive(Debug, thiserror::Error)]
#[error("{ANNOTATION_ASSIGNMENT}: not an assignment: {0}")]
pub struct NotAnAssignment(#[source] serde_json::Error);

impl Assignment {
    /// The assignment for these members (sorted, deduplicated).
    pub fn new(generation: u64, members: impl IntoIterator<Item = String>) -> Assignment {
        let mut members: Vec<String> = members.into_iter().collect();
        members.sort();
        members.dedup();
        Assignment {
            generation,
            members,
        }
    }

    /// The next assignment when the live members are `live`: this one when
    /// they are the same, else the next generation with them.
    pub fn next(&self, live: impl IntoIterator<Item = String>) -> Assignment {
        let candidate = Assignment::new(self.generation + 1, live);
        if candidate.members == self.members {
            self.clone()
        } else {
            candidate
        }
    }

    /// The member owning `bucket`; `None` when there are no members.
    pub fn owner(&self, bucket: Bucket) -> Option<&str> {
        self.members
            .iter()
            .max_by_key(|m| (score(m, bucket), m.as_str()))
            .map(String::as_str)
    }

    /// Every bucket's owner at once, in bucket order.
    pub fn owners(&self) -> Vec<Option<&str>> {
        (0..BUCKETS).map(|b| self.owner(Bucket(b as u8))).collect()
    }

    /// The buckets `member` owns.
    pub fn buckets_of(&self, member: &str) -> BucketSet {
        (0..BUCKETS)
            .map(|b| Bucket(b as u8))
            .filter(|b| self.owner(*b) == Some(member))
            .collect()
    }

    /// As the Lease annotation carries it.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// From the Lease annotation; an error names what is wrong.
    pub fn from_annotation(text: &str) -> Result<Assignment, NotAnAssignment> {
        let parsed: Assignment = serde_json::from_str(text).map_err(NotAnAssignment)?;
        // Re-sorted: a hand-edited annotation must not make replicas
        // disagree about owners.
        Ok(Assignment::new(parsed.generation, parsed.members))
    }
}

/// The member's weight for a bucket: the first 8 bytes of
/// sha256(member ‖ 0x00 ‖ bucket), the same in every process.
fn score(member: &str, bucket: Bucket) -> u64 {
    let mut hasher = Sha256::new();
    hasher.update(member.as_bytes());
    hasher.update([0u8, bucket.0]);
    let digest = hasher.finalize();
    u64::from_be_bytes(digest[..8].try_into().unwrap_or([0; 8]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn every_bucket_has_exactly_one_owner_and_the_sets_are_disjoint() {
        let a = Assignment::new(1, members(&["trellis-0", "trellis-1", "trellis-2"]));
        let sets: Vec<BucketSet> = a.members.iter().map(|m| a.buckets_of(m)).collect();
        assert_eq!(sets.iter().map(BucketSet::len).sum::<usize>(), BUCKETS);
        assert_eq!(
            sets.iter().fold(BucketSet::empty(), |u, s| u.union(s)),
            BucketSet::all()
        );
        for s in &sets {
            // An even share, within a generous spread (85 expected).
            assert!((50..=120).contains(&s.len()), "{} buckets", s.len());
        }
    }

    #[test]
    fn the_owner_does_not_depend_on_the_order_members_are_listed_in() {
        let a = Assignment::new(1, members(&["b", "a", "c"]));
        let b = Assignment::new(1, members(&["c", "b", "a", "a"]));
        assert_eq!(a, b);
        assert_eq!(a.owners(), b.owners());
    }

    #[test]
    fn a_member_added_takes_only_its_share_from_the_others() {
        let before = Assignment::new(1, members(&["m0", "m1", "m2"]));
        let after = before.next(members(&["m0", "m1", "m2", "m3"]));
        assert_eq!(after.generation, 2);
        let mut moved = 0;
        for b in 0..BUCKETS {
            let b = Bucket(b as u8);
            if before.owner(b) != after.owner(b) {
                // Only ever to the new member.
                assert_eq!(after.owner(b), Some("m3"), "bucket {b}");
                moved += 1;
            }
        }
        assert_eq!(moved, after.buckets_of("m3").len());
        assert!(moved > 0 && moved < BUCKETS / 2, "{moved} moved");
    }

    #[test]
    fn a_member_removed_gives_away_only_its_own_buckets() {
        let before = Assignment::new(4, members(&["m0", "m1", "m2"]));
        let after = before.next(members(&["m0", "m2"]));
        for b in 0..BUCKETS {
            let b = Bucket(b as u8);
            if before.owner(b) != Some("m1") {
                assert_eq!(before.owner(b), after.owner(b), "bucket {b} moved");
            }
        }
        assert!(after.buckets_of("m1").is_empty());
    }

    #[test]
    fn the_same_members_keep_the_generation() {
        let a = Assignment::new(7, members(&["x", "y"]));
        assert_eq!(a.next(members(&["y", "x"])), a);
        assert_eq!(Assignment::new(0, Vec::new()).owner(Bucket(3)), None);
    }

    #[test]
    fn the_annotation_round_trips_and_names_what_is_wrong() {
        let a = Assignment::new(3, members(&["r1", "r0"]));
        assert_eq!(Assignment::from_annotation(&a.to_annotation()).unwrap(), a);
        let err = Assignment::from_annotation("{\"generation\": \"x\"}").unwrap_err();
        assert!(err.to_string().contains(ANNOTATION_ASSIGNMENT), "{err}");
    }

    #[test]
    fn owners_are_fixed_across_releases() {
        // A change of the score function would move buckets between
        // replicas on upgrade: these fixed owners hold it.
        let a = Assignment::new(1, members(&["a", "b"]));
        let owners: String = (0..8).map(|b| a.owner(Bucket(b)).unwrap_or("-")).collect();
        assert_eq!(owners, FIXED_OWNERS_A_B);
    }

    const FIXED_OWNERS_A_B: &str = "aaabaaaa";
}
