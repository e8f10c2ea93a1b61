//! Which parent events are worth a pass: those whose hash of what wakes a
//! parent (see `controller`'s `outside_status`) changed since its last
//! event. kube's `predicate_filter` does the same with a key of three
//! owned strings per parent (name, namespace, uid: about 190 bytes a
//! parent with its table slot) kept for an hour after the parent is gone;
//! here a parent is two integers, forgotten when it is deleted, and a
//! relist keeps only the parents it lists.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use kube::Resource;
use kube::runtime::watcher::Event;

use super::relisted::Relisted;

/// A parent's identity hashed → its last hash.
type Seen = HashMap<u64, u64>;

fn identity<K: Resource>(o: &K) -> u64 {
    let meta = o.meta();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&meta.namespace, &meta.name, &meta.uid).hash(&mut h);
    h.finish()
}

/// A filter of watch events: `false` for an object listed or applied with
/// the same `hash` as its last event (an object without a hash always
/// passes); every other event passes.
pub(in crate::operator) fn changed_only<K, E>(
    hash: impl Fn(&K) -> Option<u64> + Send + 'static,
) -> impl FnMut(&Result<Event<K>, E>) -> bool + Send + 'static
where
    K: Resource,
{
    let mut seen: Relisted<Seen> = Relisted::default();
    move |event| {
        let Ok(event) = event else {
            return true;
        };
        let (Event::Apply(o) | Event::InitApply(o)) = event else {
            seen.follow(
                event,
                |_, _| {},
                |index, o| {
                    index.remove(&identity(o));
                },
            );
            return true;
        };
        let Some(now) = hash(o) else {
            return true;
        };
        let key = identity(o);
        // A relist compares with what was seen before it.
        let before = seen.live().get(&key).copied();
        seen.follow(
            event,
            |index, _| {
                index.insert(key, now);
            },
            |_, _| {},
        );
        before != Some(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn object(name: &str, v: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("a".into()),
                uid: Some(format!("u-{name}")),
                ..ObjectMeta::default()
            },
            data: Some([("v".to_owned(), v.to_owned())].into()),
            ..ConfigMap::default()
        }
    }

    fn hash(o: &ConfigMap) -> Option<u64> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        o.data.hash(&mut h);
        Some(h.finish())
    }

    #[test]
    fn an_object_passes_when_its_hash_changed_and_again_after_its_deletion() {
        let mut pass = changed_only::<_, ()>(hash);
        assert!(pass(&Ok(Event::Init)));
        assert!(pass(&Ok(Event::InitApply(object("x", "1")))));
        assert!(pass(&Ok(Event::InitDone)));
        assert!(!pass(&Ok(Event::Apply(object("x", "1")))), "unchanged");
        assert!(pass(&Ok(Event::Apply(object("x", "2")))), "changed");
        assert!(pass(&Ok(Event::Apply(object("y", "2")))), "another object");
        assert!(pass(&Ok(Event::Delete(object("x", "2")))));
        assert!(
            pass(&Ok(Event::Apply(object("x", "2")))),
            "made again after its deletion"
        );
    }

    #[test]
    fn a_relist_passes_what_changed_and_keeps_only_what_it_listed() {
        let mut pass = changed_only::<_, ()>(hash);
        pass(&Ok(Event::Apply(object("x", "1"))));
        pass(&Ok(Event::Apply(object("gone", "1"))));
        assert!(pass(&Ok(Event::Init)));
        assert!(!pass(&Ok(Event::InitApply(object("x", "1")))), "unchanged");
        assert!(pass(&Ok(Event::InitApply(object("new", "1")))));
        assert!(pass(&Ok(Event::InitDone)));
        assert!(!pass(&Ok(Event::Apply(object("new", "1")))));
        assert!(
            pass(&Ok(Event::Apply(object("gone", "1")))),
            "deleted while the watch was down: forgotten by the relist"
        );
    }
}
