//! A rule's parents by uid, kept from the parent watch's own events: the
//! trigger mapper finds the parent of a child that has no controller
//! ownerReference (a child in another namespace, or a cluster-scoped child
//! of a namespaced parent) by its `trellis.dev/parent-uid` label in O(1),
//! where it scanned the whole parent cache on every such child's event.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::Resource;
use kube::runtime::watcher::Event;

/// A parent's namespace and name.
pub type ParentName = (Option<String>, String);
type Index = HashMap<String, ParentName>;

/// Parents by uid. A uid never changes and is never reused, so an entry is
/// right for as long as its parent exists; a relist swaps the whole index
/// in when it is done, as the store does.
#[derive(Default)]
pub struct ByUid {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    live: Index,
    /// Filled during a relist, swapped in when it is done.
    relisting: Option<Index>,
}

impl ByUid {
    /// Follows one event of the parent watch (before the store takes it).
    pub fn observe<K: Resource>(&self, event: &Event<K>) {
        let mut state = super::lock(&self.state);
        match event {
            Event::Init => state.relisting = Some(Index::new()),
            Event::InitApply(o) => {
                let state = &mut *state;
                add(state.relisting.as_mut().unwrap_or(&mut state.live), o);
            }
            Event::InitDone => {
                if let Some(index) = state.relisting.take() {
                    state.live = index;
                }
            }
            Event::Apply(o) => add(&mut state.live, o),
            Event::Delete(o) => {
                if let Some(uid) = o.meta().uid.as_deref() {
                    state.live.remove(uid);
                }
            }
        }
    }

    /// The parent with `uid`, if the watch has seen it.
    pub fn get(&self, uid: &str) -> Option<ParentName> {
        super::lock(&self.state).live.get(uid).cloned()
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
