//! The operator's log, kept for the failure message of a wait that timed
//! out: one global subscriber per test binary keeps every line of the
//! in-process operators ([`Logs::get`], installed by
//! [`super::operator::Operator::spawn`]), and the log files of the running
//! `trellis run` processes ([`super::process::Replica`]) are registered here,
//! so that [`tail`] can show the lines before a timeout, wherever they went.
//!
//! Tests of one binary run in parallel and share the subscriber: lines name
//! their parent with its (unique) namespace, so [`tail`] shows the lines
//! naming the test's namespace apart from the binary's last lines.
//!
//! With `RUST_LOG` set, the lines also go to the test's output, filtered by it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Every log line of this test binary's in-process operators.
pub struct Logs(Buffer);

/// Log output kept in memory: a subscriber writes through [`Buffer::writer`].
#[derive(Clone, Default)]
pub struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Buffer {
    /// A `MakeWriter` for `tracing_subscriber`'s `with_writer`.
    pub fn writer(&self) -> impl Fn() -> Sink + Send + Sync + 'static {
        let buffer = self.0.clone();
        move || Sink(buffer.clone())
    }

    pub fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Logs {
    /// The binary's one global subscriber, installed on first call. `None`
    /// when something else installed a global subscriber first.
    pub fn get() -> Option<&'static Logs> {
        static LOGS: OnceLock<Option<Logs>> = OnceLock::new();
        LOGS.get_or_init(|| {
            let sink = Buffer::default();
            let kept = tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(sink.writer())
                .with_filter(EnvFilter::new("info,trellis=debug"));
            let shown = std::env::var_os("RUST_LOG").map(|_| {
                tracing_subscriber::fmt::layer()
                    .with_test_writer()
                    .with_filter(EnvFilter::from_default_env())
            });
            tracing_subscriber::registry()
                .with(kept)
                .with(shown)
                .try_init()
                .ok()
                .map(|()| Logs(sink))
        })
        .as_ref()
    }

    pub fn lines(&self) -> Vec<String> {
        self.0.lines()
    }
}

/// One write into a [`Buffer`].
pub struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn files() -> std::sync::MutexGuard<'static, BTreeMap<String, PathBuf>> {
    static FILES: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());
    FILES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers the log file of a running operator process as `name`.
pub fn register_file(name: &str, path: PathBuf) {
    files().insert(name.to_owned(), path);
}

/// Forgets a log file registered with [`register_file`].
pub fn forget_file(name: &str) {
    files().remove(name);
}

fn last(lines: &[String], n: usize) -> String {
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The last `n` lines of the operators' logs, for a failure message: of the
/// in-process operators, those naming `namespace` (when given) and the
/// binary's last lines; of each registered process, its last lines. Empty
/// when there is no log at all.
pub fn tail(namespace: Option<&str>, n: usize) -> String {
    let mut out = String::new();
    if let Some(logs) = Logs::get() {
        let lines = logs.lines();
        if let Some(ns) = namespace {
            let mine: Vec<String> = lines.iter().filter(|l| l.contains(ns)).cloned().collect();
            if !mine.is_empty() {
                out += &format!(
                    "\n--- last {} operator log lines naming {ns} ---\n{}",
                    n.min(mine.len()),
                    last(&mine, n)
                );
            }
        }
        if !lines.is_empty() {
            let k = n
                .min(lines.len())
                .min(if namespace.is_some() { 10 } else { n });
            out += &format!(
                "\n--- last {k} operator log lines of this test binary (tests run in parallel) ---\n{}",
                last(&lines, k)
            );
        }
    }
    for (name, path) in files().iter() {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        out += &format!(
            "\n--- last {} lines of {name}'s log ({}) ---\n{}",
            n.min(lines.len()),
            path.display(),
            last(&lines, n)
        );
    }
    out
}
