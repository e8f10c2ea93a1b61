//! The registry's source: Secrets in the operator's namespace labelled
//! `trellis.dev/cluster: <name>`, each holding a `kubeconfig`. A Secret
//! added registers its spoke, one changed (a rotated token) replaces the
//! spoke's client and watches, one removed unregisters it: its children
//! there are then held back as `ClusterUnknown`, never deleted. No restart.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Config, ResourceExt};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Clusters;
use super::spoke::Spoke;
use crate::labels::LABEL_CLUSTER;
use crate::operator::lock;
use crate::operator::retry::WatchBackoff;

/// Why a Secret registers no spoke.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("Secret {secret}: {why}")]
    Name { secret: String, why: String },
    #[error("Secret {secret}: no `kubeconfig` key")]
    NoKubeconfig { secret: String },
    #[error("Secret {secret}: the kubeconfig does not load: {source}")]
    Kubeconfig {
        secret: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("Secret {secret}: no client from the kubeconfig: {source}")]
    Client {
        secret: String,
        #[source]
        source: kube::Error,
    },
}

/// Watches the cluster Secrets in `namespace` until `shutdown`.
pub async fn run(
    client: Client,
    namespace: String,
    clusters: Arc<Clusters>,
    shutdown: CancellationToken,
) {
    let api: Api<Secret> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().labels(LABEL_CLUSTER);
    let events = watcher::watcher(api, config).backoff(WatchBackoff::default());
    let mut events = std::pin::pin!(events);
    // Secrets seen in the current (re)list: what is not among them once it
    // is done was removed meanwhile.
    let mut relisting: Option<BTreeSet<String>> = None;
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => break,
            event = events.next() => event,
        };
        match event {
            None => break,
            Some(Err(err)) => {
                warn!(namespace = %namespace, "cluster Secrets: watch failed, retrying: {err}")
            }
            Some(Ok(watcher::Event::Init)) => relisting = Some(BTreeSet::new()),
            Some(Ok(watcher::Event::InitApply(secret))) => {
                if let Some(seen) = relisting.as_mut() {
                    seen.insert(secret.name_any());
                }
                register(&clusters, &secret).await;
            }
            Some(Ok(watcher::Event::InitDone)) => {
                let seen = relisting.take().unwrap_or_default();
                let gone: Vec<String> = lock(&clusters.spokes)
                    .values()
                    .filter(|s| !seen.contains(&s.secret))
                    .map(|s| s.secret.clone())
                    .collect();
                for secret in gone {
                    unregister(&clusters, &secret);
                }
                clusters.listed.send_replace(true);
                clusters.bump();
            }
            Some(Ok(watcher::Event::Apply(secret))) => register(&clusters, &secret).await,
            Some(Ok(watcher::Event::Delete(secret))) => unregister(&clusters, &secret.name_any()),
        }
    }
    // Stopped, not unregistered: a pass still in flight at shutdown must
    // not find its spoke gone (it would write that into the status).
    for spoke in lock(&clusters.spokes).values() {
        spoke.stop.cancel();
    }
}

/// Registers (or, changed, replaces) the spoke a Secret names.
async fn register(clusters: &Arc<Clusters>, secret: &Secret) {
    let name = secret.name_any();
    let spoke = match spoke_of(secret, &clusters.metrics).await {
        Ok(spoke) => spoke,
        Err(why) => {
            // A Secret that cannot be used registers nothing; one that
            // replaced a working one leaves that in place.
            warn!("{why}");
            return;
        }
    };
    let cluster = spoke.name.clone();
    let replaced = {
        let mut spokes = lock(&clusters.spokes);
        if spokes
            .get(&cluster)
            .is_some_and(|s| s.fingerprint == spoke.fingerprint && s.secret == name)
        {
            return;
        }
        // The same Secret under a new cluster name: its old name goes.
        let renamed: Vec<String> = spokes
            .iter()
            .filter(|(c, s)| s.secret == name && **c != cluster)
            .map(|(c, _)| c.clone())
            .collect();
        for old in renamed {
            if let Some(s) = spokes.remove(&old) {
                s.stop.cancel();
            }
        }
        let spoke = Arc::new(spoke);
        spoke.start(clusters);
        spokes.insert(cluster.clone(), spoke)
    };
    match replaced {
        Some(old) => {
            old.stop.cancel();
            info!(cluster = %cluster, secret = %name, "cluster credentials changed: client and watches replaced");
        }
        None => info!(cluster = %cluster, secret = %name, "cluster registered"),
    }
    clusters.bump();
}

/// Unregisters the spoke of the Secret `secret`: nothing is deleted there.
fn unregister(clusters: &Clusters, secret: &str) {
    let removed: Vec<Arc<Spoke>> = {
        let mut spokes = lock(&clusters.spokes);
        let names: Vec<String> = spokes
            .iter()
            .filter(|(_, s)| s.secret == secret)
            .map(|(n, _)| n.clone())
            .collect();
        names.iter().filter_map(|n| spokes.remove(n)).collect()
    };
    for spoke in removed {
        spoke.stop.cancel();
        clusters.forget_metric(&spoke.name);
        info!(cluster = %spoke.name, secret = %secret, "cluster unregistered (its Secret is gone); nothing is deleted there");
    }
    clusters.bump();
}

/// The spoke a Secret describes: its name (the label), a client from its
/// `kubeconfig`, and a fingerprint of that kubeconfig.
/// Its requests are counted under the spoke's name.
async fn spoke_of(
    secret: &Secret,
    metrics: &Arc<crate::telemetry::Metrics>,
) -> Result<Spoke, Refused> {
    let (cluster, client, fingerprint) = client_of(secret).await?;
    let client = crate::operator::requests::counted_in(client, metrics.clone(), &cluster);
    Ok(Spoke::new(cluster, secret.name_any(), fingerprint, client))
}

/// What a cluster Secret holds: the spoke's name (its label), a client
/// from its `kubeconfig`, and a fingerprint of that kubeconfig. Shared
/// with the CLI (`trellis tree`, `trellis diff`), which reads spokes
/// through the same Secrets.
pub async fn client_of(secret: &Secret) -> Result<(String, Client, String), Refused> {
    let name = secret.name_any();
    let cluster = secret
        .labels()
        .get(LABEL_CLUSTER)
        .cloned()
        .unwrap_or_default();
    crate::clusters::check_name(&cluster).map_err(|why| Refused::Name {
        secret: name.clone(),
        why: format!("label {LABEL_CLUSTER}: {why}"),
    })?;
    if cluster == crate::clusters::LOCAL {
        return Err(Refused::Name {
            secret: name,
            why: format!("`{}` names the hub itself", crate::clusters::LOCAL),
        });
    }
    let text = secret
        .data
        .as_ref()
        .and_then(|d| d.get("kubeconfig"))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get("kubeconfig").cloned())
        })
        .ok_or_else(|| Refused::NoKubeconfig {
            secret: name.clone(),
        })?;
    let kubeconfig = Kubeconfig::from_yaml(&text).map_err(|source| Refused::Kubeconfig {
        secret: name.clone(),
        source,
    })?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|source| Refused::Kubeconfig {
            secret: name.clone(),
            source,
        })?;
    let client = Client::try_from(config).map_err(|source| Refused::Client {
        secret: name.clone(),
        source,
    })?;
    let fingerprint = format!("{:x}", Sha256::digest(text.as_bytes()));
    Ok((cluster, client, fingerprint))
}
