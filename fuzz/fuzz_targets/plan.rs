//! The planner on any parent and observed objects: the input, when it is
//! JSON, is `{"parent": ..., "observed": [...]}` (or a bare parent), planned
//! with every example rule. Never a panic, and every child to apply stays
//! what its rule declares.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use trellis::plan::Observed;
use trellis_fuzz::{assert_contained, example_rules, plan_once};

fuzz_target!(|data: &[u8]| {
    let Ok(input) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let (parent, observed) = match input.get("parent") {
        Some(parent) => (parent.clone(), input.get("observed").cloned()),
        None => (input, None),
    };
    let observed = match observed {
        Some(Value::Array(objects)) => Observed::from_objects(objects),
        _ => Observed::default(),
    };
    for rule in &example_rules().rules {
        let plan = plan_once(rule, &parent, &observed);
        assert_contained(rule, &parent, &plan);
    }
});
