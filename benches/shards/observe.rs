//! What the bench's own watches see of one run's namespace: each parent's
//! uid and whether its status is written for its generation, and each
//! child ConfigMap's parent, bucket label and `edition` key. Watches, not
//! polls, as in `benches/load.rs`: polling every child would load the API
//! server more as the run grows.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

struct ParentSeen {
    uid: String,
    synced: bool,
}

struct ChildSeen {
    parent_uid: String,
    edition: String,
    bucket: Option<String>,
}

#[derive(Default)]
struct Seen {
    parents: HashMap<String, ParentSeen>,
    children: HashMap<String, ChildSeen>,
}

/// The watches; stopped when dropped.
pub struct Observer {
    seen: Arc<Mutex<Seen>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Observer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Where the parents stand.
pub struct Progress {
    /// Parents whose status is written for their generation and whose
    /// ConfigMap exists.
    pub synced: usize,
    pub children: usize,
    /// A parent that is not there yet, and why.
    pub laggard: Option<String>,
}

/// Status written for the parent's generation: `Synced=True`, the
/// generation observed and the field mapped from the spec.
fn parent_synced(obj: &DynamicObject) -> bool {
    let status = &obj.data["status"];
    let synced = status["conditions"].as_array().is_some_and(|conds| {
        conds
            .iter()
            .any(|c| c["type"] == json!("Synced") && c["status"] == json!("True"))
    });
    synced
        && status["observedGeneration"].as_i64().is_some()
        && status["observedGeneration"].as_i64() == obj.metadata.generation
        && status["v"] == obj.data["spec"]["v"]
}

impl Observer {
    /// Starts the watches on `ns` (children labelled `trellis.dev/rule=RULE`)
    /// and returns once both have listed.
    pub async fn start(client: &Client, ns: &str, resource: &ApiResource, rule: &str) -> Observer {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (listed_tx, mut listed) = tokio::sync::mpsc::unbounded_channel::<()>();
        let parents: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, resource);
        let parent_watch = {
            let (seen, listed_tx) = (seen.clone(), listed_tx.clone());
            tokio::spawn(async move {
                let config = watcher::Config::default();
                let mut events = std::pin::pin!(watcher(parents, config).default_backoff());
                while let Some(event) = events.next().await {
                    match event {
                        Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                            let state = ParentSeen {
                                uid: o.uid().unwrap_or_default(),
                                synced: parent_synced(&o),
                            };
                            lock(&seen).parents.insert(o.name_any(), state);
                        }
                        Ok(watcher::Event::Delete(o)) => {
                            lock(&seen).parents.remove(&o.name_any());
                        }
                        Ok(watcher::Event::InitDone) => {
                            let _ = listed_tx.send(());
                        }
                        Ok(watcher::Event::Init) => {}
                        Err(e) => eprintln!("[shards] parent watch failed (retrying): {e}"),
                    }
                }
            })
        };
        let configs: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let child_watch = {
            let seen = seen.clone();
            let config = watcher::Config::default().labels(&format!("trellis.dev/rule={rule}"));
            tokio::spawn(async move {
                let mut events = std::pin::pin!(watcher(configs, config).default_backoff());
                while let Some(event) = events.next().await {
                    match event {
                        Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                            let label = |key: &str| cm.labels().get(key).cloned();
                            let state = ChildSeen {
                                parent_uid: label("trellis.dev/parent-uid").unwrap_or_default(),
                                edition: cm
                                    .data
                                    .as_ref()
                                    .and_then(|d| d.get("edition"))
                                    .cloned()
                                    .unwrap_or_default(),
                                bucket: label("trellis.dev/bucket"),
                            };
                            lock(&seen).children.insert(cm.name_any(), state);
                        }
                        Ok(watcher::Event::Delete(cm)) => {
                            lock(&seen).children.remove(&cm.name_any());
                        }
                        Ok(watcher::Event::InitDone) => {
                            let _ = listed_tx.send(());
                        }
                        Ok(watcher::Event::Init) => {}
                        Err(e) => eprintln!("[shards] ConfigMap watch failed (retrying): {e}"),
                    }
                }
            })
        };
        for _ in 0..2 {
            listed.recv().await;
        }
        Observer {
            seen,
            tasks: vec![parent_watch, child_watch],
        }
    }

    /// How many of the `n` parents named by `name(i)` are synced.
    pub fn progress(&self, names: &[String]) -> Progress {
        let seen = lock(&self.seen);
        let with_child: std::collections::HashSet<&str> = seen
            .children
            .values()
            .map(|c| c.parent_uid.as_str())
            .collect();
        let mut progress = Progress {
            synced: 0,
            children: seen.children.len(),
            laggard: None,
        };
        for name in names {
            let state = seen.parents.get(name);
            let synced = state.is_some_and(|p| p.synced && with_child.contains(p.uid.as_str()));
            progress.synced += usize::from(synced);
            if !synced && progress.laggard.is_none() {
                progress.laggard = Some(match state {
                    None => format!("{name}: not seen"),
                    Some(p) => format!(
                        "{name}: status synced {}, ConfigMap {}",
                        p.synced,
                        with_child.contains(p.uid.as_str())
                    ),
                });
            }
        }
        progress
    }

    /// ConfigMaps whose `edition` key is `edition`.
    pub fn carrying(&self, edition: &str) -> usize {
        lock(&self.seen)
            .children
            .values()
            .filter(|c| c.edition == edition)
            .count()
    }

    /// ConfigMaps without a `trellis.dev/bucket` label (every child carries one).
    pub fn unlabelled(&self) -> usize {
        lock(&self.seen)
            .children
            .values()
            .filter(|c| c.bucket.is_none())
            .count()
    }

    /// A ConfigMap that does not carry `edition`, for a timeout's message.
    pub fn not_carrying(&self, edition: &str) -> Option<String> {
        lock(&self.seen)
            .children
            .iter()
            .find(|(_, c)| c.edition != edition)
            .map(|(name, c)| {
                format!(
                    "{name} (bucket {}, edition {:?})",
                    c.bucket.as_deref().unwrap_or("-"),
                    c.edition
                )
            })
    }
}

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(|e| e.into_inner())
}
