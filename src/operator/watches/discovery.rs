//! Resolving the kinds a rule names through API discovery.
//!
//! A kind that is not served yet (its CRD is missing or not established) is
//! not an error: the rule waits and is resolved again when CRDs change. A
//! related kind is the exception: the rule runs without it, and only the
//! children that read it wait (`RelatedKindNotServed`).

use kube::core::{DynamicResourceScope, GroupVersionKind};
use kube::discovery::{self, Scope};
use kube::{Api, Client, Resource};

use super::decode::SharedResource;

use crate::kinds::Gvk;
use crate::rules::CompiledRule;

/// A kind as the API server serves it.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub gvk: Gvk,
    /// Shared: it is the caches' dynamic type, copied into every cache key.
    pub resource: super::decode::SharedResource,
    pub namespaced: bool,
    /// The `/status` subresource exists (CRDs with `subresources.status`).
    pub status_subresource: bool,
}

/// Every kind one rule needs, resolved.
#[derive(Debug, Clone)]
pub struct RuleKinds {
    pub parent: Resolved,
    /// One entry per distinct child kind, in first-use order.
    pub children: Vec<Resolved>,
    /// One entry per distinct served related kind (patch target kinds
    /// included), in first-use order.
    pub related: Vec<Resolved>,
    /// Related kinds not served, with why (readers wait for them).
    pub unserved_related: Vec<NotServed>,
}

/// A kind the API server does not serve (yet): its CRD is missing or not
/// established, or discovery failed. Cloned into the related caches, which
/// keep it as the pending reason of the children that read the kind.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{gvk} is not served by the API server: {why}")]
pub struct NotServed {
    pub gvk: Gvk,
    /// Discovery's own error, as text: `kube::Error` is not `Clone`.
    why: String,
}

impl Resolved {
    /// An `Api` of this kind in `namespace` when the kind is namespaced and
    /// one is given; across the cluster otherwise (a cluster-scoped kind,
    /// or every namespace). Every per-kind `Api` is made here, so that none
    /// can send a cluster-scoped kind to a namespaced path.
    pub fn api<K>(&self, client: Client, namespace: Option<&str>) -> Api<K>
    where
        K: Resource<Scope = DynamicResourceScope>,
        SharedResource: AsRef<K::DynamicType>,
    {
        let resource = self.resource.as_ref();
        match namespace {
            Some(ns) if self.namespaced => Api::namespaced_with(client, ns, resource),
            _ => Api::all_with(client, resource),
        }
    }
}

impl RuleKinds {
    pub fn child(&self, gvk: &Gvk) -> Option<&Resolved> {
        self.children.iter().find(|c| &c.gvk == gvk)
    }

    /// Whether discovery here resolved `gvk` (the parent, a child or a
    /// related kind): [`RuleKinds::scope_of`] then knows its scope.
    pub fn knows(&self, gvk: &Gvk) -> bool {
        &self.parent.gvk == gvk
            || self.child(gvk).is_some()
            || self.related.iter().any(|r| &r.gvk == gvk)
    }

    /// Scope as discovery reports it, for the planner.
    pub fn scope_of(&self, gvk: &Gvk) -> crate::rules::model::Scope {
        let namespaced = if &self.parent.gvk == gvk {
            self.parent.namespaced
        } else {
            self.child(gvk)
                .or_else(|| self.related.iter().find(|r| &r.gvk == gvk))
                .map(|c| c.namespaced)
                .unwrap_or(true)
        };
        if namespaced {
            crate::rules::model::Scope::Namespaced
        } else {
            crate::rules::model::Scope::Cluster
        }
    }
}

/// Resolves one kind; `Err` says why it is not served.
pub async fn resolve(client: &Client, gvk: &Gvk) -> Result<Resolved, NotServed> {
    let key = GroupVersionKind::gvk(&gvk.group, &gvk.version, &gvk.kind);
    match discovery::oneshot::pinned_kind(client, &key).await {
        Ok((resource, caps)) => Ok(Resolved {
            gvk: gvk.clone(),
            namespaced: caps.scope == Scope::Namespaced,
            status_subresource: caps.subresources.iter().any(|(r, _)| r.plural == "status"),
            resource: resource.into(),
        }),
        Err(err) => Err(NotServed {
            gvk: gvk.clone(),
            why: err.to_string(),
        }),
    }
}

/// Whether every child of `gvk` has `cluster:` (it may live in a spoke).
fn placed_elsewhere(rule: &CompiledRule, gvk: &Gvk) -> bool {
    rule.children
        .iter()
        .filter(|c| &c.gvk == gvk)
        .all(|c| c.cluster.is_some())
}

/// Resolves the parent, every child kind and every related kind of a rule.
pub async fn resolve_rule(client: &Client, rule: &CompiledRule) -> Result<RuleKinds, NotServed> {
    let parent = resolve(client, &rule.parent).await?;
    let mut children: Vec<Resolved> = Vec::new();
    for child in &rule.children {
        if children.iter().any(|c| c.gvk == child.gvk) {
            continue;
        }
        match resolve(client, &child.gvk).await {
            Ok(kind) => children.push(kind),
            // A kind only the spokes serve: not watched here, and a parent
            // that places such a child at home fails to apply it.
            Err(_) if placed_elsewhere(rule, &child.gvk) => {}
            Err(not_served) => return Err(not_served),
        }
    }
    let mut related: Vec<Resolved> = Vec::new();
    let mut unserved_related: Vec<NotServed> = Vec::new();
    // Patch targets are read as related objects are (and wait likewise
    // for a kind not served).
    let read = rule
        .related
        .iter()
        .map(|r| &r.gvk)
        .chain(rule.patches.iter().map(|p| &p.gvk));
    for gvk in read {
        if related.iter().any(|r| &r.gvk == gvk) || unserved_related.iter().any(|u| &u.gvk == gvk) {
            continue;
        }
        match resolve(client, gvk).await {
            Ok(kind) => related.push(kind),
            Err(not_served) => unserved_related.push(not_served),
        }
    }
    Ok(RuleKinds {
        parent,
        children,
        related,
        unserved_related,
    })
}
