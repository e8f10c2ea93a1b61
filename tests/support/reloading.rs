//! Running `trellis run` in-process with hot reload on a [`ConfigMapDir`],
//! and what reload tests look at: a rule whose children show which rule
//! text rendered them, children by rule, and their uids/resourceVersions.
//!
//! Not declared by `support/mod.rs`: a test includes it, after `mod support;`
//! and `configmap_dir`, with `#[path = "support/reloading.rs"] mod reloading;`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::Value;
use trellis::operator::Options;
use trellis::rules::RuleSet;

use crate::configmap_dir::ConfigMapDir;
use crate::support::operator::{Operator, TestKind, WAIT, config_data};

/// Two ConfigMaps per parent. `@VERSION@` is written into each child's
/// `data.version`, so a child shows which rule text rendered it.
pub const CONFIG_RULE: &str = r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: @RULE@
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-config" }}
        data:
          greeting: {{ spec.greeting }}
          version: "@VERSION@"
    - id: extra
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ "-extra" }}
        data:
          version: "@VERSION@"
"#;

/// [`CONFIG_RULE`] for `kind`, named `rule`, stamping `version`.
pub fn config_rule(kind: &TestKind, rule: &str, version: &str) -> String {
    kind.rule(CONFIG_RULE)
        .replace("@RULE@", rule)
        .replace("@VERSION@", version)
}

/// `trellis run` in a task of the test's runtime, reloading `rules`.
pub struct Reloading {
    operator: Operator,
    /// Where `/status` is served.
    addr: SocketAddr,
}

impl Reloading {
    /// Starts the operator on `rules` with a short debounce and poll,
    /// watching only `namespace`.
    pub fn start(client: &Client, namespace: &str, rules: &ConfigMapDir) -> Reloading {
        let dir = rules.path();
        let set =
            RuleSet::load(std::slice::from_ref(&dir), Default::default()).unwrap_or_else(|diags| {
                let text: Vec<String> = diags.iter().map(|d| d.to_string()).collect();
                panic!("test rules do not load:\n{}", text.join("\n"))
            });
        Reloading::start_with(client, namespace, rules, set)
    }

    /// Like [`Reloading::start`] on a partly broken set, as `trellis run`
    /// starts: the rules that validate run, the others are reported.
    pub fn start_partial(client: &Client, namespace: &str, rules: &ConfigMapDir) -> Reloading {
        let dir = rules.path();
        let loaded = trellis::rules::Loaded::read(std::slice::from_ref(&dir), Default::default());
        let partition = trellis::reload::partition(&RuleSet::default(), loaded);
        Reloading::start_with(client, namespace, rules, partition.set)
    }

    /// Like [`Reloading::start`], applying the rules' CRDs (`--manage-crds`).
    pub fn start_managing_crds(
        client: &Client,
        namespace: &str,
        rules: &ConfigMapDir,
    ) -> Reloading {
        let dir = rules.path();
        let set = RuleSet::load(std::slice::from_ref(&dir), Default::default())
            .unwrap_or_else(|diags| panic!("test rules do not load: {diags:?}"));
        Reloading::start_with_options(client, namespace, rules, set, |o| o.manage_crds = true)
    }

    fn start_with(
        client: &Client,
        namespace: &str,
        rules: &ConfigMapDir,
        set: RuleSet,
    ) -> Reloading {
        Reloading::start_with_options(client, namespace, rules, set, |_| {})
    }

    fn start_with_options(
        client: &Client,
        namespace: &str,
        rules: &ConfigMapDir,
        set: RuleSet,
        adjust: impl FnOnce(&mut Options),
    ) -> Reloading {
        let dir = rules.path();
        let addr = free_local_addr();
        let options = Options {
            reload_debounce: Duration::from_millis(200),
            reload_poll: Duration::from_secs(2),
            instance: "test".into(),
            metrics_addr: Some(addr),
            ..Options::new(vec![dir], vec![namespace.to_owned()])
        };
        let mut options = options;
        adjust(&mut options);
        Reloading {
            operator: Operator::spawn(options, set, client),
            addr,
        }
    }

    /// Polls `/status` until its `reload` part satisfies `check`; returns it.
    pub async fn wait_reload(&self, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        crate::support::eventually(what, WAIT, || async {
            let status = http_get_json(self.addr, "/status").await?;
            let reload = status["reload"].clone();
            if check(&reload) {
                Ok(reload)
            } else {
                Err(format!("reload status {reload}"))
            }
        })
        .await
    }

    /// Polls `/status` until it satisfies `check`; returns it whole.
    pub async fn wait_status(&self, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        crate::support::eventually(what, WAIT, || async {
            let status = http_get_json(self.addr, "/status").await?;
            if check(&status) {
                Ok(status)
            } else {
                Err(format!("status {status}"))
            }
        })
        .await
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        crate::support::http_get(self.addr, "/metrics")
            .await
            .unwrap_or_else(|e| panic!("GET /metrics: {e}"))
    }

    /// Cancels the operator and asserts that it exits, cleanly and promptly.
    pub async fn stop(self) {
        self.operator.stop().await;
    }
}

/// A loopback address nothing listens on (yet).
pub fn free_local_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}

/// `GET path` over plain HTTP/1.0, body parsed as JSON.
pub async fn http_get_json(addr: SocketAddr, path: &str) -> Result<Value, String> {
    let body = crate::support::http_get(addr, path).await?;
    serde_json::from_str(&body).map_err(|e| format!("GET {path}: {e}: {body}"))
}

/// The children of `rule` in `api`'s namespace.
pub async fn children<K>(api: &Api<K>, rule: &str) -> Vec<K>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&ListParams::default().labels(&format!("trellis.dev/rule={rule}")))
        .await
        .expect("list children")
        .items
}

/// Child name → (uid, resourceVersion): what any change or re-creation moves.
pub async fn fingerprints(cms: &Api<ConfigMap>, rule: &str) -> BTreeMap<String, (String, String)> {
    children(cms, rule)
        .await
        .iter()
        .map(|cm| {
            (
                cm.name_any(),
                (
                    cm.uid().unwrap_or_default(),
                    cm.resource_version().unwrap_or_default(),
                ),
            )
        })
        .collect()
}

/// Waits until `names` all exist as children of `rule` carrying `version`.
pub async fn wait_versions(cms: &Api<ConfigMap>, rule: &str, names: &[&str], version: &str) {
    crate::support::eventually(&format!("{names:?} at {version}"), WAIT, || async {
        let found: BTreeMap<String, Option<String>> = children(cms, rule)
            .await
            .iter()
            .map(|cm| (cm.name_any(), config_data(cm, "version")))
            .collect();
        let all = names
            .iter()
            .all(|n| found.get(*n).is_some_and(|v| v.as_deref() == Some(version)));
        if all { Ok(()) } else { Err(found) }
    })
    .await
}
