//! `trellis lsp` spoken to as an editor does, over the binary's stdin and
//! stdout: initialize, open a rule with an error, the diagnostic on its
//! line, the fixed text, an empty list, shutdown and a clean exit; a name
//! used twice across files reported in both; hover and completion of rule
//! fields; a rule directory deep under the workspace root; a failing rule
//! test on its case's `name` line, after a test edit and after a rule edit,
//! and a wrong test file's error on its line.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use serde_json::{Value, json};

/// Long enough for a slow machine; only a hung server waits this long.
const PATIENCE: Duration = Duration::from_secs(60);

struct Client {
    child: Child,
    stdin: ChildStdin,
    messages: Receiver<Value>,
    next_id: i64,
}

impl Client {
    fn start(root: &Path) -> Client {
        let mut child = Command::new(env!("CARGO_BIN_EXE_trellis"))
            .arg("lsp")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start trellis lsp");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, messages) = channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                let mut length = None;
                loop {
                    let mut header = String::new();
                    if reader.read_line(&mut header).unwrap_or(0) == 0 {
                        return;
                    }
                    let header = header.trim_end();
                    if header.is_empty() {
                        break;
                    }
                    if let Some(n) = header.strip_prefix("Content-Length: ") {
                        length = n.parse::<usize>().ok();
                    }
                }
                let mut body = vec![0; length.expect("a Content-Length header")];
                if reader.read_exact(&mut body).is_err() {
                    return;
                }
                let message: Value = serde_json::from_slice(&body).expect("a JSON message");
                if tx.send(message).is_err() {
                    return;
                }
            }
        });
        let mut client = Client {
            child,
            stdin,
            messages,
            next_id: 1,
        };
        let uri = uri(root);
        let result = client.request(
            "initialize",
            json!({
                "processId": null,
                "rootUri": uri,
                "workspaceFolders": [{"uri": uri, "name": "rules"}],
                "capabilities": {},
            }),
        );
        assert!(
            result.pointer("/capabilities/hoverProvider").is_some(),
            "{result}"
        );
        client.notify("initialized", json!({}));
        client
    }

    fn send(&mut self, message: &Value) {
        let body = message.to_string();
        write!(self.stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).expect("write");
        self.stdin.flush().expect("flush");
    }

    fn notify(&mut self, method: &str, params: Value) {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// Sends a request and returns its result (notifications before it are
    /// dropped).
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let message = self.next();
            if message.get("id") == Some(&json!(id)) {
                assert!(message.get("error").is_none(), "{message}");
                return message["result"].clone();
            }
        }
    }

    fn next(&self) -> Value {
        self.messages
            .recv_timeout(PATIENCE)
            .expect("a message from the server")
    }

    /// The next diagnostics published for `file`.
    fn diagnostics_for(&self, file: &Path) -> Vec<Value> {
        let want = uri(file);
        loop {
            let message = self.next();
            if message["method"] == "textDocument/publishDiagnostics"
                && message["params"]["uri"] == want
            {
                return message["params"]["diagnostics"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
            }
        }
    }

    fn open(&mut self, file: &Path, text: &str) {
        self.notify(
            "textDocument/didOpen",
            json!({"textDocument": {
                "uri": uri(file), "languageId": "yaml", "version": 1, "text": text,
            }}),
        );
    }

    fn change(&mut self, file: &Path, version: i64, text: &str) {
        self.notify(
            "textDocument/didChange",
            json!({
                "textDocument": {"uri": uri(file), "version": version},
                "contentChanges": [{"text": text}],
            }),
        );
    }

    /// `shutdown`, then `exit`: the server must end with status 0.
    fn shut_down(mut self) {
        let result = self.request("shutdown", Value::Null);
        assert_eq!(result, Value::Null);
        self.notify("exit", Value::Null);
        drop(self.stdin);
        let status = self.child.wait().expect("wait for trellis lsp");
        assert!(status.success(), "trellis lsp exited with {status}");
    }
}

fn uri(path: &Path) -> String {
    format!("file://{}", path.display())
}

/// A workspace (canonical path, so URIs compare) with rule files at `rel`.
fn workspace(files: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().canonicalize().expect("canonical temp dir");
    for (rel, text) in files {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }
    (dir, root)
}

const GOOD: &str = "apiVersion: trellis.dev/v1alpha1
kind: Rule
metadata:
  name: app
spec:
  parent:
    apiVersion: demo.example.com/v1
    kind: App
  schema:
    type: object
    properties:
      replicas: {type: integer}
  defaults:
    replicas: 1
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      includeWhen: \"spec.replicas > 0\"
      template: |
        metadata:
          name: {{ parent.metadata.name }}
        data:
          replicas: \"{{ spec.replicas }}\"
";

#[test]
fn a_diagnostic_on_its_line_then_cleared_when_fixed() {
    let (_dir, root) = workspace(&[("deploy/trellis/app.yaml", GOOD)]);
    let file = root.join("deploy/trellis/app.yaml");
    let mut client = Client::start(&root);
    // An unknown filter (line 19, an error) and a misspelt field of the
    // child (line 23, a warning), in the unsaved buffer only.
    let broken = GOOD
        .replace("> 0\"", "| bogus > 0\"")
        .replace("        data:", "        dta:");
    client.open(&file, &broken);
    let diags = client.diagnostics_for(&file);
    let lines: Vec<(u64, u64, String)> = diags
        .iter()
        .map(|d| {
            (
                d["range"]["start"]["line"].as_u64().expect("line"),
                d["severity"].as_u64().expect("severity"),
                d["message"].as_str().expect("message").to_owned(),
            )
        })
        .collect();
    assert_eq!(lines.len(), 1, "{diags:?}");
    // 0-based line 18 is the file's line 19, `includeWhen`; severity 1: error.
    assert_eq!((lines[0].0, lines[0].1), (18, 1), "{diags:?}");
    assert!(lines[0].2.contains("bogus"), "{diags:?}");

    // With the filter fixed, the child renders and its misspelt field shows.
    client.change(&file, 2, &GOOD.replace("        data:", "        dta:"));
    let diags = client.diagnostics_for(&file);
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert_eq!(diags[0]["range"]["start"]["line"], 22, "{diags:?}");
    assert_eq!(diags[0]["severity"], 2, "{diags:?}");
    assert!(
        diags[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("dta: unknown field (did you mean data?)")),
        "{diags:?}"
    );

    client.change(&file, 3, GOOD);
    assert_eq!(client.diagnostics_for(&file), Vec::<Value>::new());
    client.shut_down();
}

#[test]
fn a_name_used_twice_is_reported_in_both_files() {
    let other = GOOD.replace("name: app", "name: other");
    let (_dir, root) = workspace(&[("rules/a.yaml", GOOD), ("rules/b.yaml", &other)]);
    let (a, b) = (root.join("rules/a.yaml"), root.join("rules/b.yaml"));
    let mut client = Client::start(&root);
    client.open(&b, GOOD);
    let mut found = std::collections::BTreeMap::new();
    while found.len() < 2 {
        let message = client.next();
        if message["method"] == "textDocument/publishDiagnostics" {
            found.insert(
                message["params"]["uri"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                message["params"]["diagnostics"].clone(),
            );
        }
    }
    for file in [&a, &b] {
        let diags = &found[&uri(file)];
        assert!(
            diags.as_array().is_some_and(|d| d
                .iter()
                .any(|d| d["message"].as_str().unwrap_or_default().contains("`app`"))),
            "{}: {diags}",
            file.display()
        );
    }
    client.shut_down();
}

#[test]
fn hover_describes_a_rule_field_and_completion_offers_its_siblings() {
    let (_dir, root) = workspace(&[("app.yaml", GOOD)]);
    let file = root.join("app.yaml");
    let mut client = Client::start(&root);
    client.open(&file, GOOD);
    let hover = client.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": uri(&file)}, "position": {"line": 18, "character": 8}}),
    );
    let text = hover["contents"]["value"].as_str().unwrap_or_default();
    assert!(
        text.contains("spec.children.includeWhen") && text.contains("pruned"),
        "{hover}"
    );
    // Inside the template: not a rule field.
    let inside = client.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": uri(&file)}, "position": {"line": 21, "character": 11}}),
    );
    assert_eq!(inside, Value::Null);
    // A new key under the child.
    let typing = GOOD.replace("      template: |", "      rea\n      template: |");
    client.change(&file, 2, &typing);
    let items = client.request(
        "textDocument/completion",
        json!({"textDocument": {"uri": uri(&file)}, "position": {"line": 19, "character": 9}}),
    );
    let labels: Vec<&str> = items
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["label"].as_str())
        .collect();
    assert!(
        labels.contains(&"readyWhen") && labels.contains(&"forEach"),
        "{labels:?}"
    );
    client.shut_down();
}

#[test]
fn an_unsaved_template_file_is_checked_with_its_rule() {
    let rule = GOOD.replace(
        "      template: |\n        metadata:\n          name: {{ parent.metadata.name }}\n        data:\n          replicas: \"{{ spec.replicas }}\"\n",
        "      templateFile: templates/config.yaml.j2\n",
    );
    assert!(rule.contains("templateFile"), "{rule}");
    let template = "metadata:\n  name: {{ parent.metadata.name }}\ndata:\n  replicas: \"{{ spec.replicas }}\"\n";
    let (_dir, root) = workspace(&[
        ("rules/app.yaml", &rule),
        ("rules/templates/config.yaml.j2", template),
    ]);
    let file = root.join("rules/templates/config.yaml.j2");
    let mut client = Client::start(&root);
    client.open(&file, &template.replace("\ndata:", "\ndat:"));
    let diags = client.diagnostics_for(&file);
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert_eq!(diags[0]["range"]["start"]["line"], 2, "{diags:?}");
    // Closed without saving: the file on disk counts again, and it is clean.
    client.notify(
        "textDocument/didClose",
        json!({"textDocument": {"uri": uri(&file)}}),
    );
    assert_eq!(client.diagnostics_for(&file), Vec::<Value>::new());
    client.shut_down();
}

const APP_TEST: &str = "apiVersion: trellis.dev/v1alpha1
kind: RuleTest
metadata: {name: app}
spec:
  rule: app
  cases:
    - name: one replica renders the ConfigMap
      parent: {apiVersion: demo.example.com/v1, kind: App, metadata: {name: a, namespace: ns}}
      expect:
        children: {config: {data: {replicas: \"1\"}}}
    - name: zero replicas render nothing
      parent: {apiVersion: demo.example.com/v1, kind: App, metadata: {name: a, namespace: ns}, spec: {replicas: 0}}
      expect:
        absent: [config]
";

#[test]
fn a_failing_rule_test_shows_on_its_name_line_and_a_wrong_test_file_on_its_line() {
    let (_dir, root) = workspace(&[("rules/app.yaml", GOOD), ("tests/app.test.yaml", APP_TEST)]);
    let test = root.join("tests/app.test.yaml");
    let rule = root.join("rules/app.yaml");
    let mut client = Client::start(&root);
    // The tests directory is not taken for a rules directory.
    client.open(
        &test,
        &APP_TEST.replace("replicas: \"1\"", "replicas: \"2\""),
    );
    let diags = client.diagnostics_for(&test);
    assert_eq!(diags.len(), 1, "{diags:?}");
    // 0-based line 6: the first case's `name`; severity 1: error.
    assert_eq!(diags[0]["range"]["start"]["line"], 6, "{diags:?}");
    assert_eq!(diags[0]["severity"], 1, "{diags:?}");
    assert_eq!(
        diags[0]["message"],
        "rule test `one replica renders the ConfigMap` fails: \
         children.config.data.replicas: expected \"2\", got \"1\""
    );

    client.change(&test, 2, APP_TEST);
    assert_eq!(client.diagnostics_for(&test), Vec::<Value>::new());

    // A rule edit that breaks a case shows on the test at once.
    client.open(
        &rule,
        &GOOD.replace("spec.replicas > 0", "spec.replicas >= 0"),
    );
    let diags = loop {
        let diags = client.diagnostics_for(&test);
        if !diags.is_empty() {
            break diags;
        }
    };
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert_eq!(diags[0]["range"]["start"]["line"], 10, "{diags:?}");
    assert!(
        diags[0]["message"].as_str().is_some_and(
            |m| m.starts_with("rule test `zero replicas render nothing` fails: absent.config")
        ),
        "{diags:?}"
    );

    // A child the rule does not have: the test file itself is wrong.
    client.change(
        &test,
        3,
        &APP_TEST.replace("absent: [config]", "absent: [confg]"),
    );
    let diags = client.diagnostics_for(&test);
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert_eq!(diags[0]["range"]["start"]["line"], 13, "{diags:?}");
    assert!(
        diags[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("rule `app` has no child or patch `confg`")),
        "{diags:?}"
    );
    client.shut_down();
}
