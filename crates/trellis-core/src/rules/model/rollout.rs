//! `spec.rollout`: how a new version of a rule reaches its parents, as
//! written. `crate::rules::rollout` checks it and fills in the defaults.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::LabelSelector;

/// How a new version of the rule reaches its parents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RolloutSpec {
    /// Share of the rule's parents on the new version, step by step; a last
    /// step of 100 is implied.
    #[serde(default)]
    pub steps: Vec<RolloutStep>,
    /// Parents matching this selector move first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<RolloutHealth>,
    /// `rollback` (default): every parent back to the previous version; `halt`:
    /// stop where it is until `trellis rollout promote` or `abort`.
    #[serde(default)]
    pub on_failure: OnFailure,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RolloutStep {
    /// 1..100: at this step, the first ceil(percent * N / 100) parents of the
    /// rollout order are on the new version.
    #[schemars(range(min = 1, max = 100))]
    pub percent: u32,
    /// How long to hold once the step's parents are on the new version
    /// (`1m`, `30s`), or `manual`: until `trellis rollout promote`. Default: no pause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RolloutHealth {
    /// The parent condition that must be True at the parent's current
    /// generation (default `Ready`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
    /// A moved parent not healthy this long after moving has failed (default `5m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Failures tolerated: a count, or a share of the moved parents like
    /// `"10%"` (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_failed: Option<MaxFailedSpec>,
}

/// `maxFailed`: a count or a percentage string.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum MaxFailedSpec {
    Count(u32),
    Percent(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OnFailure {
    /// Every parent back to the previous version; the new one marked failed.
    #[default]
    Rollback,
    /// Parents stay where they are until promoted or aborted.
    Halt,
}
