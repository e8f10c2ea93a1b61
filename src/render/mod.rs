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

mod filters;

use std::collections::HashSet;
use std::io;

use minijinja::value::Serde;
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Expression, UndefinedBehavior, Value};

pub use filters::dns_label;

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
    env.set_undefined_behavior(UndefinedBehavior::Chainable);
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
            limits,
        }
    }

    /// Compiles a template; `name` must be unique in this engine.
    pub fn add_template(
        &mut self,
        name: &str,
        kind: TemplateKind,
        source: &str,
    ) -> Result<TemplateId, String> {
        let prefix = match kind {
            TemplateKind::Object => OBJECT_PREFIX,
            TemplateKind::Text => TEXT_PREFIX,
        };
        let full = format!("{prefix}{name}");
        self.env
            .add_template_owned(full.clone(), source.to_owned())
            .map_err(describe)?;
        Ok(TemplateId(full))
    }

    /// Compiles an expression.
    pub fn add_expression(&mut self, source: &str) -> Result<ExprId, String> {
        self.env
            .compile_expression_owned(source.to_owned())
            .map_err(describe)?;
        self.expressions.push(source.to_owned());
        Ok(ExprId(self.expressions.len() - 1))
    }

    /// Names used by a template but not set inside it (`nested`: dotted paths).
    pub fn template_names(&self, id: &TemplateId, nested: bool) -> HashSet<String> {
        match self.env.get_template(&id.0) {
            Ok(t) => self.without_globals(t.undeclared_variables(nested)),
            Err(_) => HashSet::new(),
        }
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

    pub fn build(self) -> Result<Engine, String> {
        let sources = self.expressions.clone();
        let compiled = Compiled::try_new(self.env, |env| {
            sources
                .iter()
                .map(|s| env.compile_expression_owned(s.clone()))
                .collect::<Result<Vec<_>, _>>()
        })
        .map_err(describe)?;
        Ok(Engine {
            compiled,
            expression_sources: self.expressions,
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
        let template = env.get_template(&id.0).map_err(|e| fail(describe(e)))?;
        let mut out = CappedBuffer {
            buf: Vec::with_capacity(1024),
            cap: self.limits.max_bytes,
            exceeded: false,
        };
        if let Err(err) = template.render_captured_to(ctx.clone(), &mut out) {
            if out.exceeded {
                return Err(fail(format!(
                    "rendered output exceeds the limit of {} bytes",
                    self.limits.max_bytes
                )));
            }
            return Err(fail(describe(err)));
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
        let value = expr.eval(ctx.clone()).map_err(|e| fail(describe(e)))?;
        if value.is_undefined() {
            return Err(fail(format!(
                "`{source}` evaluated to a missing value; use `| default(...)` or `is defined`"
            )));
        }
        Ok(value)
    }

    /// Evaluates an expression that must yield a boolean-like value.
    pub fn eval_bool(&self, id: ExprId, ctx: &Value, what: &str) -> Result<bool, RenderError> {
        Ok(self.eval(id, ctx, what)?.is_true())
    }
}

/// minijinja's error, with template line and the undefined value's origin where known.
fn describe(err: Error) -> String {
    let mut text = match err.detail() {
        Some(detail) => format!("{}: {detail}", err.kind()),
        None => err.kind().to_string(),
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
pub fn to_json(value: &Value) -> Result<serde_json::Value, String> {
    serde_json::to_value(value).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
