//! `trellis lsp`: a language server over stdio for rule files.
//!
//! It publishes the very diagnostics `trellis check` prints (errors and
//! warnings, children against their kinds' schemas included) for every
//! rule directory in the workspace, on open, change and save, from the
//! open buffers' unsaved text; a file whose problems are fixed gets an
//! empty list. Rule test files (`*.test.yaml`) are run after every change
//! (`ruletests`): a failing case shows on its `name` line, a wrong test
//! file where it is wrong. Hover on a rule field shows its description from `trellis
//! schema`; completion offers the field names of the block at the cursor.
//!
//! Built on `lsp-server` and `lsp-types` (rust-analyzer's transport and
//! protocol types): a synchronous loop fits a server whose every answer
//! is one pure, CPU-bound `check` of a few files, with no async runtime;
//! tower-lsp-server would bring one for nothing. Changes that arrive while
//! a check runs are taken together before the next one (full-text sync).

mod fields;
mod ruletests;
mod workspace;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use lsp_server::{Connection, ErrorCode, Message, Notification, Request, Response};
use lsp_types::notification::{
    DidChangeTextDocument, DidCloseTextDocument, DidOpenTextDocument, DidSaveTextDocument,
    Notification as _, PublishDiagnostics,
};
use lsp_types::request::{Completion, HoverRequest, Request as _};
use lsp_types::{
    CompletionItem, CompletionItemKind, CompletionOptions, CompletionParams, CompletionResponse,
    Diagnostic as LspDiagnostic, DiagnosticSeverity, DidChangeTextDocumentParams,
    DidCloseTextDocumentParams, DidOpenTextDocumentParams, DidSaveTextDocumentParams,
    Documentation, Hover, HoverContents, HoverParams, HoverProviderCapability, InitializeParams,
    MarkupContent, MarkupKind, Position, PublishDiagnosticsParams, Range, SaveOptions,
    ServerCapabilities, TextDocumentSyncCapability, TextDocumentSyncKind, TextDocumentSyncOptions,
    TextDocumentSyncSaveOptions, Uri,
};
use serde_json::Value;

use crate::offline::check::Inputs;
use crate::rules::{Diagnostic, Severity};
use workspace::{Workspace, canonical};
pub use workspace::{holds_rule, path_to_uri, uri_to_path};

/// `trellis lsp`: serves stdin/stdout until `shutdown` and `exit`.
pub fn run(inputs: Inputs) -> ExitCode {
    let (connection, io) = Connection::stdio();
    let result = serve(&connection, inputs);
    // The writer thread ends once the connection's sender is gone.
    drop(connection);
    let joined = io.join();
    match (result, joined) {
        (Ok(()), Ok(())) => ExitCode::SUCCESS,
        (Err(e), _) => {
            eprintln!("error: trellis lsp: {e}");
            ExitCode::from(1)
        }
        (_, Err(e)) => {
            eprintln!("error: trellis lsp: {e}");
            ExitCode::from(1)
        }
    }
}

fn capabilities() -> ServerCapabilities {
    ServerCapabilities {
        text_document_sync: Some(TextDocumentSyncCapability::Options(
            TextDocumentSyncOptions {
                open_close: Some(true),
                change: Some(TextDocumentSyncKind::FULL),
                save: Some(TextDocumentSyncSaveOptions::SaveOptions(SaveOptions {
                    include_text: Some(false),
                })),
                ..TextDocumentSyncOptions::default()
            },
        )),
        hover_provider: Some(HoverProviderCapability::Simple(true)),
        completion_provider: Some(CompletionOptions::default()),
        ..ServerCapabilities::default()
    }
}

fn serve(connection: &Connection, inputs: Inputs) -> Result<(), String> {
    let caps = serde_json::to_value(capabilities()).map_err(|e| e.to_string())?;
    let params = connection.initialize(caps).map_err(|e| e.to_string())?;
    let params: InitializeParams =
        serde_json::from_value(params).map_err(|e| format!("initialize: {e}"))?;
    let mut server = Server {
        connection,
        ws: Workspace {
            roots: roots(&params),
            inputs,
            ..Workspace::default()
        },
        uris: HashMap::new(),
        published: BTreeMap::new(),
        dirty: BTreeSet::new(),
        flagged_tests: BTreeSet::new(),
        schema: crate::rules::model::json_schema(),
    };
    server.ws.scan();
    server.dirty = server.ws.dirs.clone();
    server.publish();
    while let Ok(message) = connection.receiver.recv() {
        match message {
            Message::Request(request) => {
                if connection
                    .handle_shutdown(&request)
                    .map_err(|e| e.to_string())?
                {
                    return Ok(());
                }
                server.request(request);
            }
            Message::Notification(note) => {
                if note.method == "exit" {
                    return Err("exit without shutdown".into());
                }
                let mut dirty = server.notification(note);
                // Edits that queued up while the last check ran are taken
                // together: one check for all of them.
                while let Ok(next) = connection.receiver.try_recv() {
                    match next {
                        Message::Notification(n) if n.method != "exit" => {
                            dirty |= server.notification(n);
                        }
                        other => {
                            if dirty {
                                server.publish();
                                dirty = false;
                            }
                            match other {
                                Message::Request(r) => {
                                    if connection.handle_shutdown(&r).map_err(|e| e.to_string())? {
                                        return Ok(());
                                    }
                                    server.request(r);
                                }
                                Message::Notification(_) => {
                                    return Err("exit without shutdown".into());
                                }
                                Message::Response(_) => {}
                            }
                            break;
                        }
                    }
                }
                if dirty {
                    server.publish();
                }
            }
            Message::Response(_) => {}
        }
    }
    Err("the client closed the connection without shutdown".into())
}

/// The workspace folders (else the root URI), as directories.
fn roots(params: &InitializeParams) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = params
        .workspace_folders
        .iter()
        .flatten()
        .filter_map(|f| uri_to_path(f.uri.as_str()))
        .collect();
    #[allow(deprecated)]
    if roots.is_empty()
        && let Some(root) = params
            .root_uri
            .as_ref()
            .and_then(|u| uri_to_path(u.as_str()))
    {
        roots.push(root);
    }
    roots.iter().map(|r| canonical(r)).collect()
}

struct Server<'c> {
    connection: &'c Connection,
    ws: Workspace,
    /// Canonical path → the URI the editor calls it by.
    uris: HashMap<PathBuf, String>,
    /// Per rule directory, the files it has diagnostics published for: its
    /// next check clears those it no longer reports.
    published: BTreeMap<PathBuf, BTreeSet<PathBuf>>,
    /// Rule directories changed since their last check.
    dirty: BTreeSet<PathBuf>,
    /// Test files with diagnostics published: the only ones an empty
    /// list is sent to (to clear them) when all is well.
    flagged_tests: BTreeSet<PathBuf>,
    schema: Value,
}

impl Server<'_> {
    fn send(&self, message: Message) {
        // A closed connection ends the loop on the next receive.
        let _ = self.connection.sender.send(message);
    }

    /// Whether the rule set needs checking again.
    fn notification(&mut self, note: Notification) -> bool {
        match note.method.as_str() {
            DidOpenTextDocument::METHOD => {
                let Ok(p) = serde_json::from_value::<DidOpenTextDocumentParams>(note.params) else {
                    return false;
                };
                self.set_buffer(&p.text_document.uri, Some(p.text_document.text))
            }
            DidChangeTextDocument::METHOD => {
                let Ok(p) = serde_json::from_value::<DidChangeTextDocumentParams>(note.params)
                else {
                    return false;
                };
                // Full sync: the last change is the whole text.
                let text = p.content_changes.into_iter().last().map(|c| c.text);
                text.is_some() && self.set_buffer(&p.text_document.uri, text)
            }
            DidSaveTextDocument::METHOD => {
                let Ok(p) = serde_json::from_value::<DidSaveTextDocumentParams>(note.params) else {
                    return false;
                };
                // The disk now holds what the buffer held: check again, as
                // a file saved without being open (no buffer) changed too.
                let Some(path) = uri_to_path(p.text_document.uri.as_str()) else {
                    return false;
                };
                let dirs = self.ws.dirs_of(&canonical(&path));
                let any = !dirs.is_empty() || ruletests::is_test_file(&path);
                self.dirty.extend(dirs);
                any
            }
            DidCloseTextDocument::METHOD => {
                let Ok(p) = serde_json::from_value::<DidCloseTextDocumentParams>(note.params)
                else {
                    return false;
                };
                // The file on disk counts again.
                self.set_buffer(&p.text_document.uri, None)
            }
            _ => false,
        }
    }

    /// Keeps (or with `None` drops) an open buffer's text.
    fn set_buffer(&mut self, uri: &Uri, text: Option<String>) -> bool {
        let Some(path) = uri_to_path(uri.as_str()) else {
            return false;
        };
        let path = canonical(&path);
        self.uris.insert(path.clone(), uri.as_str().to_owned());
        if let Some(text) = &text {
            self.ws.note(&path, text);
        }
        let dirs = self.ws.dirs_of(&path);
        let any = !dirs.is_empty() || self.ws.tests.contains(&path);
        self.dirty.extend(dirs);
        if let Ok(mut buffers) = self.ws.buffers.write() {
            match text {
                Some(text) => buffers.insert(path, text),
                None => buffers.remove(&path),
            };
        }
        any
    }

    /// Checks the changed rule directories and publishes each file's
    /// diagnostics, an empty list for a file that had some and has none now.
    fn publish(&mut self) {
        let dirs = std::mem::take(&mut self.dirty);
        let by_file = self.ws.check(&dirs);
        for dir in &dirs {
            let now: BTreeSet<PathBuf> = by_file
                .keys()
                .filter(|f| f.starts_with(dir))
                .cloned()
                .collect();
            let before = self.published.insert(dir.clone(), now.clone());
            for path in before.unwrap_or_default().difference(&now) {
                self.publish_file(path, Vec::new());
            }
        }
        // Rule tests run after every change: a rule edit may break a case.
        let mut by_test = self.ws.check_tests();
        by_test.retain(|path, diags| {
            let was = !diags.is_empty() || self.flagged_tests.contains(path);
            if diags.is_empty() {
                self.flagged_tests.remove(path);
            } else {
                self.flagged_tests.insert(path.clone());
            }
            was
        });
        for (path, diags) in by_file.iter().chain(&by_test) {
            let text = self.ws.text(path).unwrap_or_default();
            let list = diags.iter().map(|d| to_lsp(d, &text)).collect();
            self.publish_file(path, list);
        }
    }

    fn publish_file(&self, path: &Path, diagnostics: Vec<LspDiagnostic>) {
        let uri = self
            .uris
            .get(path)
            .cloned()
            .unwrap_or_else(|| path_to_uri(path));
        let Ok(uri) = uri.parse::<Uri>() else {
            return;
        };
        let params = PublishDiagnosticsParams {
            uri,
            diagnostics,
            version: None,
        };
        self.send(Message::Notification(Notification::new(
            PublishDiagnostics::METHOD.to_owned(),
            params,
        )));
    }

    fn request(&mut self, request: Request) {
        let response = match request.method.as_str() {
            HoverRequest::METHOD => match serde_json::from_value::<HoverParams>(request.params) {
                Ok(p) => Response::new_ok(request.id, self.hover(&p)),
                Err(e) => {
                    Response::new_err(request.id, ErrorCode::InvalidParams as i32, e.to_string())
                }
            },
            Completion::METHOD => {
                match serde_json::from_value::<CompletionParams>(request.params) {
                    Ok(p) => Response::new_ok(request.id, self.complete(&p)),
                    Err(e) => Response::new_err(
                        request.id,
                        ErrorCode::InvalidParams as i32,
                        e.to_string(),
                    ),
                }
            }
            _ => Response::new_err(
                request.id,
                ErrorCode::MethodNotFound as i32,
                format!("unhandled method {}", request.method),
            ),
        };
        self.send(Message::Response(response));
    }

    /// The text of a rule file the request is about; `None` for any other file.
    fn rule_text(&self, uri: &Uri) -> Option<String> {
        let path = canonical(&uri_to_path(uri.as_str())?);
        let text = self.ws.text(&path)?;
        holds_rule(&text).then_some(text)
    }

    fn hover(&self, p: &HoverParams) -> Option<Hover> {
        let at = &p.text_document_position_params;
        let text = self.rule_text(&at.text_document.uri)?;
        let path = fields::path_at(&text, at.position.line as usize)?;
        let node = fields::schema_at(&self.schema, &path)?;
        let description = fields::description(&self.schema, node)?;
        Some(Hover {
            contents: HoverContents::Markup(MarkupContent {
                kind: MarkupKind::Markdown,
                value: format!("**{}**\n\n{description}", path.join(".")),
            }),
            range: None,
        })
    }

    fn complete(&self, p: &CompletionParams) -> Option<CompletionResponse> {
        let at = &p.text_document_position;
        let text = self.rule_text(&at.text_document.uri)?;
        let line = at.position.line as usize;
        // The column the key being typed starts at.
        let current = text.lines().nth(line).unwrap_or_default();
        let typed = current.trim_start().trim_start_matches("- ");
        let col = current.len() - typed.len();
        let path = fields::enclosing(&text, line, col)?;
        let node = fields::schema_at(&self.schema, &path)?;
        let items = fields::fields_of(&self.schema, node)
            .into_iter()
            .map(|(name, doc)| CompletionItem {
                label: name.to_owned(),
                kind: Some(CompletionItemKind::FIELD),
                documentation: doc.map(|d| {
                    Documentation::MarkupContent(MarkupContent {
                        kind: MarkupKind::Markdown,
                        value: d.to_owned(),
                    })
                }),
                insert_text: Some(format!("{name}: ")),
                ..CompletionItem::default()
            })
            .collect();
        Some(CompletionResponse::Array(items))
    }
}

/// A `check` diagnostic as the editor shows it: on its line (the first
/// when it names none), the field before the message.
fn to_lsp(d: &Diagnostic, text: &str) -> LspDiagnostic {
    let line = d.line.map_or(0, |l| l.saturating_sub(1));
    let width = usize::try_from(line)
        .ok()
        .and_then(|l| text.lines().nth(l))
        .map_or(0, |l| l.encode_utf16().count());
    let line = u32::try_from(line).unwrap_or(u32::MAX);
    let message = if d.field.is_empty() {
        d.message.clone()
    } else {
        format!("{}: {}", d.field, d.message)
    };
    LspDiagnostic {
        range: Range::new(
            Position::new(line, 0),
            Position::new(line, u32::try_from(width).unwrap_or(u32::MAX)),
        ),
        severity: Some(match d.severity {
            Severity::Error => DiagnosticSeverity::ERROR,
            Severity::Warning => DiagnosticSeverity::WARNING,
        }),
        source: Some("trellis".into()),
        message,
        ..LspDiagnostic::default()
    }
}
