//! One pass over one parent, and everything it writes.
//!
//! ```text
//!  reconcile: caches → plan() ─┬─▶ apply (one child)      ──┐
//!                              ├─▶ patch_writes (patches)   ├─▶ summary (one Event)
//!                              ├─▶ release (retained child) │
//!                              └─▶ status_write (status)  ──┘
//!  deleted parent ──▶ finalize      parent that left the rule ──▶ released
//! ```
//!
//! `reconcile.rs` is the entry. The decisions are `plan`'s; the files here
//! carry them out against the API server. `patch_writes.rs` sends the
//! patches a plan contributes to objects the rule does not own (the plan's
//! side of them is `plan::patch`, their compiled form
//! `rules::compile::patch`).

pub(super) mod apply;
pub(super) mod finalize;
pub(super) mod own_writes;
pub(super) mod patch_writes;
pub(super) mod reconcile;
pub(super) mod release;
pub(super) mod released;
pub(super) mod status_write;
pub(super) mod summary;
mod trace;
