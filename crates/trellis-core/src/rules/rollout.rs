//! A rule's `rollout:` block, checked and with its defaults filled in
//! ([`Settings`]): what the compiler reports on (`spec.rollout.<field>`) and
//! what the rollout machine (`crate::rollout`) runs with. The machine itself
//! lives above the rule format; the settings are part of it.

use std::time::Duration;

use super::model::{LabelSelector, MaxFailedSpec, OnFailure, RolloutSpec};

/// One step: the share of parents on the new version, and the hold after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub percent: u32,
    pub pause: Pause,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    None,
    For(Duration),
    /// Until `trellis rollout promote`.
    Manual,
}

/// Failures tolerated before `onFailure` applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxFailed {
    Count(u32),
    /// Percent of the parents moved so far.
    Percent(u32),
}

impl MaxFailed {
    /// Whether `failed` failures among `moved` moved parents exceed it.
    pub fn exceeded(self, failed: usize, moved: usize) -> bool {
        let allowed = match self {
            MaxFailed::Count(n) => n as usize,
            MaxFailed::Percent(p) => moved * p as usize / 100,
        };
        failed > allowed
    }
}

/// A rule's `rollout:` block, checked and with its defaults filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Ends with a step of 100 percent (implied when not written).
    pub steps: Vec<Step>,
    pub canary: Option<LabelSelector>,
    pub condition: String,
    pub timeout: Duration,
    pub max_failed: MaxFailed,
    pub on_failure: OnFailure,
}

/// Default `health.timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

impl Settings {
    /// Checks `spec`; each error is (field under `spec.rollout`, message).
    pub fn compile(spec: &RolloutSpec) -> Result<Settings, Vec<(String, String)>> {
        let mut errors = Vec::new();
        let mut steps = Vec::new();
        let mut last = 0;
        for (i, step) in spec.steps.iter().enumerate() {
            let at = format!("steps[{i}]");
            if !(1..=100).contains(&step.percent) {
                errors.push((format!("{at}.percent"), "must be 1..100".to_owned()));
            } else if step.percent <= last {
                errors.push((
                    format!("{at}.percent"),
                    format!("must be more than the step before ({last})"),
                ));
            }
            last = last.max(step.percent);
            let pause = match step.pause.as_deref() {
                None => Pause::None,
                Some("manual") => Pause::Manual,
                Some(text) => match humantime::parse_duration(text) {
                    Ok(d) => Pause::For(d),
                    Err(err) => {
                        errors.push((
                            format!("{at}.pause"),
                            format!("`{text}` is neither `manual` nor a duration like 1m: {err}"),
                        ));
                        Pause::None
                    }
                },
            };
            steps.push(Step {
                percent: step.percent,
                pause,
            });
        }
        if steps.last().is_none_or(|s| s.percent != 100) {
            steps.push(Step {
                percent: 100,
                pause: Pause::None,
            });
        }
        let health = spec.health.clone().unwrap_or_default();
        let condition = health.condition.unwrap_or_else(|| "Ready".to_owned());
        if condition.is_empty() {
            errors.push(("health.condition".into(), "must not be empty".into()));
        }
        let timeout = match health.timeout.as_deref() {
            None => DEFAULT_TIMEOUT,
            Some(text) => match humantime::parse_duration(text) {
                Ok(d) if d >= Duration::from_secs(1) => d,
                Ok(_) => {
                    errors.push(("health.timeout".into(), "must be at least 1s".into()));
                    DEFAULT_TIMEOUT
                }
                Err(err) => {
                    errors.push((
                        "health.timeout".into(),
                        format!("`{text}` is not a duration like 5m: {err}"),
                    ));
                    DEFAULT_TIMEOUT
                }
            },
        };
        let max_failed = match &health.max_failed {
            None => MaxFailed::Count(0),
            Some(MaxFailedSpec::Count(n)) => MaxFailed::Count(*n),
            Some(MaxFailedSpec::Percent(text)) => match text
                .strip_suffix('%')
                .and_then(|n| n.trim().parse::<u32>().ok())
                .filter(|n| *n <= 100)
            {
                Some(p) => MaxFailed::Percent(p),
                None => {
                    errors.push((
                        "health.maxFailed".into(),
                        format!("`{text}` is neither a count nor a percentage like \"10%\""),
                    ));
                    MaxFailed::Count(0)
                }
            },
        };
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Settings {
            steps,
            canary: spec.canary.clone(),
            condition,
            timeout,
            max_failed,
            on_failure: spec.on_failure,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::model::{RolloutHealth, RolloutStep};

    fn spec(steps: &[(u32, Option<&str>)]) -> RolloutSpec {
        RolloutSpec {
            steps: steps
                .iter()
                .map(|(p, pause)| RolloutStep {
                    percent: *p,
                    pause: pause.map(str::to_owned),
                })
                .collect(),
            canary: None,
            health: None,
            on_failure: OnFailure::Rollback,
        }
    }

    #[test]
    fn a_last_step_of_100_is_implied() {
        let s = Settings::compile(&spec(&[(10, Some("1m")), (50, Some("manual"))])).unwrap();
        assert_eq!(
            s.steps,
            vec![
                Step {
                    percent: 10,
                    pause: Pause::For(Duration::from_secs(60))
                },
                Step {
                    percent: 50,
                    pause: Pause::Manual
                },
                Step {
                    percent: 100,
                    pause: Pause::None
                },
            ]
        );
        assert_eq!(s.condition, "Ready");
        assert_eq!(s.timeout, DEFAULT_TIMEOUT);
        assert_eq!(s.max_failed, MaxFailed::Count(0));
        let s = Settings::compile(&spec(&[(100, None)])).unwrap();
        assert_eq!(s.steps.len(), 1);
    }

    #[test]
    fn steps_must_grow_and_pauses_must_read() {
        let errors = Settings::compile(&spec(&[(50, None), (20, Some("soon"))])).unwrap_err();
        let fields: Vec<&str> = errors.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(fields, vec!["steps[1].percent", "steps[1].pause"]);
    }

    #[test]
    fn max_failed_is_a_count_or_a_percentage() {
        let mut s = spec(&[]);
        s.health = Some(RolloutHealth {
            max_failed: Some(MaxFailedSpec::Percent("10%".into())),
            ..Default::default()
        });
        assert_eq!(
            Settings::compile(&s).unwrap().max_failed,
            MaxFailed::Percent(10)
        );
        s.health = Some(RolloutHealth {
            max_failed: Some(MaxFailedSpec::Percent("ten".into())),
            ..Default::default()
        });
        assert!(Settings::compile(&s).is_err());
    }

    #[test]
    fn failures_count_against_a_count_or_a_share_of_the_moved() {
        assert!(!MaxFailed::Count(0).exceeded(0, 10));
        assert!(MaxFailed::Count(0).exceeded(1, 10));
        assert!(!MaxFailed::Count(2).exceeded(2, 10));
        assert!(MaxFailed::Count(2).exceeded(3, 10));
        // 10% of 25 moved: 2 tolerated (rounded down).
        assert!(!MaxFailed::Percent(10).exceeded(2, 25));
        assert!(MaxFailed::Percent(10).exceeded(3, 25));
        // 10% of 5 moved: none tolerated.
        assert!(MaxFailed::Percent(10).exceeded(1, 5));
    }
}
