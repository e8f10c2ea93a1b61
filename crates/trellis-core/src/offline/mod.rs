//! What the offline commands decide, without a cluster: the diagnostics of
//! a rule set ([`check`]), one pass over a parent file ([`render`]), the
//! rule tests run through that pass ([`ruletest`]), and what `trellis tree`
//! shows of a live parent ([`tree`], from a plan the binary makes against
//! the cluster).
//! The binary's `cli` reads the inputs and prints; `lsp` and the golden
//! tests call these directly. `check` runs `crate::conform`, whose tests go
//! through `check`'s pipeline and so live here (`tests_conform.rs`; the
//! handOff and version round-trip checks in `tests_sample_paths.rs`).

pub mod check;
pub mod hazards;
pub mod render;
pub mod ruletest;
pub mod tree;

#[cfg(test)]
mod tests_conform;
#[cfg(test)]
mod tests_sample_paths;
