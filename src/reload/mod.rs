//! Noticing rule changes on disk and deciding what they mean.
//!
//! ```text
//!  notify (debounced) ─┐
//!  30 s poll (hashes) ─┴─▶ content fingerprint changed? ──▶ Loaded::read (the `check` path)
//!                                                              │
//!                               partition(last good, loaded) ◀─┘
//!                                 │ a rule with an error: its last good version (or none)
//!                                 ▼ every other rule: as loaded
//!                       diff(old, new) ──▶ start / stop / restart / update
//! ```
//!
//! One broken rule never holds up the others: each diagnostic is tied to
//! the rules it concerns (its document's rule; every rule a file held at
//! the last good load when the file cannot be read or parsed; every rule of
//! a name used twice), and only those rules stay at their last good version.
//!
//! The kubelet updates a ConfigMap volume by writing a new timestamped
//! directory and renaming `..data` onto it; event kinds are unreliable there,
//! so any event under a rules directory only means "look again", and the
//! decision rests on a fingerprint of the files' contents. Carrying out the
//! diff is the operator's job.
//!
//! Files: `watch.rs` notices (the fingerprint and the wake-ups),
//! `partition.rs` decides what of a load runs, `diff.rs` what that means
//! for each running rule.

mod diff;
mod partition;
mod watch;

pub use diff::{Change, diff};
pub use partition::{Partition, partition};
pub use watch::{fingerprint, watch};

/// A rule file for the tests: `NAME`, `KIND` and `TEXT` are replaced.
#[cfg(test)]
const RULE: &str = "apiVersion: trellis.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: NAME\nspec:\n  parent: {apiVersion: demo.trellis.dev/v1, kind: KIND}\n  children:\n    - id: cm\n      apiVersion: v1\n      kind: ConfigMap\n      template: |\n        metadata:\n          name: {{ parent.metadata.name }}\n        data: {v: TEXT}\n";
