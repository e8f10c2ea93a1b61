//! trellis's pure core: everything that decides, and nothing that talks to
//! a cluster. The compiler keeps it so: this crate depends on no cluster
//! client and no async runtime.
//!
//! ```text
//!  rules/ ──rules::RuleSet::load──▶ compiled rules ──plan::plan──▶ Plan
//!                                                    (children to apply / delete / hold, status)
//! ```
//!
//! The binary crate (`trellis`) wraps it: the operator observes the cluster
//! and carries out what `plan` decides; the CLI reads files and prints what
//! [`offline`] decides.

pub mod clock;
pub mod clusters;
pub mod conform;
pub mod conversion;
pub mod crd;
pub mod drift;
pub mod field_path;
pub mod graph;
pub mod json_path;
pub mod kinds;
pub mod labels;
pub mod manifests;
pub mod offline;
pub mod ownership;
pub mod pass;
pub mod plan;
pub mod rbac;
pub mod related_watches;
pub mod render;
pub mod rollout;
pub mod rules;
pub mod shard;
pub mod status;
pub mod status_patch;
pub mod yaml;
