//! The revision ConfigMaps of one rule with `rollout:`, as the rollout's
//! tick reads them: a watch (label `trellis.dev/revision-of=<rule>`, in the
//! operator's namespace) kept in memory, overlaid with the leader's own
//! writes and deletes that the watch has not shown yet.
//!
//! ```text
//!  watch ──events──▶ observe ──▶ shown      by name; a relist replaces it whole at InitDone
//!  the leader's write response ──▶ written  until the watch shows that version or a newer one
//!  the leader's delete ──────────▶ gone     until the watch shows the delete
//!
//!  view = shown, overridden by written, minus gone  ──▶ the tick (no request)
//! ```
//!
//! Without the overlay, a tick could act on the state from before the
//! leader's own last write (the watch lags the write's response) and take
//! the same step twice: parents moved again, Events sent again. The watch
//! and the writes are tied by resourceVersion, which Kubernetes 1.35 made
//! comparable (KEP-5504: decimal integers, newer is larger).
//!
//! This module owns the cache, not the decisions: `rollout` reads
//! [`Revisions::stored`] and reports its writes back.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, future, stream::BoxStream};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

use super::versions::{LABEL_REVISION_OF, Stored};
use crate::operator::retry::WatchBackoff;
use crate::operator::watches::own_errors;

/// The watch of `rule`'s revision ConfigMaps in `namespace`: errors are
/// logged and retried by the watch's own backoff, never passed on.
pub(in crate::operator) fn watch(
    client: &Client,
    namespace: &str,
    rule: &str,
) -> BoxStream<'static, watcher::Event<ConfigMap>> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let config = watcher::Config::default().labels(&format!("{LABEL_REVISION_OF}={rule}"));
    own_errors(
        format!("{rule} revision ConfigMaps in {namespace}"),
        watcher(api, config).backoff(WatchBackoff::default()),
    )
    .filter_map(|event| future::ready(event.ok()))
    .boxed()
}

/// One ConfigMap at one resourceVersion; `stored` is `None` when it does
/// not decode as a version (it is then left out, as a list would).
#[derive(Debug, Clone)]
struct Shown {
    version: String,
    stored: Option<Stored>,
}

impl Shown {
    fn of(cm: &ConfigMap) -> Shown {
        Shown {
            version: cm.resource_version().unwrap_or_default(),
            stored: Stored::decode(cm),
        }
    }
}

/// What the rollout knows of its revision ConfigMaps (see the module docs).
#[derive(Debug, Default)]
pub(in crate::operator) struct Revisions {
    shown: BTreeMap<String, Shown>,
    /// A list under way (the first, or a relist after the watch was lost):
    /// what it has returned so far; it replaces `shown` once complete.
    relisting: Option<BTreeMap<String, Shown>>,
    listed: bool,
    /// The leader's writes, by name, until the watch shows them.
    written: BTreeMap<String, Shown>,
    /// Names the leader deleted, with the version they were shown at,
    /// until the watch shows them gone.
    gone: BTreeMap<String, String>,
}

impl Revisions {
    /// Whether the watch's first list is complete: before, the view is
    /// partial and the tick must not act on it.
    pub fn listed(&self) -> bool {
        self.listed
    }

    /// Takes one watch event; returns whether the view changed (a write
    /// of the leader's own coming back is no change).
    pub fn observe(&mut self, event: watcher::Event<ConfigMap>) -> bool {
        let before = self.versions();
        match event {
            watcher::Event::Init => self.relisting = Some(BTreeMap::new()),
            watcher::Event::InitApply(cm) => {
                self.relisting
                    .get_or_insert_with(BTreeMap::new)
                    .insert(cm.name_any(), Shown::of(&cm));
            }
            watcher::Event::InitDone => {
                self.shown = self.relisting.take().unwrap_or_default();
                let first = !self.listed;
                self.listed = true;
                self.settle();
                return first || self.versions() != before;
            }
            watcher::Event::Apply(cm) => {
                self.shown.insert(cm.name_any(), Shown::of(&cm));
            }
            watcher::Event::Delete(cm) => {
                self.shown.remove(&cm.name_any());
            }
        }
        self.settle();
        self.versions() != before
    }

    /// The leader wrote `cm` (the write's response): it is the view of that
    /// name until the watch shows this version or a newer one.
    pub fn wrote(&mut self, cm: &ConfigMap) {
        let name = cm.name_any();
        self.gone.remove(&name);
        self.written.insert(name, Shown::of(cm));
        self.settle();
    }

    /// The leader deleted `name` (or found it gone): left out of the view
    /// until the watch shows the delete.
    pub fn deleted(&mut self, name: &str) {
        self.written.remove(name);
        if let Some(shown) = self.shown.get(name) {
            self.gone.insert(name.to_owned(), shown.version.clone());
        }
    }

    /// Every version in the view, by ConfigMap name.
    pub fn stored(&self) -> Vec<Stored> {
        self.view()
            .filter_map(|(_, shown)| shown.stored.clone())
            .collect()
    }

    /// (name, resourceVersion) of the view: what tells a change.
    fn versions(&self) -> Vec<(String, String)> {
        self.view()
            .map(|(name, shown)| (name.to_owned(), shown.version.clone()))
            .collect()
    }

    fn view(&self) -> impl Iterator<Item = (&str, &Shown)> {
        let names: BTreeSet<&String> = self.shown.keys().chain(self.written.keys()).collect();
        names.into_iter().filter_map(|name| {
            let shown = match self.written.get(name) {
                Some(mine) => mine,
                None if self.gone.contains_key(name) => return None,
                None => self.shown.get(name)?,
            };
            Some((name.as_str(), shown))
        })
    }

    /// Forgets the writes and deletes the watch has caught up with.
    fn settle(&mut self) {
        let shown = &self.shown;
        self.written.retain(|name, mine| {
            shown
                .get(name)
                .is_none_or(|s| newer(&mine.version, &s.version))
        });
        self.gone
            .retain(|name, at| shown.get(name).is_some_and(|s| !newer(&s.version, at)));
    }
}

/// Orders two resourceVersions of one resource: since Kubernetes 1.35 they
/// are decimal integers without leading zeros (KEP-5504), of any length.
/// `None` when either is not.
pub(in crate::operator) fn compare_versions(a: &str, b: &str) -> Option<Ordering> {
    let valid =
        |v: &str| !v.is_empty() && !v.starts_with('0') && v.bytes().all(|c| c.is_ascii_digit());
    (valid(a) && valid(b)).then(|| a.len().cmp(&b.len()).then_with(|| a.cmp(b)))
}

/// `a` is strictly newer than `b`. Versions that do not compare (an API
/// server older than 1.35 may send any string) count as newer when they
/// differ: the watch then wins over a write as soon as it shows anything
/// else for that name, which never leaves a write held over newer changes.
fn newer(a: &str, b: &str) -> bool {
    match compare_versions(a, b) {
        Some(order) => order == Ordering::Greater,
        None => a != b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const A: &str = "trellis-revision-r-aaa";
    const B: &str = "trellis-revision-r-bbb";

    fn cm(name: &str, version: &str) -> ConfigMap {
        let revision = name.rsplit('-').next().unwrap_or_default();
        serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "resourceVersion": version,
                "labels": {
                    LABEL_REVISION_OF: "r",
                    crate::plan::LABEL_REVISION: revision,
                },
            },
            "data": {"rule.json": "{}"},
        }))
        .expect("a ConfigMap")
    }

    fn listed(objects: &[ConfigMap]) -> Revisions {
        let mut revisions = Revisions::default();
        assert!(!revisions.observe(watcher::Event::Init));
        for o in objects {
            assert!(!revisions.observe(watcher::Event::InitApply(o.clone())));
        }
        assert!(!revisions.listed(), "listed before InitDone");
        assert!(revisions.observe(watcher::Event::InitDone));
        revisions
    }

    /// (name, resourceVersion) pairs, as [`Revisions::versions`] gives them.
    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn nothing_is_listed_until_the_first_list_is_complete() {
        let revisions = Revisions::default();
        assert!(!revisions.listed());
        assert!(revisions.stored().is_empty());
        let revisions = listed(&[cm(A, "5")]);
        assert!(revisions.listed());
        assert_eq!(revisions.stored().len(), 1);
    }

    #[test]
    fn the_leaders_own_write_is_the_view_until_the_watch_shows_it() {
        let mut revisions = listed(&[cm(A, "5")]);
        revisions.wrote(&cm(A, "7"));
        assert_eq!(revisions.versions(), pairs(&[(A, "7")]));
        assert!(
            !revisions.observe(watcher::Event::Apply(cm(A, "6"))),
            "an event older than the write changes nothing"
        );
        assert_eq!(
            revisions.versions(),
            pairs(&[(A, "7")]),
            "the older event is not acted on"
        );
        assert!(
            !revisions.observe(watcher::Event::Apply(cm(A, "7"))),
            "the write coming back is no change: it must not wake the tick"
        );
        assert!(
            revisions.written.is_empty(),
            "the write is forgotten once shown"
        );
        assert!(
            revisions.observe(watcher::Event::Apply(cm(A, "8"))),
            "a newer change (a decision) is one"
        );
        assert_eq!(revisions.versions(), pairs(&[(A, "8")]));
    }

    #[test]
    fn a_new_configmap_written_is_in_the_view_before_the_watch_shows_it() {
        let mut revisions = listed(&[cm(A, "5")]);
        revisions.wrote(&cm(B, "9"));
        assert_eq!(revisions.versions(), pairs(&[(A, "5"), (B, "9")]));
        assert!(!revisions.observe(watcher::Event::Apply(cm(B, "9"))));
        assert_eq!(revisions.versions(), pairs(&[(A, "5"), (B, "9")]));
    }

    #[test]
    fn a_watch_event_newer_than_the_write_wins() {
        let mut revisions = listed(&[cm(A, "5")]);
        revisions.wrote(&cm(A, "7"));
        // The write's own event was skipped (a relist after it, say).
        assert!(revisions.observe(watcher::Event::Apply(cm(A, "9"))));
        assert_eq!(revisions.versions(), pairs(&[(A, "9")]));
        assert!(revisions.written.is_empty());
    }

    #[test]
    fn a_relist_replaces_the_cache_but_not_a_write_it_is_older_than() {
        let mut revisions = listed(&[cm(A, "5"), cm(B, "6")]);
        revisions.wrote(&cm(A, "12"));
        assert!(!revisions.observe(watcher::Event::Init));
        assert!(!revisions.observe(watcher::Event::InitApply(cm(A, "10"))));
        assert_eq!(
            revisions.versions(),
            pairs(&[(A, "12"), (B, "6")]),
            "the cache stays whole while the relist runs"
        );
        assert!(
            revisions.observe(watcher::Event::InitDone),
            "B deleted while the watch was down"
        );
        assert_eq!(revisions.versions(), pairs(&[(A, "12")]));
        revisions.observe(watcher::Event::Apply(cm(A, "12")));
        assert_eq!(revisions.versions(), pairs(&[(A, "12")]));
        assert!(revisions.written.is_empty());
    }

    #[test]
    fn a_deleted_configmap_is_left_out_until_the_watch_shows_the_delete() {
        let mut revisions = listed(&[cm(A, "5"), cm(B, "6")]);
        revisions.deleted(B);
        assert_eq!(revisions.versions(), pairs(&[(A, "5")]));
        assert!(
            !revisions.observe(watcher::Event::Apply(cm(B, "6"))),
            "a late event for the deleted version does not bring it back"
        );
        assert!(!revisions.observe(watcher::Event::Delete(cm(B, "11"))));
        assert!(revisions.gone.is_empty());
        assert!(
            revisions.observe(watcher::Event::Apply(cm(B, "14"))),
            "created again, it is back"
        );
        assert_eq!(revisions.versions(), pairs(&[(A, "5"), (B, "14")]));
    }

    #[test]
    fn a_relist_without_the_deleted_configmap_ends_its_delete_and_a_write_brings_it_back() {
        let mut revisions = listed(&[cm(A, "5"), cm(B, "6")]);
        revisions.deleted(B);
        revisions.observe(watcher::Event::Init);
        revisions.observe(watcher::Event::InitApply(cm(A, "5")));
        revisions.observe(watcher::Event::InitDone);
        assert!(revisions.gone.is_empty());

        let mut revisions = listed(&[cm(A, "5"), cm(B, "6")]);
        revisions.deleted(B);
        revisions.wrote(&cm(B, "20"));
        assert_eq!(revisions.versions(), pairs(&[(A, "5"), (B, "20")]));
    }

    #[test]
    fn resource_versions_compare_as_integers_of_any_length() {
        assert_eq!(compare_versions("9", "10"), Some(Ordering::Less));
        assert_eq!(compare_versions("10", "10"), Some(Ordering::Equal));
        assert_eq!(
            compare_versions("100000000000000000000000", "99"),
            Some(Ordering::Greater)
        );
        for invalid in ["", "0", "010", "12a", "-1"] {
            assert_eq!(compare_versions(invalid, "5"), None, "{invalid:?}");
        }
        assert!(newer("b", "a"), "incomparable and different: newer");
        assert!(!newer("a", "a"));
    }
}
