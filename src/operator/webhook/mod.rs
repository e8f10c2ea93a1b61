//! The conversion webhook (`versions:`): every replica serves `POST
//! /convert` over TLS ([`server`]), answering with the rule set in force.
//!
//! ```text
//!  rule set with versions ──▶ start (once): bind --webhook-addr, serve
//!  certificates: --webhook-cert-dir (read every 10 s)
//!             or the Secret trellis-webhook-tls: made and renewed by the
//!                leader ([`certs`]), read by every replica every 10 s
//!  CA ──▶ Endpoint::ca ──▶ the CRD manager writes it as each CRD's caBundle
//! ```
//!
//! Nothing starts (no port, no Secret) while no rule has `versions:`.

pub mod certs;
mod server;
mod tls;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::leadership::leader::Gate;
use crate::rules::RuleSet;
use certs::{Bundle, Due};

/// The Secret that keeps the made CA and serving certificate.
pub const SECRET: &str = "trellis-webhook-tls";
const ANNOTATION_NOT_AFTER: &str = "trellis.dev/not-after";
const ANNOTATION_HOSTS: &str = "trellis.dev/hosts";
/// How often certificates are looked at again.
const REFRESH: Duration = Duration::from_secs(10);

/// Where the webhook listens and how the API server reaches it.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--webhook-addr`.
    pub addr: SocketAddr,
    /// `--webhook-cert-dir`: `tls.crt`, `tls.key` (and `ca.crt`) made by
    /// someone else (cert-manager); trellis makes none.
    pub cert_dir: Option<PathBuf>,
    /// `--webhook-service`: namespace and name of the Service in front of
    /// the replicas.
    pub service: (String, String),
    /// `--webhook-url https://HOST:PORT`: the API server calls this instead
    /// (trellis run outside the cluster).
    pub url: Option<String>,
}

impl Settings {
    /// Defaults for an operator in `namespace`.
    pub fn new(namespace: &str) -> Settings {
        Settings {
            addr: SocketAddr::from(([0, 0, 0, 0], 9443)),
            cert_dir: None,
            service: (namespace.to_owned(), "trellis-webhook".to_owned()),
            url: None,
        }
    }

    /// The names a made serving certificate holds.
    pub fn hosts(&self) -> Vec<String> {
        if let Some(host) = self.url.as_deref().and_then(url_host) {
            return vec![host];
        }
        let (ns, name) = &self.service;
        vec![
            format!("{name}.{ns}.svc"),
            format!("{name}.{ns}.svc.cluster.local"),
            format!("{name}.{ns}"),
            name.clone(),
        ]
    }

    /// A CRD's `spec.conversion.webhook.clientConfig` for this webhook.
    pub fn client_config(&self, ca_pem: Option<&str>) -> Value {
        let mut config = match &self.url {
            Some(url) => {
                json!({"url": format!("{}{}", url.trim_end_matches('/'), crate::rules::crd::versions::CONVERT_PATH)})
            }
            None => json!({"service": {
                "namespace": self.service.0,
                "name": self.service.1,
                "path": crate::rules::crd::versions::CONVERT_PATH,
                "port": 443,
            }}),
        };
        if let Some(ca) = ca_pem {
            config["caBundle"] =
                json!(base64::engine::general_purpose::STANDARD.encode(ca.as_bytes()));
        }
        config
    }
}

/// The host of `https://HOST:PORT/...` (an IPv6 address without brackets).
fn url_host(url: &str) -> Option<String> {
    let rest = url.strip_prefix("https://")?;
    let authority = rest.split('/').next()?;
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next()?,
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    (!host.is_empty()).then(|| host.to_owned())
}

/// What the CRD manager needs of the webhook.
#[derive(Clone)]
pub struct Endpoint {
    pub settings: Settings,
    /// The CA the API server must trust (PEM), once known.
    pub ca: watch::Receiver<Option<String>>,
    /// Whether `/convert` is being served (a rule with `versions:` came).
    pub serving: Arc<std::sync::atomic::AtomicBool>,
}

/// How long a stopping replica that serves `/convert` keeps answering: the
/// API server dials the Service, and a deleted Pod's endpoint leaves it
/// (endpoints controller, then kube-proxy) only a moment after SIGTERM; a
/// listener closed before that fails the conversions sent to it meanwhile.
pub const DRAIN: std::time::Duration = std::time::Duration::from_secs(3);

/// Starts the webhook the first time `sets` holds a rule with `versions:`;
/// returns at once.
pub fn spawn(
    client: Client,
    settings: Settings,
    gate: Gate,
    namespace: String,
    sets: watch::Receiver<Option<Arc<RuleSet>>>,
    metrics: Arc<crate::telemetry::Metrics>,
    shutdown: CancellationToken,
) -> Endpoint {
    let (ca_tx, ca_rx) = watch::channel(None);
    let serving = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let endpoint = Endpoint {
        settings: settings.clone(),
        ca: ca_rx,
        serving: serving.clone(),
    };
    tokio::spawn(async move {
        let mut watched = sets.clone();
        loop {
            let wanted = watched
                .borrow_and_update()
                .as_ref()
                .is_some_and(|s| s.rules.iter().any(|r| !r.versions.is_empty()));
            if wanted {
                break;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = watched.changed() => if changed.is_err() { return },
            }
        }
        let listener = match tokio::net::TcpListener::bind(settings.addr).await {
            Ok(l) => l,
            Err(e) => {
                warn!(addr = %settings.addr, "conversion webhook: cannot listen: {e}; parents of other versions cannot be read or written");
                return;
            }
        };
        info!(addr = %settings.addr, "conversion webhook: serving /convert");
        serving.store(true, std::sync::atomic::Ordering::Relaxed);
        let cert = Arc::new(tls::Swappable::default());
        tokio::spawn(server::serve(
            listener,
            cert.clone(),
            sets,
            metrics,
            shutdown.clone(),
        ));
        keep_certificates(client, settings, gate, namespace, cert, ca_tx, shutdown).await;
    });
    endpoint
}

/// Keeps the serving certificate current, and the CA known, until shutdown.
async fn keep_certificates(
    client: Client,
    settings: Settings,
    gate: Gate,
    namespace: String,
    cert: Arc<tls::Swappable>,
    ca: watch::Sender<Option<String>>,
    shutdown: CancellationToken,
) {
    let secrets: Api<Secret> = Api::namespaced(client, &namespace);
    let mut served: Option<(String, String)> = None;
    loop {
        let found = match &settings.cert_dir {
            Some(dir) => from_dir(dir),
            None => {
                // The leader reads the Secret to keep it current; the others
                // only read it.
                let current = if gate.may_write() {
                    ensure_secret(&secrets, &settings.hosts()).await
                } else {
                    secrets
                        .get_opt(SECRET)
                        .await
                        .map(|s| s.as_ref().and_then(bundle_of))
                        .map_err(SecretError::from)
                };
                match current {
                    Ok(bundle) => bundle.map(|b| (b.tls_crt, b.tls_key, Some(b.ca_crt))),
                    Err(e) => {
                        warn!("conversion webhook: Secret {namespace}/{SECRET}: {e}");
                        None
                    }
                }
            }
        };
        if let Some((crt, key, ca_pem)) = found
            && served.as_ref() != Some(&(crt.clone(), key.clone()))
        {
            match cert.set(&crt, &key) {
                Ok(()) => {
                    info!("conversion webhook: serving certificate loaded");
                    served = Some((crt, key));
                }
                Err(e) => warn!("conversion webhook: the certificate cannot be used: {e}"),
            }
            ca.send_if_modified(|now| {
                let changed = *now != ca_pem;
                *now = ca_pem.clone();
                changed
            });
        }
        // Quick until there is something to serve.
        let wait = if cert.is_set() {
            REFRESH
        } else {
            Duration::from_secs(1)
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// `tls.crt`, `tls.key` and, when there, `ca.crt` of `--webhook-cert-dir`.
fn from_dir(dir: &std::path::Path) -> Option<(String, String, Option<String>)> {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    match (read("tls.crt"), read("tls.key")) {
        (Some(crt), Some(key)) => Some((crt, key, read("ca.crt"))),
        _ => {
            warn!(dir = %dir.display(), "conversion webhook: tls.crt or tls.key missing");
            None
        }
    }
}

fn bundle_of(secret: &Secret) -> Option<Bundle> {
    let data = secret.data.as_ref()?;
    let text = |key: &str| {
        data.get(key)
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
            .unwrap_or_default()
    };
    let annotations = secret.annotations();
    Some(Bundle {
        ca_crt: text("ca.crt"),
        ca_key: text("ca.key"),
        tls_crt: text("tls.crt"),
        tls_key: text("tls.key"),
        not_after: annotations
            .get(ANNOTATION_NOT_AFTER)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        hosts: annotations
            .get(ANNOTATION_HOSTS)
            .map(|h| h.split(',').map(str::to_owned).collect())
            .unwrap_or_default(),
    })
}

/// Why the Secret could not be made or renewed.
#[derive(Debug, thiserror::Error)]
enum SecretError {
    #[error(transparent)]
    Cert(#[from] certs::CertError),
    #[error(transparent)]
    Api(#[from] kube::Error),
}

/// The leader's part: the Secret exists and is not due for renewal.
/// The bundle it holds now (`None`: another leader's write won a race; it
/// is read on the next look).
async fn ensure_secret(
    secrets: &Api<Secret>,
    hosts: &[String],
) -> Result<Option<Bundle>, SecretError> {
    let live = secrets.get_opt(SECRET).await?;
    let bundle = live.as_ref().and_then(bundle_of);
    let now = certs::now_secs();
    let made = match certs::due(bundle.as_ref(), hosts, now) {
        Due::Nothing => return Ok(bundle),
        Due::Make => certs::make(hosts, now)?,
        Due::Renew => certs::renew(bundle.as_ref().expect("due to renew"), hosts, now)?,
    };
    let data: BTreeMap<String, ByteString> = [
        ("ca.crt", &made.ca_crt),
        ("ca.key", &made.ca_key),
        ("tls.crt", &made.tls_crt),
        ("tls.key", &made.tls_key),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), ByteString(v.clone().into_bytes())))
    .collect();
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(SECRET.to_owned()),
            resource_version: live.as_ref().and_then(|s| s.resource_version()),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_owned(),
                    "trellis".to_owned(),
                )]
                .into(),
            ),
            annotations: Some(
                [
                    (ANNOTATION_NOT_AFTER.to_owned(), made.not_after.to_string()),
                    (ANNOTATION_HOSTS.to_owned(), made.hosts.join(",")),
                ]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(data),
        ..Secret::default()
    };
    // Guarded by the resourceVersion read: a leader that lost the race
    // reads the winner's on its next look.
    let result = match live {
        Some(_) => {
            secrets
                .replace(SECRET, &PostParams::default(), &secret)
                .await
        }
        None => secrets.create(&PostParams::default(), &secret).await,
    };
    match result {
        Ok(_) => {
            info!(
                hosts = %made.hosts.join(","),
                "conversion webhook: serving certificate made, valid until {}",
                made.not_after
            );
            Ok(Some(made))
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_certificate_names_the_url_host_or_the_service() {
        let mut settings = Settings::new("ops");
        assert_eq!(
            settings.hosts(),
            [
                "trellis-webhook.ops.svc",
                "trellis-webhook.ops.svc.cluster.local",
                "trellis-webhook.ops",
                "trellis-webhook"
            ]
        );
        settings.url = Some("https://127.0.0.1:9443".into());
        assert_eq!(settings.hosts(), ["127.0.0.1"]);
        assert_eq!(url_host("https://[::1]:9443/x").as_deref(), Some("::1"));
        assert_eq!(
            url_host("https://example.com").as_deref(),
            Some("example.com")
        );
        assert_eq!(url_host("http://example.com"), None);
        assert_eq!(
            settings.client_config(Some("PEM")),
            json!({"url": "https://127.0.0.1:9443/convert", "caBundle": "UEVN"})
        );
    }
}
