//! What one pass tells on its parent: at most one Event, a summary of the
//! children it created, updated and deleted, and the parent's Ready
//! transition if it had one. Never one Event per child: at a thousand
//! parents that is thousands of writes nobody reads. Failures are reported
//! on their own (Warnings, deduplicated by the backoff).

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::debug;

/// Publishes Events through kube's `Recorder`, which keeps every Event it
/// published for 6 minutes (to patch a repeat into a series) and scans all
/// of them on each publish: at 10,000 parents, two Events each, that is
/// 20,000 cached Events (megabytes) and an O(N) scan per write. A fresh
/// recorder after every [`ROTATE`] publishes bounds both; a repeat across a
/// rotation is written as a new Event instead of a patch of the old one.
///
/// A pass does not wait for its Event: [`Publisher::enqueue`] hands it to a
/// few background senders, so the Event (one request in five of a pass
/// that creates three children) is off the critical path of convergence.
/// The queue is bounded: when it is full the pass waits, so a flood of
/// Events slows passes down instead of growing memory.
pub struct Publisher {
    queue: mpsc::Sender<Queued>,
}

struct Rotating {
    client: Client,
    reporter: Reporter,
    current: Mutex<(Recorder, usize)>,
}

/// An Event waiting to be sent, and whether it may still be sent then
/// (the replica may have lost the Lease or the parent's bucket meanwhile).
struct Queued {
    event: Event,
    reference: ObjectReference,
    allowed: Box<dyn Fn() -> bool + Send>,
}

/// Publishes per recorder.
const ROTATE: usize = 256;
/// Events waiting to be sent before a pass has to wait.
const QUEUE: usize = 512;
/// Events in flight at once.
const SENDERS: usize = 8;

impl Publisher {
    /// Starts the background senders (needs a Tokio runtime).
    pub fn new(client: Client, reporter: Reporter) -> Publisher {
        let recorder = Recorder::new(client.clone(), reporter.clone());
        let inner = Arc::new(Rotating {
            client,
            reporter,
            current: Mutex::new((recorder, 0)),
        });
        let (queue, rx) = mpsc::channel::<Queued>(QUEUE);
        let sender = inner;
        let queued = futures::stream::unfold(rx, |mut rx| async move {
            let next = rx.recv().await?;
            Some((next, rx))
        });
        tokio::spawn(queued.for_each_concurrent(SENDERS, move |q| {
            let sender = sender.clone();
            async move {
                if !(q.allowed)() {
                    return;
                }
                if let Err(err) = sender.publish(&q.event, &q.reference).await {
                    debug!("cannot publish event: {err}");
                }
            }
        }));
        Publisher { queue }
    }

    /// Sends the Event in the background, if `allowed` still says so then.
    pub async fn enqueue(
        &self,
        event: Event,
        reference: ObjectReference,
        allowed: impl Fn() -> bool + Send + 'static,
    ) {
        let queued = Queued {
            event,
            reference,
            allowed: Box::new(allowed),
        };
        if self.queue.send(queued).await.is_err() {
            debug!("the event senders have stopped; event dropped");
        }
    }
}

impl Rotating {
    async fn publish(&self, event: &Event, reference: &ObjectReference) -> Result<(), kube::Error> {
        let recorder = {
            let mut current = crate::operator::lock(&self.current);
            if current.1 >= ROTATE {
                *current = (Recorder::new(self.client.clone(), self.reporter.clone()), 0);
            }
            current.1 += 1;
            current.0.clone()
        };
        recorder.publish(event, reference).await
    }
}

/// Most objects named in one Event; the rest are counted.
const NAMED: usize = 10;

/// How the parent's `Ready` condition moved in this pass.
#[derive(Debug, Clone, PartialEq)]
pub enum ReadyChange {
    Became,
    /// It was True; the message says why it is not any more.
    Lost(String),
}

/// The children a pass wrote, as `Kind ns/name`.
#[derive(Debug, Default)]
pub struct Summary {
    pub created: Vec<String>,
    pub updated: Vec<String>,
    pub deleted: Vec<String>,
    pub ready: Option<ReadyChange>,
}

impl Summary {
    /// The Event to write, if the pass is worth one: it created or deleted
    /// a child, or the parent's readiness changed. An update alone (a
    /// drift repaired, a rule edit rolled out) is in the logs and metrics.
    pub fn event(&self) -> Option<(EventType, &'static str, String)> {
        let mut parts = Vec::new();
        for (verb, keys) in [
            ("created", &self.created),
            ("updated", &self.updated),
            ("deleted", &self.deleted),
        ] {
            if !keys.is_empty() {
                parts.push(format!("{verb} {}", list(keys)));
            }
        }
        match &self.ready {
            Some(ReadyChange::Became) => parts.push("Ready".to_owned()),
            Some(ReadyChange::Lost(why)) if why.is_empty() => parts.push("no longer Ready".into()),
            Some(ReadyChange::Lost(why)) => parts.push(format!("no longer Ready: {why}")),
            None => {}
        }
        let (type_, reason) = if !self.created.is_empty() {
            (EventType::Normal, "Created")
        } else if !self.deleted.is_empty() {
            (EventType::Normal, "Deleted")
        } else {
            match self.ready {
                Some(ReadyChange::Became) => (EventType::Normal, "Ready"),
                Some(ReadyChange::Lost(_)) => (EventType::Warning, "NotReady"),
                None => return None,
            }
        };
        Some((type_, reason, parts.join("; ")))
    }
}

/// `3 children: ConfigMap a/x, Service a/y, Deployment.apps a/z`.
fn list(keys: &[String]) -> String {
    let noun = if keys.len() == 1 { "child" } else { "children" };
    let mut named = keys
        .iter()
        .take(NAMED)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if keys.len() > NAMED {
        named.push_str(&format!(" and {} more", keys.len() - NAMED));
    }
    format!("{} {noun}: {named}", keys.len())
}

/// The `Ready` transition from the parent's current status to `new`:
/// turning True, or leaving True. A parent seen for the first time and not
/// ready yet has no transition (it was never Ready).
pub fn ready_change(parent: &Value, new: Option<&Value>) -> Option<ReadyChange> {
    let ready = |status: Option<&Value>| {
        status?
            .get("conditions")?
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Ready")
            .cloned()
    };
    let before_true = ready(parent.get("status")).is_some_and(|c| c["status"] == "True");
    let after = ready(new);
    let after_true = after.as_ref().is_some_and(|c| c["status"] == "True");
    match (before_true, after_true) {
        (false, true) => Some(ReadyChange::Became),
        (true, false) => Some(ReadyChange::Lost(
            after
                .as_ref()
                .and_then(|c| c.get("message"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status(ready: &str) -> Value {
        json!({"conditions": [{"type": "Ready", "status": ready, "message": "Deployment a/web not ready"}]})
    }

    #[test]
    fn a_pass_that_creates_children_is_one_event_naming_them_all() {
        let summary = Summary {
            created: vec![
                "ConfigMap a/x".into(),
                "Service a/y".into(),
                "Deployment.apps a/z".into(),
            ],
            ready: Some(ReadyChange::Became),
            ..Summary::default()
        };
        let (type_, reason, note) = summary.event().expect("an event");
        assert_eq!((type_, reason), (EventType::Normal, "Created"));
        assert_eq!(
            note,
            "created 3 children: ConfigMap a/x, Service a/y, Deployment.apps a/z; Ready"
        );
    }

    #[test]
    fn many_children_are_counted_past_the_first_ten() {
        let summary = Summary {
            deleted: (0..12).map(|i| format!("ConfigMap a/c{i}")).collect(),
            ..Summary::default()
        };
        let (_, reason, note) = summary.event().expect("an event");
        assert_eq!(reason, "Deleted");
        assert!(
            note.starts_with("deleted 12 children: ConfigMap a/c0,"),
            "{note}"
        );
        assert!(note.ends_with("ConfigMap a/c9 and 2 more"), "{note}");
    }

    #[test]
    fn updates_alone_and_a_quiet_pass_write_no_event() {
        let summary = Summary {
            updated: vec!["ConfigMap a/x".into()],
            ..Summary::default()
        };
        assert!(summary.event().is_none());
        assert!(Summary::default().event().is_none());
    }

    #[test]
    fn readiness_lost_is_a_warning_with_the_reason() {
        let summary = Summary {
            ready: ready_change(&json!({"status": status("True")}), Some(&status("False"))),
            ..Summary::default()
        };
        let (type_, reason, note) = summary.event().expect("an event");
        assert_eq!((type_, reason), (EventType::Warning, "NotReady"));
        assert_eq!(note, "no longer Ready: Deployment a/web not ready");
    }

    #[test]
    fn only_a_change_of_ready_is_a_transition() {
        let parent = |s: &str| json!({"status": status(s)});
        assert_eq!(
            ready_change(&parent("False"), Some(&status("True"))),
            Some(ReadyChange::Became)
        );
        assert_eq!(ready_change(&parent("True"), Some(&status("True"))), None);
        assert_eq!(ready_change(&parent("False"), Some(&status("False"))), None);
        assert_eq!(
            ready_change(&json!({}), Some(&status("False"))),
            None,
            "a new parent not ready yet was never Ready"
        );
        assert_eq!(
            ready_change(&json!({}), Some(&status("True"))),
            Some(ReadyChange::Became),
            "ready at once"
        );
    }
}
