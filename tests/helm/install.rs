//! `helm install` of charts/trellis on the test cluster's node, then `helm
//! upgrade` with an edited rule.
//!
//! The cluster also runs tests/deploy.rs's trellis (every namespace, the
//! example kinds of demo.trellis.dev), so this release must not serve those
//! kinds: it serves the example WebApp rule moved to an API group of its own
//! (`rules.examples=false`, the rule in `rules.files`, `rbac.rules` from
//! `trellis rbac` for it, `manageCrds=true` so trellis applies the CRD) and
//! skips the chart's crds/. Its release name, hence its ClusterRole and
//! ClusterRoleBinding, is unique to the run; namespaced objects live in the
//! test's namespace.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, LogParams, Patch, PatchParams,
};
use kube::core::GroupVersionKind;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::{helm, rbac_namespaced_rules, rbac_rules, repo};
use crate::support;
use crate::support::node::{APP_IMAGE, node, pod_proxy_get, trellis_image};

const WAIT: Duration = Duration::from_secs(180);

/// One install: the API group its WebApp kind lives in (unique to the test,
/// so tests never share the cluster-scoped CRD), and the ServiceAccount the
/// rule acts as (`serviceAccountName`), if any.
#[derive(Clone, Copy)]
struct Setup {
    group: &'static str,
    account: Option<&'static str>,
}

/// The example WebApp rule and its template, moved to the setup's group
/// (and given its account); `edit` changes the rule text (for the upgrade).
fn rule_files(setup: Setup, edit: impl Fn(String) -> String) -> BTreeMap<String, String> {
    ["webapp.yaml", "templates/webapp-deployment.yaml.j2"]
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(repo().join("rules").join(path)).unwrap();
            let text = text.replace("demo.trellis.dev", setup.group);
            let text = match (path, setup.account) {
                ("webapp.yaml", None) => edit(text),
                ("webapp.yaml", Some(account)) => edit(text.replacen(
                    "\nspec:\n",
                    &format!("\nspec:\n  serviceAccountName: {account}\n"),
                    1,
                )),
                _ => text,
            };
            (path.to_string(), text)
        })
        .collect()
}

/// The release's values for `files`: the trellis image under test, our rule
/// and the RBAC `trellis rbac --manage-crds` prints for it (through
/// `charts/rbac-values` when the rule has its own account).
fn values(ns: &str, setup: Setup, files: &BTreeMap<String, String>) -> Value {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let file = dir.path().join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, text).unwrap();
    }
    let (repository, tag) = trellis_image().rsplit_once(':').expect("image NAME:TAG");
    let mut values = json!({
        "image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
        "namespaces": [ns],
        "manageCrds": true,
        "rules": {"examples": false, "files": files},
    });
    if setup.account.is_some() {
        let out = std::process::Command::new(repo().join("charts/rbac-values"))
            .arg("--manage-crds")
            .arg(dir.path())
            .env("TRELLIS", env!("CARGO_BIN_EXE_trellis"))
            .output()
            .expect("running charts/rbac-values");
        assert!(out.status.success(), "charts/rbac-values: {out:?}");
        let rbac: Value = serde_saphyr::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
        values["rbac"] = rbac["rbac"].clone();
        values["ruleServiceAccounts"] = rbac["ruleServiceAccounts"].clone();
    } else {
        let dir = dir.path().to_string_lossy();
        let args = ["--rules", &dir, "--manage-crds"];
        values["rbac"] = json!({
            "rules": rbac_rules(&args),
            "namespacedRules": rbac_namespaced_rules(&args),
        });
    }
    values
}

/// `helm ARGS` against the test cluster, values from `values`.
fn helm_on_cluster(args: &[&str], values: Option<&Value>) -> Result<String, String> {
    let kubeconfig = node()
        .kubeconfig_path
        .clone()
        .expect("a kubeconfig file for helm");
    let dir = tempfile::tempdir().unwrap();
    let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    all.push(format!("--kubeconfig={}", kubeconfig.display()));
    if let Some(values) = values {
        let file = dir.path().join("values.json");
        std::fs::write(&file, values.to_string()).unwrap();
        all.push(format!("--values={}", file.display()));
    }
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    helm(&all)
}

fn webapps(client: &Client, ns: &str, group: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(group, "v1", "WebApp");
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The release's Pods once `n` are Ready: name -> (uid, restart count).
async fn ready_pods(
    client: &Client,
    ns: &str,
    release: &str,
    n: usize,
) -> BTreeMap<String, (String, i32)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let selector = format!("app.kubernetes.io/instance={release}");
    support::eventually(&format!("{n} Ready trellis Pods"), WAIT, || async {
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| e.to_string())?;
        let ready: BTreeMap<String, (String, i32)> = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && pod_ready(p))
            .map(|p| {
                let restarts = p
                    .status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .map(|c| c.iter().map(|c| c.restart_count).sum())
                    .unwrap_or(0);
                (p.name_any(), (p.uid().unwrap_or_default(), restarts))
            })
            .collect();
        if ready.len() == n && list.items.len() == n {
            Ok(ready)
        } else {
            Err(format!("{} Pods, ready {ready:?}", list.items.len()))
        }
    })
    .await
}

/// The Pod named by the Lease's holder identity (`POD_suffix`).
async fn leader(client: &Client, ns: &str, lease: &str) -> Result<String, String> {
    let lease = Api::<Lease>::namespaced(client.clone(), ns)
        .get(lease)
        .await
        .map_err(|e| e.to_string())?;
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
        .ok_or("no holder")?;
    holder
        .rsplit_once('_')
        .map(|(p, _)| p.to_string())
        .ok_or(format!("holder {holder} is not POD_suffix"))
}

/// Uninstalls the release (its ClusterRole and binding go with it) when
/// dropped, so a failed run leaves no cluster-scoped objects behind.
struct Release(String, String);

impl Drop for Release {
    fn drop(&mut self) {
        let out = helm_on_cluster(&["uninstall", &self.0, "--namespace", &self.1], None);
        if let Err(e) = out {
            eprintln!("[helm] uninstall {}: {e}", self.0);
        }
    }
}

#[tokio::test]
async fn helm_install_runs_two_replicas_one_leader_and_an_upgraded_rule_reloads_without_restarts() {
    install_and_upgrade(Setup {
        group: "helm.test.trellis.dev",
        account: None,
    })
    .await;
}

/// The same with the rule acting as its own ServiceAccount, made by the
/// chart (`ruleServiceAccounts`): the operator's role holds no write on the
/// children, so the children exist only if the account's writes work.
#[tokio::test]
async fn helm_install_with_a_per_rule_service_account_writes_children_as_that_account() {
    install_and_upgrade(Setup {
        group: "helm-accounts.test.trellis.dev",
        account: Some("rule-webapp"),
    })
    .await;
}

async fn install_and_upgrade(setup: Setup) {
    let client = support::client().await;
    let ns = support::namespace().await;
    let release = support::unique_name("trellis-helm");
    let files = rule_files(setup, |t| t);
    let chart = repo().join("charts/trellis");
    let chart = chart.to_string_lossy();
    let install_values = values(ns.name(), setup, &files);
    if setup.account.is_some() {
        // The operator itself may read Deployments, never write them.
        let role = install_values["rbac"]["rules"].as_array().unwrap();
        let writes: Vec<&Value> = role
            .iter()
            .filter(|r| r["resources"].to_string().contains("deployments"))
            .filter(|r| {
                r["verbs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|v| v != "get" && v != "list" && v != "watch")
            })
            .collect();
        assert!(
            writes.is_empty(),
            "the operator's own role writes Deployments: {writes:?}"
        );
    }
    let started = Instant::now();
    helm_on_cluster(
        &[
            "install",
            &release,
            &chart,
            "--namespace",
            ns.name(),
            "--skip-crds",
        ],
        Some(&install_values),
    )
    .unwrap();
    let _release = Release(release.clone(), ns.name().to_string());

    // Two Pods Ready, one of them the leader.
    let pods = ready_pods(&client, ns.name(), &release, 2).await;
    let leader_pod = support::eventually("a Lease holder", WAIT, || {
        leader(&client, ns.name(), &release)
    })
    .await;
    assert!(
        pods.contains_key(&leader_pod),
        "the Lease names {leader_pod}, not one of {pods:?}"
    );
    println!(
        "[helm] install: 2 Ready Pods and a leader after {:?}",
        started.elapsed()
    );
    for pod in pods.keys() {
        let metrics = pod_proxy_get(&client, ns.name(), pod, 8080, "/metrics")
            .await
            .unwrap();
        let want = if *pod == leader_pod {
            "trellis_leader 1"
        } else {
            "trellis_leader 0"
        };
        assert!(metrics.contains(want), "{pod}: no `{want}` in /metrics");
    }
    // The chart's defaults as they run: JSON logs, the hardened container.
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    let logs = pods_api
        .logs(
            &leader_pod,
            &LogParams {
                tail_lines: Some(5),
                ..LogParams::default()
            },
        )
        .await
        .unwrap();
    assert!(!logs.trim().is_empty(), "{leader_pod} logged nothing");
    for line in logs.lines().filter(|l| !l.trim().is_empty()) {
        serde_json::from_str::<Value>(line)
            .unwrap_or_else(|e| panic!("a log line of {leader_pod} is not JSON ({e}): {line}"));
    }
    let pod = pods_api.get(&leader_pod).await.unwrap();
    let sc = pod.spec.unwrap().containers[0]
        .security_context
        .clone()
        .unwrap_or_default();
    assert_eq!(sc.read_only_root_filesystem, Some(true), "{sc:?}");
    assert_eq!(sc.allow_privilege_escalation, Some(false), "{sc:?}");

    // trellis applied the CRD (manageCrds); a WebApp is reconciled.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd_name = format!("webapps.{}", setup.group);
    support::eventually("the WebApp CRD established", WAIT, || async {
        let crd = crds.get(&crd_name).await.map_err(|e| e.to_string())?;
        let established = crd.status.and_then(|s| s.conditions).is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
        if established {
            Ok(())
        } else {
            Err("not established".to_string())
        }
    })
    .await;
    let parent: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{}/v1", setup.group), "kind": "WebApp",
        "metadata": {"name": "shop"},
        "spec": {"image": APP_IMAGE, "replicas": 1, "greeting": "hi"}
    }))
    .unwrap();
    let parents = webapps(&client, ns.name(), setup.group);
    support::eventually("the WebApp created", WAIT, || async {
        parents
            .patch(
                "shop",
                &PatchParams::apply("trellis-tests"),
                &Patch::Apply(&parent),
            )
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    let deployments: Api<Deployment> = ns.api();
    support::eventually("the shop Deployment Available", WAIT, || async {
        let d = deployments.get("shop").await.map_err(|e| e.to_string())?;
        let s = d.status.unwrap_or_default();
        if s.available_replicas == Some(1) {
            Ok(())
        } else {
            Err(format!("{s:?}"))
        }
    })
    .await;
    support::eventually("the WebApp Ready=True", WAIT, || async {
        let obj = parents.get("shop").await.map_err(|e| e.to_string())?;
        let ready = obj.data["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready").cloned());
        match ready {
            Some(c) if c["status"] == "True" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    println!(
        "[helm] install: the WebApp Ready after {:?}",
        started.elapsed()
    );
    let configs: Api<ConfigMap> = ns.api();
    let config = configs.get("shop-config").await.unwrap();
    assert_eq!(
        config
            .data
            .unwrap_or_default()
            .get("greeting")
            .map(String::as_str),
        Some("hi")
    );

    // `helm upgrade` with an edited rule: the children change, the Pods stay.
    let generation = deployments.get(&release).await.unwrap().metadata.generation;
    let edited = rule_files(setup, |t| {
        let from = "          greeting: {{ spec.greeting }}\n";
        assert!(
            t.contains(from),
            "the webapp rule's config child changed: update this test"
        );
        t.replace(
            from,
            &format!("{from}          upgraded: \"by helm upgrade\"\n"),
        )
    });
    let started = Instant::now();
    helm_on_cluster(
        &[
            "upgrade",
            &release,
            &chart,
            "--namespace",
            ns.name(),
            "--skip-crds",
        ],
        Some(&values(ns.name(), setup, &edited)),
    )
    .unwrap();
    support::eventually(
        "the edited rule's child (shop-config upgraded)",
        WAIT,
        || async {
            let cm = configs
                .get("shop-config")
                .await
                .map_err(|e| e.to_string())?;
            let data = cm.data.unwrap_or_default();
            match data.get("upgraded") {
                Some(v) if v == "by helm upgrade" => Ok(()),
                _ => Err(format!("{data:?}")),
            }
        },
    )
    .await;
    println!(
        "[helm] upgrade: the edited rule's child changed after {:?}",
        started.elapsed()
    );
    let after = ready_pods(&client, ns.name(), &release, 2).await;
    assert_eq!(
        after, pods,
        "the trellis Pods were replaced or restarted by the upgrade"
    );
    assert_eq!(
        deployments.get(&release).await.unwrap().metadata.generation,
        generation,
        "the upgrade changed the trellis Deployment's spec"
    );

    // Clean up while the operator runs: it releases the WebApp's finalizer.
    parents
        .delete("shop", &DeleteParams::default())
        .await
        .unwrap();
    support::eventually("the WebApp gone", WAIT, || async {
        match parents.get_opt("shop").await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err("still there".to_string()),
        }
    })
    .await;
    drop(_release);
    let _ = crds.delete(&crd_name, &DeleteParams::default()).await;
}
