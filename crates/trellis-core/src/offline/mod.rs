//! What the offline commands decide, without a cluster: the diagnostics of
//! a rule set ([`check`]), one pass over a parent file ([`render`]) and
//! the rule tests run through that pass ([`ruletest`]).
//! The binary's `cli` reads the inputs and prints; `lsp` and the golden
//! tests call these directly. `check` runs `crate::conform`, whose tests go
//! through `check`'s pipeline and so live here (`tests_conform.rs`).

pub mod check;
pub mod hazards;
pub mod render;
pub mod ruletest;

#[cfg(test)]
mod tests_conform;
