//! The rule loader: see [`trellis_fuzz::load`] for what it feeds and what it checks.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| trellis_fuzz::load(data));
