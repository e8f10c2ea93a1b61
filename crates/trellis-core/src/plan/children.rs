//! `children` in the evaluation context, and the root of a status field's
//! `jsonPath`: what is observed of each child of the rule, by id.
//!
//! A child without `forEach` is its one observed object, absent until it
//! exists. A `forEach` child is a list, `[]` when nothing is observed. Once
//! it has rendered in this pass the list is in the order of this pass's
//! items, and objects of items no longer rendered (about to be pruned) are
//! left out; a child reading `children.X` is rendered after `X`, and status
//! fields and conditions after every child, so they see that order. Before
//! `X` renders (in `vars`, in `X`'s own `includeWhen`, `forEach` and
//! template) and when it does not render in the pass (held back, failed),
//! the list holds every observed object in name order.
//!
//! An excluded `X` (`includeWhen` false) shows as not created once its
//! `includeWhen` has decided — absent, or `[]` for a `forEach` child — since
//! all its objects are about to be pruned; `vars` and `X`'s own `includeWhen`
//! still see what is observed.
//!
//! Readiness and pruning read the observed objects themselves, not this.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde_json::Value;

use super::ObjectKey;
use super::observed::strip_noise;
use crate::render;
use crate::rules::CompiledRule;

/// The observed children of one parent as templates and status see them.
pub(super) struct Children {
    by_id: BTreeMap<String, Entry>,
}

struct Entry {
    for_each: bool,
    /// Name order until a `forEach` child renders, item order after.
    objects: Vec<(ObjectKey, Seen)>,
}

/// One observed object, noise stripped, converted once for templates.
struct Seen {
    json: Value,
    value: minijinja::Value,
}

impl Children {
    /// What is observed of each of the rule's children, before the pass
    /// renders anything.
    pub(super) fn observed(
        rule: &CompiledRule,
        observed: &BTreeMap<String, Vec<(&ObjectKey, &Value)>>,
    ) -> Children {
        let by_id = rule
            .children
            .iter()
            .map(|child| {
                let objects = observed
                    .get(&child.spec.id)
                    .into_iter()
                    .flatten()
                    .map(|(key, obj)| {
                        let mut json = (*obj).clone();
                        strip_noise(&mut json);
                        let value = render::to_value(&json);
                        ((*key).clone(), Seen { json, value })
                    })
                    .collect();
                let entry = Entry {
                    for_each: child.spec.for_each.is_some(),
                    objects,
                };
                (child.spec.id.clone(), entry)
            })
            .collect();
        Children { by_id }
    }

    /// The child `id` rendered `keys` in this pass, in item order: a
    /// `forEach` child's list becomes the observed objects of those keys, in
    /// that order. A child without `forEach` reads as the object it
    /// rendered when that one is observed (a child moved to another
    /// cluster under the same name has two objects until the old one is
    /// pruned). Whether anything changed.
    pub(super) fn rendered<'k>(
        &mut self,
        id: &str,
        keys: impl IntoIterator<Item = &'k ObjectKey>,
    ) -> bool {
        let Some(entry) = self.by_id.get_mut(id) else {
            return false;
        };
        if !entry.for_each {
            let Some(key) = keys.into_iter().next() else {
                return false;
            };
            return match entry.objects.iter().position(|(k, _)| k == key) {
                Some(at) if at > 0 => {
                    let seen = entry.objects.remove(at);
                    entry.objects.insert(0, seen);
                    true
                }
                _ => false,
            };
        }
        let mut by_key: BTreeMap<ObjectKey, Seen> =
            std::mem::take(&mut entry.objects).into_iter().collect();
        entry.objects = keys
            .into_iter()
            .filter_map(|k| by_key.remove_entry(k))
            .collect();
        true
    }

    /// The child `id` is excluded in this pass (`includeWhen` false): every
    /// object of it is about to be pruned, so it reads as not created —
    /// absent, or `[]` for a `forEach` child. Whether anything changed.
    pub(super) fn excluded(&mut self, id: &str) -> bool {
        match self.by_id.get_mut(id) {
            Some(entry) if !entry.objects.is_empty() => {
                entry.objects.clear();
                true
            }
            _ => false,
        }
    }

    /// `children` for templates and expressions.
    pub(super) fn context(&self) -> minijinja::Value {
        let map: BTreeMap<String, minijinja::Value> = self
            .by_id
            .iter()
            .filter_map(|(id, entry)| {
                let value = if entry.for_each {
                    let items: Vec<minijinja::Value> =
                        entry.objects.iter().map(|(_, s)| s.value.clone()).collect();
                    minijinja::Value::from(items)
                } else {
                    entry.objects.first()?.1.value.clone()
                };
                Some((id.clone(), value))
            })
            .collect();
        minijinja::Value::from(map)
    }

    /// The child `id` as the root of a status field's `jsonPath`: its
    /// object, or for a `forEach` child the list of its items.
    pub(super) fn json(&self, id: &str) -> Option<Cow<'_, Value>> {
        let entry = self.by_id.get(id)?;
        if entry.for_each {
            let items = entry.objects.iter().map(|(_, s)| s.json.clone()).collect();
            Some(Cow::Owned(Value::Array(items)))
        } else {
            entry.objects.first().map(|(_, s)| Cow::Borrowed(&s.json))
        }
    }
}

/// `fixed` (parent, related entries, vars) with `children` as it stands:
/// rebuilt whenever a child renders or is excluded (item order).
pub(super) fn with_children(fixed: &minijinja::Value, children: &Children) -> minijinja::Value {
    minijinja::context! { children => children.context(), ..fixed.clone() }
}
