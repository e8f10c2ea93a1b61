//! The spokes `trellis tree` and `trellis diff` read, through the same
//! Secrets the operator registers them by (`trellis.dev/cluster: <name>`
//! with a `kubeconfig`, in the operator's namespace): a rule's children
//! there by label, placed by the `trellis.dev/cluster` annotation as the
//! operator places them, and what its spoke related entries read. A spoke
//! that cannot be read is not an error of the command: its entries are
//! held back as the operator would hold them (`ClusterUnreachable`, the
//! message saying why), and every other line is shown.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, ListParams};
use kube::{Client, ResourceExt};
use serde_json::Value;

use super::{Kinds, to_value};
use crate::clusters::{Clusters, Reach};
use crate::kinds::Gvk;
use crate::labels::{LABEL_CLUSTER, LABEL_HUB};
use crate::operator::discovery::{Resolved, resolve};
use crate::plan::{LABEL_PARENT_UID, LABEL_RULE, RelatedRead, RelatedTarget};
use crate::rules::CompiledRule;

/// How long one request to a spoke may take: one that does not answer
/// must not hold the command.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The spokes registered in the operator's namespace, as far as they could
/// be read.
#[derive(Default)]
pub(crate) struct Spokes {
    /// Name → a client from its Secret, or why there is none.
    clients: BTreeMap<String, Result<Client, String>>,
    /// Why the Secrets themselves could not be read.
    unread: Option<String>,
    /// The operator's namespace: a rule's account there is impersonated
    /// in spokes too.
    namespace: String,
}

impl Spokes {
    /// Reads the cluster Secrets in `namespace` when some rule of `rules`
    /// places children or reads related objects in spokes (else none are
    /// read: a command on such rules needs no access to Secrets).
    pub(crate) async fn read<'r>(
        client: &Client,
        namespace: &str,
        mut rules: impl Iterator<Item = &'r CompiledRule>,
    ) -> Spokes {
        let mut out = Spokes {
            namespace: namespace.to_owned(),
            ..Spokes::default()
        };
        if !rules.any(crate::operator::clusters::reads_spokes) {
            return out;
        }
        let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let listed = tokio::time::timeout(
            TIMEOUT,
            api.list(&ListParams::default().labels(LABEL_CLUSTER)),
        )
        .await;
        let secrets = match listed {
            Ok(Ok(list)) => list.items,
            Ok(Err(e)) => {
                out.unread = Some(format!(
                    "cannot read the cluster Secrets in namespace {namespace}: {e}"
                ));
                return out;
            }
            Err(_) => {
                out.unread = Some(format!(
                    "cannot read the cluster Secrets in namespace {namespace}: no answer within {TIMEOUT:?}"
                ));
                return out;
            }
        };
        for secret in secrets {
            let label = secret.labels().get(LABEL_CLUSTER).cloned();
            match crate::operator::clusters::client_of(&secret).await {
                Ok((name, client, _)) => {
                    out.clients.insert(name, Ok(client));
                }
                Err(why) => {
                    if let Some(name) = label {
                        out.clients.insert(name, Err(why.to_string()));
                    }
                }
            }
        }
        out
    }

    /// `rule`'s objects for the parent `uid` in every spoke it places
    /// children in, each annotated with its cluster, and what the planner
    /// may know of the spokes: one whose list failed is unreachable.
    /// A rule that uses no spoke is planned as offline (every name is a
    /// reachable spoke: nothing of it is placed there anyway).
    pub(crate) async fn children(&self, rule: &CompiledRule, uid: &str) -> (Vec<Value>, Clusters) {
        if !crate::operator::clusters::reads_spokes(rule) {
            return (Vec::new(), Clusters::offline());
        }
        let mut kinds: Vec<&Gvk> = Vec::new();
        for child in rule.children.iter().filter(|c| c.cluster.is_some()) {
            if !kinds.contains(&&child.gvk) {
                kinds.push(&child.gvk);
            }
        }
        let selector = format!("{LABEL_RULE}={},{LABEL_PARENT_UID}={uid}", rule.name);
        let mut objects = Vec::new();
        let mut reach = BTreeMap::new();
        for (name, client) in &self.clients {
            let client = match client {
                Ok(c) => c,
                Err(why) => {
                    reach.insert(name.clone(), Reach::Unreachable(why.clone()));
                    continue;
                }
            };
            let mut state = Reach::Ready;
            for gvk in &kinds {
                match list_in(client, gvk, &selector).await {
                    Ok(found) => objects.extend(found.into_iter().map(|o| placed(o, name))),
                    Err(why) => {
                        state = Reach::Unreachable(why);
                        break;
                    }
                }
            }
            reach.insert(name.clone(), state);
        }
        let hub = objects
            .iter()
            .find_map(|o| o.pointer("/metadata/labels")?.get(LABEL_HUB)?.as_str())
            .unwrap_or(crate::clusters::DEFAULT_HUB)
            .to_owned();
        let clusters = Clusters {
            hub,
            spokes: Some(reach),
            unread: self.unread.clone(),
        };
        (objects, clusters)
    }

    /// The objects a related read covers in every readable spoke, placed
    /// there (a read does not say its cluster: the planner picks what the
    /// entry's `cluster:` names). Empty for a rule reading no spoke.
    pub(crate) async fn related(&self, rule: &CompiledRule, read: &RelatedRead) -> Vec<Value> {
        if !rule
            .related
            .iter()
            .any(|r| r.cluster.is_some() && r.spec.id == read.id)
        {
            return Vec::new();
        }
        let gvk = Gvk::new(&read.api_version, &read.kind);
        let mut out = Vec::new();
        for (name, client) in &self.clients {
            let Ok(client) = client else { continue };
            let Ok(Ok(kind)) = tokio::time::timeout(TIMEOUT, resolve(client, &gvk)).await else {
                continue;
            };
            let api: Api<DynamicObject> = kind.api(client.clone(), read.namespace.as_deref());
            let found = match &read.target {
                RelatedTarget::Name(n) => tokio::time::timeout(TIMEOUT, api.get_opt(n))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .flatten()
                    .into_iter()
                    .collect(),
                RelatedTarget::Selector(_) => {
                    tokio::time::timeout(TIMEOUT, api.list(&ListParams::default()))
                        .await
                        .ok()
                        .and_then(Result::ok)
                        .map(|l| l.items)
                        .unwrap_or_default()
                }
            };
            out.extend(found.into_iter().map(|o| placed(to_value(o, &kind), name)));
        }
        out
    }

    /// The client a rule's writes in `cluster` are dry-run with (its
    /// account impersonated there, as the operator sends them) and the
    /// kind `gvk` as that spoke serves it; why not when it cannot be read.
    pub(crate) async fn writer(
        &self,
        cluster: &str,
        rule: &CompiledRule,
        parent: &Resolved,
        gvk: (&str, &str),
    ) -> Result<(Client, Kinds), String> {
        let client = match self.clients.get(cluster) {
            Some(Ok(c)) => c.clone(),
            Some(Err(why)) => return Err(format!("cluster \"{cluster}\" cannot be read: {why}")),
            None => return Err(format!("cluster \"{cluster}\" is not registered")),
        };
        let Some(child) = rule
            .children
            .iter()
            .find(|c| c.gvk.group == gvk.0 && c.gvk.kind == gvk.1)
        else {
            return Err(format!(
                "{}.{} is no child kind of rule {}",
                gvk.1, gvk.0, rule.name
            ));
        };
        let kind = match tokio::time::timeout(TIMEOUT, resolve(&client, &child.gvk)).await {
            Ok(Ok(kind)) => kind,
            Ok(Err(why)) => return Err(format!("cluster \"{cluster}\": {why}")),
            Err(_) => {
                return Err(format!(
                    "cluster \"{cluster}\": no answer within {TIMEOUT:?}"
                ));
            }
        };
        let writer = match &rule.rule.spec.service_account_name {
            Some(account) => crate::operator::identity::impersonating(
                client,
                &crate::operator::identity::username(&self.namespace, account),
            ),
            None => client,
        };
        Ok((
            writer,
            Kinds {
                parent: parent.clone(),
                others: vec![kind],
                unserved: Vec::new(),
            },
        ))
    }
}

/// The objects of `gvk` in a spoke with the labels `selector`; why not.
async fn list_in(client: &Client, gvk: &Gvk, selector: &str) -> Result<Vec<Value>, String> {
    let kind = match tokio::time::timeout(TIMEOUT, resolve(client, gvk)).await {
        Ok(Ok(kind)) => kind,
        // Not served there, or no answer: either way what it holds is not
        // known (the operator holds such children back too).
        Ok(Err(why)) => return Err(why.to_string()),
        Err(_) => return Err(format!("no answer within {TIMEOUT:?}")),
    };
    let api: Api<DynamicObject> = kind.api(client.clone(), None);
    match tokio::time::timeout(TIMEOUT, api.list(&ListParams::default().labels(selector))).await {
        Ok(Ok(list)) => Ok(list.items.into_iter().map(|o| to_value(o, &kind)).collect()),
        Ok(Err(e)) => Err(format!("listing {gvk}: {e}")),
        Err(_) => Err(format!("no answer within {TIMEOUT:?}")),
    }
}

/// `obj` annotated as living in `cluster` (what the planner keys it by).
fn placed(mut obj: Value, cluster: &str) -> Value {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(a) = annotations.as_object_mut() {
            a.insert(LABEL_CLUSTER.into(), Value::String(cluster.to_owned()));
        }
    }
    obj
}
