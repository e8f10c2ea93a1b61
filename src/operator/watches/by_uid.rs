//! A rule's parents by uid, kept from the parent watch's own events: the
//! trigger mapper finds the parent of a child that has no controller
//! ownerReference (a child in another namespace, or a cluster-scoped child
//! of a namespaced parent) by its `trellis.dev/parent-uid` label in O(1),
//! where it scanned the whole parent cache on every such child's event.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::Resource;
use kube::runtime::watcher::Event;

use super::relisted::Relisted;

/// A parent's namespace and name.
pub type ParentName = (Option<String>, String);
type Index = HashMap<String, ParentName>;

/// Parents by uid. A uid never changes and is never reused, so an entry is
/// right for as long as its parent exists; a relist swaps the whole index
/// in when it is done, as the store does.
#[derive(Default)]
pub struct ByUid {
    state: Mutex<Relisted<Index>>,
}

impl ByUid {
    /// Follows one event of the parent watch (before the store takes it).
    pub fn observe<K: Resource>(&self, event: &Event<K>) {
        crate::operator::lock(&self.state).follow(event, add, |index, o| {
            if let Some(uid) = o.meta().uid.as_deref() {
                index.remove(uid);
            }
        });
    }

    /// The parent with `uid`, if the watch has seen it.
    pub fn get(&self, uid: &str) -> Option<ParentName> {
        crate::operator::lock(&self.state).live().get(uid).cloned()
    }
}

fn add<K: Resource>(index: &mut Index, o: &K) {
    let meta = o.meta();
    if let (Some(uid), Some(name)) = (&meta.uid, &meta.name) {
        index.insert(uid.clone(), (meta.namespace.clone(), name.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn parent(name: &str, uid: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("a".into()),
                uid: Some(uid.into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    fn named(name: &str) -> Option<ParentName> {
        Some((Some("a".to_owned()), name.to_owned()))
    }

    #[test]
    fn parents_are_found_by_uid_until_they_are_deleted() {
        let index = ByUid::default();
        index.observe(&Event::Apply(parent("x", "ux")));
        index.observe(&Event::Apply(parent("y", "uy")));
        assert_eq!(index.get("ux"), named("x"));
        assert_eq!(index.get("uy"), named("y"));
        index.observe(&Event::Delete(parent("x", "ux")));
        assert_eq!(index.get("ux"), None);
        assert_eq!(index.get("uy"), named("y"));
        assert_eq!(index.get("unknown"), None);
    }

    #[test]
    fn a_relist_replaces_the_parents_once_it_is_done() {
        let index = ByUid::default();
        index.observe(&Event::Apply(parent("gone", "ug")));
        index.observe(&Event::<ConfigMap>::Init);
        index.observe(&Event::InitApply(parent("kept", "uk")));
        // Until the relist is done, the mapper sees the old parents.
        assert_eq!(index.get("ug"), named("gone"));
        assert_eq!(index.get("uk"), None);
        index.observe(&Event::<ConfigMap>::InitDone);
        assert_eq!(index.get("ug"), None);
        assert_eq!(index.get("uk"), named("kept"));
    }
}
