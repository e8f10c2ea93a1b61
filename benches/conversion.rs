//! The conversion webhook and the storage migration (`versions:`).
//!
//! ```text
//! cargo bench --bench conversion                                   # both parts
//! TRELLIS_BENCH_PART=reviews cargo bench --bench conversion        # reviews only (no parents)
//! TRELLIS_BENCH_PARENTS=10000 TRELLIS_BENCH_PART=migration cargo bench --bench conversion
//! TRELLIS_BENCH_BINARY=target/release/trellis ...                  # an operator built elsewhere
//! ```
//!
//! **Reviews**: `trellis run` in a process of its own (release build by
//! default) with a rule of two versions and `--webhook-cert-dir` (a CA and
//! serving certificate the bench makes); the bench posts ConversionReviews
//! of 1 and of 500 objects over TLS, on one keep-alive connection and on 4
//! at once, for `TRELLIS_BENCH_SECONDS` (default 5) each, and prints
//! reviews/s, objects/s and the p50/p99/max latency of a review as the
//! bench's client saw it.
//!
//! **Migration**: against the tests' control plane, the same operator with
//! `--manage-crds` and `--webhook-url`, N parents (default 10,000) created
//! at v1 and stored at v1; the rule's `storageVersion` is then switched to
//! v2 (a rule edit, hot-reloaded) and the bench waits for the CRD's
//! `status.storedVersions` to be `[v2]`: it prints the time, and the
//! operator's parent updates (target: one per parent) and other writes
//! counted by its own request metric.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};

use common::{OperatorProcess, build_operator, env_number, load_average};

fn rule(group: &str, storage: &str) -> String {
    format!(
        r#"apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata: {{name: shop}}
spec:
  parent: {{apiVersion: {group}/v2, kind: Shop}}
  crd: {{}}
  schema:
    type: object
    properties:
      image: {{type: string}}
      ports: {{type: array, items: {{type: integer}}}}
  versions:
    - name: v1
      schema:
        type: object
        properties:
          image: {{type: string}}
          port: {{type: integer}}
      toHub: |
        image: {{{{ spec.image }}}}
        ports: [{{{{ spec.port }}}}]
      fromHub: |
        image: {{{{ spec.image }}}}
        port: {{{{ spec.ports[0] }}}}
  storageVersion: {storage}
  children: []
"#
    )
}

fn shop(group: &str, version: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": format!("{group}/{version}"),
        "kind": "Shop",
        "metadata": {"name": name, "namespace": "bench", "uid": format!("uid-{name}")},
        "spec": spec,
    })
}

fn main() {
    let part = std::env::var("TRELLIS_BENCH_PART").unwrap_or_default();
    let binary = build_operator();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!("[bench] load average {}", load_average());
    if part.is_empty() || part == "reviews" {
        runtime.block_on(reviews(&binary));
    }
    if part.is_empty() || part == "migration" {
        runtime.block_on(migration(&binary));
    }
}

/// A TLS connection to the webhook, HTTP/1.1 keep-alive, spoken by hand:
/// the bench needs POST and a Content-Length body, nothing more.
struct Connection {
    stream: tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    buffer: Vec<u8>,
}

impl Connection {
    async fn open(addr: SocketAddr, connector: &tokio_rustls::TlsConnector) -> Connection {
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        tcp.set_nodelay(true).expect("nodelay");
        let name = ServerName::try_from("127.0.0.1").expect("server name");
        let stream = connector.connect(name, tcp).await.expect("TLS handshake");
        Connection {
            stream,
            buffer: Vec::new(),
        }
    }

    /// POSTs `body` to `/convert`; the response body.
    async fn convert(&mut self, body: &[u8]) -> Vec<u8> {
        let head = format!(
            "POST /convert HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        self.stream.write_all(head.as_bytes()).await.expect("write");
        self.stream.write_all(body).await.expect("write");
        self.stream.flush().await.expect("flush");
        let header_end = loop {
            if let Some(i) = self.buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            self.read_more().await;
        };
        let head = String::from_utf8_lossy(&self.buffer[..header_end]).to_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{head}");
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("content-length");
        while self.buffer.len() < header_end + length {
            self.read_more().await;
        }
        let body = self.buffer[header_end..header_end + length].to_vec();
        self.buffer.drain(..header_end + length);
        body
    }

    async fn read_more(&mut self) {
        let mut chunk = [0u8; 65536];
        let n = self.stream.read(&mut chunk).await.expect("read");
        assert!(n > 0, "the webhook closed the connection");
        self.buffer.extend_from_slice(&chunk[..n]);
    }
}

fn review(group: &str, objects: usize) -> Vec<u8> {
    let objects: Vec<Value> = (0..objects)
        .map(|i| {
            shop(
                group,
                "v1",
                &format!("s{i}"),
                json!({"image": "nginx:1.27", "port": 8000 + i}),
            )
        })
        .collect();
    serde_json::to_vec(&json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": "bench", "desiredAPIVersion": format!("{group}/v2"), "objects": objects},
    }))
    .expect("json")
}

async fn reviews(binary: &Path) {
    let seconds = env_number("TRELLIS_BENCH_SECONDS", 5);
    let dir = tempfile::tempdir().expect("dir");
    let group = "bench.trellis.test";
    let rules = dir.path().join("rules");
    std::fs::create_dir_all(&rules).expect("rules dir");
    std::fs::write(rules.join("shop.yaml"), rule(group, "v2")).expect("rule");
    let certs = dir.path().join("certs");
    std::fs::create_dir_all(&certs).expect("certs dir");
    let bundle = trellis::operator::webhook::certs::make(
        &["127.0.0.1".to_owned()],
        trellis::operator::webhook::certs::now_secs(),
    )
    .expect("certificates");
    for (file, text) in [
        ("tls.crt", &bundle.tls_crt),
        ("tls.key", &bundle.tls_key),
        ("ca.crt", &bundle.ca_crt),
    ] {
        std::fs::write(certs.join(file), text).expect("write certificate");
    }
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let ns = support::namespace_for("bench-conversion").await;
    let mut operator = OperatorProcess::start(
        binary,
        "bench-conversion",
        &rules,
        ns.name(),
        &[
            "--webhook-addr",
            &addr.to_string(),
            "--webhook-cert-dir",
            &certs.to_string_lossy(),
            "--webhook-url",
            &format!("https://{addr}"),
        ],
    );
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(bundle.ca_crt.as_bytes()) {
        roots.add(cert.expect("CA")).expect("root");
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocols")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    // Until the webhook answers.
    let started = Instant::now();
    loop {
        operator.check_running();
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the webhook never listened"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for objects in [1usize, 500] {
        let body = Arc::new(review(group, objects));
        // Warm-up, and a check that the answer is a conversion.
        let mut warm = Connection::open(addr, &connector).await;
        let answer: Value = serde_json::from_slice(&warm.convert(&body).await).expect("json");
        assert_eq!(
            answer["response"]["result"]["status"], "Success",
            "{answer}"
        );
        assert_eq!(
            answer["response"]["convertedObjects"]
                .as_array()
                .map(Vec::len),
            Some(objects)
        );
        for connections in [1usize, 4] {
            let until = Instant::now() + Duration::from_secs(seconds);
            let tasks: Vec<_> = (0..connections)
                .map(|_| {
                    let (body, connector) = (body.clone(), connector.clone());
                    tokio::spawn(async move {
                        let mut connection = Connection::open(addr, &connector).await;
                        let mut latencies = Vec::new();
                        while Instant::now() < until {
                            let sent = Instant::now();
                            connection.convert(&body).await;
                            latencies.push(sent.elapsed());
                        }
                        latencies
                    })
                })
                .collect();
            let mut latencies: Vec<Duration> = futures::stream::iter(tasks)
                .then(|t| async { t.await.expect("client") })
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .flatten()
                .collect();
            latencies.sort();
            let n = latencies.len();
            let at = |q: f64| latencies[((n as f64 * q) as usize).min(n - 1)];
            println!(
                "[bench] reviews of {objects:>3} object(s), {connections} connection(s): {:.0} reviews/s, {:.0} objects/s; latency p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({n} reviews in {seconds} s)",
                n as f64 / seconds as f64,
                (n * objects) as f64 / seconds as f64,
                at(0.5).as_secs_f64() * 1e3,
                at(0.99).as_secs_f64() * 1e3,
                latencies[n - 1].as_secs_f64() * 1e3,
            );
        }
    }
    let reviews = operator
        .metric("trellis_conversion_reviews_total", &["result=\"ok\""])
        .await;
    println!(
        "[bench] the operator counted {reviews:?} successful reviews; peak RSS {:.1} MiB",
        common::mib(common::proc_status_kb(operator.pid(), "VmHWM").unwrap_or(0))
    );
    operator.terminate();
    let client = ns.client.clone();
    common::delete_namespace(&client, ns).await;
}

async fn migration(binary: &Path) {
    let parents = env_number("TRELLIS_BENCH_PARENTS", 10_000) as usize;
    let ns = support::namespace_for("bench-migration").await;
    let client = ns.client.clone();
    let group = format!("{}.trellis.test", support::unique_name("migr"));
    let crd_name = format!("shops.{group}");
    let dir = tempfile::tempdir().expect("dir");
    let rules = dir.path().join("rules");
    std::fs::create_dir_all(&rules).expect("rules dir");
    std::fs::write(rules.join("shop.yaml"), rule(&group, "v1")).expect("rule");
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let mut operator = OperatorProcess::start(
        binary,
        "bench-migration",
        &rules,
        ns.name(),
        &[
            "--manage-crds",
            "--operator-namespace",
            ns.name(),
            "--webhook-addr",
            &addr.to_string(),
            "--webhook-url",
            &format!("https://{addr}"),
            "--reload-poll",
            "2s",
        ],
    );
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let stored = |crd: &CustomResourceDefinition| {
        crd.status
            .as_ref()
            .and_then(|s| s.stored_versions.clone())
            .unwrap_or_default()
    };
    let v1 = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        ns.name(),
        &ApiResource::from_gvk(&GroupVersionKind::gvk(&group, "v1", "Shop")),
    );
    let started = Instant::now();
    loop {
        operator.check_running();
        let ready = crds
            .get_opt(&crd_name)
            .await
            .ok()
            .flatten()
            .is_some_and(|c| {
                c.spec
                    .conversion
                    .as_ref()
                    .and_then(|c| c.webhook.as_ref())
                    .and_then(|w| w.client_config.as_ref())
                    .and_then(|c| c.ca_bundle.as_ref())
                    .is_some()
            });
        if ready && v1.list(&Default::default()).await.is_ok() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the CRD never came"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let created = Instant::now();
    let namespace = ns.name().to_owned();
    futures::stream::iter(0..parents)
        .for_each_concurrent(32, |i| {
            let (v1, group, namespace) = (v1.clone(), group.clone(), namespace.clone());
            async move {
                let mut object = shop(
                    &group,
                    "v1",
                    &format!("p{i}"),
                    json!({"image": "nginx", "port": 8080}),
                );
                object["metadata"] = json!({"name": format!("p{i}"), "namespace": namespace});
                let object: DynamicObject = serde_json::from_value(object).expect("object");
                v1.create(&PostParams::default(), &object)
                    .await
                    .expect("create");
            }
        })
        .await;
    println!(
        "[bench] {parents} parents created at v1 in {:.1?}",
        created.elapsed()
    );
    // The operator's first passes over them end before the switch, so the
    // writes counted after it are the migration's (and the rule edit's).
    let mut last = None;
    loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let now = operator.requests().await.expect("requests").writes();
        if last == Some(now) {
            break;
        }
        last = Some(now);
    }
    println!(
        "[bench] the operator is at rest {:.1?} after the first create",
        created.elapsed()
    );
    let before = operator.requests().await.expect("requests");
    let switched = Instant::now();
    std::fs::write(rules.join("shop.yaml"), rule(&group, "v2")).expect("rule edit");
    let mut last_print = Instant::now();
    loop {
        operator.check_running();
        let crd = crds.get(&crd_name).await.expect("CRD");
        if stored(&crd) == ["v2"] {
            break;
        }
        if last_print.elapsed() > Duration::from_secs(10) {
            println!(
                "[bench] migrating: {:?} after {:.0?}",
                stored(&crd),
                switched.elapsed()
            );
            last_print = Instant::now();
        }
        assert!(
            switched.elapsed() < Duration::from_secs(1800),
            "the migration never ended"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = switched.elapsed();
    let after = operator.requests().await.expect("requests");
    let delta = after.since(&before);
    println!(
        "[bench] migration of {parents} parents v1 -> v2: {took:.1?} ({:.0} parents/s); operator writes: {} in all, {:?}; peak RSS {:.1} MiB",
        parents as f64 / took.as_secs_f64(),
        delta.writes(),
        delta
            .0
            .iter()
            .filter(|(k, _)| k.verb != "get" && k.verb != "list" && k.verb != "watch")
            .collect::<Vec<_>>(),
        common::mib(common::proc_status_kb(operator.pid(), "VmHWM").unwrap_or(0)),
    );
    operator.terminate();
    let crd_cleanup = crds.delete(&crd_name, &Default::default()).await;
    if let Err(e) = crd_cleanup {
        eprintln!("[bench] deleting {crd_name}: {e}");
    }
    common::delete_namespace(&client, ns).await;
}
