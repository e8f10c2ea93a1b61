use std::time::Duration;

use super::*;
use crate::rollout::{MaxFailed, Step};

fn settings(steps: &[(u32, Pause)]) -> Settings {
    let mut steps: Vec<Step> = steps
        .iter()
        .map(|(percent, pause)| Step {
            percent: *percent,
            pause: *pause,
        })
        .collect();
    if steps.last().is_none_or(|s| s.percent != 100) {
        steps.push(Step {
            percent: 100,
            pause: Pause::None,
        });
    }
    Settings {
        steps,
        canary: None,
        condition: "Ready".into(),
        timeout: Duration::from_secs(60),
        max_failed: MaxFailed::Count(0),
        on_failure: OnFailure::Rollback,
    }
}

/// A little world: parents that do what the state says at once and are
/// healthy unless told otherwise.
struct World {
    parents: Vec<ParentView>,
    sick: BTreeSet<String>,
}

impl World {
    fn new(n: usize, on: &str) -> World {
        World {
            parents: (0..n)
                .map(|i| ParentView {
                    uid: format!("u{i}"),
                    canary: false,
                    on: Some(on.to_owned()),
                    health: Health::Healthy,
                })
                .collect(),
            sick: BTreeSet::new(),
        }
    }

    /// Every parent reconciled with the version the state says.
    fn reconcile(&mut self, state: &State) {
        for p in &mut self.parents {
            let want = state.desired(&p.uid, p.on.as_deref()).to_owned();
            let sick = self.sick.contains(&p.uid) && want == state.to;
            p.on = Some(want);
            p.health = if sick {
                Health::NotYet
            } else {
                Health::Healthy
            };
        }
    }

    fn on(&self, rev: &str) -> usize {
        self.parents
            .iter()
            .filter(|p| p.on.as_deref() == Some(rev))
            .count()
    }
}

const PAUSE: Pause = Pause::For(Duration::from_secs(30));

#[test]
fn each_step_moves_exactly_its_share_then_holds_for_its_pause() {
    let s = settings(&[(10, PAUSE), (50, PAUSE)]);
    let mut world = World::new(7, "a");
    let mut state = State::start("a", "b", 0);
    let fx = state.step(&s, "web", 0, &world.parents, Input::Tick);
    assert_eq!(fx.len(), 1, "⌈10·7/100⌉ = 1 parent moves: {fx:?}");
    assert_eq!(state.phase, Phase::Progressing);
    world.reconcile(&state);
    assert_eq!(world.on("b"), 1);

    state.step(&s, "web", 1, &world.parents, Input::Tick);
    assert_eq!(state.phase, Phase::Paused, "the step's parents are there");
    assert_eq!(state.resume_at(&s), Some(31));
    assert!(
        state
            .step(&s, "web", 30, &world.parents, Input::Tick)
            .is_empty()
    );

    let fx = state.step(&s, "web", 31, &world.parents, Input::Tick);
    assert_eq!(state.step, 1);
    assert_eq!(
        fx.iter().filter(|e| matches!(e, Effect::Moved(_))).count(),
        3,
        "⌈50·7/100⌉ = 4 in all: {fx:?}"
    );
    world.reconcile(&state);
    assert_eq!(world.on("b"), 4);
    state.step(&s, "web", 32, &world.parents, Input::Tick);
    state.step(&s, "web", 62, &world.parents, Input::Tick);
    world.reconcile(&state);
    assert_eq!(world.on("b"), 7);
    state.step(&s, "web", 63, &world.parents, Input::Tick);
    assert_eq!(state.phase, Phase::Complete);
    assert_eq!(state.live(), vec!["b"]);
}

#[test]
fn a_step_waits_until_its_parents_are_on_the_new_version() {
    let s = settings(&[(50, PAUSE)]);
    let world = World::new(4, "a");
    let mut state = State::start("a", "b", 0);
    state.step(&s, "web", 0, &world.parents, Input::Tick);
    // Nobody reconciled yet: no pause starts.
    state.step(&s, "web", 30, &world.parents, Input::Tick);
    assert_eq!(state.phase, Phase::Progressing);
    assert_eq!(state.moved.len(), 2);
}

#[test]
fn manual_holds_until_promote() {
    let s = settings(&[(25, Pause::Manual)]);
    let mut world = World::new(8, "a");
    let mut state = State::start("a", "b", 0);
    state.step(&s, "web", 0, &world.parents, Input::Tick);
    world.reconcile(&state);
    state.step(&s, "web", 1, &world.parents, Input::Tick);
    assert_eq!(state.phase, Phase::Paused);
    assert_eq!(state.resume_at(&s), None);
    state.step(&s, "web", 10_000, &world.parents, Input::Tick);
    assert_eq!(
        state.phase,
        Phase::Paused,
        "a manual pause never ends by itself"
    );
    assert_eq!(world.on("b"), 2);
    state.step(&s, "web", 10_001, &world.parents, Input::Promote);
    assert_eq!(state.moved.len(), 8);
    world.reconcile(&state);
    state.step(&s, "web", 10_002, &world.parents, Input::Tick);
    assert_eq!(state.phase, Phase::Complete);
}

#[test]
fn an_unhealthy_parent_past_the_timeout_rolls_everyone_back() {
    let s = settings(&[(50, PAUSE)]);
    let mut world = World::new(4, "a");
    let mut state = State::start("a", "b", 0);
    state.step(&s, "web", 0, &world.parents, Input::Tick);
    world.sick = state.moved.keys().take(1).cloned().collect();
    world.reconcile(&state);
    state.step(&s, "web", 59, &world.parents, Input::Tick);
    assert_eq!(state.phase, Phase::Progressing, "still within the timeout");
    let fx = state.step(&s, "web", 60, &world.parents, Input::Tick);
    assert!(
        matches!(&fx[0], Effect::Failed(_, why) if why.contains("within 1m")),
        "{fx:?}"
    );
    assert!(
        matches!(&fx[1], Effect::RolledBack(uids) if uids.len() == 2),
        "{fx:?}"
    );
    assert_eq!(state.phase, Phase::RolledBack);
    world.reconcile(&state);
    assert_eq!(world.on("a"), 4, "everyone back");
    assert_eq!(state.live(), vec!["a"]);
    assert!(
        state
            .step(&s, "web", 1000, &world.parents, Input::Promote)
            .is_empty()
    );
}

#[test]
fn a_failed_pass_on_the_new_version_is_a_failure_at_once() {
    let mut s = settings(&[(50, PAUSE)]);
    s.max_failed = MaxFailed::Count(1);
    let mut world = World::new(4, "a");
    let mut state = State::start("a", "b", 0);
    state.step(&s, "web", 0, &world.parents, Input::Tick);
    world.reconcile(&state);
    let bad = state.moved.keys().next().cloned().unwrap();
    for p in &mut world.parents {
        if p.uid == bad {
            p.health = Health::Failed("RenderError: boom".into());
        }
    }
    let fx = state.step(&s, "web", 1, &world.parents, Input::Tick);
    assert_eq!(
        fx[0],
        Effect::Failed(bad.clone(), "RenderError: boom".into())
    );
    assert_eq!(state.phase, Phase::Paused, "one failure is tolerated");
    assert_eq!(state.failed.len(), 1);
}

#[test]
fn halt_stops_until_promoted() {
    let mut s = settings(&[(50, PAUSE)]);
    s.on_failure = OnFailure::Halt;
    let mut world = World::new(4, "a");
    let mut state = State::start("a", "b", 0);
    state.step(&s, "web", 0, &world.parents, Input::Tick);
    world.sick = state.moved.keys().cloned().collect();
    world.reconcile(&state);
    let fx = state.step(&s, "web", 60, &world.parents, Input::Tick);
    assert!(fx.contains(&Effect::Halted), "{fx:?}");
    assert_eq!(state.phase, Phase::Halted);
    state.step(&s, "web", 61, &world.parents, Input::Tick);
    world.reconcile(&state);
    assert_eq!(world.on("b"), 2, "parents stay where they are");
    world.sick.clear();
    world.reconcile(&state);
    state.step(&s, "web", 62, &world.parents, Input::Promote);
    assert_eq!(
        state.phase,
        Phase::Paused,
        "resumed, and the step is reached"
    );
}

#[test]
fn abort_returns_everyone() {
    let s = settings(&[(50, Pause::Manual)]);
    let mut world = World::new(4, "a");
    let mut state = State::start("a", "b", 0);
    state.step(&s, "web", 0, &world.parents, Input::Tick);
    world.reconcile(&state);
    let fx = state.step(&s, "web", 1, &world.parents, Input::Abort);
    assert!(
        matches!(&fx[..], [Effect::RolledBack(u)] if u.len() == 2),
        "{fx:?}"
    );
    world.reconcile(&state);
    assert_eq!(world.on("a"), 4);
}

#[test]
fn an_edit_mid_rollout_restarts_toward_the_newest() {
    let s = settings(&[(50, Pause::Manual)]);
    let mut world = World::new(4, "a");
    let mut state = State::start("a", "b", 0);
    state.step(&s, "web", 0, &world.parents, Input::Tick);
    world.reconcile(&state);
    let on_b: BTreeSet<String> = state.moved.keys().cloned().collect();

    let mut next = state.retarget("c", 5);
    assert_eq!((next.from.as_str(), next.to.as_str()), ("a", "c"));
    assert_eq!(next.between.as_deref(), Some("b"));
    assert_eq!(next.step, 0);
    assert_eq!(next.live(), vec!["c", "a", "b"]);
    // Nobody moves by the edit itself: those on b stay until their turn.
    world.reconcile(&next);
    assert_eq!(world.on("b"), 2);
    next.step(&s, "web", 6, &world.parents, Input::Tick);
    world.reconcile(&next);
    assert_eq!(world.on("c"), 2);
    // The same order: the parents on b were the first 2, so they move on.
    assert!(
        world
            .parents
            .iter()
            .filter(|p| on_b.contains(&p.uid))
            .all(|p| p.on.as_deref() == Some("c"))
    );

    // A third edit: the in-between version is no longer live.
    let third = next.retarget("d", 7);
    assert_eq!(third.between.as_deref(), Some("c"));
    assert_eq!(third.live(), vec!["d", "a", "c"]);
}

#[test]
fn a_retarget_after_completion_starts_from_the_completed_version() {
    let mut state = State::start("a", "b", 0);
    state.phase = Phase::Complete;
    let next = state.retarget("c", 1);
    assert_eq!(
        (next.from.as_str(), next.to.as_str(), next.between.as_ref()),
        ("b", "c", None)
    );
    let mut rolled = State::start("a", "b", 0);
    rolled.phase = Phase::RolledBack;
    let next = rolled.retarget("c", 1);
    assert_eq!((next.from.as_str(), next.to.as_str()), ("a", "c"));
}

#[test]
fn a_parent_created_mid_rollout_takes_its_place() {
    let s = settings(&[(50, Pause::Manual)]);
    let mut world = World::new(4, "a");
    let mut state = State::start("a", "b", 0);
    state.step(&s, "web", 0, &world.parents, Input::Tick);
    world.reconcile(&state);
    state.step(&s, "web", 1, &world.parents, Input::Tick);
    // Two new parents: ⌈50·6/100⌉ = 3 are due once promoted or ticked.
    for uid in ["n1", "n2"] {
        world.parents.push(ParentView {
            uid: uid.into(),
            canary: false,
            on: None,
            health: Health::NotYet,
        });
    }
    assert_eq!(
        state.desired("n1", None),
        "a",
        "new parents start on the old version"
    );
    assert_eq!(state.phase, Phase::Paused);
    // Even during a manual pause: at 50% of 6, 3 are on the new version.
    state.step(&s, "web", 2, &world.parents, Input::Tick);
    assert_eq!(state.phase, Phase::Paused);
    assert_eq!(state.total, 6);
    // The first three of the order are on it; a parent moved before keeps
    // the new version even when a newcomer took its place in the order.
    let keyed: Vec<(String, bool)> = world
        .parents
        .iter()
        .map(|p| (p.uid.clone(), false))
        .collect();
    let first: Vec<String> = crate::rollout::order("web", &keyed)
        .into_iter()
        .take(3)
        .collect();
    assert!(
        first.iter().all(|u| state.moved.contains_key(u)),
        "{first:?} {:?}",
        state.moved
    );
    assert!((3..=4).contains(&state.moved.len()));
}

#[test]
fn a_restart_that_reads_the_state_back_moves_nobody() {
    let s = settings(&[(50, PAUSE)]);
    let mut world = World::new(6, "a");
    let mut state = State::start("a", "b", 0);
    state.step(&s, "web", 0, &world.parents, Input::Tick);
    world.reconcile(&state);
    let text = serde_json::to_string(&state).unwrap();
    let mut back: State = serde_json::from_str(&text).unwrap();
    assert_eq!(back, state);
    let before: Vec<Option<String>> = world.parents.iter().map(|p| p.on.clone()).collect();
    world.reconcile(&back);
    let after: Vec<Option<String>> = world.parents.iter().map(|p| p.on.clone()).collect();
    assert_eq!(before, after);
    let fx = back.step(&s, "web", 1, &world.parents, Input::Tick);
    assert!(!fx.iter().any(|e| matches!(e, Effect::Moved(_))), "{fx:?}");
}

#[test]
fn canaries_move_first() {
    let s = settings(&[(10, Pause::Manual)]);
    let mut world = World::new(20, "a");
    world.parents[13].canary = true;
    world.parents[17].canary = true;
    let mut state = State::start("a", "b", 0);
    state.step(&s, "web", 0, &world.parents, Input::Tick);
    let moved: Vec<&str> = state.moved.keys().map(String::as_str).collect();
    assert_eq!(moved, vec!["u13", "u17"]);
}
