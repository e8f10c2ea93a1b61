//! Load benchmark of `related:` reads in the real operator: N parents, each
//! reading one ConfigMap by name and copying it into a child, in a namespace
//! that also holds M ConfigMaps nobody reads. The release `trellis run`
//! binary runs in a process of its own against the shared test control
//! plane (see `tests/support/mod.rs`).
//!
//! Run: `cargo bench --bench load_related` (prints figures; fails only when
//! the operator does not converge or an edit does not reach its reader).
//!
//! Environment:
//! * `TRELLIS_BENCH_PARENTS`: parents, each with its own source (default 1000).
//! * `TRELLIS_BENCH_NOISE`: unrelated ConfigMaps (default 10000).
//! * `TRELLIS_BENCH_EDITS`: source edits timed (default 20).
//! * `TRELLIS_BENCH_SELECTOR=1`: each parent reads its source by a templated
//!   label selector (`matchLabels: {src: "{{ spec.from }}"}`) instead of by
//!   name, and the unrelated ConfigMaps exist before the operator starts, so
//!   every pass's selector read meets all of them; the operator's CPU time to
//!   converge is the figure that shows the cost of those reads.
//!   `TRELLIS_BENCH_SELECTOR=2`: the same selector as `matchExpressions`
//!   (`src In [...]`), which the label index does not serve: every read
//!   scans the cache (the cost before the index).
//! * `TRELLIS_BENCH_WATCH_MEMORY=1`: instead, the memory a related watch
//!   costs per cached object, full objects against metadata only (kube's
//!   `metadata_watcher`): `TRELLIS_BENCH_NOISE` ConfigMaps of 1 KiB data,
//!   then this binary run again three times, once per mode (`none`, `full`,
//!   `metadata`), each listing them into a store as the operator's related
//!   watches do (managed fields dropped) and reporting its RSS.
//!
//! What is measured: the time until every parent's child carries its
//! source's data ("converged"); the operator's RSS (`/proc/<pid>/status`)
//! after convergence and again once the unrelated ConfigMaps exist (the
//! related ConfigMap watch is a whole-kind watch, since the rule's `name:` is
//! a template: it caches them too); then, with everything in place, the
//! latency from editing one source to its reader's child carrying the edit
//! (a GET every 10 ms), and that no other parent had a pass for it. The
//! operator log (JSON lines) is kept in `target/tmp/bench-load-related.log`.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use common::{OperatorProcess, build_operator, env_number, mib, proc_cpu_seconds, proc_status_kb};
use support::operator::{Cleanup, TestKind};

const CREATE_CONCURRENCY: usize = 32;

fn main() {
    if let Some(mode) = std::env::var_os("TRELLIS_BENCH_WATCH_ONLY") {
        let ns = std::env::var("TRELLIS_BENCH_WATCH_NS").expect("TRELLIS_BENCH_WATCH_NS");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let (objects, rss) = rt.block_on(watch_only(&mode.to_string_lossy(), &ns));
        println!("{objects} {rss}");
        return;
    }
    if env_number("TRELLIS_BENCH_WATCH_MEMORY", 0) == 1 {
        let noise = env_number("TRELLIS_BENCH_NOISE", 10_000) as usize;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        rt.block_on(watch_memory(noise));
        return;
    }
    let parents = env_number("TRELLIS_BENCH_PARENTS", 1000) as usize;
    let noise = env_number("TRELLIS_BENCH_NOISE", 10_000) as usize;
    let edits = env_number("TRELLIS_BENCH_EDITS", 20) as usize;
    let selector = env_number("TRELLIS_BENCH_SELECTOR", 0);
    assert!(parents > 0 && edits > 0);
    let binary = build_operator();
    let cluster = support::cluster();
    eprintln!("[related] cluster: {}", cluster.source);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(bench(&binary, parents, noise, edits, selector));
}

fn rule(kind: &TestKind, selector: u64) -> String {
    // By name the entry is one object; by selector a list of (here) one.
    let (source, data) = match selector {
        0 => ("name: \"{{ spec.from }}\"", "related.source.data"),
        1 => (
            "selector:\n        matchLabels:\n          src: \"{{ spec.from }}\"",
            "(related.source | first).data",
        ),
        _ => (
            "selector:\n        matchExpressions:\n          - {key: src, operator: In, values: [\"{{ spec.from }}\"]}",
            "(related.source | first).data",
        ),
    };
    kind.rule(
        &r#"
apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: related-load
spec:
  parent:
    apiVersion: @API_VERSION@
    kind: @KIND@
  related:
    - id: source
      apiVersion: v1
      kind: ConfigMap
      @SOURCE@
  children:
    - id: copy
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{ parent.metadata.name ~ '-copy' }}
        data: {{ @DATA@ }}
"#
        .replace("@SOURCE@", source)
        .replace("@DATA@", data),
    )
}

/// Passes logged per parent so far (the operator's debug line `planned`).
fn passes(log: &Path) -> BTreeMap<String, usize> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| l.contains("\"planned\"")) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let parent = v
            .pointer("/fields/parent")
            .or_else(|| v.get("parent"))
            .and_then(|p| p.as_str());
        if let Some(p) = parent {
            *out.entry(p.to_owned()).or_insert(0) += 1;
        }
    }
    out
}

/// Name, data and labels of a ConfigMap to create.
type Spec = (String, BTreeMap<String, String>, BTreeMap<String, String>);

async fn create_config_maps(api: &Api<ConfigMap>, names: Vec<Spec>) {
    futures::stream::iter(names)
        .for_each_concurrent(CREATE_CONCURRENCY, |(name, data, labels)| {
            let api = api.clone();
            async move {
                let cm: ConfigMap = serde_json::from_value(
                    json!({"metadata": {"name": name, "labels": labels}, "data": data}),
                )
                .expect("a ConfigMap");
                api.create(&PostParams::default(), &cm)
                    .await
                    .unwrap_or_else(|e| panic!("creating ConfigMap {name}: {e}"));
            }
        })
        .await;
}

async fn copies_with(cms: &Api<ConfigMap>, value: &str) -> usize {
    let list = cms
        .list(&ListParams::default().labels("trellis.dev/rule=related-load"))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    list.iter()
        .filter(|cm| {
            cm.data
                .as_ref()
                .and_then(|d| d.get("v"))
                .map(String::as_str)
                == Some(value)
        })
        .count()
}

/// The unrelated ConfigMaps, 100 bytes of data each.
fn noise_specs(noise: usize) -> Vec<Spec> {
    let filler = "x".repeat(100);
    (0..noise)
        .map(|i| {
            (
                format!("noise-{i}"),
                [("k".to_owned(), filler.clone())].into(),
                [("noise".to_owned(), "yes".to_owned())].into(),
            )
        })
        .collect()
}

async fn bench(binary: &Path, n: usize, noise: usize, edits: usize, selector: u64) {
    let ns = support::namespace_for("bench-related").await;
    let client = ns.client.clone();
    let group = format!("{}.bench.trellis.test", support::unique_name("related"));
    let kind = TestKind::in_group(&group, "RelatedApp");
    let _crd = Cleanup::crds(&[&kind]);
    kind.install(&client).await;
    let cms: Api<ConfigMap> = ns.api();

    let started = Instant::now();
    create_config_maps(
        &cms,
        (0..n)
            .map(|i| {
                (
                    format!("src-{i}"),
                    [("v".to_owned(), "0".to_owned())].into(),
                    [("src".to_owned(), format!("src-{i}"))].into(),
                )
            })
            .collect(),
    )
    .await;
    if selector > 0 {
        create_config_maps(&cms, noise_specs(noise)).await;
    }
    let parents = kind.api(&ns);
    futures::stream::iter(0..n)
        .for_each_concurrent(CREATE_CONCURRENCY, |i| {
            let kind = kind.clone();
            let ns = &ns;
            async move {
                kind.create(
                    ns,
                    &format!("p-{i}"),
                    json!({"from": format!("src-{i}")}),
                    &[],
                )
                .await;
            }
        })
        .await;
    eprintln!(
        "[related] {n} sources and {n} parents created in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let dir = tempfile::tempdir().expect("temp dir");
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).expect("rules dir");
    std::fs::write(rules.join("related-load.yaml"), rule(&kind, selector)).expect("rule");
    let spawned = Instant::now();
    let mut operator = OperatorProcess::start_with_env(
        binary,
        "load-related",
        &rules,
        ns.name(),
        &[],
        &[("RUST_LOG", "info,trellis::operator::reconcile=debug")],
    );
    let log = operator.log.clone();
    let pid = operator.pid();
    loop {
        if let Ok(Some(status)) = operator.child.try_wait() {
            panic!("the operator exited: {status}");
        }
        if copies_with(&cms, "0").await == n {
            break;
        }
        assert!(
            spawned.elapsed() < Duration::from_secs(600),
            "no convergence in 600 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let converged = spawned.elapsed();
    let cpu_converged = proc_cpu_seconds(pid).unwrap_or(0.0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_converged = proc_status_kb(pid, "VmRSS").map(mib).unwrap_or(0.0);

    let noise_started = Instant::now();
    if selector == 0 {
        create_config_maps(&cms, noise_specs(noise)).await;
    }
    let noise_created = noise_started.elapsed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_noise = proc_status_kb(pid, "VmRSS").map(mib).unwrap_or(0.0);

    // Edits, one at a time, with everything in place.
    let before = passes(&log);
    let mut latencies = Vec::new();
    let mut edited = Vec::new();
    for j in 0..edits {
        let i = (j * 97 + 13) % n;
        let value = format!("edit-{j}");
        let t = Instant::now();
        cms.patch(
            &format!("src-{i}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"v": value}})),
        )
        .await
        .expect("edit a source");
        loop {
            let copy = cms.get(&format!("p-{i}-copy")).await.expect("the copy");
            if copy.data.as_ref().and_then(|d| d.get("v")) == Some(&value) {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "edit {j} never reached p-{i}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        latencies.push(t.elapsed());
        edited.push(format!("{}/p-{i}", ns.name()));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = passes(&log);
    let woken: Vec<&String> = after
        .iter()
        .filter(|(p, c)| before.get(*p) != Some(*c))
        .map(|(p, _)| p)
        .collect();
    let strangers: Vec<&&String> = woken.iter().filter(|p| !edited.contains(p)).collect();
    let rss_end = proc_status_kb(pid, "VmRSS").map(mib).unwrap_or(0.0);
    drop(operator);
    drop(parents);

    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let how = match selector {
        0 => "by name",
        1 => "by a templated matchLabels (indexed); the unrelated ones exist before the start",
        _ => "by a templated matchExpressions (scanned); the unrelated ones exist before the start",
    };
    println!(
        "related load: {n} parents, each reading its own ConfigMap {how}; {noise} unrelated ConfigMaps"
    );
    println!(
        "  converged (all children)      {:.1} s after start, operator CPU {cpu_converged:.2} s",
        converged.as_secs_f64()
    );
    println!(
        "  RSS after convergence         {rss_converged:.1} MiB ({n} related + {n} children cached{})",
        if selector > 0 {
            ", and the unrelated ones"
        } else {
            ""
        }
    );
    if selector == 0 {
        println!(
            "  RSS with the unrelated ones   {rss_noise:.1} MiB (+{:.1} MiB for {noise} ConfigMaps, created in {:.1} s)",
            rss_noise - rss_converged,
            noise_created.as_secs_f64()
        );
    }
    println!("  RSS at the end                {rss_end:.1} MiB");
    println!(
        "  edit → reader's child         median {:.0} ms, max {:.0} ms over {} edits",
        ms(latencies[latencies.len() / 2]),
        ms(latencies[latencies.len() - 1]),
        latencies.len()
    );
    println!(
        "  parents with a pass during the edits: {} (edited {}), others: {}",
        woken.len(),
        edited.len(),
        strangers.len()
    );
    assert!(
        strangers.is_empty(),
        "parents that read nothing edited had a pass: {strangers:?}"
    );
}

/// One watch of the namespace's ConfigMaps into a store (`none`: only the
/// client); the objects cached and this process's RSS in kB once listed.
async fn watch_only(mode: &str, ns: &str) -> (usize, u64) {
    use kube::ResourceExt;
    use kube::api::{ApiResource, DynamicObject, PartialObjectMeta};
    use kube::runtime::{WatchStreamExt, reflector, watcher};
    let client = support::client().await;
    let resource = ApiResource::erase::<ConfigMap>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
    let config = watcher::Config::default().streaming_lists();
    let objects = match mode {
        "none" => {
            // The same requests' worth of client state, no cache.
            api.list(&ListParams::default().limit(1))
                .await
                .expect("list");
            0
        }
        "full" => {
            let writer = reflector::store::Writer::<DynamicObject>::new(resource.clone());
            let store = writer.as_reader();
            let stream = reflector(
                writer,
                watcher(api, config).modify(|o| o.managed_fields_mut().clear()),
            );
            tokio::spawn(stream.for_each(|_| async {}));
            store.wait_until_ready().await.expect("listed");
            store.len()
        }
        "metadata" => {
            let writer =
                reflector::store::Writer::<PartialObjectMeta<DynamicObject>>::new(resource.clone());
            let store = writer.as_reader();
            // An Api of PartialObjectMeta makes metadata-only requests.
            let api: Api<PartialObjectMeta<DynamicObject>> =
                Api::namespaced_with(client, ns, &resource);
            let stream = reflector(
                writer,
                watcher(api, config).modify(|o| o.managed_fields_mut().clear()),
            );
            tokio::spawn(stream.for_each(|_| async {}));
            store.wait_until_ready().await.expect("listed");
            store.len()
        }
        other => panic!("TRELLIS_BENCH_WATCH_ONLY={other}: none, full or metadata"),
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    (
        objects,
        proc_status_kb(std::process::id(), "VmRSS").unwrap_or(0),
    )
}

async fn watch_memory(noise: usize) {
    let ns = support::namespace_for("bench-watch-memory").await;
    let cms: Api<ConfigMap> = ns.api();
    let kib = "x".repeat(1024);
    let started = Instant::now();
    create_config_maps(
        &cms,
        (0..noise)
            .map(|i| {
                (
                    format!("cm-{i}"),
                    [("k".to_owned(), kib.clone())].into(),
                    [("team".to_owned(), format!("t{}", i % 10))].into(),
                )
            })
            .collect(),
    )
    .await;
    eprintln!(
        "[related] {noise} ConfigMaps of 1 KiB created in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let exe = std::env::current_exe().expect("this binary");
    let run = |mode: &str| {
        let out = std::process::Command::new(&exe)
            .env("TRELLIS_BENCH_WATCH_ONLY", mode)
            .env("TRELLIS_BENCH_WATCH_NS", ns.name())
            .output()
            .expect("run a watch");
        assert!(
            out.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().last().unwrap_or_default().to_owned();
        let mut parts = line
            .split_whitespace()
            .map(|p| p.parse::<u64>().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    };
    let (_, none) = run("none");
    let (full_n, full) = run("full");
    let (meta_n, meta) = run("metadata");
    // Every namespace also holds kube-root-ca.crt.
    assert!(full_n as usize >= noise, "the full watch cached them all");
    assert!(
        meta_n as usize >= noise,
        "the metadata watch cached them all"
    );
    let per = |rss: u64| (rss.saturating_sub(none)) as f64 * 1024.0 / noise as f64;
    println!("related watch memory: {noise} ConfigMaps of 1 KiB data, managed fields dropped");
    println!("  client only                   {:.1} MiB", mib(none));
    println!(
        "  full objects                  {:.1} MiB ({:.0} bytes per object)",
        mib(full),
        per(full)
    );
    println!(
        "  metadata only                 {:.1} MiB ({:.0} bytes per object)",
        mib(meta),
        per(meta)
    );
}
