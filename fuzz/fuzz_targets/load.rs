//! The rule loader: any text as a rule file gives a rule set or diagnostics
//! (each naming the file), never a panic; a reload's partition of it too.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use trellis::rules::{Loaded, RuleSet};

fn dir() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a temp dir"))
}

fuzz_target!(|data: &[u8]| {
    let dir = dir();
    let file = dir.path().join("rule.yaml");
    if std::fs::write(&file, data).is_err() {
        return;
    }
    let dirs = [dir.path().to_path_buf()];
    let loaded = Loaded::read(&dirs, Default::default());
    for d in loaded.diagnostics() {
        assert!(d.file.starts_with(dir.path()), "diagnostic without its file: {d}");
        let _ = d.to_string();
    }
    let partition = trellis::reload::partition(trellis_fuzz::example_rules(), loaded);
    let _ = trellis::reload::diff(&RuleSet::default(), &partition.set);
});
