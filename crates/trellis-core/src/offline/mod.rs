//! What the offline commands decide, without a cluster: the diagnostics of
//! a rule set ([`check`]) and one pass over a parent file ([`render`]).
//! The binary's `cli` reads the inputs and prints; `lsp`, `conform` and the
//! golden tests call these directly.

pub mod check;
pub mod render;
