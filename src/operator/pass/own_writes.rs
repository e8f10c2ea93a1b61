//! What this process wrote of its children, until their watch shows it.
//!
//! A pass reads the API server's answer to each child it writes: that is
//! the observed state its plan goes on with. The watch event that later
//! brings the same version tells the parent nothing new, yet it used to wake
//! the parent for another pass: up to one per child written, competing with
//! the first passes of other parents for the controller and the CPU the API
//! server needs (the latency trace of `docs/benchmarks.md`). So each write's
//! version is kept here, and its event ([`OwnWrites::is_own`], in the child
//! watches' trigger mapper) wakes nobody. Any other version of the child —
//! someone's edit, the controller manager's status — wakes its parent as
//! before; an event that beats the write's answer to the pass wakes it as
//! before too (one pass more, never one less).
//!
//! The same event ends what [`OwnWrites::created`] remembers of the child:
//! the cache shows the write now.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::operator::context::Created;
use crate::operator::lock;
use crate::plan::ObjectKey;

/// A version written and not yet seen by the watch.
struct Version {
    resource_version: String,
    key: ObjectKey,
    at: Instant,
}

/// How long a written version waits for its event: one that never comes (a
/// relist listed a later version instead) is forgotten after this, once
/// the map looks oversized.
const VERSION_MEMORY: Duration = Duration::from_secs(60);
/// How long a deleted child's uid is remembered, once the map looks
/// oversized: far longer than any watch takes to drop it.
const DELETED_MEMORY: Duration = Duration::from_secs(600);

#[derive(Default)]
pub struct OwnWrites {
    /// Children this process wrote (made or updated), by key, with their
    /// parent's uid and render hash, until the cache shows them as written:
    /// the next pass must not mistake one for someone else's, let another
    /// parent take it, nor write it again because a relist served before
    /// the write put an older version back in the cache.
    pub created: Mutex<HashMap<ObjectKey, Created>>,
    /// Child uid → the version this process wrote last.
    versions: Mutex<HashMap<String, Version>>,
    /// Uids of children this process deleted (the API server said yes),
    /// when: until its watch drops one, the cache still shows it, and a
    /// pass or finalizer round woken meanwhile (by another child's event)
    /// would delete it again, for a 404. A uid is deleted once: a namesake
    /// made later has another.
    deleted: Mutex<HashMap<String, Instant>>,
}

impl OwnWrites {
    /// Records the version of `key` a write answered with (`object`, the API
    /// server's answer).
    pub fn wrote(&self, key: &ObjectKey, object: &serde_json::Value) {
        let meta = &object["metadata"];
        let (Some(uid), Some(version)) = (meta["uid"].as_str(), meta["resourceVersion"].as_str())
        else {
            return;
        };
        let version = Version {
            resource_version: version.to_owned(),
            key: key.clone(),
            at: Instant::now(),
        };
        lock(&self.versions).insert(uid.to_owned(), version);
    }

    /// Whether a child event (uid, resourceVersion) brings a version this
    /// process wrote and its pass already read; forgotten then, with what
    /// [`OwnWrites::created`] held of it: one event per write.
    pub fn is_own(&self, uid: Option<&str>, resource_version: Option<&str>) -> bool {
        let (Some(uid), Some(version)) = (uid, resource_version) else {
            return false;
        };
        let mut versions = lock(&self.versions);
        match versions.get(uid) {
            Some(v) if v.resource_version == version => {
                let key = versions.remove(uid).map(|v| v.key);
                drop(versions);
                if let Some(key) = key {
                    lock(&self.created).remove(&key);
                }
                true
            }
            _ => false,
        }
    }

    /// Records that the child with `uid` was deleted.
    pub fn deleted(&self, uid: Option<&str>) {
        if let Some(uid) = uid {
            let mut deleted = lock(&self.deleted);
            if deleted.len() > 1024 {
                deleted.retain(|_, at| at.elapsed() < DELETED_MEMORY);
            }
            deleted.insert(uid.to_owned(), Instant::now());
        }
    }

    /// Whether this process already deleted the child with `uid`.
    pub fn was_deleted(&self, uid: Option<&str>) -> bool {
        uid.is_some_and(|uid| {
            let deleted = lock(&self.deleted);
            !deleted.is_empty() && deleted.contains_key(uid)
        })
    }

    /// Forgets versions whose event never came, when the map looks
    /// oversized.
    pub fn sweep(&self) {
        let mut versions = lock(&self.versions);
        if versions.len() > 1024 {
            versions.retain(|_, v| v.at.elapsed() < VERSION_MEMORY);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_deleted_uid_is_remembered_and_no_other() {
        let own = OwnWrites::default();
        assert!(!own.was_deleted(Some("u1")));
        own.deleted(Some("u1"));
        own.deleted(None);
        assert!(own.was_deleted(Some("u1")));
        assert!(!own.was_deleted(Some("u2")) && !own.was_deleted(None));
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey {
            group: String::new(),
            kind: "ConfigMap".into(),
            namespace: Some("a".into()),
            name: name.into(),
            cluster: None,
        }
    }

    #[test]
    fn the_event_of_a_written_version_is_own_once_and_any_other_version_is_not() {
        let own = OwnWrites::default();
        let answer = json!({"metadata": {"uid": "u1", "resourceVersion": "7"}});
        own.wrote(&key("c"), &answer);
        lock(&own.created).insert(
            key("c"),
            Created {
                parent_uid: "p".into(),
                hash: "h".into(),
                at: Instant::now(),
            },
        );
        assert!(!own.is_own(Some("u1"), Some("6")), "an older version");
        assert!(!own.is_own(Some("u2"), Some("7")), "another object");
        assert!(!own.is_own(None, Some("7")));
        assert!(
            lock(&own.created).contains_key(&key("c")),
            "still unseen by the cache"
        );
        assert!(own.is_own(Some("u1"), Some("7")), "the version written");
        assert!(
            lock(&own.created).is_empty(),
            "the cache shows the write: nothing left to remember"
        );
        assert!(
            !own.is_own(Some("u1"), Some("7")),
            "once: a second event of it (a relist) wakes its parent"
        );
    }
}
