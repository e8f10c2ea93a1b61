//! `examples/deploy/` on the test cluster's node, applied as users apply it
//! (`kubectl apply -k`, through an overlay that sets only the image): two
//! replicas and one leader, a webapp child that becomes Available, rules
//! ConfigMap edits that the kubelet delivers and trellis reloads, a broken edit
//! that changes nothing and is visible from outside the Pod, leader hand-over,
//! the Pod's confinement, and the quickstart's sample parents ending Ready
//! (`deploy/samples.rs`).
//!
//! The deployment is cluster-wide (namespace trellis-system, ClusterRole
//! trellis), so the tests here take turns ([`DEPLOY`]) and each starts by
//! applying it again (a no-op when it runs already). It stays deployed after
//! the run. Measured times are printed (`cargo test --test deploy -- --nocapture`).

mod support;

#[path = "deploy/conversion.rs"]
mod deploy_conversion;
#[path = "deploy/rollout.rs"]
mod deploy_rollout;
#[path = "deploy/samples.rs"]
mod deploy_samples;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use support::node::{APP_IMAGE, node, pod_proxy_get, trellis_image};
use tokio::sync::Mutex;

/// One test at a time owns the deployment.
static DEPLOY: Mutex<()> = Mutex::const_new(());

const NS: &str = "trellis-system";
const WAIT: Duration = Duration::from_secs(120);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `kubectl ARGS` against the test cluster, with `stdin`; stdout on success.
fn kubectl(args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    let cluster = node();
    let kubectl = Command::new(support::cluster_script())
        .arg("bin")
        .output()
        .map_err(|e| e.to_string())?;
    let bin = PathBuf::from(String::from_utf8_lossy(&kubectl.stdout).trim()).join("kubectl");
    let kubeconfig = cluster.kubeconfig_path.clone().expect("a kubeconfig file");
    let mut child = Command::new(&bin)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    if let Some(mut pipe) = child.stdin.take() {
        pipe.write_all(stdin.unwrap_or("").as_bytes())
            .map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    } else {
        Err(format!(
            "kubectl {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `to` relative to `from` (both absolute), for kustomize, which accepts only
/// relative resource paths.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<Component> = from.components().collect();
    let to: Vec<Component> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path = PathBuf::new();
    for _ in common..from.len() {
        path.push("..");
    }
    for c in &to[common..] {
        path.push(c.as_os_str());
    }
    path
}

/// Apply the example CRDs and `examples/deploy/` (an overlay that sets only
/// the image), then wait for 2 Ready replicas and a Lease holder. Returns the
/// Pods' names.
async fn deploy(client: &Client) -> Vec<String> {
    deploy_from(client, "examples/deploy", 2).await
}

/// [`deploy`] of the kustomization in `dir` (examples/deploy or an overlay
/// of it), waiting for `replicas` Ready Pods.
async fn deploy_from(client: &Client, dir: &str, replicas: usize) -> Vec<String> {
    let image = trellis_image();
    let (name, tag) = image.rsplit_once(':').expect("image NAME:TAG");
    for crd in ["webapp", "database", "tenant"] {
        let path = repo().join(format!("examples/crds/{crd}.yaml"));
        kubectl(
            &["apply", "--server-side", "-f", &path.to_string_lossy()],
            None,
        )
        .unwrap();
    }
    kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=60s",
        ],
        None,
    )
    .unwrap();
    let overlay = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{}-overlay", dir.rsplit('/').next().unwrap_or(dir)));
    std::fs::create_dir_all(&overlay).unwrap();
    let overlay = overlay.canonicalize().unwrap();
    let base = relative(&overlay, &repo().join(dir).canonicalize().unwrap());
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "resources: [{}]\nimages:\n  - name: trellis\n    newName: {name}\n    newTag: \"{tag}\"\n",
            base.display()
        ),
    )
    .unwrap();
    kubectl(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-k",
            &overlay.to_string_lossy(),
        ],
        None,
    )
    .unwrap();
    wait_ready_replicas(client, replicas).await
}

async fn wait_ready_replicas(client: &Client, n: usize) -> Vec<String> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    support::eventually(
        &format!("{n} Ready trellis Pods of the current template"),
        WAIT,
        || async {
            let d = deployments
                .get("trellis")
                .await
                .map_err(|e| e.to_string())?;
            let s = d.status.clone().unwrap_or_default();
            let generation = d.metadata.generation.unwrap_or(0);
            if s.observed_generation.unwrap_or(0) < generation
                || s.updated_replicas.unwrap_or(0) < n as i32
                || s.ready_replicas.unwrap_or(0) < n as i32
                || s.replicas.unwrap_or(0) != n as i32
            {
                return Err(format!("status {s:?}"));
            }
            let list = pods
                .list(&ListParams::default().labels("app.kubernetes.io/name=trellis"))
                .await
                .map_err(|e| e.to_string())?;
            let ready: Vec<String> = list
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none() && pod_ready(p))
                .map(|p| p.name_any())
                .collect();
            if ready.len() == n {
                Ok(ready)
            } else {
                Err(format!("ready pods {ready:?}"))
            }
        },
    )
    .await
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The Lease's holder identity (`POD_NAME_suffix`) and the Pod it names.
async fn leader(client: &Client) -> Result<(String, String), String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    let lease = leases.get("trellis").await.map_err(|e| e.to_string())?;
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
        .ok_or("no holder")?;
    let pod = holder
        .rsplit_once('_')
        .map(|(p, _)| p.to_string())
        .ok_or(format!("holder {holder} is not POD_suffix"))?;
    Ok((holder, pod))
}

async fn status_of(client: &Client, pod: &str) -> Result<Value, String> {
    let body = pod_proxy_get(client, NS, pod, 8080, "/status").await?;
    serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))
}

#[tokio::test]
async fn examples_deploy_comes_up_with_two_ready_replicas_and_one_leader() {
    let _turn = DEPLOY.lock().await;
    let client = support::client().await;
    let started = Instant::now();
    let pods = deploy(&client).await;
    println!(
        "[deploy] 2 Ready replicas {:?} after apply",
        started.elapsed()
    );
    let (holder, leader_pod) =
        support::eventually("a Lease holder", WAIT, || leader(&client)).await;
    assert!(
        pods.contains(&leader_pod),
        "the Lease names {holder}, not one of the Pods {pods:?}"
    );
    for pod in &pods {
        let status = status_of(&client, pod).await.unwrap();
        let is_leader = status["leader"]["leader"] == json!(true);
        assert_eq!(
            is_leader,
            *pod == leader_pod,
            "{pod}: /status leader section {} (Lease holder {holder})",
            status["leader"]
        );
        let readyz = pod_proxy_get(&client, NS, pod, 8080, "/readyz")
            .await
            .unwrap();
        assert_eq!(
            readyz.contains("standby"),
            *pod != leader_pod,
            "{pod}: /readyz says {readyz:?}"
        );
        let metrics = pod_proxy_get(&client, NS, pod, 8080, "/metrics")
            .await
            .unwrap();
        let gauge = if is_leader {
            "trellis_leader 1"
        } else {
            "trellis_leader 0"
        };
        assert!(metrics.contains(gauge), "{pod}: no `{gauge}` in /metrics");
    }
    // JSON logs in the container.
    let logs = kubectl(&["logs", "-n", NS, &leader_pod, "--tail=5"], None).unwrap();
    for line in logs.lines().filter(|l| !l.trim().is_empty()) {
        serde_json::from_str::<Value>(line)
            .unwrap_or_else(|e| panic!("a log line of {leader_pod} is not JSON ({e}): {line}"));
    }
}

/// The host PID of the trellis process in `pod` (this test runs on the node).
fn host_pid(pod_uid: &str) -> u32 {
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if !cmdline.starts_with(b"/usr/local/bin/trellis\0run") {
            continue;
        }
        let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
        if cgroup.contains(&pod_uid.replace('-', "_")) || cgroup.contains(pod_uid) {
            return pid;
        }
    }
    panic!("no trellis process of pod {pod_uid} on this host")
}

#[tokio::test]
async fn the_trellis_pod_runs_as_nonroot_with_a_read_only_root_and_no_shell() {
    let _turn = DEPLOY.lock().await;
    let client = support::client().await;
    let pods = deploy(&client).await;
    let pod: Pod = Api::namespaced(client.clone(), NS)
        .get(&pods[0])
        .await
        .unwrap();
    let pid = host_pid(&pod.uid().unwrap());
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uid.split_whitespace().skip(1).all(|u| u == "65532"),
        "trellis runs as {uid}"
    );
    let caps = status.lines().find(|l| l.starts_with("CapEff:")).unwrap();
    assert!(
        caps.ends_with("0000000000000000"),
        "capabilities left: {caps}"
    );
    let nnp = status
        .lines()
        .find(|l| l.starts_with("NoNewPrivs:"))
        .unwrap();
    assert!(nnp.ends_with('1'), "{nnp}");
    let seccomp = status.lines().find(|l| l.starts_with("Seccomp:")).unwrap();
    assert!(seccomp.ends_with('2'), "no seccomp filter: {seccomp}");
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .expect("a root mount");
    let options = root.split_whitespace().nth(5).unwrap_or_default();
    assert!(
        options.split(',').any(|o| o == "ro"),
        "root filesystem mounted {options}: {root}"
    );
    let shell = kubectl(
        &["exec", "-n", NS, &pods[0], "--", "/bin/sh", "-c", "true"],
        None,
    );
    assert!(
        shell.is_err(),
        "a shell ran in the trellis image: {shell:?}"
    );
    let err = shell.unwrap_err();
    assert!(
        err.contains("no such file") || err.contains("not found"),
        "exec failed, not for want of a shell: {err}"
    );
}

fn webapps(client: &Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("demo.trellis.dev", "v1", "WebApp");
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

fn ready_condition(obj: &DynamicObject) -> Option<(String, String)> {
    let conditions = obj.data["status"]["conditions"].as_array()?;
    let ready = conditions.iter().find(|c| c["type"] == "Ready")?;
    Some((
        ready["status"].as_str()?.to_string(),
        ready["message"].as_str().unwrap_or_default().to_string(),
    ))
}

#[tokio::test]
async fn a_webapp_deployment_child_becomes_available_and_the_parent_ready() {
    let _turn = DEPLOY.lock().await;
    let client = support::client().await;
    deploy(&client).await;
    let ns = support::namespace().await;
    let started = Instant::now();
    let parent: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "demo.trellis.dev/v1",
        "kind": "WebApp",
        "metadata": {"name": "shop"},
        "spec": {"image": APP_IMAGE, "replicas": 2, "greeting": "hi"}
    }))
    .unwrap();
    webapps(&client, ns.name())
        .patch(
            "shop",
            &PatchParams::apply("trellis-tests"),
            &Patch::Apply(&parent),
        )
        .await
        .unwrap();
    let deployments: Api<Deployment> = ns.api();
    support::eventually("the shop Deployment Available", WAIT, || async {
        let d = deployments.get("shop").await.map_err(|e| e.to_string())?;
        let s = d.status.unwrap_or_default();
        if s.available_replicas == Some(2) {
            Ok(())
        } else {
            Err(format!("{s:?}"))
        }
    })
    .await;
    let available = started.elapsed();
    let message = support::eventually("the WebApp Ready=True", WAIT, || async {
        let obj = webapps(&client, ns.name())
            .get("shop")
            .await
            .map_err(|e| e.to_string())?;
        match ready_condition(&obj) {
            Some((s, m)) if s == "True" => Ok(m),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    println!(
        "[deploy] webapp child Available after {available:?}, parent Ready=True after {:?} ({message})",
        started.elapsed()
    );
}

/// The rules ConfigMap as committed (examples/deploy/rules.yaml).
fn committed_rules() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(repo().join("examples/deploy/rules.yaml")).unwrap();
    let cm: ConfigMap = serde_saphyr::from_str(&text).unwrap();
    cm.data.unwrap_or_default().into_iter().collect()
}

async fn set_rules(client: &Client, data: &BTreeMap<String, String>) {
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "trellis-rules", "namespace": NS},
        "data": data,
    });
    Api::<ConfigMap>::namespaced(client.clone(), NS)
        .patch(
            "trellis-rules",
            &PatchParams::apply("trellis-tests-edit").force(),
            &Patch::Apply(&cm),
        )
        .await
        .unwrap();
}

/// Every child's (kind/name -> version) in `ns`: a ConfigMap's resourceVersion,
/// a Deployment's generation (its status changes as its Pods come and go;
/// only a spec change bumps the generation).
async fn child_versions(client: &Client, ns: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    for cm in cms.list(&ListParams::default()).await.unwrap() {
        if cm.name_any() != "kube-root-ca.crt" {
            out.insert(
                format!("ConfigMap/{}", cm.name_any()),
                cm.resource_version().unwrap(),
            );
        }
    }
    let ds: Api<Deployment> = Api::namespaced(client.clone(), ns);
    for d in ds.list(&ListParams::default()).await.unwrap() {
        let generation = d.metadata.generation.unwrap_or(0).to_string();
        out.insert(format!("Deployment/{}", d.name_any()), generation);
    }
    out
}

#[tokio::test]
async fn rules_configmap_edits_reload_in_the_pods_and_a_broken_edit_changes_nothing() {
    let _turn = DEPLOY.lock().await;
    let client = support::client().await;
    let pods = deploy(&client).await;
    let ns = support::namespace().await;
    let parent: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "demo.trellis.dev/v1", "kind": "WebApp",
        "metadata": {"name": "blog"},
        "spec": {"image": APP_IMAGE, "replicas": 1, "greeting": "hi"}
    }))
    .unwrap();
    webapps(&client, ns.name())
        .patch(
            "blog",
            &PatchParams::apply("trellis-tests"),
            &Patch::Apply(&parent),
        )
        .await
        .unwrap();
    let cms: Api<ConfigMap> = ns.api();
    // deploy() re-applied the committed rules; an earlier run may have left an
    // edit in force: wait until every Pod runs the committed set.
    for pod in &pods {
        support::eventually(
            &format!("{pod} running the committed rules"),
            WAIT,
            || async {
                let s = status_of(&client, pod).await?;
                if s["reload"]["ok"] == json!(true) {
                    Ok(())
                } else {
                    Err(format!("{}", s["reload"]))
                }
            },
        )
        .await;
    }
    support::eventually(
        "the blog-config child, from the committed rules",
        WAIT,
        || async {
            let cm = cms.get("blog-config").await.map_err(|e| e.to_string())?;
            match cm.data.unwrap_or_default().get("edited") {
                None => Ok(()),
                Some(v) => Err(format!("edited = {v:?} (an earlier edit still in force)")),
            }
        },
    )
    .await;

    // A good edit: the config child gains a key.
    let good = committed_rules();
    let mut edited = good.clone();
    let webapp = edited
        .get_mut("webapp.yaml")
        .expect("webapp.yaml in the ConfigMap");
    let before = "          greeting: {{ spec.greeting }}\n";
    assert!(
        webapp.contains(before),
        "the webapp rule's config template changed; adapt the test"
    );
    *webapp = webapp.replace(before, &format!("{before}          edited: \"yes\"\n"));
    let started = Instant::now();
    set_rules(&client, &edited).await;
    support::eventually("the edited rule's key in blog-config", WAIT, || async {
        let cm = cms.get("blog-config").await.map_err(|e| e.to_string())?;
        match cm.data.unwrap_or_default().get("edited") {
            Some(v) if v == "yes" => Ok(()),
            other => Err(format!("edited = {other:?}")),
        }
    })
    .await;
    println!(
        "[deploy] ConfigMap edit -> kubelet volume swap -> reload -> child updated: {:?}",
        started.elapsed()
    );

    // A broken edit: rejected as a whole, visible from outside the Pod.
    let (_, leader_pod) = support::eventually("a Lease holder", WAIT, || leader(&client)).await;
    let failures_before = status_of(&client, &leader_pod).await.unwrap()["reload"]["failures"]
        .as_u64()
        .unwrap_or(0);
    let children_before = child_versions(&client, ns.name()).await;
    let mut broken = edited.clone();
    broken.insert(
        "webapp.yaml".into(),
        edited["webapp.yaml"].replace("kind: Deployment", "kind: [not, a, kind"),
    );
    let started = Instant::now();
    set_rules(&client, &broken).await;
    let status = support::eventually(
        "the rejected reload in /status (through the pod proxy)",
        WAIT,
        || async {
            let s = status_of(&client, &leader_pod).await?;
            if s["reload"]["ok"] == json!(false)
                && s["reload"]["failures"].as_u64().unwrap_or(0) > failures_before
            {
                Ok(s)
            } else {
                Err(format!("{}", s["reload"]))
            }
        },
    )
    .await;
    println!(
        "[deploy] broken edit rejected after {:?}: {}",
        started.elapsed(),
        status["reload"]["error"]
    );
    let error = status["reload"]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("webapp.yaml"),
        "the error names no file: {error}"
    );
    let metrics = pod_proxy_get(&client, NS, &leader_pod, 8080, "/metrics")
        .await
        .unwrap();
    assert!(
        metrics.contains("trellis_rule_reload_last_success 0"),
        "no `trellis_rule_reload_last_success 0` in /metrics"
    );
    let logs = kubectl(&["logs", "-n", NS, &leader_pod, "--since=5m"], None).unwrap();
    assert!(
        logs.lines().any(
            |l| l.contains("webapp.yaml") && l.contains("\"level\":\"ERROR\"")
                || l.contains("webapp.yaml") && l.contains("\"level\":\"WARN\"")
        ),
        "no log line about the rejected webapp.yaml"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let children_after = child_versions(&client, ns.name()).await;
    assert_eq!(
        children_before, children_after,
        "the broken edit changed children"
    );

    set_rules(&client, &good).await;
    support::eventually("the committed rules in force again", WAIT, || async {
        let s = status_of(&client, &leader_pod).await?;
        if s["reload"]["ok"] == json!(true) {
            Ok(())
        } else {
            Err(format!("{}", s["reload"]))
        }
    })
    .await;
}

#[tokio::test]
async fn the_standby_takes_over_when_the_leader_pod_is_deleted_or_killed() {
    let _turn = DEPLOY.lock().await;
    let client = support::client().await;
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), NS);
    deploy(&client).await;
    let (holder, leader_pod) =
        support::eventually("a Lease holder", WAIT, || leader(&client)).await;

    // SIGTERM (a Pod deletion) releases the Lease: the standby takes it at once.
    let started = Instant::now();
    pods_api
        .delete(&leader_pod, &DeleteParams::default())
        .await
        .unwrap();
    let (new_holder, new_pod) = support::eventually("a new Lease holder", WAIT, || async {
        match leader(&client).await {
            Ok((h, p)) if h != holder && p != leader_pod => Ok((h, p)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let handoff = started.elapsed();
    println!("[deploy] leader Pod deleted (SIGTERM): {new_pod} leads after {handoff:?}");
    assert!(
        handoff <= Duration::from_secs(5),
        "SIGTERM hand-over took {handoff:?} (target 2 s)"
    );

    // A crash (SIGKILL, no release): the standby waits out the lease (15 s).
    let pods = wait_ready_replicas(&client, 2).await;
    assert!(pods.contains(&new_pod));
    let pod: Pod = pods_api.get(&new_pod).await.unwrap();
    let pid = host_pid(&pod.uid().unwrap());
    let started = Instant::now();
    let killed = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success(), "kill -9 {pid}");
    let (_, after_crash) = support::eventually("a Lease holder after the crash", WAIT, || async {
        match leader(&client).await {
            Ok((h, p)) if h != new_holder => Ok((h, p)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let gap = started.elapsed();
    println!("[deploy] leader killed (SIGKILL): {after_crash} leads after {gap:?}");
    assert!(
        gap <= Duration::from_secs(20),
        "takeover after a crash took {gap:?}"
    );
}

#[test]
fn the_rules_configmap_holds_every_rules_file_and_the_deployment_mounts_each_at_its_path() {
    let root = repo().join("rules");
    let mut files = BTreeMap::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path
                    .strip_prefix(&root)
                    .unwrap()
                    .to_string_lossy()
                    .to_string();
                files.insert(rel, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    let data = committed_rules();
    let want: BTreeMap<String, String> = files
        .iter()
        .map(|(p, t)| (p.replace('/', "."), t.clone()))
        .collect();
    assert_eq!(
        data, want,
        "examples/deploy/rules.yaml is stale: regenerate it with \
         `examples/deploy/rules-configmap rules/ > examples/deploy/rules.yaml`"
    );
    let text = std::fs::read_to_string(repo().join("examples/deploy/trellis.yaml")).unwrap();
    let deployment: Value = text
        .split("\n---\n")
        .filter_map(|doc| serde_saphyr::from_str::<Value>(doc).ok())
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment in trellis.yaml");
    let items: BTreeMap<String, String> =
        deployment["spec"]["template"]["spec"]["volumes"][0]["configMap"]["items"]
            .as_array()
            .expect("volume items")
            .iter()
            .map(|i| {
                (
                    i["key"].as_str().unwrap().into(),
                    i["path"].as_str().unwrap().into(),
                )
            })
            .collect();
    let want_items: BTreeMap<String, String> = files
        .keys()
        .map(|p| (p.replace('/', "."), p.clone()))
        .collect();
    assert_eq!(
        items, want_items,
        "the rules volume's items in examples/deploy/trellis.yaml must list every key at its path"
    );
}

/// Writes (create, update, patch, delete) in the API server's audit log from
/// `user`, counted by source IP, after byte `offset`.
fn writes_by_source(offset: usize, user: &str) -> BTreeMap<String, usize> {
    let path = support::node::state_dir().join("logs/audit.log");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut counts = BTreeMap::new();
    for line in text.get(offset..).unwrap_or_default().lines() {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if event["user"]["username"] != user || event["stage"] != "ResponseComplete" {
            continue;
        }
        for ip in event["sourceIPs"].as_array().into_iter().flatten() {
            *counts
                .entry(ip.as_str().unwrap_or_default().to_string())
                .or_default() += 1;
        }
    }
    counts
}

fn audit_len() -> usize {
    std::fs::metadata(support::node::state_dir().join("logs/audit.log"))
        .map(|m| m.len() as usize)
        .unwrap_or(0)
}

#[tokio::test]
async fn only_the_leader_writes_to_the_api_server() {
    let _turn = DEPLOY.lock().await;
    let client = support::client().await;
    let pods = deploy(&client).await;
    let (_, leader_pod) = support::eventually("a Lease holder", WAIT, || leader(&client)).await;
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut ips = BTreeMap::new();
    for pod in &pods {
        let p = pods_api.get(pod).await.unwrap();
        let ip = p.status.and_then(|s| s.pod_ip).expect("a Pod IP");
        ips.insert(pod.clone(), ip);
    }
    let offset = audit_len();
    let ns = support::namespace().await;
    let parent: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "demo.trellis.dev/v1", "kind": "WebApp",
        "metadata": {"name": "audited"},
        "spec": {"image": APP_IMAGE, "replicas": 1}
    }))
    .unwrap();
    webapps(&client, ns.name())
        .patch(
            "audited",
            &PatchParams::apply("trellis-tests"),
            &Patch::Apply(&parent),
        )
        .await
        .unwrap();
    support::eventually("the audited WebApp Ready=True", WAIT, || async {
        let obj = webapps(&client, ns.name())
            .get("audited")
            .await
            .map_err(|e| e.to_string())?;
        match ready_condition(&obj) {
            Some((s, _)) if s == "True" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // Audit events are written in batches: let them land.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let writes = writes_by_source(offset, "system:serviceaccount:trellis-system:trellis");
    let leader_ip = &ips[&leader_pod];
    let leader_writes = writes.get(leader_ip).copied().unwrap_or(0);
    println!(
        "[deploy] writes by source IP while a WebApp converged: {writes:?} (leader {leader_pod} = {leader_ip})"
    );
    assert!(
        leader_writes >= 4,
        "the leader {leader_pod} ({leader_ip}) made {leader_writes} writes: the audit log does not see it ({writes:?})"
    );
    for (pod, ip) in &ips {
        if pod != &leader_pod {
            assert_eq!(
                writes.get(ip).copied().unwrap_or(0),
                0,
                "the standby {pod} ({ip}) wrote to the API server: {writes:?}"
            );
        }
    }
    // The field managers on the children are trellis's own.
    let deployments: Api<Deployment> = ns.api();
    let child = deployments.get("audited").await.unwrap();
    let managers: Vec<String> = child
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(
        managers.iter().any(|m| m == "trellis/webapp"),
        "field managers of the child: {managers:?}"
    );
}

/// A Pod's `/status` `shard` section: (generation, buckets, waiting, members).
async fn shard_of(client: &Client, pod: &str) -> Result<(u64, Vec<u64>, usize, u64), String> {
    let status = status_of(client, pod).await?;
    let s = &status["shard"];
    let numbers = |v: &Value| -> Vec<u64> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_u64)
            .collect()
    };
    if !s.is_object() {
        return Err(format!("{pod}: no shard section in /status"));
    }
    Ok((
        s["generation"].as_u64().unwrap_or(0),
        numbers(&s["buckets"]),
        numbers(&s["waiting"]).len(),
        s["members"].as_u64().unwrap_or(0),
    ))
}

#[tokio::test]
async fn examples_deploy_shards_runs_three_working_replicas_whose_buckets_cover_256_once() {
    let _turn = DEPLOY.lock().await;
    let client = support::client().await;
    let started = Instant::now();
    let pods = deploy_from(&client, "examples/deploy-shards", 3).await;
    let split = support::eventually(
        "3 replicas with disjoint buckets covering 0..255",
        WAIT,
        || async {
            let mut shards = Vec::new();
            for pod in &pods {
                shards.push(shard_of(&client, pod).await?);
            }
            let generations: std::collections::BTreeSet<u64> = shards.iter().map(|s| s.0).collect();
            let mut all: Vec<u64> = shards.iter().flat_map(|s| s.1.clone()).collect();
            all.sort_unstable();
            let settled = generations.len() == 1
                && shards.iter().all(|s| s.2 == 0 && s.3 == 3)
                && all == (0..256).collect::<Vec<u64>>();
            if settled {
                Ok(shards.iter().map(|s| s.1.len()).collect::<Vec<_>>())
            } else {
                Err(format!("{shards:?}"))
            }
        },
    )
    .await;
    println!(
        "[deploy] examples/deploy-shards: 3 Ready replicas, buckets {split:?}, {:?} after apply",
        started.elapsed()
    );
    // Each Pod works: every one has buckets and says so in its gauge.
    for (pod, n) in pods.iter().zip(&split) {
        let metrics = pod_proxy_get(&client, NS, pod, 8080, "/metrics")
            .await
            .unwrap();
        assert!(
            metrics.contains(&format!("trellis_shard_buckets {n}")),
            "{pod}: no `trellis_shard_buckets {n}` in /metrics"
        );
    }
    // A parent is served: its child carries its bucket.
    let ns = support::namespace().await;
    let parent: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "demo.trellis.dev/v1", "kind": "WebApp",
        "metadata": {"name": "sharded"},
        "spec": {"image": APP_IMAGE, "replicas": 0}
    }))
    .unwrap();
    let created = webapps(&client, ns.name())
        .patch(
            "sharded",
            &PatchParams::apply("trellis-tests"),
            &Patch::Apply(&parent),
        )
        .await
        .unwrap();
    let bucket = trellis::shard::bucket_of(&created.uid().unwrap())
        .0
        .to_string();
    let cms: Api<ConfigMap> = ns.api();
    support::eventually("the sharded WebApp's config child", WAIT, || async {
        let cm = cms.get("sharded-config").await.map_err(|e| e.to_string())?;
        match cm.labels().get("trellis.dev/bucket") {
            Some(b) if *b == bucket => Ok(()),
            other => Err(format!("bucket label {other:?}, want {bucket}")),
        }
    })
    .await;

    // The default back: two replicas, one writer, no shard section.
    let pods = deploy(&client).await;
    for pod in &pods {
        let status = status_of(&client, pod).await.unwrap();
        assert!(
            status["shard"].is_null(),
            "{pod} still runs with shards: {}",
            status["shard"]
        );
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    leases
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("trellis.dev/ring=trellis"),
        )
        .await
        .unwrap();
}
