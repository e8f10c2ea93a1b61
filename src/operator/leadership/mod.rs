//! Which replica may write what: the leader gate (`--leader-elect`, one
//! writer among the replicas) and, under `--shards`, the buckets of parents
//! this replica may write. Both are carried out with Leases; every
//! per-parent write checks them through [`crate::operator::Shared`] and the
//! rule's context.
//!
//! This is the operator's runtime of sharding. What a bucket is, how the
//! buckets are assigned and handed over, is decided in the core's pure
//! [`crate::shard`]; `shards/` here only renews, watches and publishes the
//! Leases that carry those decisions.

pub mod leader;
pub mod shards;
