//! Leader election (`trellis run --leader-elect`): which replica may write.
//!
//! ```text
//!  kube-lease-manager ──acquire / renew every retry period / release──▶ Lease
//!                                                                        │ watch
//!  Elector: open only while the crate says "holder" AND the Lease itself ◀┘
//!           shows us as holder, renewed less than the renew deadline ago
//!     │
//!     ▼
//!  Gate (watch<bool>) ──▶ every write checks it; a rising edge re-reconciles every parent
//! ```
//!
//! The crate does the Lease protocol; this module adds what an operator needs
//! on top and the crate does not give:
//! - **Fencing.** The crate keeps believing it leads while it cannot reach the
//!   API server. The gate therefore also requires that the Lease, as last
//!   seen, names us with a `renewTime` (stamped by our own clock) younger than
//!   the renew deadline: a leader cut off stops writing before the lease
//!   duration ends, i.e. before anyone else may take over.
//! - **Prompt handoff.** A standby in the crate sleeps until the lease it saw
//!   expires. The watch on the Lease wakes it the moment the holder releases
//!   it (on SIGTERM), so the successor takes over at once.
//!
//! Without `--leader-elect` the gate is always open.
//!
//! Files: `gate.rs` (the write gate), `settings.rs` (the Lease, identity and
//! timings), `campaign.rs` ([`Elector`] and its loop).

mod campaign;
mod gate;
mod settings;

pub use campaign::Elector;
pub(crate) use gate::epoch_millis;
pub use gate::{Gate, NotLeader};
pub use settings::{SERVICE_ACCOUNT_NAMESPACE, Settings, identity, namespace_from_environment};
