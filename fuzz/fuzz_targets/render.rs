//! The renderer under hostile parent values: the example rules' templates
//! fed a parent whose values are the fuzzer's text (`{{ }}`, `{% %}`,
//! `---`, newlines, quotes, ...), deep nesting or a whole spec of its
//! choosing. Never a panic, never an injected object: every child rendered
//! is one the rule declares, with its declared apiVersion and kind, and one
//! object per child.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use trellis::plan::Observed;
use trellis_fuzz::{assert_contained, examples, plan_once};

/// Deepest spec nesting the operator decodes (serde_json refuses 128).
const MAX_DEPTH: usize = 120;

/// Replaces every string under `value` with `text`.
fn replace_strings(value: &mut Value, text: &str) {
    match value {
        Value::String(s) => *s = text.to_owned(),
        Value::Array(items) => items.iter_mut().for_each(|v| replace_strings(v, text)),
        Value::Object(map) => map.values_mut().for_each(|v| replace_strings(v, text)),
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let examples = examples();
    let (rule, example) = &examples[pick as usize % examples.len()];
    let text = String::from_utf8_lossy(rest).into_owned();
    let mut parent = example.clone();
    match (pick as usize / examples.len()) % 5 {
        // Every value of the example spec is the text.
        0 => replace_strings(&mut parent["spec"], &text),
        // The text as a whole spec, when it is JSON.
        1 => match serde_json::from_str::<Value>(&text) {
            Ok(spec) => parent["spec"] = spec,
            Err(_) => replace_strings(&mut parent["spec"], &text),
        },
        // Every spec value nested deep, the text at the bottom.
        2 => {
            let depth = rest.len() % MAX_DEPTH;
            let mut deep = Value::String(text.clone());
            for _ in 0..depth {
                deep = json!({ "a": deep });
            }
            if let Some(spec) = parent["spec"].as_object_mut() {
                for v in spec.values_mut() {
                    *v = deep.clone();
                }
            }
        }
        // The text in labels and annotations the templates may read.
        3 => {
            parent["metadata"]["labels"] = json!({ "app": text, "tier": text });
            parent["metadata"]["annotations"] = json!({ "note": text });
            replace_strings(&mut parent["spec"], &text);
        }
        // A huge value: the text repeated up to 64 KiB.
        _ => {
            let times = (64 * 1024) / text.len().max(1);
            replace_strings(&mut parent["spec"], &text.repeat(times.clamp(1, 4096)));
        }
    }
    let plan = plan_once(rule, &parent, &Observed::default());
    assert_contained(rule, &parent, &plan);
});
