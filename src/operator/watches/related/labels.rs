//! A related cache's objects by label pair, so that a `matchLabels` read
//! visits the objects carrying one of its pairs instead of the whole cache
//! (1,000 parents × a 10,000-object kind is 10M label checks per resync).
//! Pure, no I/O: the watch feeds it what it feeds the store, in the same
//! order, with the labels the store held before (so the index keeps no copy
//! of them); a relist builds a new index and swaps it in at its end, as the
//! store does.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hash;

type Pair = (String, String);

/// Objects (`K`, a cache key) per label pair.
#[derive(Debug)]
pub struct LabelIndex<K> {
    by_pair: HashMap<Pair, HashSet<K>>,
    /// The index a relist is building (between `Init` and `InitDone`).
    next: Option<Box<LabelIndex<K>>>,
}

impl<K> Default for LabelIndex<K> {
    fn default() -> Self {
        LabelIndex {
            by_pair: HashMap::new(),
            next: None,
        }
    }
}

impl<K: Clone + Eq + Hash> LabelIndex<K> {
    /// An object created or changed (`old`: its labels before), or listed
    /// during a relist.
    pub fn apply(
        &mut self,
        key: &K,
        old: Option<&BTreeMap<String, String>>,
        labels: &BTreeMap<String, String>,
    ) {
        match &mut self.next {
            Some(next) => next.put(key, labels),
            None => {
                if let Some(old) = old {
                    self.remove(key, old);
                }
                self.put(key, labels);
            }
        }
    }

    /// An object deleted, with its last labels.
    pub fn delete(&mut self, key: &K, labels: &BTreeMap<String, String>) {
        self.remove(key, labels);
    }

    /// A relist starts: what it lists replaces everything at [`Self::relisted`].
    pub fn relist(&mut self) {
        self.next = Some(Box::default());
    }

    /// A relist is complete.
    pub fn relisted(&mut self) {
        if let Some(next) = self.next.take() {
            *self = *next;
        }
    }

    /// The objects carrying the pair of `match_labels` that the fewest carry
    /// (every match carries all of them); `None` for an empty map: the
    /// caller scans.
    pub fn candidates(&self, match_labels: &BTreeMap<String, String>) -> Option<Vec<K>> {
        let empty = HashSet::new();
        match_labels
            .iter()
            .map(|(k, v)| self.by_pair.get(&(k.clone(), v.clone())).unwrap_or(&empty))
            .min_by_key(|set| set.len())
            .map(|set| set.iter().cloned().collect())
    }

    fn put(&mut self, key: &K, labels: &BTreeMap<String, String>) {
        for (k, v) in labels {
            self.by_pair
                .entry((k.clone(), v.clone()))
                .or_default()
                .insert(key.clone());
        }
    }

    fn remove(&mut self, key: &K, labels: &BTreeMap<String, String>) {
        for (k, v) in labels {
            let pair = (k.clone(), v.clone());
            if let Some(set) = self.by_pair.get_mut(&pair) {
                set.remove(key);
                if set.is_empty() {
                    self.by_pair.remove(&pair);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn sorted(mut v: Vec<&'static str>) -> Vec<&'static str> {
        v.sort();
        v
    }

    #[test]
    fn a_match_labels_read_gets_the_objects_of_its_rarest_pair() {
        let mut index = LabelIndex::default();
        index.apply(&"a", None, &labels(&[("team", "x"), ("app", "db")]));
        index.apply(&"b", None, &labels(&[("team", "x"), ("app", "web")]));
        index.apply(&"c", None, &labels(&[("team", "y"), ("app", "db")]));
        let got = index.candidates(&labels(&[("team", "x"), ("app", "web")]));
        assert_eq!(got.map(sorted), Some(vec!["b"]));
        let got = index.candidates(&labels(&[("team", "x")]));
        assert_eq!(got.map(sorted), Some(vec!["a", "b"]));
        assert_eq!(index.candidates(&labels(&[("team", "z")])), Some(vec![]));
        assert_eq!(index.candidates(&labels(&[])), None, "empty: scan");
    }

    #[test]
    fn a_relabelled_or_deleted_object_leaves_its_old_pairs() {
        let mut index = LabelIndex::default();
        let (x, y) = (labels(&[("team", "x")]), labels(&[("team", "y")]));
        index.apply(&"a", None, &x);
        index.apply(&"a", Some(&x), &y);
        assert_eq!(index.candidates(&x), Some(vec![]));
        assert_eq!(index.candidates(&y), Some(vec!["a"]));
        index.delete(&"a", &y);
        assert_eq!(index.candidates(&y), Some(vec![]));
        assert!(index.by_pair.is_empty());
    }

    #[test]
    fn a_relist_replaces_the_index_only_when_it_is_complete() {
        let mut index = LabelIndex::default();
        index.apply(&"gone", None, &labels(&[("team", "x")]));
        index.relist();
        index.apply(&"new", None, &labels(&[("team", "x")]));
        assert_eq!(
            index.candidates(&labels(&[("team", "x")])),
            Some(vec!["gone"]),
            "until the relist ends, the old state serves"
        );
        index.relisted();
        assert_eq!(
            index.candidates(&labels(&[("team", "x")])),
            Some(vec!["new"])
        );
    }
}
