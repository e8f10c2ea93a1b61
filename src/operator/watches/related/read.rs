//! How a pass reads the related caches: [`Caches`] as the planner's
//! [`RelatedSource`] — a name read gets the one object it names, a selector
//! read the objects it matches (through the label index when the watch has
//! one), a spoke read goes to the spokes' caches, and an object that cannot
//! be decoded is an error its readers wait on, never a missing object.

use std::sync::Arc;

use kube::runtime::reflector::ObjectRef;
use serde_json::Value;

use super::super::decode::ParentObject;
use super::Caches;
use crate::kinds::Gvk;
use crate::plan::{ObjectKey, RelatedRead, RelatedSource, RelatedTarget, Unreadable};

impl RelatedSource for Caches {
    fn find_in(
        &self,
        cluster: &str,
        gvk: &Gvk,
        read: &RelatedRead,
    ) -> Result<Vec<(ObjectKey, Value)>, Unreadable> {
        match &self.spokes {
            Some(spokes) => spokes.find_related(cluster, gvk, read),
            None => Err(Unreadable {
                reason: crate::clusters::UNKNOWN,
                message: format!(
                    "cluster \"{cluster}\": the rule's related objects there are not watched"
                ),
            }),
        }
    }

    fn managed_by(&self, manager: &str) -> Vec<(ObjectKey, Value)> {
        let targets = crate::operator::lock(&self.managers).of(manager);
        let mut out = Vec::new();
        for (w, (namespace, name)) in targets {
            let Some(watch) = self.watches.get(w) else {
                continue;
            };
            let mut key = ObjectRef::new_with(&name, watch.kind.resource.clone());
            if let Some(ns) = &namespace {
                key = key.within(ns);
            }
            if let Some(o) = watch.store.get(&key)
                && let Ok(Some(entry)) = to_entry(&watch.kind.gvk, &o)
            {
                out.push(entry);
            }
        }
        out
    }

    fn served(&self, gvk: &Gvk) -> Result<(), Unreadable> {
        match self.unserved.iter().find(|u| &u.gvk == gvk) {
            Some(not_served) => Err(Unreadable {
                reason: Unreadable::KIND_NOT_SERVED,
                message: not_served.to_string(),
            }),
            None => Ok(()),
        }
    }

    fn find(&self, gvk: &Gvk, read: &RelatedRead) -> Result<Vec<(ObjectKey, Value)>, Unreadable> {
        self.served(gvk)?;
        let Some(watch) = self.watch_for(gvk, read) else {
            return Ok(Vec::new());
        };
        if let Some(ns) = &read.namespace
            && !watch.scope.is_empty()
            && !watch.scope.contains(ns)
        {
            return Err(Unreadable {
                reason: Unreadable::OUT_OF_SCOPE,
                message: format!(
                    "namespace `{ns}` is outside the namespaces trellis watches ({}): \
                     add it to the operator's --namespace",
                    watch.scope.join(", ")
                ),
            });
        }
        let covers = |o: &ParentObject| {
            let meta = &o.object.metadata;
            let labels = o.object.labels();
            read.covers_with(
                meta.namespace.as_deref(),
                meta.name.as_deref().unwrap_or_default(),
                |k| labels.get(k).map(String::as_str),
            )
        };
        let found: Vec<Arc<ParentObject>> = match &read.target {
            RelatedTarget::Name(name) => {
                let mut key = ObjectRef::new_with(name, watch.kind.resource.clone());
                if let (true, Some(ns)) = (watch.kind.namespaced, &read.namespace) {
                    key = key.within(ns);
                }
                watch
                    .store
                    .get(&key)
                    .filter(|o| covers(o))
                    .into_iter()
                    .collect()
            }
            RelatedTarget::Selector(sel) => {
                let candidates = watch
                    .labels
                    .as_ref()
                    .and_then(|l| crate::operator::lock(l).candidates(&sel.match_labels));
                match candidates {
                    Some(keys) => keys
                        .iter()
                        .filter_map(|(ns, name)| {
                            let key = ObjectRef::new_with(name, watch.kind.resource.clone());
                            watch.store.get(&match ns {
                                Some(ns) => key.within(ns),
                                None => key,
                            })
                        })
                        .filter(|o| covers(o))
                        .collect(),
                    None => watch.store.state_filter(covers),
                }
            }
        };
        let mut out = Vec::with_capacity(found.len());
        for o in &found {
            out.extend(to_entry(gvk, o)?);
        }
        Ok(out)
    }
}

/// A cached object as the planner reads it, or why it cannot be: a
/// template must not read half an object, nor take it for missing.
pub(super) fn to_entry(
    gvk: &Gvk,
    o: &ParentObject,
) -> Result<Option<(ObjectKey, Value)>, Unreadable> {
    if let Some(why) = &o.undecodable {
        let meta = &o.object.metadata;
        let name = meta.name.as_deref().unwrap_or_default();
        let object = match &meta.namespace {
            Some(ns) => format!("{} {ns}/{name}", gvk.kind),
            None => format!("{} {name}", gvk.kind),
        };
        return Err(Unreadable {
            reason: Unreadable::UNDECODABLE,
            message: format!("{object} cannot be decoded: {why}"),
        });
    }
    let value = o.to_value();
    Ok(ObjectKey::of(&value).map(|k| (k, value)))
}
