//! Readiness and "synced" of one line's object, from the planner's verdict
//! and the operator's own skip test.

use serde_json::Value;

use crate::ownership::live_render_hash;
use crate::plan::{Apply, ObjectKey};
use crate::rules::model::Policy;

/// Per-object readiness of an entry of several objects (`forEach`) from
/// the planner's verdict, which names the first object that is not ready:
/// those before it are ready, it is not, and past it the verdict says
/// nothing. A verdict that names none of them (a `readyWhen` that failed)
/// leaves every object's readiness unknown.
pub(super) struct FirstNotReady {
    passed: bool,
    named: bool,
}

impl FirstNotReady {
    pub(super) fn new<'k>(
        not_ready: &Option<String>,
        mut keys: impl Iterator<Item = &'k ObjectKey>,
    ) -> FirstNotReady {
        FirstNotReady {
            passed: false,
            named: keys.any(|k| is_about(not_ready, k)),
        }
    }

    /// An object that does not exist: the verdict may be about it.
    pub(super) fn missing(&mut self, not_ready: &Option<String>, key: &ObjectKey) {
        self.passed |= is_about(not_ready, key);
    }

    /// Ready or not (`None`: not known) and why not, for the object at
    /// `key`; `after` reads readiness past the first one that is not.
    pub(super) fn readiness(
        &mut self,
        not_ready: &Option<String>,
        key: &ObjectKey,
        after: impl FnOnce() -> Option<Result<(), String>>,
    ) -> (Option<bool>, Option<String>) {
        let Some(why) = not_ready else {
            return (Some(true), None);
        };
        if !self.named {
            return (None, Some(why.clone()));
        }
        if self.passed {
            return match after() {
                Some(Ok(())) => (Some(true), None),
                Some(Err(why)) => (Some(false), Some(why)),
                None => (None, None),
            };
        }
        if is_about(not_ready, key) {
            self.passed = true;
            // The line names the object already.
            let why = why
                .strip_prefix(&format!("{key} is not ready: "))
                .unwrap_or(why);
            return (Some(false), Some(why.to_owned()));
        }
        (Some(true), None)
    }
}

/// Whether the planner's "not ready" message is about the object at `key`
/// (it starts with the object's key).
pub(super) fn is_about(not_ready: &Option<String>, key: &ObjectKey) -> bool {
    not_ready
        .as_deref()
        .is_some_and(|why| why.starts_with(&format!("{key} ")))
}

/// The operator's skip test: a live child carrying this rendering's hash
/// and holding every field it sets (less its `handOff` paths) needs no
/// write. `createOnly` children are never written again once they exist.
pub(super) fn synced(apply: &Apply, live: &Value) -> bool {
    if apply.policy == Policy::CreateOnly {
        return true;
    }
    live_render_hash(live) == Some(apply.hash.as_str())
        && !crate::drift::drifted(&apply.compared(), live)
}
