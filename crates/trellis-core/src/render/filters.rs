//! Filters beyond minijinja's built-ins.
//!
//! Every filter refuses an undefined input, so `{{ spec.typo | b64encode }}`
//! is an error rather than the encoding of an empty string. `tojson` replaces
//! minijinja's own: that one returns markup-safe text, which in a child
//! template would be inserted raw (adding YAML structure, or breaking the
//! document when concatenated); ours returns a plain string, like `toyaml`.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use minijinja::{Environment, Error, ErrorKind, Value};
use rand::Rng;
use sha2::{Digest, Sha256};

/// Longest string `rand_alnum` produces.
const MAX_RANDOM_LEN: usize = 256;
/// Longest DNS-1123 label.
const DNS_LABEL_MAX: usize = 63;

pub fn register(env: &mut Environment<'static>) {
    env.add_filter("tojson", tojson);
    env.add_filter("toyaml", toyaml);
    env.add_filter("b64encode", b64encode);
    env.add_filter("b64decode", b64decode);
    env.add_filter("sha256", sha256);
    env.add_filter("dns_label", |v: &Value| -> Result<String, Error> {
        Ok(dns_label(&string_arg("dns_label", v)?))
    });
    env.add_filter("rand_alnum", rand_alnum);
    env.add_filter("fromjson", super::convert::fromjson);
    env.add_filter("fromyaml", super::convert::fromyaml);
    env.add_filter("quantity", super::convert::quantity);
    super::patterns::register(env);
    env.add_function("rand_alnum", rand_alnum);
}

fn defined<'a>(filter: &str, value: &'a Value) -> Result<&'a Value, Error> {
    if value.is_undefined() {
        Err(Error::new(
            ErrorKind::UndefinedError,
            format!("`{filter}` got a missing value; use `| default(...)` first"),
        ))
    } else {
        Ok(value)
    }
}

pub(super) fn string_arg(filter: &str, value: &Value) -> Result<String, Error> {
    let value = defined(filter, value)?;
    Ok(match value.as_str() {
        Some(s) => s.to_owned(),
        None => value.to_string(),
    })
}

fn tojson(value: &Value) -> Result<String, Error> {
    let value = defined("tojson", value)?;
    serde_json::to_string(value).map_err(|e| Error::new(ErrorKind::BadSerialization, e.to_string()))
}

fn toyaml(value: &Value) -> Result<String, Error> {
    let value = defined("toyaml", value)?;
    crate::yaml::to_string(value)
        .map_err(|e| Error::new(ErrorKind::BadSerialization, e.to_string()))
}

fn b64encode(value: &Value) -> Result<String, Error> {
    Ok(STANDARD.encode(string_arg("b64encode", value)?))
}

fn b64decode(value: &Value) -> Result<String, Error> {
    let bytes = STANDARD
        .decode(string_arg("b64decode", value)?.trim())
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("b64decode: {e}")))?;
    String::from_utf8(bytes).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            "b64decode: decoded bytes are not UTF-8 text",
        )
    })
}

fn sha256(value: &Value) -> Result<String, Error> {
    Ok(sha256_hex(string_arg("sha256", value)?.as_bytes()))
}

fn rand_alnum(len: usize) -> Result<String, Error> {
    if len > MAX_RANDOM_LEN {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("rand_alnum: at most {MAX_RANDOM_LEN} characters"),
        ));
    }
    let mut rng = rand::rng();
    Ok((0..len)
        .map(|_| rng.sample(rand::distr::Alphanumeric) as char)
        .collect())
}

/// Lowercase hex SHA-256. One `format!` per byte cost more than the hash
/// itself on every pass (the webapp rule hashes its ConfigMap each render).
pub fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// Makes any string a valid DNS-1123 label (≤ 63 chars, `[a-z0-9-]`, alphanumeric
/// at both ends). When the cleaned string had to be cut, an 8-hex-digit hash of
/// the original keeps distinct inputs distinct.
pub fn dns_label(input: &str) -> String {
    let mut cleaned = String::with_capacity(input.len());
    for c in input.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_alphanumeric() {
            cleaned.push(c);
        } else if !cleaned.ends_with('-') {
            cleaned.push('-');
        }
    }
    let cleaned = cleaned.trim_matches('-');
    if !cleaned.is_empty() && cleaned.len() <= DNS_LABEL_MAX {
        return cleaned.to_owned();
    }
    let digest = sha256_hex(input.as_bytes());
    let suffix = &digest[..8];
    let keep = DNS_LABEL_MAX - suffix.len() - 1;
    let head = cleaned[..cleaned.len().min(keep)].trim_end_matches('-');
    if head.is_empty() {
        suffix.to_owned()
    } else {
        format!("{head}-{suffix}")
    }
}
