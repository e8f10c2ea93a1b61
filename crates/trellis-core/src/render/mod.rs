//! The minijinja environment every rule renders with.
//!
//! One [`Engine`] per rule holds its compiled child templates, message
//! templates and expressions; nothing is parsed per render. The engine
//! enforces the format's safety rules:
//!
//! * child templates auto-escape every `{{ }}` as a JSON literal, so values
//!   from a parent are data and can never add YAML structure;
//! * lookups on missing fields are undefined at any depth (so `| default`
//!   works), but printing an undefined value, or an expression evaluating to
//!   one, is an error — never an empty string or a quiet `false`;
//! * fuel, recursion depth and rendered bytes are capped per render.
//!
//! It does not know about rules or Kubernetes; `plan` decides what to render.

mod calls;
mod convert;
pub use convert::parse_quantity;
mod filters;
mod patterns;
pub mod shape;

use std::collections::{HashMap, HashSet};
use std::io;

use minijinja::value::Serde;
use minijinja::value::ValueKind;
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Expression, UndefinedBehavior, Value};

pub use calls::{Calls, scan as scan_calls};
pub use filters::{dns_label, sha256_hex};

/// Per-render limits. A render that exceeds one fails that parent only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// minijinja fuel: roughly, instructions executed.
    pub fuel: u64,
    /// Nesting depth of templates, macros and data structures.
    pub recursion: usize,
    /// Bytes one template may produce.
    pub max_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            fuel: 100_000,
            recursion: 64,
            max_bytes: 1024 * 1024,
        }
    }
}

/// What went wrong in one render or evaluation, and where.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{what}: {message}")]
pub struct RenderError {
    /// e.g. `template of child "web"` or `readyWhen of child "web"`.
    pub what: String,
    pub message: String,
}

/// How a template's output is escaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateKind {
    /// Renders a Kubernetes object as YAML; `{{ }}` emits JSON literals.
    Object,
    /// Plain text (condition messages); nothing is escaped.
    Text,
}

const OBJECT_PREFIX: &str = "object:";
const TEXT_PREFIX: &str = "text:";

/// Handle of an expression compiled into an [`Engine`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExprId(usize);

/// Handle of a template compiled into an [`Engine`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TemplateId(String);

/// Collects templates and expressions, checking their syntax as they come.
pub struct EngineBuilder {
    env: Environment<'static>,
    expressions: Vec<String>,
    sources: HashMap<String, String>,
    limits: Limits,
}

type Expressions<'env> = Vec<Expression<'env, 'static>>;

self_cell::self_cell!(
    struct Compiled {
        owner: Environment<'static>,
        #[covariant]
        dependent: Expressions,
    }
);

/// The compiled templates and expressions of one rule.
pub struct Engine {
    compiled: Compiled,
    expression_sources: Vec<String>,
    /// Template name → source, so an error can quote the failing expression.
    template_sources: HashMap<String, String>,
    limits: Limits,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("expressions", &self.expression_sources)
            .field("limits", &self.limits)
            .finish()
    }
}

fn new_environment(limits: &Limits) -> Environment<'static> {
    let mut env = Environment::new();
    // SemiStrict as patched in vendor/minijinja: lookups chain through missing
    // fields (so `| default` and `is defined` work at any depth), while a
    // missing operand of a comparison, arithmetic, `~`, `in` or a filter
    // other than `default` is an error, never a quiet `false`.
    env.set_undefined_behavior(UndefinedBehavior::SemiStrict);
    env.set_fuel(Some(limits.fuel));
    env.set_recursion_limit(limits.recursion);
    env.set_auto_escape_callback(|name| {
        if name.starts_with(OBJECT_PREFIX) {
            AutoEscape::Json
        } else {
            AutoEscape::None
        }
    });
    env.set_formatter(|out, state, value| {
        if value.is_undefined() {
            return Err(Error::new(
                ErrorKind::UndefinedError,
                "printing a missing value; use `| default(...)` or `is defined`",
            ));
        }
        minijinja::escape_formatter(out, state, value)
    });
    // Templates are data from rule files: no loader, so no includes from disk.
    filters::register(&mut env);
    env
}

impl EngineBuilder {
    pub fn new(limits: Limits) -> Self {
        EngineBuilder {
            env: new_environment(&limits),
            expressions: Vec::new(),
            sources: HashMap::new(),
            limits,
        }
    }

    /// Compiles a template; `name` must be unique in this engine.
    pub fn add_template(
        &mut self,
        name: &str,
        kind: TemplateKind,
        source: &str,
    ) -> Result<TemplateId, SyntaxError> {
        let prefix = match kind {
            TemplateKind::Object => OBJECT_PREFIX,
            TemplateKind::Text => TEXT_PREFIX,
        };
        let full = format!("{prefix}{name}");
        self.env
            .add_template_owned(full.clone(), source.to_owned())
            .map_err(SyntaxError)?;
        self.sources.insert(full.clone(), source.to_owned());
        Ok(TemplateId(full))
    }

    /// Compiles an expression.
    pub fn add_expression(&mut self, source: &str) -> Result<ExprId, SyntaxError> {
        self.env
            .compile_expression_owned(source.to_owned())
            .map_err(SyntaxError)?;
        self.expressions.push(source.to_owned());
        Ok(ExprId(self.expressions.len() - 1))
    }

    /// Names used by a template but not set inside it (`nested`: dotted paths).
    /// A name the template assigns anywhere (even only in `if`/`else`
    /// branches) is its own, not a context name.
    pub fn template_names(&self, id: &TemplateId, nested: bool) -> HashSet<String> {
        let calls = self.template_calls(id);
        let mut names: HashSet<String> = match self.env.get_template(&id.0) {
            Ok(t) => self
                .without_globals(t.undeclared_variables(nested))
                .into_iter()
                .filter(|n| !calls.locals.contains(n.split('.').next().unwrap_or(n)))
                .collect(),
            Err(_) => HashSet::new(),
        };
        if calls.reads_self {
            names.insert("self".to_owned());
        }
        names
    }

    /// Filters, tests, functions and locals of a compiled template.
    pub fn template_calls(&self, id: &TemplateId) -> Calls {
        self.sources
            .get(&id.0)
            .map(|s| calls::scan(s))
            .unwrap_or_default()
    }

    /// The YAML collection a compiled template's own text writes.
    pub fn template_shape(&self, id: &TemplateId) -> Option<shape::Shape> {
        self.sources.get(&id.0).and_then(|s| shape::of(s))
    }

    /// Filters, tests and functions of a compiled expression.
    pub fn expression_calls(&self, id: ExprId) -> Calls {
        calls::scan(&format!("{{{{ {} }}}}", self.expressions[id.0]))
    }

    /// One message per filter, test or function that this engine lacks.
    pub fn unknown_calls(&self, calls: &Calls) -> Vec<String> {
        calls::unknown(&self.env, calls)
    }

    /// Names an expression uses (`nested`: dotted paths).
    pub fn expression_names(&self, id: ExprId, nested: bool) -> HashSet<String> {
        match self.env.compile_expression(&self.expressions[id.0]) {
            Ok(e) => self.without_globals(e.undeclared_variables(nested)),
            Err(_) => HashSet::new(),
        }
    }

    fn without_globals(&self, names: HashSet<String>) -> HashSet<String> {
        names
            .into_iter()
            .filter(|n| {
                let root = n.split('.').next().unwrap_or(n);
                !self.env.globals().any(|(g, _)| g == root)
            })
            .collect()
    }

    pub fn build(self) -> Result<Engine, SyntaxError> {
        let sources = self.expressions.clone();
        let compiled = Compiled::try_new(self.env, |env| {
            sources
                .iter()
                .map(|s| env.compile_expression_owned(s.clone()))
                .collect::<Result<Vec<_>, _>>()
        })
        .map_err(SyntaxError)?;
        Ok(Engine {
            compiled,
            expression_sources: self.expressions,
            template_sources: self.sources,
            limits: self.limits,
        })
    }
}

/// A `Write` that refuses to grow past a cap, so a runaway loop cannot eat memory.
struct CappedBuffer {
    buf: Vec<u8>,
    cap: usize,
    exceeded: bool,
}

impl io::Write for CappedBuffer {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > self.cap {
            self.exceeded = true;
            return Err(io::Error::other("rendered output too large"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Engine {
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Renders a template to text, within the byte cap.
    pub fn render(&self, id: &TemplateId, ctx: &Value, what: &str) -> Result<String, RenderError> {
        let fail = |message: String| RenderError {
            what: what.to_owned(),
            message,
        };
        let env = self.compiled.borrow_owner();
        let template = env.get_template(&id.0).map_err(|e| fail(describe(&e)))?;
        let mut out = CappedBuffer {
            buf: Vec::with_capacity(1024),
            cap: self.limits.max_bytes,
            exceeded: false,
        };
        if let Err(err) = template.render_captured_to(ctx.clone(), &mut out) {
            if out.exceeded {
                return Err(fail(format!(
                    "rendered output exceeds the limit of {} bytes (--render-max-bytes)",
                    self.limits.max_bytes
                )));
            }
            let mut message = describe_in(&err, self.template_sources.get(&id.0));
            self.name_the_limit(&err, &mut message);
            if err.kind() == ErrorKind::UndefinedError && !message.contains("default(") {
                message.push_str("; use `| default(...)` or `is defined`");
            }
            return Err(fail(message));
        }
        String::from_utf8(out.buf).map_err(|_| fail("rendered output is not UTF-8".into()))
    }

    /// Evaluates an expression; an undefined result is an error.
    pub fn eval(&self, id: ExprId, ctx: &Value, what: &str) -> Result<Value, RenderError> {
        let source = &self.expression_sources[id.0];
        let fail = |message: String| RenderError {
            what: what.to_owned(),
            message,
        };
        let expr = &self.compiled.borrow_dependent()[id.0];
        let value = expr.eval(ctx.clone()).map_err(|e| {
            let mut message = format!("`{}`: {}", one_line(source), describe(&e));
            self.name_the_limit(&e, &mut message);
            if !message.contains("default(") && message.contains("undefined") {
                message.push_str("; use `| default(...)` or `is defined`");
            }
            fail(message)
        })?;
        if value.is_undefined() {
            return Err(fail(format!(
                "`{}` evaluated to a missing value; use `| default(...)` or `is defined`",
                one_line(source)
            )));
        }
        Ok(value)
    }

    /// Evaluates an expression that must yield a boolean: the string
    /// `"false"`, a number or a list is an error, not a truthy value.
    pub fn eval_bool(&self, id: ExprId, ctx: &Value, what: &str) -> Result<bool, RenderError> {
        let value = self.eval(id, ctx, what)?;
        if value.kind() != ValueKind::Bool {
            return Err(RenderError {
                what: what.to_owned(),
                message: format!(
                    "`{}` must yield a boolean, got {} {value}",
                    one_line(&self.expression_sources[id.0]),
                    value.kind()
                ),
            });
        }
        Ok(value.is_true())
    }

    /// Says which configurable limit an error hit, so the message tells
    /// what to raise.
    fn name_the_limit(&self, err: &Error, message: &mut String) {
        if err.kind() == ErrorKind::OutOfFuel {
            message.push_str(&format!(
                "; the fuel limit is {} per render (--render-fuel)",
                self.limits.fuel
            ));
        } else if err.kind() == ErrorKind::InvalidOperation
            && err
                .detail()
                .is_some_and(|d| d.contains("recursion limit exceeded"))
        {
            message.push_str(&format!(
                "; the recursion limit is {} (--render-recursion)",
                self.limits.recursion
            ));
        }
    }

    /// The source of a compiled expression.
    pub fn expression_source(&self, id: ExprId) -> &str {
        &self.expression_sources[id.0]
    }
}

/// An expression as one line, for messages (YAML block scalars keep newlines).
pub fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Like [`describe`], naming the failing expression when its span is known.
fn describe_in(err: &Error, source: Option<&String>) -> String {
    let mut text = describe(err);
    let quoted = err
        .range()
        .and_then(|r| source.and_then(|s| s.get(r)))
        .map(one_line)
        .filter(|e| !e.is_empty() && !text.contains(&format!("`{e}`")));
    if let Some(expr) = quoted {
        text.push_str(&format!(" in `{expr}`"));
    }
    text
}

/// A template or expression that does not compile; shown as minijinja's
/// error with its line ([`describe`]).
#[derive(Debug, thiserror::Error)]
#[error("{}", describe(.0))]
pub struct SyntaxError(#[source] Error);

/// minijinja's error, with template line and the undefined value's origin where known.
fn describe(err: &Error) -> String {
    let kind = match err.kind() {
        ErrorKind::UndefinedError => "missing value".to_owned(),
        other => other.to_string(),
    };
    let mut text = match err.detail() {
        Some(detail) => format!("{kind}: {detail}"),
        None => kind,
    };
    if let Some(line) = err.line() {
        text.push_str(&format!(" (line {line})"));
    }
    if err.kind() == ErrorKind::WriteFailure {
        text = "rendered output too large".into();
    }
    text
}

/// Turns a JSON value into a template value.
pub fn to_value(value: &serde_json::Value) -> Value {
    Value::from(Serde(value))
}

/// Turns a template value back into JSON (e.g. an expression's result).
pub fn to_json(value: &Value) -> Result<serde_json::Value, serde_json::Error> {
    serde_json::to_value(value)
}

#[cfg(test)]
mod tests;
