//! API versions on the real control plane: trellis (`--manage-crds`, run
//! outside the cluster with `--webhook-url`) serves `/convert` over TLS
//! with the certificate it made and keeps in its Secret, writes the CA into
//! the CRD's `caBundle`, and the API server converts through it: a parent
//! created at v1 is read at v2 and back; a conversion template that fails
//! refuses only the request that needed it, with its message. A serving
//! certificate renewed under the same CA keeps working without a CRD change.
mod support;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::json;

use support::faults::free_address;
use support::operator::{Cleanup, Operator, rule_set, wait_for};

fn rule(group: &str) -> String {
    format!(
        r#"apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: shop
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
      deprecated: "Shop v1 is deprecated; use v2"
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
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      template: |
        metadata:
          name: {{{{ parent.metadata.name }}}}
        data:
          ports: {{{{ spec.ports | join(',') }}}}
"#
    )
}

/// `rule` stored at `storage`.
fn stored_at(group: &str, storage: &str) -> String {
    rule(group).replace(
        "  children:\n",
        &format!("  storageVersion: {storage}\n  children:\n"),
    )
}

/// The leaf certificate `addr` serves (PEM), as `openssl s_client` sees it.
fn served_certificate(addr: std::net::SocketAddr) -> String {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl s_client -connect {addr} </dev/null 2>/dev/null | openssl x509"
        ))
        .output()
        .expect("openssl");
    let pem = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(pem.contains("BEGIN CERTIFICATE"), "openssl: {pem}");
    pem
}

fn options_for(ns: &support::TestNamespace) -> trellis::operator::Options {
    let addr = free_address();
    let mut options = trellis::operator::Options::new(vec![], vec![ns.name().to_owned()]);
    options.instance = "test".into();
    options.manage_crds = true;
    options.operator_namespace = ns.name().to_owned();
    options.webhook = trellis::operator::webhook::Settings::new(ns.name());
    options.webhook.addr = addr;
    options.webhook.url = Some(format!("https://{addr}"));
    options
}

fn api_at(ns: &support::TestNamespace, group: &str, version: &str) -> Api<DynamicObject> {
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, "Shop"), "shops");
    Api::namespaced_with(ns.client.clone(), ns.name(), &resource)
}

fn shop(group: &str, version: &str, name: &str, spec: serde_json::Value) -> DynamicObject {
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, "Shop"), "shops");
    DynamicObject::new(name, &resource).data(json!({ "spec": spec }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parents_are_converted_between_versions_by_trellis_itself() {
    let ns = support::namespace().await;
    let group = format!("{}.trellis.test", support::unique_name("conv"));
    let crd_name = format!("shops.{group}");
    let mut cleanup = Cleanup::default();
    cleanup.add::<CustomResourceDefinition>(&crd_name);

    let options = options_for(&ns);
    let addr = options.webhook.addr;
    let operator = Operator::spawn(options, rule_set(&[&rule(&group)]), &ns.client);

    // The CRD carries the CA trellis made, and points at its URL.
    let crds: Api<CustomResourceDefinition> = Api::all(ns.client.clone());
    let crd = wait_for(
        &crds,
        &crd_name,
        "the CRD with a caBundle, Established",
        |crd| {
            let json = serde_json::to_value(crd).map_err(|e| e.to_string())?;
            let config = &json["spec"]["conversion"]["webhook"]["clientConfig"];
            let established = json["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Established" && c["status"] == "True")
            });
            if config["caBundle"].is_string() && established {
                Ok(json)
            } else {
                Err(format!("clientConfig {config}, established {established}"))
            }
        },
    )
    .await;
    assert_eq!(
        crd["spec"]["conversion"]["webhook"]["clientConfig"]["url"],
        format!("https://{addr}/convert")
    );
    let secrets: Api<Secret> = Api::namespaced(ns.client.clone(), ns.name());
    let secret = secrets
        .get("trellis-webhook-tls")
        .await
        .expect("the Secret");
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));

    // Created at v1 (stored at v2, the hub): converted by the webhook.
    let v1 = api_at(&ns, &group, "v1");
    let v2 = api_at(&ns, &group, "v2");
    v1.create(
        &PostParams::default(),
        &shop(&group, "v1", "a", json!({"image": "nginx", "port": 8080})),
    )
    .await
    .expect("a v1 parent is accepted");
    let at_v2 = v2.get("a").await.expect("read at v2");
    assert_eq!(
        at_v2.data["spec"],
        json!({"image": "nginx", "ports": [8080]})
    );
    let at_v1 = v1.get("a").await.expect("read at v1");
    assert_eq!(at_v1.data["spec"], json!({"image": "nginx", "port": 8080}));

    // The rule renders the hub's spec.
    let configmaps: Api<ConfigMap> = Api::namespaced(ns.client.clone(), ns.name());
    wait_for(
        &configmaps,
        "a",
        "the child rendered from v2",
        |cm| match cm.data.as_ref().and_then(|d| d.get("ports")) {
            Some(p) if p == "8080" => Ok(()),
            other => Err(format!("ports {other:?}")),
        },
    )
    .await;

    // A v1 parent the template cannot convert (no port): refused, naming
    // the rule and the versions; the other requests go on.
    let err = v1
        .create(
            &PostParams::default(),
            &shop(&group, "v1", "b", json!({"image": "nginx"})),
        )
        .await
        .expect_err("the conversion fails");
    let text = err.to_string();
    assert!(
        text.contains("rule shop: converting Shop from v1 to v2"),
        "{text}"
    );
    v2.create(
        &PostParams::default(),
        &shop(
            &group,
            "v2",
            "c",
            json!({"image": "nginx", "ports": [1, 2]}),
        ),
    )
    .await
    .expect("a v2 parent needs no conversion");
    assert_eq!(
        v1.get("c").await.expect("read at v1").data["spec"],
        json!({"image": "nginx", "port": 1})
    );

    // A serving certificate renewed from the same CA (the leader renews one
    // whose hosts changed), under load: four readers convert without pause
    // from before the renewal until well after every replica's 10 s look
    // has picked the new certificate up. Served from the Secret without a
    // restart; the API server, trusting the same CA, loses no request.
    let stop_readers = tokio_util::sync::CancellationToken::new();
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (v1, stop) = (v1.clone(), stop_readers.clone());
            tokio::spawn(async move {
                let (mut answered, mut failed) = (0usize, Vec::new());
                while !stop.is_cancelled() {
                    match v1.get("a").await {
                        Ok(got) if got.data["spec"]["port"] == 8080 => answered += 1,
                        Ok(got) => failed.push(format!("converted wrong: {:?}", got.data["spec"])),
                        Err(e) => failed.push(e.to_string()),
                    }
                }
                (answered, failed)
            })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let before = secret.data.clone().expect("data");
    secrets
        .patch(
            "trellis-webhook-tls",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"trellis.dev/hosts": "renew.example"}}}),
            ),
        )
        .await
        .expect("mark for renewal");
    wait_for(
        &secrets,
        "trellis-webhook-tls",
        "a renewed serving certificate",
        |s| {
            let data = s.data.as_ref().ok_or("no data")?;
            if data.get("tls.crt") != before.get("tls.crt")
                && data.get("ca.crt") == before.get("ca.crt")
            {
                Ok(())
            } else {
                Err("not renewed yet".to_owned())
            }
        },
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(13)).await;
    stop_readers.cancel();
    let (mut answered, mut failed) = (0, Vec::new());
    for reader in readers {
        let (a, f) = reader.await.expect("reader");
        answered += a;
        failed.extend(f);
    }
    println!(
        "conversions across the renewal: {answered} answered, {} failed",
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "{} failed, e.g. {:?}",
        failed.len(),
        failed.first()
    );
    assert!(answered >= 100, "only {answered} conversions: not a load");
    // The replica serves the renewed certificate now.
    let served = served_certificate(addr);
    let stored = secrets
        .get("trellis-webhook-tls")
        .await
        .expect("secret")
        .data
        .expect("data")["tls.crt"]
        .0
        .clone();
    assert!(
        String::from_utf8_lossy(&stored).contains(served.trim()),
        "the renewed certificate is the one served:\n{served}"
    );
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_version_switch_rewrites_every_stored_parent_and_trims_stored_versions() {
    let ns = support::namespace().await;
    let group = format!("{}.trellis.test", support::unique_name("migr"));
    let crd_name = format!("shops.{group}");
    let mut cleanup = Cleanup::default();
    cleanup.add::<CustomResourceDefinition>(&crd_name);
    let crds: Api<CustomResourceDefinition> = Api::all(ns.client.clone());
    let stored_versions = |crd: &CustomResourceDefinition| {
        crd.status
            .as_ref()
            .and_then(|s| s.stored_versions.clone())
            .unwrap_or_default()
    };

    // Stored at v1: parents written now are kept in etcd as v1.
    let operator = Operator::spawn(
        options_for(&ns),
        rule_set(&[&stored_at(&group, "v1")]),
        &ns.client,
    );
    wait_for(&crds, &crd_name, "the CRD stored at v1", |crd| {
        if stored_versions(crd) == ["v1"]
            && serde_json::to_value(crd).is_ok_and(|j| {
                j["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"].is_string()
            })
        {
            Ok(())
        } else {
            Err(format!("storedVersions {:?}", stored_versions(crd)))
        }
    })
    .await;
    let v1 = api_at(&ns, &group, "v1");
    let names: Vec<String> = (0..12).map(|i| format!("p{i}")).collect();
    for name in &names {
        support::eventually(
            "a v1 parent accepted",
            std::time::Duration::from_secs(30),
            || {
                let v1 = v1.clone();
                let shop = shop(&group, "v1", name, json!({"image": "nginx", "port": 80}));
                async move { v1.create(&PostParams::default(), &shop).await.map(|_| ()) }
            },
        )
        .await;
    }
    let v2 = api_at(&ns, &group, "v2");
    let before: Vec<String> = {
        let mut out = Vec::new();
        for name in &names {
            out.push(
                v2.get(name)
                    .await
                    .expect("read")
                    .metadata
                    .resource_version
                    .unwrap_or_default(),
            );
        }
        out
    };
    operator.stop().await;

    // A new version of the rule stores at v2 (the hub): the leader rewrites
    // each parent once and trims storedVersions; /status says how far.
    let mut options = options_for(&ns);
    let status_addr = free_address();
    options.metrics_addr = Some(status_addr);
    let operator = Operator::spawn(options, rule_set(&[&stored_at(&group, "v2")]), &ns.client);
    wait_for(&crds, &crd_name, "storedVersions trimmed to v2", |crd| {
        if stored_versions(crd) == ["v2"] {
            Ok(())
        } else {
            Err(format!("storedVersions {:?}", stored_versions(crd)))
        }
    })
    .await;
    for (name, was) in names.iter().zip(&before) {
        let now = v2.get(name).await.expect("read");
        assert_ne!(
            now.metadata.resource_version.as_ref(),
            Some(was),
            "{name} was rewritten"
        );
        assert_eq!(now.data["spec"], json!({"image": "nginx", "ports": [80]}));
    }
    let status = support::http_get(status_addr, "/status")
        .await
        .expect("/status");
    let status: serde_json::Value = serde_json::from_str(&status).expect("json");
    assert_eq!(
        status["rules"]["shop"]["migration"],
        json!({"from": "v1", "to": "v2", "done": 12, "total": 12})
    );
    operator.stop().await;
}
