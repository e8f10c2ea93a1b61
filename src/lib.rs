//! trellis: a Kubernetes operator programmed with YAML rules.
//!
//! ```text
//!  rules/ ──rules::RuleSet::load──▶ compiled rules ──plan::plan──▶ Plan
//!                                                    (children to apply / delete / hold, status)
//! ```
//!
//! The offline commands (`check`, `render`, `rbac`, `schema`) and the operator
//! share this library; `plan` is the only place that decides anything.

pub mod cli;
pub mod clock;
pub mod conform;
pub mod crd;
pub mod diff;
pub mod drift;
pub mod field_path;
pub mod graph;
pub mod kinds;
pub mod lsp;
pub mod manifests;
pub mod operator;
pub mod plan;
pub mod rbac;
pub mod reload;
pub mod render;
pub mod rollout;
pub mod rules;
pub mod shard;
pub mod status;
pub mod telemetry;
pub mod yaml;
