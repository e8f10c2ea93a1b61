//! Which targets carry which patch managers: `trellis/<rule>/<parent uid>`
//! → (watch, namespace, name), kept from the patch watches' events so that
//! a pass finds what its parent contributed before without a scan. Pure.

use std::collections::{HashMap, HashSet};

use kube::api::ObjectMeta;

/// A target: the index of its watch, its namespace and name.
pub type At = (usize, (Option<String>, String));

#[derive(Debug, Default)]
pub struct Managers {
    by_manager: HashMap<String, HashSet<At>>,
}

/// The patch managers named in `meta`'s (trimmed) `managedFields`.
fn names(meta: &ObjectMeta) -> impl Iterator<Item = &str> {
    meta.managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.as_deref())
}

impl Managers {
    pub fn add(&mut self, at: &At, meta: &ObjectMeta) {
        for name in names(meta) {
            self.by_manager
                .entry(name.to_owned())
                .or_default()
                .insert(at.clone());
        }
    }

    pub fn remove(&mut self, at: &At, meta: &ObjectMeta) {
        for name in names(meta) {
            if let Some(set) = self.by_manager.get_mut(name) {
                set.remove(at);
                if set.is_empty() {
                    self.by_manager.remove(name);
                }
            }
        }
    }

    /// Forgets watch `w`'s targets (it relists).
    pub fn clear(&mut self, w: usize) {
        self.by_manager.retain(|_, set| {
            set.retain(|(at, _)| *at != w);
            !set.is_empty()
        });
    }

    /// The managers whose names start with `prefix` (a rule's patch
    /// managers: `trellis/<rule>/`).
    pub fn named(&self, prefix: &str) -> Vec<String> {
        self.by_manager
            .keys()
            .filter(|m| m.starts_with(prefix))
            .cloned()
            .collect()
    }

    pub fn of(&self, manager: &str) -> Vec<At> {
        self.by_manager
            .get(manager)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    fn meta(managers: &[&str]) -> ObjectMeta {
        ObjectMeta {
            managed_fields: Some(
                managers
                    .iter()
                    .map(|m| ManagedFieldsEntry {
                        manager: Some((*m).to_owned()),
                        ..ManagedFieldsEntry::default()
                    })
                    .collect(),
            ),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn targets_follow_their_managers() {
        let mut index = Managers::default();
        let ns = (0, (None, "team-a".to_owned()));
        index.add(&ns, &meta(&["trellis/r/u1", "trellis/r/u2"]));
        assert_eq!(index.of("trellis/r/u1"), vec![ns.clone()]);
        index.remove(&ns, &meta(&["trellis/r/u1", "trellis/r/u2"]));
        index.add(&ns, &meta(&["trellis/r/u2"]));
        assert!(index.of("trellis/r/u1").is_empty());
        assert_eq!(index.of("trellis/r/u2"), vec![ns.clone()]);
        assert_eq!(index.named("trellis/r/"), vec!["trellis/r/u2".to_owned()]);
        assert!(index.named("trellis/other/").is_empty());
        index.clear(0);
        assert!(index.of("trellis/r/u2").is_empty());
    }
}
