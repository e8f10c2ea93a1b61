//! Staged rollout of a rule change (`rollout:`): the pure core.
//!
//! ```text
//!  rule's rollout: ──Settings::compile──▶ Settings (steps, canary, health, onFailure)
//!                                            │
//!  parents (uid, canary?, version on, health) ▼
//!        ──order──▶ fixed order (canaries first, then sha256(rule, uid))
//!        ──State::step(Input::Tick / Promote / Abort)──▶ new State + Effects
//!                                            │   (moved, failed, rolled back, step reached)
//!  State::desired(uid, on) ──▶ the revision a parent is due to run
//! ```
//!
//! Nothing here performs I/O or reads the clock: the operator's shell
//! (`operator::versions`) feeds it the parents it sees and the time, keeps
//! the [`State`] in the version's ConfigMap, and renders each parent with
//! the version [`State::desired`] names. So a restart that reads the same
//! state back moves nobody, and every transition is a unit test.

mod machine;
mod order;

pub use machine::{Effect, Health, Input, ParentView, Phase, State};
pub use order::{order, order_key, step_count};
// The settings the machine runs with are a rule's checked `rollout:` block,
// which the rule compiler owns.
pub use crate::rules::rollout::{DEFAULT_TIMEOUT, MaxFailed, Pause, Settings, Step};
