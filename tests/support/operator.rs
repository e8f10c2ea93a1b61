//! Running `trellis run` in-process against the test control plane.
//!
//! ```ignore
//! let ns = support::namespace().await;
//! let app = TestKind::new("App");
//! let _cleanup = Cleanup::crds(&[&app]);
//! app.install(&ns.client).await;
//! let operator = Operator::start(&ns.client, ns.name(), &[&app.rule(RULE)]);
//! // ... create parents with `app.api(&ns)`, wait with `support::eventually`
//! operator.stop().await;
//! ```
//!
//! The operator watches only the test's namespace, so tests sharing the
//! cluster never see each other's parents. Custom kinds live in an API group
//! of their own per test ([`TestKind`]), so tests may run in parallel; the
//! [`Cleanup`] guard removes the cluster-scoped objects a test made (CRDs,
//! ClusterRoles, ...) even when it panics.

use std::fmt::Debug;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use kube::config::KubeConfigOptions;
use kube::{Client, Config, ResourceExt};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use trellis::operator::FINALIZER;

use super::TestNamespace;

/// How long a test waits for the operator to do something it should do.
pub const WAIT: Duration = Duration::from_secs(30);
/// How long a test watches for something that must not happen.
pub const QUIET: Duration = Duration::from_secs(3);

/// A custom kind of one test's own: a CRD in a unique API group, namespaced,
/// with the status subresource; spec and status take any fields.
#[derive(Clone)]
pub struct TestKind {
    pub group: String,
    pub kind: String,
    pub plural: String,
    pub resource: ApiResource,
}

impl TestKind {
    /// A kind named `kind` in a fresh group; its plural is the lowercase kind
    /// plus `s`, as `trellis rbac` guesses it. Give kinds plain names.
    pub fn new(kind: &str) -> TestKind {
        let group = format!("{}.trellis.test", super::unique_name("op"));
        TestKind::in_group(&group, kind)
    }

    /// Another kind in the group of `self`.
    pub fn sibling(&self, kind: &str) -> TestKind {
        TestKind::in_group(&self.group, kind)
    }

    /// A kind in a fixed group, for a CRD that stays installed across tests
    /// and runs (never hand it to [`Cleanup`]). The garbage collector learns
    /// of new kinds only every 30 s, so a test that needs it to act on a kind
    /// is quick only with a kind it already knows.
    pub fn lasting(group: &str, kind: &str) -> TestKind {
        TestKind::in_group(group, kind)
    }

    /// A kind named `kind` in `group`.
    pub fn in_group(group: &str, kind: &str) -> TestKind {
        let plural = format!("{}s", kind.to_ascii_lowercase());
        let gvk = GroupVersionKind::gvk(group, "v1", kind);
        TestKind {
            group: group.to_owned(),
            kind: kind.to_owned(),
            resource: ApiResource::from_gvk_with_plural(&gvk, &plural),
            plural,
        }
    }

    pub fn api_version(&self) -> String {
        format!("{}/v1", self.group)
    }

    pub fn crd_name(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }

    pub fn crd(&self) -> CustomResourceDefinition {
        let mut crd = self.crd_without_status_subresource();
        if let Some(version) = crd.spec.versions.first_mut() {
            version.subresources =
                Some(serde_json::from_value(json!({ "status": {} })).expect("subresources"));
        }
        crd
    }

    /// The CRD with status as a plain field: writing it bumps `generation`.
    pub fn crd_without_status_subresource(&self) -> CustomResourceDefinition {
        let open = json!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true });
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": { "name": self.crd_name() },
            "spec": {
                "group": self.group,
                "scope": "Namespaced",
                "names": {
                    "plural": self.plural,
                    "singular": self.kind.to_ascii_lowercase(),
                    "kind": self.kind,
                    "listKind": format!("{}List", self.kind),
                },
                "versions": [{
                    "name": "v1",
                    "served": true,
                    "storage": true,
                    "schema": { "openAPIV3Schema": {
                        "type": "object",
                        "properties": { "spec": open, "status": open },
                    }},
                }],
            },
        }))
        .expect("valid CRD")
    }

    /// Applies the CRD and waits until it is Established.
    pub async fn install(&self, client: &Client) {
        super::apply_crd(client, &self.crd()).await;
    }

    pub fn api(&self, ns: &TestNamespace) -> Api<DynamicObject> {
        Api::namespaced_with(ns.client.clone(), ns.name(), &self.resource)
    }

    /// Creates an object of this kind with `spec` (and optional annotations).
    pub async fn create(
        &self,
        ns: &TestNamespace,
        name: &str,
        spec: Value,
        annotations: &[(&str, &str)],
    ) -> DynamicObject {
        let mut obj = DynamicObject::new(name, &self.resource)
            .within(ns.name())
            .data(json!({ "spec": spec }));
        if !annotations.is_empty() {
            obj.metadata.annotations = Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
        }
        self.api(ns)
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("creating {} {name}: {e}", self.kind))
    }

    /// Creates an object of this kind in namespace `ns` through a raw
    /// request, for objects the typed client cannot decode (a spec nested
    /// past serde_json's depth limit: the response holds it too).
    pub async fn create_raw(
        &self,
        client: &Client,
        ns: &str,
        name: &str,
        spec: Value,
        finalizers: &[&str],
    ) {
        let body = json!({
            "apiVersion": self.api_version(),
            "kind": self.kind,
            "metadata": {"name": name, "namespace": ns, "finalizers": finalizers},
            "spec": spec,
        });
        let url = format!("/apis/{}/v1/namespaces/{ns}/{}", self.group, self.plural);
        let req = kube::core::Request::new(url)
            .create(
                &PostParams::default(),
                serde_json::to_vec(&body).expect("json"),
            )
            .expect("request");
        client
            .request_text(req)
            .await
            .unwrap_or_else(|e| panic!("creating {} {name}: {e}", self.kind));
    }

    /// Merge-patches an object of this kind.
    pub async fn patch(&self, ns: &TestNamespace, name: &str, patch: Value) -> DynamicObject {
        self.api(ns)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("patching {} {name}: {e}", self.kind))
    }

    /// A rule text with `@API_VERSION@` and `@KIND@` replaced by this kind's.
    pub fn rule(&self, text: &str) -> String {
        text.replace("@API_VERSION@", &self.api_version())
            .replace("@KIND@", &self.kind)
    }
}

/// Compiles rule texts (one rule file each), panicking with the diagnostics.
pub fn rule_set(rules: &[&str]) -> trellis::rules::RuleSet {
    let dir = tempfile::tempdir().expect("temp dir for rules");
    for (i, text) in rules.iter().enumerate() {
        std::fs::write(dir.path().join(format!("rule-{i}.yaml")), text).expect("write rule");
    }
    trellis::rules::RuleSet::load(&[dir.path().to_path_buf()], Default::default()).unwrap_or_else(
        |diags| {
            let text: Vec<String> = diags.iter().map(|d| d.to_string()).collect();
            panic!("test rules do not load:\n{}", text.join("\n"))
        },
    )
}

/// `trellis run` in a task of the test's runtime, watching one namespace.
pub struct Operator {
    cancel: CancellationToken,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl Operator {
    /// Loads `rules` (one rule file each) and starts the operator with `client`,
    /// watching only `namespace`.
    pub fn start(client: &Client, namespace: &str, rules: &[&str]) -> Operator {
        let mut options = trellis::operator::Options::new(vec![], vec![namespace.to_owned()]);
        options.concurrency = 16;
        options.instance = "test".into();
        Operator::spawn(options, rule_set(rules), client)
    }

    /// Starts the operator on `rules` with `options` and `client`.
    pub fn spawn(
        options: trellis::operator::Options,
        rules: trellis::rules::RuleSet,
        client: &Client,
    ) -> Operator {
        // Its log is kept for the message of a wait that times out.
        let _ = super::logs::Logs::get();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(trellis::operator::run_with(
            options,
            rules,
            client.clone(),
            cancel.clone(),
        ));
        Operator {
            cancel,
            task: Some(task),
        }
    }

    /// Cancels the operator and asserts that it exits, cleanly and promptly.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        let task = self.task.take().expect("operator task");
        match tokio::time::timeout(WAIT, task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => panic!("the operator failed: {e:#}"),
            Ok(Err(e)) => panic!("the operator task panicked: {e}"),
            Err(_) => panic!("the operator did not stop within {WAIT:?} of being cancelled"),
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        // A test that panicked never called `stop`.
        self.cancel.cancel();
    }
}

/// A fresh parent kind, its CRD installed and removed at the end.
pub async fn install_kind(ns: &TestNamespace, kind: &str) -> (TestKind, Cleanup) {
    let test_kind = TestKind::new(kind);
    let cleanup = Cleanup::crds(&[&test_kind]);
    test_kind.install(&ns.client).await;
    (test_kind, cleanup)
}

/// Installs a fresh kind named `kind` and starts the operator with `rule`
/// for it (see [`TestKind::rule`]), watching the test's namespace.
pub async fn start_with_new_kind(
    ns: &TestNamespace,
    kind: &str,
    rule: &str,
) -> (TestKind, Cleanup, Operator) {
    let (kind, cleanup) = install_kind(ns, kind).await;
    let operator = Operator::start(&ns.client, ns.name(), &[&kind.rule(rule)]);
    (kind, cleanup, operator)
}

/// `data[key]` of a ConfigMap.
pub fn config_data(cm: &ConfigMap, key: &str) -> Option<String> {
    cm.data.as_ref().and_then(|d| d.get(key)).cloned()
}

/// Cluster-scoped objects a test made, deleted when dropped (also on panic).
#[derive(Default)]
pub struct Cleanup {
    objects: Vec<(ApiResource, String)>,
}

impl Cleanup {
    /// Deletes the CRDs of `kinds` at the end (their objects go with them).
    pub fn crds(kinds: &[&TestKind]) -> Cleanup {
        let mut cleanup = Cleanup::default();
        for kind in kinds {
            cleanup.add::<CustomResourceDefinition>(&kind.crd_name());
        }
        cleanup
    }

    pub fn add<K>(&mut self, name: &str)
    where
        K: kube::Resource<DynamicType = ()>,
    {
        self.objects
            .push((ApiResource::erase::<K>(&()), name.to_owned()));
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.objects.is_empty() {
            return;
        }
        let objects = std::mem::take(&mut self.objects);
        let kubeconfig = super::cluster().kubeconfig.clone();
        // The test's runtime may be gone or unwinding: use a runtime of our own.
        let result = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                let config =
                    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                        .await
                        .map_err(|e| e.to_string())?;
                let client = Client::try_from(config).map_err(|e| e.to_string())?;
                let mut errors = Vec::new();
                for (resource, name) in objects {
                    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
                    match api.delete(&name, &DeleteParams::background()).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(e) => errors.push(format!("{} {name}: {e}", resource.kind)),
                    }
                }
                if errors.is_empty() {
                    Ok(())
                } else {
                    Err(errors.join("; "))
                }
            })
        })
        .join();
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("[support] cleanup: {e}"),
            Err(_) => eprintln!("[support] cleanup panicked"),
        }
    }
}

/// A client that acts as `user` (through impersonation by the admin client).
pub async fn impersonating(user: &str) -> Client {
    let kubeconfig = super::cluster().kubeconfig.clone();
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("client config");
    config.auth_info.impersonate = Some(user.to_owned());
    Client::try_from(config).expect("impersonating client")
}

/// Creates `role` (a ClusterRole manifest, e.g. what `trellis rbac` prints)
/// and binds it to the ServiceAccount `trellis` of the test's namespace;
/// returns a client acting as it, once the authorizer allows it `probe`
/// (it learns of new bindings through a watch). Both are removed by `cleanup`.
pub async fn service_account_with_role(
    ns: &TestNamespace,
    role: Value,
    probe: ResourceAttributes,
    cleanup: &mut Cleanup,
) -> Client {
    let role: ClusterRole = serde_json::from_value(role).expect("ClusterRole");
    let name = role
        .metadata
        .name
        .clone()
        .expect("the ClusterRole has a name");
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "trellis", "namespace": ns.name()}],
    }))
    .expect("ClusterRoleBinding");
    cleanup.add::<ClusterRole>(&name);
    cleanup.add::<ClusterRoleBinding>(&name);
    Api::<ClusterRole>::all(ns.client.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("create ClusterRole");
    Api::<ClusterRoleBinding>::all(ns.client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("create ClusterRoleBinding");

    let client = impersonating(&format!("system:serviceaccount:{}:trellis", ns.name())).await;
    wait_allowed(&client, probe).await;
    client
}

/// Waits until `client` may do `what`: the authorizer learns of new
/// bindings through a watch.
pub async fn wait_allowed(client: &Client, what: ResourceAttributes) {
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    super::eventually("the new binding to take effect", WAIT, || async {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(what.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = reviews
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| e.to_string())?;
        answer
            .status
            .is_some_and(|s| s.allowed)
            .then_some(())
            .ok_or("not allowed yet".to_owned())
    })
    .await;
}

/// The condition `type_` of an object's `.status.conditions`.
pub fn condition<'a>(obj: &'a DynamicObject, type_: &str) -> Option<&'a Value> {
    obj.data
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// `Ok((status, reason))` of a condition, or `Err` saying it is missing.
pub fn condition_state(obj: &DynamicObject, type_: &str) -> Result<(String, String), String> {
    let c = condition(obj, type_).ok_or_else(|| {
        format!(
            "no {type_} condition in status {}",
            obj.data.get("status").unwrap_or(&Value::Null)
        )
    })?;
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
    Ok((s("status"), s("reason")))
}

/// Polls `api` until the object `name` exists and `check` accepts it.
pub async fn wait_for<K, T, F>(api: &Api<K>, name: &str, what: &str, check: F) -> T
where
    K: Clone + serde::de::DeserializeOwned + Debug,
    F: Fn(&K) -> Result<T, String>,
{
    super::eventually(what, WAIT, || async {
        match api.get_opt(name).await {
            Ok(Some(obj)) => check(&obj),
            Ok(None) => Err(format!("{name} does not exist")),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
}

/// Polls `api` until the object `name` exists.
pub async fn wait_exists<K>(api: &Api<K>, name: &str) -> K
where
    K: Clone + serde::de::DeserializeOwned + Debug,
{
    wait_for(api, name, &format!("{name} to exist"), |o| Ok(o.clone())).await
}

/// Polls `api` until the object `name` is gone.
pub async fn wait_gone<K>(api: &Api<K>, name: &str, timeout: Duration)
where
    K: Clone + serde::de::DeserializeOwned + Debug,
{
    super::eventually(&format!("{name} to be gone"), timeout, || async {
        match api.get_opt(name).await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err(format!("{name} still exists")),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
}

/// Polls until the object `name` exists with `data[key]` equal to `value`.
pub async fn wait_data(
    api: &Api<ConfigMap>,
    name: &str,
    what: &str,
    key: &str,
    value: &str,
) -> ConfigMap {
    wait_for(api, name, what, |cm| {
        match config_data(cm, key).as_deref() {
            Some(v) if v == value => Ok(cm.clone()),
            other => Err(format!("{key} is {other:?}")),
        }
    })
    .await
}

/// Polls until the object `name` exists as another object than `old` (it
/// was deleted and made again); returns the new one.
pub async fn wait_recreated<K>(api: &Api<K>, name: &str, what: &str, old: &K) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + Debug,
{
    wait_for(api, name, what, |obj| {
        (obj.uid() != old.uid())
            .then(|| obj.clone())
            .ok_or_else(|| "still the old object".to_owned())
    })
    .await
}

/// Polls until the parent `name` has the condition `type_` at `status`.
pub async fn wait_condition(
    parents: &Api<DynamicObject>,
    name: &str,
    type_: &str,
    status: &str,
) -> DynamicObject {
    let what = format!("{type_}={status}");
    wait_for(parents, name, &what, |p| match condition_state(p, type_)? {
        (s, _) if s == status => Ok(p.clone()),
        other => Err(format!("{type_} is {other:?}")),
    })
    .await
}

/// Polls until the parent `name` has the condition `type_` at `status` for
/// `reason`.
pub async fn wait_condition_reason(
    parents: &Api<DynamicObject>,
    name: &str,
    type_: &str,
    status: &str,
    reason: &str,
) -> DynamicObject {
    let what = format!("{type_}={status}/{reason}");
    wait_for(parents, name, &what, |p| match condition_state(p, type_)? {
        (s, r) if s == status && r == reason => Ok(p.clone()),
        other => Err(format!("{type_} is {other:?}")),
    })
    .await
}

/// Polls until the parent `name` is `Synced=False` for `ApplyError` (a
/// child refused: someone else's object), and returns that condition's message.
pub async fn wait_refused(parents: &Api<DynamicObject>, name: &str) -> String {
    let parent = wait_condition_reason(parents, name, "Synced", "False", "ApplyError").await;
    condition(&parent, "Synced")
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// Polls until the parent `name` is `Ready=True` and `Synced=True` at once,
/// for its current generation.
pub async fn wait_ready_and_synced(parents: &Api<DynamicObject>, name: &str) {
    wait_for(parents, name, "Ready=True and Synced=True", |p| {
        // Should it time out, the conditions say which child holds it back.
        super::converge::parent_converged(p)
            .then_some(())
            .ok_or_else(|| super::converge::describe(p))
    })
    .await
}

/// Whether `obj` carries trellis's finalizer.
pub fn has_finalizer(obj: &DynamicObject) -> bool {
    obj.finalizers().iter().any(|f| f == FINALIZER)
}

/// Polls until the parent `name` carries trellis's finalizer.
pub async fn wait_finalizer(parents: &Api<DynamicObject>, name: &str) {
    wait_for(parents, name, "trellis's finalizer", |p| {
        has_finalizer(p)
            .then_some(())
            .ok_or(format!("finalizers {:?}", p.finalizers()))
    })
    .await
}

/// Polls until the parent `name` no longer carries trellis's finalizer.
pub async fn wait_finalizer_released(parents: &Api<DynamicObject>, name: &str) {
    wait_for(parents, name, "the finalizer released", |p| {
        (!has_finalizer(p))
            .then_some(())
            .ok_or(format!("finalizers {:?}", p.finalizers()))
    })
    .await
}

/// Polls the namespace's Events until one satisfies `matches`.
pub async fn wait_event(ns: &TestNamespace, what: &str, matches: impl Fn(&Event) -> bool) {
    let events: Api<Event> = ns.api();
    super::eventually(what, WAIT, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .iter()
            .any(&matches)
            .then_some(())
            .ok_or_else(|| format!("{} events, none matching", list.items.len()))
    })
    .await
}

/// Asserts that the object `name` does not exist.
pub async fn assert_absent<K>(api: &Api<K>, name: &str, why: &str)
where
    K: Clone + serde::de::DeserializeOwned + Debug,
{
    let found = api.get_opt(name).await.expect("GET");
    assert!(found.is_none(), "{name} exists, but {why}: {found:?}");
}

/// Log lines written while it is installed, on the current thread only (so
/// use it in a `current_thread` test, where the operator's tasks run too).
pub struct LogCapture {
    lines: super::logs::Buffer,
    _guard: tracing::subscriber::DefaultGuard,
}

impl LogCapture {
    pub fn start() -> LogCapture {
        let lines = super::logs::Buffer::default();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter("info,trellis=debug")
            .with_ansi(false)
            .with_writer(lines.writer())
            .finish();
        LogCapture {
            lines,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lines()
    }
}

/// Takes trellis's finalizer off every parent of `resource` left in `ns`
/// of the hub: a test that failed midway would otherwise leave parents, and
/// their CRD, undeletable once the operator is gone, holding up the shared
/// cluster's CRD finalizer for every test. For a `Drop`: runs on a thread
/// of its own.
pub fn release_parents(ns: &str, resource: &kube::discovery::ApiResource) {
    let (namespace, resource) = (ns.to_owned(), resource.clone());
    let kubeconfig = super::cluster().kubeconfig.clone();
    let _ = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        rt.block_on(async {
            let config = Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .ok()?;
            let client = Client::try_from(config).ok()?;
            let api: kube::Api<kube::api::DynamicObject> =
                kube::Api::namespaced_with(client, &namespace, &resource);
            for parent in api.list(&Default::default()).await.ok()?.items {
                let patch = json!({"metadata": {"finalizers": null}});
                let _ = api
                    .patch(
                        &parent.name_any(),
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(&patch),
                    )
                    .await;
            }
            Some(())
        })
    })
    .join();
}
