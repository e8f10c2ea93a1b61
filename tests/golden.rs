//! Golden tests for `trellis render` on the shipped examples: the document a
//! sample parent (and optionally a stream of observed children) renders to is
//! compared with `tests/golden/<case>.yaml`.
//!
//! After an intended change, regenerate and review the diff:
//!
//! ```text
//! TRELLIS_UPDATE_GOLDEN=1 cargo test --test golden
//! git diff tests/golden
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use trellis::render::Limits;
use trellis::rules::RuleSet;
use trellis::yaml;

/// The `--now` every case renders with, so transition times are stable.
const NOW: &str = "2026-11-29T00:00:00Z";
const UPDATE_VAR: &str = "TRELLIS_UPDATE_GOLDEN";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read_stream(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    yaml::parse_documents(&text, &yaml::Limits::FILES)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .map(|d| d.value)
        .collect()
}

/// One golden case: `examples/parents/<parent>`, optionally
/// `examples/observed/<observed>`, rendered to `tests/golden/<name>.yaml`.
struct Case {
    name: &'static str,
    parent: &'static str,
    observed: Option<&'static str>,
    /// JSON pointers of values that differ on every render (`rand_alnum`),
    /// replaced by a marker before comparing.
    random: &'static [&'static str],
}

impl Case {
    fn golden_path(&self) -> PathBuf {
        root()
            .join("tests/golden")
            .join(format!("{}.yaml", self.name))
    }

    /// The document `render` prints, as text (what the CLI writes to stdout).
    fn render(&self) -> String {
        let set =
            RuleSet::load(&[root().join("rules")], Limits::default()).unwrap_or_else(|diags| {
                panic!(
                    "rules/ fails check:\n{}",
                    diags
                        .iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join("\n")
                )
            });
        let parent_path = root().join("examples/parents").join(self.parent);
        let [parent] = read_stream(&parent_path)
            .try_into()
            .unwrap_or_else(|docs: Vec<Value>| {
                panic!(
                    "{}: expected one object, found {}",
                    parent_path.display(),
                    docs.len()
                )
            });
        let observed = self
            .observed
            .map(|o| read_stream(&root().join("examples/observed").join(o)))
            .unwrap_or_default();
        let rule = trellis::offline::render::rule_for(&set, &parent)
            .unwrap_or_else(|e| panic!("{}: {e}", self.parent));
        let doc = trellis::offline::render::render_document(rule, &parent, observed, NOW);
        to_text(&self.redact(doc))
    }

    fn redact(&self, mut doc: Value) -> Value {
        for pointer in self.random {
            let slot = doc
                .pointer_mut(pointer)
                .unwrap_or_else(|| panic!("case {}: nothing at {pointer} to redact", self.name));
            *slot = Value::String(format!("<random, differs on every render: {pointer}>"));
        }
        doc
    }

    fn check(&self) {
        compare(&self.golden_path(), &self.render(), self.name);
    }
}

/// The CLI prints `to_string` with trailing whitespace trimmed and one newline.
fn to_text(doc: &Value) -> String {
    let text = yaml::to_string(doc).expect("the render document serializes");
    format!("{}\n", text.trim_end())
}

fn updating() -> bool {
    std::env::var(UPDATE_VAR).is_ok_and(|v| v == "1")
}

/// Compares `actual` with the golden file, or writes it when updating.
fn compare(path: &Path, actual: &str, what: &str) {
    if updating() {
        std::fs::create_dir_all(path.parent().expect("golden dir")).expect("create tests/golden");
        std::fs::write(path, actual).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let expected = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}\nCreate it with: {UPDATE_VAR}=1 cargo test --test golden",
            path.display()
        )
    });
    if expected != actual {
        panic!(
            "{what}: output differs from {} (- golden, + actual):\n{}\n\
             If the change is intended, re-run with {UPDATE_VAR}=1 cargo test --test golden \
             and review `git diff tests/golden`.",
            path.display(),
            line_diff(&expected, actual)
        );
    }
}

/// A line diff (longest common subsequence), with two lines of context
/// around each change.
fn line_diff(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    // lcs[i][j]: length of the LCS of a[i..] and b[j..].
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut ops: Vec<(char, usize, &str)> = Vec::new(); // (tag, old line no, text)
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', i + 1, a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', i + 1, a[i]));
            i += 1;
        } else {
            ops.push(('+', i + 1, b[j]));
            j += 1;
        }
    }
    const CONTEXT: usize = 2;
    let changed: Vec<usize> = (0..ops.len()).filter(|&k| ops[k].0 != ' ').collect();
    let near = |k: usize| changed.iter().any(|&c| c.abs_diff(k) <= CONTEXT);
    let mut out = String::new();
    let mut skipped = false;
    for (k, (tag, line, text)) in ops.iter().enumerate() {
        if near(k) {
            if skipped || (out.is_empty() && k > 0) {
                out.push_str(&format!("@@ line {line} @@\n"));
            }
            out.push_str(&format!("{tag} {text}\n"));
            skipped = false;
        } else {
            skipped = true;
        }
    }
    out
}

const CASES: &[Case] = &[
    // WebApp: nothing exists yet; the Deployment waits for its ConfigMap.
    Case {
        name: "webapp",
        parent: "webapp.yaml",
        observed: None,
        random: &[],
    },
    // WebApp rolling out: one of two replicas available, Serving but not Ready.
    Case {
        name: "webapp-rolling-out",
        parent: "webapp.yaml",
        observed: Some("webapp-rolling-out.yaml"),
        random: &[],
    },
    // WebApp up: Ready; an Ingress for a removed host is deleted.
    Case {
        name: "webapp-ready",
        parent: "webapp.yaml",
        observed: Some("webapp-ready.yaml"),
        random: &[],
    },
    // WebApp not exposed: no Ingress (includeWhen), in-cluster URL, defaults.
    Case {
        name: "webapp-internal",
        parent: "webapp-internal.yaml",
        observed: None,
        random: &[],
    },
    // WebApp with a spec the schema refuses: InvalidSpec, nothing applied.
    Case {
        name: "webapp-invalid",
        parent: "webapp-invalid.yaml",
        observed: None,
        random: &[],
    },
    // Tenant (cluster-scoped): only the Namespace until it is Active.
    Case {
        name: "tenant-acme",
        parent: "tenant-acme.yaml",
        observed: None,
        random: &[],
    },
    // Tenant all up: quota usage in status; a removed admin's binding is deleted.
    Case {
        name: "tenant-acme-ready",
        parent: "tenant-acme.yaml",
        observed: Some("tenant-acme-ready.yaml"),
        random: &[],
    },
    // Tenant with defaults, no viewers and no isolation, placeholder uid.
    Case {
        name: "tenant-sandbox-active",
        parent: "tenant-sandbox.yaml",
        observed: Some("tenant-sandbox-active.yaml"),
        random: &[],
    },
    // Team: its Namespace not observed: the patch is pending (TargetNotFound,
    // nothing made), the volume waits for the quota.
    Case {
        name: "team-payments",
        parent: "team-payments.yaml",
        observed: None,
        random: &[],
    },
    // Team all up: the Namespace labelled under the Team's own manager,
    // cost reported; an old contribution to another Namespace is released.
    Case {
        name: "team-payments-ready",
        parent: "team-payments.yaml",
        observed: Some("team-payments-ready.yaml"),
        random: &[],
    },
    // Decorator on a labelled Deployment: Service + PDB, no status.
    Case {
        name: "deployment-api",
        parent: "deployment-api.yaml",
        observed: None,
        random: &[],
    },
    // Database: a generated password (createOnly), the server waits for it.
    Case {
        name: "database-orders",
        parent: "database-orders.yaml",
        observed: None,
        random: &["/children/0/data/password"],
    },
    // Database up.
    Case {
        name: "database-orders-ready",
        parent: "database-orders.yaml",
        observed: Some("database-orders-ready.yaml"),
        // The Secret exists: createOnly keeps it, so it is listed as unchanged.
        random: &[],
    },
    // ConfigPropagation (cluster-scoped): a copy per Namespace the selector
    // matches; the source ConfigMap (same kind and name, another namespace)
    // is read, never taken for a copy nor pruned.
    Case {
        name: "config-propagation-ca",
        parent: "config-propagation-ca.yaml",
        observed: Some("config-propagation-ca.yaml"),
        random: &[],
    },
];

fn case(name: &str) -> &'static Case {
    CASES
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no golden case {name}"))
}

#[test]
fn render_webapp() {
    case("webapp").check();
}

#[test]
fn render_webapp_rolling_out() {
    case("webapp-rolling-out").check();
}

#[test]
fn render_webapp_ready() {
    case("webapp-ready").check();
}

#[test]
fn render_webapp_internal() {
    case("webapp-internal").check();
}

#[test]
fn render_webapp_invalid() {
    case("webapp-invalid").check();
}

#[test]
fn render_team_payments() {
    case("team-payments").check();
}

#[test]
fn render_team_payments_ready() {
    case("team-payments-ready").check();
}

#[test]
fn render_tenant_acme() {
    case("tenant-acme").check();
}

#[test]
fn render_tenant_acme_ready() {
    case("tenant-acme-ready").check();
}

#[test]
fn render_tenant_sandbox_active() {
    case("tenant-sandbox-active").check();
}

#[test]
fn render_deployment_api() {
    case("deployment-api").check();
}

#[test]
fn render_database_orders() {
    case("database-orders").check();
}

#[test]
fn render_database_orders_ready() {
    case("database-orders-ready").check();
}

#[test]
fn every_golden_file_has_a_case() {
    let dir = root().join("tests/golden");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("entry").path();
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_owned();
        assert!(
            CASES.iter().any(|c| c.name == stem),
            "{} has no case in tests/golden.rs: remove it or add the case",
            path.display()
        );
    }
}

/// The redacted password is still what the rule promises: base64 of 24
/// alphanumeric characters, different on every render.
#[test]
fn database_password_is_random_alphanumeric() {
    use base64::Engine as _;
    let set = RuleSet::load(&[root().join("rules")], Limits::default()).expect("rules load");
    let [parent] = read_stream(&root().join("examples/parents/database-orders.yaml"))
        .try_into()
        .expect("one parent");
    let rule = trellis::offline::render::rule_for(&set, &parent).expect("rule");
    let password = || {
        let doc = trellis::offline::render::render_document(rule, &parent, Vec::new(), NOW);
        let encoded = doc
            .pointer("/children/0/data/password")
            .and_then(Value::as_str)
            .expect("a password")
            .to_owned();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&encoded)
            .expect("base64");
        String::from_utf8(bytes).expect("utf-8")
    };
    let (first, second) = (password(), password());
    assert_eq!(first.len(), 24);
    assert!(first.chars().all(|c| c.is_ascii_alphanumeric()), "{first}");
    assert_ne!(first, second, "rand_alnum repeats itself");
}

/// Runs the real binary and checks that it prints exactly the golden document.
fn check_cli(name: &str) {
    let case = case(name);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trellis"));
    cmd.current_dir(root())
        .args(["render", "--rules", "rules"])
        .arg(Path::new("examples/parents").join(case.parent))
        .args(["--now", NOW]);
    if let Some(observed) = case.observed {
        cmd.arg("--observed")
            .arg(Path::new("examples/observed").join(observed));
    }
    let out = cmd.output().expect("run trellis");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "trellis render failed ({}):\n{stderr}",
        out.status
    );
    let stdout = String::from_utf8(out.stdout).expect("UTF-8 output");
    // The in-process render and the binary agree, and both match the file.
    assert_eq!(
        stdout,
        case.render(),
        "the binary prints something else than render_document"
    );
    if !updating() {
        compare(
            &case.golden_path(),
            &stdout,
            &format!("trellis render ({name})"),
        );
    }
}

#[test]
fn cli_render_prints_the_golden_document() {
    check_cli("webapp");
}

#[test]
fn cli_render_with_observed_prints_the_golden_document() {
    check_cli("webapp-ready");
}

#[test]
fn render_config_propagation_reads_its_source_without_pruning_it() {
    case("config-propagation-ca").check();
}
