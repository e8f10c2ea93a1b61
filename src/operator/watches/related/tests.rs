//! The read index, without a cluster.

use std::collections::BTreeMap;

use super::index::RECENT_EVENTS;
use super::*;
use crate::rules::model::LabelSelector;

fn named(kind: &str, ns: Option<&str>, name: &str) -> RelatedRead {
    RelatedRead {
        id: "r".into(),
        api_version: "v1".into(),
        kind: kind.into(),
        namespace: ns.map(str::to_owned),
        target: RelatedTarget::Name(name.into()),
    }
}

fn selected(kind: &str, ns: Option<&str>, labels: &[(&str, &str)]) -> RelatedRead {
    RelatedRead {
        id: "r".into(),
        api_version: "v1".into(),
        kind: kind.into(),
        namespace: ns.map(str::to_owned),
        target: RelatedTarget::Selector(LabelSelector {
            match_labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            match_expressions: Vec::new(),
        }),
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn touched(kind: &str, ns: Option<&str>, name: &str, sets: &[&[(&str, &str)]]) -> Touched {
    Touched {
        group: String::new(),
        kind: kind.into(),
        namespace: ns.map(str::to_owned),
        name: Some(name.into()),
        labels: sets.iter().map(|s| labels(s)).collect(),
    }
}

fn sorted(mut v: Vec<&'static str>) -> Vec<&'static str> {
    v.sort();
    v
}

#[test]
fn an_edit_of_a_named_object_wakes_exactly_its_readers() {
    let mut index = ReadIndex::default();
    index.record(&"a", &[named("ConfigMap", Some("ns"), "settings")], 0);
    index.record(&"b", &[named("ConfigMap", Some("ns"), "other")], 0);
    index.record(
        &"c",
        &[named("ConfigMap", Some("elsewhere"), "settings")],
        0,
    );
    index.record(&"d", &[named("Secret", Some("ns"), "settings")], 0);
    let woken = index.touch(touched("ConfigMap", Some("ns"), "settings", &[&[]]));
    assert_eq!(woken, vec!["a"]);
    assert!(
        index
            .touch(touched("ConfigMap", Some("ns"), "unread", &[&[]]))
            .is_empty()
    );
}

#[test]
fn an_object_starting_or_stopping_to_match_a_selector_wakes_its_readers() {
    let mut index = ReadIndex::default();
    index.record(
        &"prod",
        &[selected("Namespace", None, &[("env", "prod")])],
        0,
    );
    index.record(&"dev", &[selected("Namespace", None, &[("env", "dev")])], 0);
    // Gains the label: the new labels match.
    let gained = index.touch(touched(
        "Namespace",
        None,
        "team-a",
        &[&[("env", "prod")], &[]],
    ));
    assert_eq!(gained, vec!["prod"]);
    // Loses it: only the old labels matched.
    let lost = index.touch(touched(
        "Namespace",
        None,
        "team-a",
        &[&[], &[("env", "prod")]],
    ));
    assert_eq!(lost, vec!["prod"]);
    // Moves from one selector to the other: both readers look.
    let moved = index.touch(touched(
        "Namespace",
        None,
        "team-a",
        &[&[("env", "dev")], &[("env", "prod")]],
    ));
    assert_eq!(sorted(moved), vec!["dev", "prod"]);
    // Never matched either.
    assert!(
        index
            .touch(touched("Namespace", None, "team-b", &[&[("env", "qa")]]))
            .is_empty()
    );
}

#[test]
fn a_selector_read_in_one_namespace_ignores_objects_elsewhere() {
    let mut index = ReadIndex::default();
    index.record(
        &"a",
        &[selected("ConfigMap", Some("ns"), &[("app", "x")])],
        0,
    );
    assert!(
        index
            .touch(touched("ConfigMap", Some("other"), "c", &[&[("app", "x")]]))
            .is_empty()
    );
    assert_eq!(
        index.touch(touched("ConfigMap", Some("ns"), "c", &[&[("app", "x")]])),
        vec!["a"]
    );
}

#[test]
fn a_forgotten_parent_is_never_woken_and_a_new_pass_replaces_old_reads() {
    let mut index = ReadIndex::default();
    index.record(&"a", &[named("ConfigMap", Some("ns"), "one")], 0);
    index.record(&"a", &[named("ConfigMap", Some("ns"), "two")], 0);
    assert!(
        index
            .touch(touched("ConfigMap", Some("ns"), "one", &[&[]]))
            .is_empty(),
        "the old read is replaced"
    );
    assert_eq!(
        index.touch(touched("ConfigMap", Some("ns"), "two", &[&[]])),
        vec!["a"]
    );
    index.forget(&"a");
    assert!(index.is_empty());
    assert!(
        index
            .touch(touched("ConfigMap", Some("ns"), "two", &[&[]]))
            .is_empty()
    );
}

#[test]
fn a_relist_wakes_every_reader_of_the_kind() {
    let mut index = ReadIndex::default();
    index.record(&"a", &[named("ConfigMap", Some("ns"), "one")], 0);
    index.record(&"b", &[selected("ConfigMap", Some("ns"), &[("x", "y")])], 0);
    index.record(&"c", &[named("Secret", Some("ns"), "one")], 0);
    let all = Touched {
        group: String::new(),
        kind: "ConfigMap".into(),
        namespace: None,
        name: None,
        labels: Vec::new(),
    };
    assert_eq!(sorted(index.touch(all)), vec!["a", "b"]);
}

#[test]
fn an_event_between_reading_and_recording_is_reported_as_missed() {
    let mut index = ReadIndex::default();
    let since = index.seq();
    // Lands after the pass read the caches, before it recorded its reads.
    index.touch(touched("ConfigMap", Some("ns"), "settings", &[&[]]));
    index.touch(touched("ConfigMap", Some("ns"), "unrelated", &[&[]]));
    assert!(index.record(&"a", &[named("ConfigMap", Some("ns"), "settings")], since));
    let since = index.seq();
    index.touch(touched("ConfigMap", Some("ns"), "unrelated", &[&[]]));
    assert!(
        !index.record(&"b", &[named("ConfigMap", Some("ns"), "settings")], since),
        "an event on another object is not a miss"
    );
}

#[test]
fn more_events_than_are_kept_count_as_missed() {
    let mut index = ReadIndex::default();
    let since = index.seq();
    for i in 0..(RECENT_EVENTS + 2) {
        index.touch(touched("ConfigMap", Some("ns"), &format!("cm-{i}"), &[&[]]));
    }
    assert!(index.record(&"a", &[named("Secret", Some("ns"), "s")], since));
}

#[test]
fn retain_drops_parents_that_are_gone() {
    let mut index = ReadIndex::default();
    index.record(&"a", &[named("ConfigMap", Some("ns"), "one")], 0);
    index.record(&"b", &[named("ConfigMap", Some("ns"), "one")], 0);
    index.retain(|p| *p == "b");
    assert_eq!(index.len(), 1);
    assert_eq!(
        index.touch(touched("ConfigMap", Some("ns"), "one", &[&[]])),
        vec!["b"]
    );
}
