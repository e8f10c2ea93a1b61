//! The rollout state machine, stepped by [`State::step`].
//!
//! ```text
//!             ┌──── step reached, timed pause ───▶ Paused ── pause over / promote ──┐
//!  start ─▶ Progressing ◀──────────────────────── (next step) ◀──────────────────────┘
//!             │  last step reached ─▶ Complete
//!             │  too many failures ─▶ RolledBack (onFailure: rollback) | Halted (halt)
//!             │  abort ─────────────▶ RolledBack          Halted ── promote ─▶ Progressing
//! ```
//!
//! The state is plain data kept in the cluster; the caller hands in the
//! parents it sees (uid, canary, the revision each is on, its health) and
//! the time, and carries out the [`Effect`]s (Events, logs, writes of the
//! state). A parent is moved by being named in `moved`; which version
//! renders it is [`State::desired`].

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::order::{order, step_count};
use super::{Pause, Settings};
use crate::rules::model::OnFailure;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    Progressing,
    Paused,
    Halted,
    RolledBack,
    Complete,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Progressing => "Progressing",
            Phase::Paused => "Paused",
            Phase::Halted => "Halted",
            Phase::RolledBack => "RolledBack",
            Phase::Complete => "Complete",
        }
    }

    pub const ALL: [Phase; 5] = [
        Phase::Progressing,
        Phase::Paused,
        Phase::Halted,
        Phase::RolledBack,
        Phase::Complete,
    ];

    /// Nothing moves any more until the rule's text changes.
    pub fn is_final(self) -> bool {
        matches!(self, Phase::RolledBack | Phase::Complete)
    }
}

/// One rollout of a rule from one version to another (times: Unix seconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    pub from: String,
    pub to: String,
    /// The target of a rollout an edit replaced: parents already on it stay
    /// there until their turn (at most three versions live).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub between: Option<String>,
    /// Index into the settings' steps.
    pub step: usize,
    pub phase: Phase,
    /// When the current step or phase began.
    pub since: u64,
    /// When every parent of the current step was on the new version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reached_at: Option<u64>,
    /// Parents moved to `to`, with when.
    #[serde(default)]
    pub moved: BTreeMap<String, u64>,
    /// Moved parents that failed on `to`.
    #[serde(default)]
    pub failed: BTreeSet<String>,
    /// Parents of the rule at the last tick.
    #[serde(default)]
    pub total: usize,
}

/// What the caller sees of a parent.
#[derive(Debug, Clone, PartialEq)]
pub struct ParentView {
    pub uid: String,
    pub canary: bool,
    /// The revision it is on (its status, else its children's label).
    pub on: Option<String>,
    pub health: Health,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Health {
    /// The health condition is True at the parent's current generation.
    Healthy,
    NotYet,
    /// Its pass failed (`RenderError`, `ApplyError`, ...): the message.
    Failed(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// Look at the parents and the time.
    Tick,
    /// `trellis rollout promote`: end a pause, resume a halted rollout.
    Promote,
    /// `trellis rollout abort`: everyone back, the new version failed.
    Abort,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// The parent is due on the new version.
    Moved(String),
    /// A moved parent failed on the new version: why.
    Failed(String, String),
    /// Every moved parent goes back to `from`.
    RolledBack(Vec<String>),
    Halted,
    /// Step (index) begun.
    Step(usize),
    Paused,
    Complete,
}

impl State {
    /// A rollout from `from` to `to`, at its first step.
    pub fn start(from: &str, to: &str, now: u64) -> State {
        State {
            from: from.to_owned(),
            to: to.to_owned(),
            between: None,
            step: 0,
            phase: if from == to {
                Phase::Complete
            } else {
                Phase::Progressing
            },
            since: now,
            reached_at: None,
            moved: BTreeMap::new(),
            failed: BTreeSet::new(),
            total: 0,
        }
    }

    /// An edit during this rollout: `to` becomes the target, from the first
    /// step. Parents already on this rollout's target keep it until their
    /// turn; those on an older in-between version go back to `from`, so at
    /// most three versions are live.
    pub fn retarget(&self, to: &str, now: u64) -> State {
        match self.phase {
            Phase::Complete => State::start(&self.to, to, now),
            Phase::RolledBack => State::start(&self.from, to, now),
            _ => {
                let mut next = State::start(&self.from, to, now);
                if self.to != self.from && self.to != to && !self.moved.is_empty() {
                    next.between = Some(self.to.clone());
                }
                next
            }
        }
    }

    /// Versions parents may be on now: `from`, `to`, `between`.
    pub fn live(&self) -> Vec<&str> {
        match self.phase {
            Phase::Complete => vec![&self.to],
            Phase::RolledBack => vec![&self.from],
            _ => {
                let mut out = vec![self.to.as_str(), self.from.as_str()];
                if let Some(b) = &self.between {
                    out.push(b);
                }
                out.dedup();
                out
            }
        }
    }

    /// The revision the parent `uid`, on `on`, is due to run.
    pub fn desired<'a>(&'a self, uid: &str, on: Option<&str>) -> &'a str {
        match self.phase {
            Phase::RolledBack => &self.from,
            Phase::Complete => &self.to,
            _ if self.moved.contains_key(uid) || on == Some(self.to.as_str()) => &self.to,
            _ => match (&self.between, on) {
                (Some(b), Some(on)) if b == on => b,
                _ => &self.from,
            },
        }
    }

    /// When a timed pause ends, if the rollout is in one.
    pub fn resume_at(&self, settings: &Settings) -> Option<u64> {
        match (self.phase, settings.steps.get(self.step).map(|s| s.pause)) {
            (Phase::Paused, Some(Pause::For(d))) => {
                Some(self.reached_at.unwrap_or(self.since) + d.as_secs())
            }
            _ => None,
        }
    }

    /// One step of the machine for `rule` at `now` with the parents seen.
    pub fn step(
        &mut self,
        settings: &Settings,
        rule: &str,
        now: u64,
        parents: &[ParentView],
        input: Input,
    ) -> Vec<Effect> {
        let mut effects = Vec::new();
        if self.phase.is_final() {
            return effects;
        }
        self.total = parents.len();
        match input {
            Input::Abort => {
                self.roll_back(now, &mut effects);
                return effects;
            }
            Input::Promote => match self.phase {
                Phase::Paused => self.advance(settings, now, &mut effects),
                Phase::Halted => {
                    // Another chance: the failed parents get a fresh timeout.
                    for uid in std::mem::take(&mut self.failed) {
                        self.moved.insert(uid, now);
                    }
                    self.phase = Phase::Progressing;
                    self.since = now;
                }
                _ => {}
            },
            Input::Tick => {}
        }
        self.count_failures(settings, now, parents, &mut effects);
        if settings
            .max_failed
            .exceeded(self.failed.len(), self.moved.len())
        {
            match settings.on_failure {
                OnFailure::Rollback => self.roll_back(now, &mut effects),
                OnFailure::Halt if self.phase != Phase::Halted => {
                    self.phase = Phase::Halted;
                    self.since = now;
                    effects.push(Effect::Halted);
                }
                OnFailure::Halt => {}
            }
            return effects;
        }
        // Each pass of the loop is one step; a step without a pause whose
        // parents are all there already lets the next one begin at once.
        for _ in 0..=settings.steps.len() {
            match self.phase {
                Phase::Paused => {
                    // Parents created during the pause take their place.
                    if let Some(step) = settings.steps.get(self.step) {
                        self.top_up(step.percent, rule, now, parents, &mut effects);
                    }
                    match self.resume_at(settings) {
                        Some(at) if now >= at => self.advance(settings, now, &mut effects),
                        _ => return effects,
                    }
                    continue;
                }
                Phase::Progressing => {}
                _ => return effects,
            }
            let Some(step) = settings.steps.get(self.step) else {
                self.phase = Phase::Complete;
                return effects;
            };
            self.top_up(step.percent, rule, now, parents, &mut effects);
            if !self.reached(parents) {
                return effects;
            }
            self.reached_at = Some(now);
            match step.pause {
                Pause::None => self.advance(settings, now, &mut effects),
                Pause::For(_) | Pause::Manual => {
                    self.phase = Phase::Paused;
                    effects.push(Effect::Paused);
                    if step.pause == Pause::Manual {
                        return effects;
                    }
                }
            }
        }
        effects
    }

    /// Moves the first ⌈percent·N/100⌉ parents of the order that are not
    /// moved yet (N: the parents now, so newcomers take their place).
    fn top_up(
        &mut self,
        percent: u32,
        rule: &str,
        now: u64,
        parents: &[ParentView],
        effects: &mut Vec<Effect>,
    ) {
        let keyed: Vec<(String, bool)> =
            parents.iter().map(|p| (p.uid.clone(), p.canary)).collect();
        let due = step_count(percent, parents.len());
        for uid in order(rule, &keyed).into_iter().take(due) {
            if !self.moved.contains_key(&uid) {
                self.moved.insert(uid.clone(), now);
                effects.push(Effect::Moved(uid));
            }
        }
    }

    /// Every moved parent the caller sees is on `to` and healthy (or has
    /// failed, within what is tolerated).
    fn reached(&self, parents: &[ParentView]) -> bool {
        parents
            .iter()
            .filter(|p| self.moved.contains_key(&p.uid))
            .all(|p| {
                self.failed.contains(&p.uid)
                    || (p.on.as_deref() == Some(&self.to) && p.health == Health::Healthy)
            })
    }

    fn count_failures(
        &mut self,
        settings: &Settings,
        now: u64,
        parents: &[ParentView],
        effects: &mut Vec<Effect>,
    ) {
        for p in parents {
            let Some(&moved_at) = self.moved.get(&p.uid) else {
                continue;
            };
            if self.failed.contains(&p.uid) {
                continue;
            }
            let on_new = p.on.as_deref() == Some(&self.to);
            let why = match &p.health {
                Health::Failed(why) if on_new => Some(why.clone()),
                Health::Healthy if on_new => None,
                _ if now.saturating_sub(moved_at) >= settings.timeout.as_secs() => Some(format!(
                    "not healthy ({}) within {}",
                    settings.condition,
                    humantime::format_duration(settings.timeout)
                )),
                _ => None,
            };
            if let Some(why) = why {
                self.failed.insert(p.uid.clone());
                effects.push(Effect::Failed(p.uid.clone(), why));
            }
        }
    }

    fn advance(&mut self, settings: &Settings, now: u64, effects: &mut Vec<Effect>) {
        self.since = now;
        self.reached_at = None;
        if self.step + 1 < settings.steps.len() {
            self.step += 1;
            self.phase = Phase::Progressing;
            effects.push(Effect::Step(self.step));
        } else {
            self.phase = Phase::Complete;
            effects.push(Effect::Complete);
        }
    }

    fn roll_back(&mut self, now: u64, effects: &mut Vec<Effect>) {
        self.phase = Phase::RolledBack;
        self.since = now;
        effects.push(Effect::RolledBack(self.moved.keys().cloned().collect()));
    }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
