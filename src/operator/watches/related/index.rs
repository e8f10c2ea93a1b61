//! The read index: which parents read which related objects, so that an
//! event on one re-reconciles exactly its readers. Pure, no I/O: the
//! operator feeds it what passes read ([`ReadIndex::record`]) and what the
//! watches saw ([`ReadIndex::touch`]).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::Hash;

use crate::kinds::Gvk;
use crate::plan::{RelatedRead, RelatedTarget};

/// Group and kind: what a read and an event are matched on (any version).
type GroupKind = (String, String);

/// A change to related objects, as the index matches it against reads.
#[derive(Debug, Clone)]
pub struct Touched {
    pub group: String,
    pub kind: String,
    pub namespace: Option<String>,
    /// `None`: every object of the kind (a relist replaced the cache).
    pub name: Option<String>,
    /// The labels before and after (one set for a create or delete).
    pub labels: Vec<BTreeMap<String, String>>,
}

impl Touched {
    fn covered_by(&self, read: &RelatedRead, group: &str) -> bool {
        if group != self.group || read.kind != self.kind {
            return false;
        }
        let Some(name) = &self.name else {
            return true;
        };
        self.labels.iter().any(|labels| {
            read.covers_with(self.namespace.as_deref(), name, |k| {
                labels.get(k).map(String::as_str)
            })
        })
    }
}

/// Events kept to catch one that lands while a pass is between reading the
/// caches and recording what it read (see [`ReadIndex::record`]).
pub(super) const RECENT_EVENTS: usize = 1024;

/// Which parents read what: related object → parents. Pure, no I/O.
#[derive(Debug)]
pub struct ReadIndex<P> {
    /// Every parent's reads of its last pass (with each read's group).
    reads: HashMap<P, Vec<(String, RelatedRead)>>,
    /// Name reads: (group, kind, namespace, name) → parents.
    by_name: HashMap<(String, String, Option<String>, String), HashSet<P>>,
    /// Parents with selector reads, per kind.
    by_selector: HashMap<GroupKind, HashSet<P>>,
    /// Parents with any read, per kind (a relist wakes them all).
    by_kind: HashMap<GroupKind, HashSet<P>>,
    /// Events seen so far; `recent` holds the last ones with their number.
    seq: u64,
    recent: VecDeque<(u64, Touched)>,
}

impl<P> Default for ReadIndex<P> {
    fn default() -> Self {
        ReadIndex {
            reads: HashMap::new(),
            by_name: HashMap::new(),
            by_selector: HashMap::new(),
            by_kind: HashMap::new(),
            seq: 0,
            recent: VecDeque::new(),
        }
    }
}

fn group_of(read: &RelatedRead) -> String {
    Gvk::new(&read.api_version, &read.kind).group
}

impl<P: Clone + Eq + Hash> ReadIndex<P> {
    /// The number of the last event seen: take it before a pass reads.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Every parent indexed (a missed change: they all look again).
    pub fn parents(&self) -> Vec<P> {
        self.reads.keys().cloned().collect()
    }

    /// Parents indexed (with at least one read).
    pub fn len(&self) -> usize {
        self.reads.len()
    }

    pub fn is_empty(&self) -> bool {
        self.reads.is_empty()
    }

    /// Replaces what `parent` reads. Returns whether an event numbered after
    /// `since` (the [`seq`](Self::seq) taken before the pass read the
    /// caches) touched one of these reads: the pass may have missed it, and
    /// the parent must be reconciled again.
    pub fn record(&mut self, parent: &P, reads: &[RelatedRead], since: u64) -> bool {
        self.forget(parent);
        if reads.is_empty() {
            return false;
        }
        let reads: Vec<(String, RelatedRead)> =
            reads.iter().map(|r| (group_of(r), r.clone())).collect();
        for (group, read) in &reads {
            let gk = (group.clone(), read.kind.clone());
            self.by_kind
                .entry(gk.clone())
                .or_default()
                .insert(parent.clone());
            match &read.target {
                RelatedTarget::Name(name) => {
                    self.by_name
                        .entry((
                            group.clone(),
                            read.kind.clone(),
                            read.namespace.clone(),
                            name.clone(),
                        ))
                        .or_default()
                        .insert(parent.clone());
                }
                RelatedTarget::Selector(_) => {
                    self.by_selector
                        .entry(gk)
                        .or_default()
                        .insert(parent.clone());
                }
            }
        }
        // Events older than the oldest kept one may be lost: assume missed.
        let overflowed = self
            .recent
            .front()
            .is_some_and(|(first, _)| *first > since + 1);
        let missed = overflowed
            || self
                .recent
                .iter()
                .rev()
                .take_while(|(n, _)| *n > since)
                .any(|(_, t)| reads.iter().any(|(g, r)| t.covered_by(r, g)));
        self.reads.insert(parent.clone(), reads);
        missed
    }

    /// Drops a parent's reads (it was deleted, or reads nothing now).
    pub fn forget(&mut self, parent: &P) {
        let Some(old) = self.reads.remove(parent) else {
            return;
        };
        for (group, read) in old {
            let gk = (group.clone(), read.kind.clone());
            remove_from(&mut self.by_kind, &gk, parent);
            match read.target {
                RelatedTarget::Name(name) => {
                    remove_from(
                        &mut self.by_name,
                        &(group, read.kind, read.namespace, name),
                        parent,
                    );
                }
                RelatedTarget::Selector(_) => remove_from(&mut self.by_selector, &gk, parent),
            }
        }
    }

    /// Keeps only the parents `keep` accepts (a sweep after churn).
    pub fn retain(&mut self, keep: impl Fn(&P) -> bool) {
        let gone: Vec<P> = self.reads.keys().filter(|p| !keep(p)).cloned().collect();
        for p in &gone {
            self.forget(p);
        }
    }

    /// Records a change and returns the parents whose reads cover it.
    pub fn touch(&mut self, touched: Touched) -> Vec<P> {
        self.seq += 1;
        let mut out: HashSet<P> = HashSet::new();
        let gk = (touched.group.clone(), touched.kind.clone());
        match &touched.name {
            None => {
                if let Some(ps) = self.by_kind.get(&gk) {
                    out.extend(ps.iter().cloned());
                }
            }
            Some(name) => {
                let key = (
                    gk.0.clone(),
                    gk.1.clone(),
                    touched.namespace.clone(),
                    name.clone(),
                );
                if let Some(ps) = self.by_name.get(&key) {
                    out.extend(ps.iter().cloned());
                }
                // A cluster-scoped kind, or a name read in every namespace.
                if touched.namespace.is_some() {
                    let key = (gk.0.clone(), gk.1.clone(), None, name.clone());
                    if let Some(ps) = self.by_name.get(&key) {
                        out.extend(ps.iter().cloned());
                    }
                }
                if let Some(ps) = self.by_selector.get(&gk) {
                    for p in ps {
                        let covered = self.reads.get(p).is_some_and(|reads| {
                            reads.iter().any(|(g, r)| {
                                matches!(r.target, RelatedTarget::Selector(_))
                                    && touched.covered_by(r, g)
                            })
                        });
                        if covered {
                            out.insert(p.clone());
                        }
                    }
                }
            }
        }
        if self.recent.len() == RECENT_EVENTS {
            self.recent.pop_front();
        }
        self.recent.push_back((self.seq, touched));
        out.into_iter().collect()
    }
}

fn remove_from<K: Eq + Hash, P: Eq + Hash>(map: &mut HashMap<K, HashSet<P>>, key: &K, p: &P) {
    if let Some(set) = map.get_mut(key) {
        set.remove(p);
        if set.is_empty() {
            map.remove(key);
        }
    }
}
