//! The webhook's TLS: a rustls server whose certificate can be swapped
//! while it serves (a renewed or rotated one takes effect on the next
//! handshake; connections already open keep theirs), and PEM reading.

use std::sync::{Arc, RwLock};

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

/// Why a certificate and key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("the certificate is not PEM: {0}")]
    Certificate(String),
    #[error("the key is not a PEM private key: {0}")]
    Key(String),
    #[error("the key does not fit rustls: {0}")]
    Unsupported(rustls::Error),
}

/// The serving certificate of the moment.
#[derive(Debug, Default)]
pub struct Swappable(RwLock<Option<Arc<CertifiedKey>>>);

impl Swappable {
    /// Serves `cert_pem` (a chain) with `key_pem` from the next handshake.
    pub fn set(&self, cert_pem: &str, key_pem: &str) -> Result<(), TlsError> {
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|e| TlsError::Certificate(e.to_string()))?;
        if chain.is_empty() {
            return Err(TlsError::Certificate("no certificate in it".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| TlsError::Key(e.to_string()))?;
        let signing =
            rustls::crypto::ring::sign::any_supported_type(&key).map_err(TlsError::Unsupported)?;
        let certified = Arc::new(CertifiedKey::new(chain, signing));
        if let Ok(mut now) = self.0.write() {
            *now = Some(certified);
        }
        Ok(())
    }

    pub fn is_set(&self) -> bool {
        self.0.read().is_ok_and(|c| c.is_some())
    }
}

impl ResolvesServerCert for Swappable {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.read().ok().and_then(|c| c.clone())
    }
}

/// A server configuration that serves whatever `cert` holds.
pub fn server_config(cert: Arc<Swappable>) -> Arc<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}
