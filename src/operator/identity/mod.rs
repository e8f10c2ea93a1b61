//! Per-rule identity (`serviceAccountName:`): the clients a rule's child
//! writes are sent with, and what a refused write says.
//!
//! A rule with an account writes its children impersonating
//! `system:serviceaccount:<operator namespace>:<account>`, so the API server
//! authorizes every write as that account. The impersonating client is the
//! operator's own client (already counting requests, see [`super::requests`])
//! with one header added to each request: it shares the operator's
//! connection pool and its credentials' refresh, costs nothing to keep, and
//! is built once per account and reused by every pass. A rule without an
//! account gets the operator's client itself: its hot path is unchanged.
//! Status, finalizers, Events, Leases and CRDs never go through here.
//!
//! Caches are shared, so a rule could read through trellis what its account
//! cannot: [`preflight`] asks, before the rule starts, on every reload and
//! every `--service-account-recheck` (10 minutes), whether the account may
//! read every kind the rule reads; the rule runs only while it may.
//!
//! The API server groups an impersonated ServiceAccount itself
//! (`system:serviceaccounts`, `system:serviceaccounts:<namespace>`,
//! `system:authenticated`) when no group is given, so only the user is sent.
//!
//! Files: this one (the clients and the preflight), `access.rs` (the
//! questions the preflight asks, shared with `trellis diff`'s checks).

pub(super) mod access;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use http::{HeaderValue, Request};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec, SubjectAccessReview,
    SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::PostParams;
use kube::client::Body;
use kube::{Api, Client};
use tokio::sync::watch;

use super::watches::discovery::RuleKinds;
use super::{Shared, lock};
use crate::rules::CompiledRule;

/// The header that makes the API server act as another user.
const IMPERSONATE_USER: &str = "impersonate-user";

/// One client per account, built on first use and reused.
pub struct Identities {
    base: Client,
    namespace: String,
    clients: Mutex<HashMap<String, Client>>,
}

impl Identities {
    /// Accounts live in `namespace` (the operator's); `base` is the
    /// operator's own (counted) client.
    pub fn new(base: Client, namespace: String) -> Identities {
        Identities {
            base,
            namespace,
            clients: Mutex::default(),
        }
    }

    /// The operator's namespace, where every rule's account lives.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The user the API server sees for `account`.
    pub fn username(&self, account: &str) -> String {
        username(&self.namespace, account)
    }

    /// The user `rule`'s writes are sent as: its account's, if it has one.
    pub fn user_of(&self, rule: &crate::rules::CompiledRule) -> Option<String> {
        let account = rule.rule.spec.service_account_name.as_deref();
        account.map(|a| self.username(a))
    }

    /// The client a rule's child writes go through: the operator's own
    /// without an account, else the account's, made once.
    pub fn client(&self, account: Option<&str>) -> Client {
        let Some(account) = account else {
            return self.base.clone();
        };
        let mut clients = lock(&self.clients);
        if let Some(client) = clients.get(account) {
            return client.clone();
        }
        let client = impersonating(self.base.clone(), &self.username(account));
        clients.insert(account.to_owned(), client.clone());
        client
    }
}

/// `system:serviceaccount:<namespace>:<account>`.
pub fn username(namespace: &str, account: &str) -> String {
    format!("system:serviceaccount:{namespace}:{account}")
}

/// `client`, with every request sent as `user`.
pub fn impersonating(client: Client, user: &str) -> Client {
    let namespace = client.default_namespace().to_owned();
    let valid_until = *client.valid_until();
    // A ServiceAccount name is a DNS subdomain and a namespace a DNS label:
    // always a valid header value. Should it not be, every request goes out
    // unsent rather than as the operator (see `send`).
    let header = HeaderValue::from_str(user).ok();
    let service = tower::service_fn(move |mut request: Request<Body>| {
        let inner = client.clone();
        let header = header.clone();
        async move {
            let Some(header) = header else {
                return Err(kube::Error::Service(
                    "the ServiceAccount's name is not a valid header value".into(),
                ));
            };
            request.headers_mut().insert(IMPERSONATE_USER, header);
            inner.send(request).await
        }
    });
    Client::new(service, namespace).with_valid_until(valid_until)
}

/// Why a rule's account may not be used; each names the account
/// (`ServiceAccount NS/NAME`).
#[derive(Debug, thiserror::Error)]
pub enum AccountRefused {
    #[error("trellis may not impersonate {account}; grant what `trellis rbac` prints")]
    MayNotImpersonate { account: String },
    #[error("{account} does not exist")]
    Missing { account: String },
    #[error("{account} may not {}: the rule would read through trellis what its account cannot", .denied.join(", "))]
    MayNotRead {
        account: String,
        denied: Vec<String>,
    },
    /// The API server did not answer a review or a read; `what` says which.
    #[error("cannot {what}: {source}")]
    Unchecked { what: String, source: kube::Error },
}

/// Whether `rule`'s account may be used: it exists, the operator may
/// impersonate it, and it may get, list and watch every kind the rule reads
/// where the rule reads it ([`access::checks`]), asked with one
/// SubjectAccessReview each. `Err` says what is missing, naming account,
/// verb, resource and namespace. `Ok` for a rule without an account.
pub async fn preflight(
    shared: &Shared,
    rule: &CompiledRule,
    kinds: &RuleKinds,
    namespaces: &[String],
) -> Result<(), AccountRefused> {
    let Some(account) = rule.rule.spec.service_account_name.as_deref() else {
        return Ok(());
    };
    let home = shared.identities.namespace();
    let named = format!("ServiceAccount {home}/{account}");
    // Impersonation first: without it no write of the rule can be made,
    // and the operator's own preflight may not have run (a recheck).
    let own: Api<SelfSubjectAccessReview> = Api::all(shared.client.clone());
    let impersonate = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(String::new()),
                resource: Some("serviceaccounts".into()),
                verb: Some("impersonate".into()),
                name: Some(account.to_owned()),
                namespace: Some(home.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    match own.create(&PostParams::default(), &impersonate).await {
        Ok(r) if r.status.as_ref().is_some_and(|s| s.allowed) => {}
        Ok(_) => return Err(AccountRefused::MayNotImpersonate { account: named }),
        Err(source) => {
            return Err(AccountRefused::Unchecked {
                what: format!("check impersonating {named}"),
                source,
            });
        }
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(shared.client.clone(), home);
    match accounts.get_opt(account).await {
        Ok(Some(_)) => {}
        Ok(None) => return Err(AccountRefused::Missing { account: named }),
        Err(source) => {
            return Err(AccountRefused::Unchecked {
                what: format!("read {named}"),
                source,
            });
        }
    }
    let reviews: Api<SubjectAccessReview> = Api::all(shared.client.clone());
    let checks = access::checks(
        crate::rbac::account_read_permissions(rule),
        rule,
        kinds,
        namespaces,
        &shared.namespaces,
        home,
    );
    let user = username(home, account);
    let mut denied = Vec::new();
    for check in checks {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.clone()),
                groups: Some(groups(home)),
                resource_attributes: Some(access::attributes(&check)),
                ..Default::default()
            },
            ..Default::default()
        };
        match reviews.create(&PostParams::default(), &review).await {
            Ok(r) if r.status.as_ref().is_some_and(|s| s.allowed) => {}
            Ok(_) => denied.push(check.to_string()),
            Err(source) => {
                return Err(AccountRefused::Unchecked {
                    what: format!("review what {named} may do"),
                    source,
                });
            }
        }
    }
    if denied.is_empty() {
        Ok(())
    } else {
        Err(AccountRefused::MayNotRead {
            account: named,
            denied,
        })
    }
}

/// The groups the API server gives a ServiceAccount of `namespace`.
fn groups(namespace: &str) -> Vec<String> {
    vec![
        "system:serviceaccounts".into(),
        format!("system:serviceaccounts:{namespace}"),
        "system:authenticated".into(),
    ]
}

/// While the rule runs: checks its account again every
/// `shared.account_recheck` and whenever the rule is reloaded; a failure is
/// returned (and the caller stops the rule's watches, leaving its children
/// as they are). Never returns for a rule without an account.
pub async fn recheck(
    shared: &Shared,
    mut rules: watch::Receiver<Arc<CompiledRule>>,
    kinds: &RuleKinds,
    namespaces: &[String],
) -> String {
    rules.borrow_and_update();
    loop {
        if rules.borrow().rule.spec.service_account_name.is_none() {
            return std::future::pending().await;
        }
        tokio::select! {
            _ = tokio::time::sleep(shared.account_recheck) => {}
            changed = rules.changed() => if changed.is_err() {
                return std::future::pending().await;
            },
        }
        let rule = rules.borrow_and_update().clone();
        if let Err(why) = preflight(shared, &rule, kinds, namespaces).await {
            return why.to_string();
        }
    }
}

/// A write refused (403) to a rule's account: who was refused what, in
/// words an administrator can act on. `None` for anything else.
pub fn refusal(account_user: &str, err: &kube::Error) -> Option<String> {
    let kube::Error::Api(status) = err else {
        return None;
    };
    if status.code != 403 {
        return None;
    }
    // The API server's message: `<resource> "<name>" is forbidden: User
    // "<user>" cannot <verb> resource "<resource>" in API group "<group>"
    // in the namespace "<ns>"`; the part after the user names the verb,
    // resource and namespace.
    let what = status
        .message
        .split_once(" cannot ")
        .map(|(_, rest)| format!("may not {rest}"))
        .unwrap_or_else(|| format!("was refused: {}", status.message));
    Some(format!("{account_user} {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_account_verb_resource_and_namespace_of_a_refusal() {
        let status = kube::core::Status::failure(
            "configmaps \"x\" is forbidden: User \"system:serviceaccount:trellis:w\" cannot patch resource \"configmaps\" in API group \"\" in the namespace \"other\"",
            "Forbidden",
        )
        .with_code(403);
        let err = kube::Error::Api(Box::new(status));
        assert_eq!(
            refusal("system:serviceaccount:trellis:w", &err).as_deref(),
            Some(
                "system:serviceaccount:trellis:w may not patch resource \"configmaps\" in API group \"\" in the namespace \"other\""
            )
        );
        let conflict = kube::Error::Api(Box::new(
            kube::core::Status::failure("exists", "AlreadyExists").with_code(409),
        ));
        assert_eq!(refusal("u", &conflict), None);
    }

    #[test]
    fn the_user_is_the_service_account_of_the_operator_namespace() {
        assert_eq!(
            username("trellis-system", "webapp-rule"),
            "system:serviceaccount:trellis-system:webapp-rule"
        );
    }
}
