//! trellis: a Kubernetes operator programmed with YAML rules.
//!
//! ```text
//!  rules/ ──rules::RuleSet::load──▶ compiled rules ──plan::plan──▶ Plan
//!                                                    (children to apply / delete / hold, status)
//! ```
//!
//! Two crates: `trellis-core` (`crates/trellis-core`) holds everything that
//! decides — the rule format, rendering, the planner, CRD and RBAC
//! generation, the rollout and shard state machines — with no cluster
//! client and no async runtime; this crate is the shell around it: the
//! operator, the CLI, the LSP, `diff`, hot reload and telemetry. The
//! core's modules are re-exported here under their own names, so
//! `trellis::plan` is `trellis_core::plan`.

pub use trellis_core::{
    clock, clusters, conform, conversion, crd, drift, field_path, graph, json_path, kinds, labels,
    manifests, offline, ownership, pass, plan, rbac, related_watches, render, rollout, rules,
    shard, status, status_patch, yaml,
};

pub mod cli;
pub mod diff;
pub mod lsp;
pub mod operator;
pub mod reload;
pub mod telemetry;
