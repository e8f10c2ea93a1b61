//! Where a child lives: the hub (the parent's own cluster) or a spoke, a
//! cluster registered with the operator by a Secret. A child's `cluster:`
//! expression names it per parent; this module says what a name may be and
//! whether a pass may touch that cluster now.
//!
//! It knows names and states only: the operator decides reachability (its
//! probes and watches) and hands the planner a [`Clusters`]; offline
//! commands hand it [`Clusters::offline`], where every name is reachable.

use std::collections::BTreeMap;

/// The name that means the hub itself in a `cluster:` expression.
pub const LOCAL: &str = "local";
/// `--cluster-name` when none is given.
pub const DEFAULT_HUB: &str = "hub";

/// The `Synced`/`Ready` reason of a child held back by a spoke that does
/// not answer (or whose objects are not listed yet).
pub const UNREACHABLE: &str = "ClusterUnreachable";
/// The reason of a child placed in a cluster no Secret registers.
pub const UNKNOWN: &str = "ClusterUnknown";

/// What a pass knows of the spokes it may place children in.
#[derive(Debug, Clone)]
pub struct Clusters {
    /// This hub's `--cluster-name`: the `trellis.dev/hub` label of its
    /// spoke children.
    pub hub: String,
    /// Registered spokes by name; `None` (offline): every name counts as a
    /// reachable spoke.
    pub spokes: Option<BTreeMap<String, Reach>>,
    /// Why a name not in `spokes` cannot be read, when its registration
    /// itself could not be (the CLI could not read the cluster Secrets):
    /// it is then unreachable, not unknown.
    pub unread: Option<String>,
}

/// Whether a registered spoke may be read and written now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// It answers and its objects are listed.
    Ready,
    /// It does not answer, or its objects are not listed yet: why.
    Unreachable(String),
}

/// Why a child in some cluster is held back: a reason and a message
/// naming the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub reason: &'static str,
    pub message: String,
}

impl Clusters {
    /// For offline commands: hub `hub`, every spoke name reachable.
    pub fn offline() -> Clusters {
        Clusters {
            hub: DEFAULT_HUB.to_owned(),
            spokes: None,
            unread: None,
        }
    }

    /// Why nothing may be done in `cluster` now (`None`: the hub, or a
    /// spoke that is ready).
    pub fn hold(&self, cluster: Option<&str>) -> Option<Held> {
        let name = cluster?;
        let spokes = self.spokes.as_ref()?;
        match spokes.get(name) {
            Some(Reach::Ready) => None,
            Some(Reach::Unreachable(why)) => Some(Held {
                reason: UNREACHABLE,
                message: format!("cluster \"{name}\" is unreachable: {why}"),
            }),
            None if self.unread.is_some() => Some(Held {
                reason: UNREACHABLE,
                message: format!(
                    "cluster \"{name}\" cannot be read: {}",
                    self.unread.as_deref().unwrap_or_default()
                ),
            }),
            None => Some(Held {
                reason: UNKNOWN,
                message: format!(
                    "cluster \"{name}\" is not registered (no Secret labelled trellis.dev/cluster: {name} in the operator's namespace)"
                ),
            }),
        }
    }
}

/// A `cluster:` expression's value as a placement: `None` for the hub
/// (empty-handed `local`), the spoke's name otherwise. A name is a label
/// value trellis writes and selects by: a DNS-1123 label.
pub fn placement(value: &str) -> Result<Option<String>, String> {
    if value == LOCAL {
        return Ok(None);
    }
    check_name(value)?;
    Ok(Some(value.to_owned()))
}

/// Whether `name` may name a cluster (a spoke's Secret label, a
/// `--cluster-name`, a `cluster:` value): a DNS-1123 label.
pub fn check_name(name: &str) -> Result<(), String> {
    crate::rules::names::check_cluster_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_is_the_hub_and_names_are_labels() {
        assert_eq!(placement("local"), Ok(None));
        assert_eq!(placement("eu-prod-1"), Ok(Some("eu-prod-1".into())));
        assert!(placement("").unwrap_err().contains("not a cluster name"));
        assert!(placement("EU_1").is_err());
        assert!(placement(&"a".repeat(64)).is_err());
    }

    #[test]
    fn holds_back_unknown_and_unreachable_spokes_only() {
        let clusters = Clusters {
            unread: None,
            hub: "hub".into(),
            spokes: Some(BTreeMap::from([
                ("up".to_owned(), Reach::Ready),
                (
                    "down".to_owned(),
                    Reach::Unreachable("connection refused".into()),
                ),
            ])),
        };
        assert_eq!(clusters.hold(None), None);
        assert_eq!(clusters.hold(Some("up")), None);
        let down = clusters.hold(Some("down")).unwrap();
        assert_eq!(down.reason, UNREACHABLE);
        assert!(down.message.contains("\"down\"") && down.message.contains("refused"));
        let unknown = clusters.hold(Some("elsewhere")).unwrap();
        assert_eq!(unknown.reason, UNKNOWN);
        assert!(unknown.message.contains("\"elsewhere\""));
        assert_eq!(Clusters::offline().hold(Some("anything")), None);
    }
}
