//! `regex_match` and `regex_replace`: linear-time regular expressions (the
//! `regex` crate has no backtracking). Each engine (one per rule) keeps the
//! patterns it compiled, so a literal pattern is compiled once per rule set;
//! patterns computed at render time are bounded in length and compiled size,
//! and the cache in entries.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use minijinja::{Environment, Error, ErrorKind, Value};
use regex::{Regex, RegexBuilder};

use super::filters::string_arg;

/// Longest pattern accepted.
const MAX_PATTERN_LEN: usize = 1024;
/// Compiled-program size limit per pattern.
const MAX_COMPILED_BYTES: usize = 1 << 20;
/// Distinct patterns kept per engine.
const MAX_CACHED: usize = 256;

#[derive(Default)]
struct Cache(Mutex<HashMap<String, Arc<Regex>>>);

impl Cache {
    fn get(&self, filter: &str, pattern: &str) -> Result<Arc<Regex>, Error> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(re) = map.get(pattern) {
            return Ok(re.clone());
        }
        let re = Arc::new(compile(filter, pattern)?);
        if map.len() < MAX_CACHED {
            map.insert(pattern.to_owned(), re.clone());
        }
        Ok(re)
    }
}

/// Compiles one pattern within the bounds; errors read well in a condition.
pub fn compile(filter: &str, pattern: &str) -> Result<Regex, Error> {
    if pattern.len() > MAX_PATTERN_LEN {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("{filter}: pattern longer than {MAX_PATTERN_LEN} bytes"),
        ));
    }
    RegexBuilder::new(pattern)
        .size_limit(MAX_COMPILED_BYTES)
        .build()
        .map_err(|e| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("{filter}: invalid pattern: {e}"),
            )
        })
}

pub fn register(env: &mut Environment<'static>) {
    let cache = Arc::new(Cache::default());
    let c = cache.clone();
    env.add_filter(
        "regex_match",
        move |value: &Value, pattern: String| -> Result<bool, Error> {
            let text = string_arg("regex_match", value)?;
            Ok(c.get("regex_match", &pattern)?.is_match(&text))
        },
    );
    env.add_filter(
        "regex_replace",
        move |value: &Value, pattern: String, replacement: String| -> Result<String, Error> {
            let text = string_arg("regex_replace", value)?;
            let re = cache.get("regex_replace", &pattern)?;
            Ok(re.replace_all(&text, replacement.as_str()).into_owned())
        },
    );
}
