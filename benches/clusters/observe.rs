//! What the bench's own watches see of one run: each parent's state (its
//! status written for its generation, with the field mapped from the
//! remote child), and the names of the rule's ConfigMaps in the hub's and
//! the spoke's namespace. Watches, not polls, as in `benches/load.rs`:
//! polls would add requests to the very counts the bench reports.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

#[derive(Default)]
struct Seen {
    /// Parent name → status written for its generation.
    parents: HashMap<String, bool>,
    /// ConfigMap names, per watched place (0: the hub, 1: the spoke).
    children: [HashSet<String>; 2],
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
    /// Parents whose status is written for their generation and whose two
    /// ConfigMaps exist where the rule places them.
    pub synced: usize,
    /// ConfigMaps seen in the hub and in the spoke.
    pub children: [usize; 2],
    pub parents: usize,
    /// A parent that is not there yet, and why.
    pub laggard: Option<String>,
}

/// `Synced=True`, the generation observed and `remoteV` (mapped from the
/// remote child) equal to `spec.v`.
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
        && status["remoteV"] == obj.data["spec"]["v"]
}

impl Observer {
    /// Watches the parents in `ns` of the hub, and the ConfigMaps labelled
    /// `trellis.dev/rule=RULE` in `ns` of the hub and (when given) of the
    /// spoke; returns once every watch has listed.
    pub async fn start(
        hub: &Client,
        spoke: Option<&Client>,
        ns: &str,
        resource: &ApiResource,
        rule: &str,
    ) -> Observer {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (listed_tx, mut listed) = tokio::sync::mpsc::unbounded_channel::<()>();
        let mut tasks = Vec::new();
        let parents: Api<DynamicObject> = Api::namespaced_with(hub.clone(), ns, resource);
        tasks.push({
            let (seen, listed_tx) = (seen.clone(), listed_tx.clone());
            tokio::spawn(async move {
                let config = watcher::Config::default();
                let mut events = std::pin::pin!(watcher(parents, config).default_backoff());
                while let Some(event) = events.next().await {
                    match event {
                        Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                            lock(&seen).parents.insert(o.name_any(), parent_synced(&o));
                        }
                        Ok(watcher::Event::Delete(o)) => {
                            lock(&seen).parents.remove(&o.name_any());
                        }
                        Ok(watcher::Event::InitDone) => {
                            let _ = listed_tx.send(());
                        }
                        Ok(watcher::Event::Init) => {}
                        Err(e) => eprintln!("[clusters] parent watch failed (retrying): {e}"),
                    }
                }
            })
        });
        let places: Vec<Client> = std::iter::once(hub.clone()).chain(spoke.cloned()).collect();
        for (at, client) in places.into_iter().enumerate() {
            let configs: Api<ConfigMap> = Api::namespaced(client, ns);
            let (seen, listed_tx) = (seen.clone(), listed_tx.clone());
            let config = watcher::Config::default().labels(&format!("trellis.dev/rule={rule}"));
            tasks.push(tokio::spawn(async move {
                let mut events = std::pin::pin!(watcher(configs, config).default_backoff());
                while let Some(event) = events.next().await {
                    match event {
                        Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                            lock(&seen).children[at].insert(cm.name_any());
                        }
                        Ok(watcher::Event::Delete(cm)) => {
                            lock(&seen).children[at].remove(&cm.name_any());
                        }
                        Ok(watcher::Event::InitDone) => {
                            let _ = listed_tx.send(());
                        }
                        Ok(watcher::Event::Init) => {}
                        Err(e) => eprintln!("[clusters] ConfigMap watch failed (retrying): {e}"),
                    }
                }
            }));
        }
        for _ in 0..tasks.len() {
            listed.recv().await;
        }
        Observer { seen, tasks }
    }

    /// How many of `names` are synced, the remote child looked for in the
    /// spoke when `remote_in_spoke`.
    pub fn progress(&self, names: &[String], remote_in_spoke: bool) -> Progress {
        let seen = lock(&self.seen);
        let remote_at = usize::from(remote_in_spoke);
        let mut progress = Progress {
            synced: 0,
            children: [seen.children[0].len(), seen.children[1].len()],
            parents: seen.parents.len(),
            laggard: None,
        };
        for name in names {
            let status = seen.parents.get(name).copied();
            let home = seen.children[0].contains(&format!("{name}-home"));
            let remote = seen.children[remote_at].contains(&format!("{name}-remote"));
            let synced = status == Some(true) && home && remote;
            progress.synced += usize::from(synced);
            if !synced && progress.laggard.is_none() {
                progress.laggard = Some(format!(
                    "{name}: status synced {status:?}, home child {home}, remote child {remote}"
                ));
            }
        }
        progress
    }
}

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(|e| e.into_inner())
}
