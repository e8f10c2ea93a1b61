//! The certificates of the conversion webhook, when trellis makes them: a
//! CA (ten years) and a serving certificate signed by it (one year) for the
//! webhook's hosts — the Service's DNS names, or the `--webhook-url` host.
//! The API server trusts the CA (each managed CRD's `caBundle`), so a
//! renewed serving certificate needs no CRD change. Renewal is due once
//! less than a third of the serving certificate's life is left.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// How long a made CA is valid.
pub const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long a made serving certificate is valid.
pub const SERVING_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);

/// Why a certificate could not be made or read back.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("making a certificate: {0}")]
    Make(#[from] rcgen::Error),
    #[error("a time outside what a certificate can hold")]
    Time,
}

/// A CA and a serving certificate, PEM-encoded, as the Secret keeps them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    pub ca_crt: String,
    pub ca_key: String,
    pub tls_crt: String,
    pub tls_key: String,
    /// The serving certificate's end of validity (seconds since the epoch).
    pub not_after: u64,
    /// The hosts the serving certificate names.
    pub hosts: Vec<String>,
}

fn at(secs: u64) -> Result<time::OffsetDateTime, CertError> {
    time::OffsetDateTime::from_unix_timestamp(i64::try_from(secs).map_err(|_| CertError::Time)?)
        .map_err(|_| CertError::Time)
}

pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn ca_params(now: u64) -> Result<CertificateParams, CertError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, "trellis webhook CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    // An hour back: a node whose clock is a little behind still accepts it.
    params.not_before = at(now.saturating_sub(3600))?;
    params.not_after = at(now + CA_LIFETIME.as_secs())?;
    Ok(params)
}

/// A new CA and a serving certificate for `hosts`, `now` seconds since the epoch.
pub fn make(hosts: &[String], now: u64) -> Result<Bundle, CertError> {
    let ca_key = KeyPair::generate()?;
    let params = ca_params(now)?;
    let ca_crt = params.self_signed(&ca_key)?.pem();
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(params, ca_key);
    serving(&issuer, ca_crt, ca_key_pem, hosts, now)
}

/// A new serving certificate for `hosts`, signed by the CA of `bundle`.
pub fn renew(bundle: &Bundle, hosts: &[String], now: u64) -> Result<Bundle, CertError> {
    let key = KeyPair::from_pem(&bundle.ca_key)?;
    // A certificate names its issuer by distinguished name and key: the
    // CA's parameters made again (its name is fixed) sign as the CA did.
    let issuer = Issuer::new(ca_params(now)?, key);
    serving(
        &issuer,
        bundle.ca_crt.clone(),
        bundle.ca_key.clone(),
        hosts,
        now,
    )
}

fn serving(
    issuer: &Issuer<'_, KeyPair>,
    ca_crt: String,
    ca_key: String,
    hosts: &[String],
    now: u64,
) -> Result<Bundle, CertError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(hosts.to_vec())?;
    params.distinguished_name.push(
        DnType::CommonName,
        hosts.first().cloned().unwrap_or_default(),
    );
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = at(now.saturating_sub(3600))?;
    let not_after = now + SERVING_LIFETIME.as_secs();
    params.not_after = at(not_after)?;
    let tls_crt = params.signed_by(&key, issuer)?.pem();
    Ok(Bundle {
        ca_crt,
        ca_key,
        tls_crt,
        tls_key: key.serialize_pem(),
        not_after,
        hosts: hosts.to_vec(),
    })
}

/// What the leader does with the bundle it finds (`None`: there is none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Nothing: it is good for a while.
    Nothing,
    /// A new serving certificate from the same CA (nearing its end, or
    /// for other hosts).
    Renew,
    /// A new CA and certificate (none yet, or the CA itself is old).
    Make,
}

/// Whether `bundle` needs renewing for `hosts` at `now`.
pub fn due(bundle: Option<&Bundle>, hosts: &[String], now: u64) -> Due {
    let Some(bundle) = bundle else {
        return Due::Make;
    };
    if bundle.ca_crt.is_empty() || bundle.ca_key.is_empty() {
        return Due::Make;
    }
    let left = bundle.not_after.saturating_sub(now);
    if left < SERVING_LIFETIME.as_secs() / 3 || bundle.hosts != hosts {
        Due::Renew
    } else {
        Due::Nothing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts() -> Vec<String> {
        vec![
            "trellis-webhook.trellis-system.svc".into(),
            "127.0.0.1".into(),
        ]
    }

    #[test]
    fn a_made_bundle_is_a_ca_and_a_serving_certificate_for_the_hosts() {
        let now = 1_800_000_000;
        let bundle = make(&hosts(), now).expect("made");
        assert!(bundle.ca_crt.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(bundle.tls_crt.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(bundle.tls_key.contains("PRIVATE KEY"));
        assert_eq!(bundle.not_after, now + SERVING_LIFETIME.as_secs());
        assert_ne!(bundle.ca_crt, bundle.tls_crt);
        // Renewal keeps the CA (the CRDs' caBundle) and makes a new key.
        let renewed = renew(&bundle, &hosts(), now + 100).expect("renewed");
        assert_eq!(renewed.ca_crt, bundle.ca_crt);
        assert_ne!(renewed.tls_key, bundle.tls_key);
        assert_eq!(renewed.not_after, now + 100 + SERVING_LIFETIME.as_secs());
    }

    #[test]
    fn renewal_is_due_in_the_last_third_of_the_life_or_for_other_hosts() {
        let now = 1_800_000_000;
        let bundle = make(&hosts(), now).expect("made");
        assert_eq!(due(None, &hosts(), now), Due::Make);
        assert_eq!(due(Some(&bundle), &hosts(), now), Due::Nothing);
        let two_thirds = now + SERVING_LIFETIME.as_secs() * 2 / 3;
        assert_eq!(due(Some(&bundle), &hosts(), two_thirds - 60), Due::Nothing);
        assert_eq!(due(Some(&bundle), &hosts(), two_thirds + 60), Due::Renew);
        assert_eq!(
            due(Some(&bundle), &["other.example.com".to_owned()], now),
            Due::Renew
        );
    }
}
