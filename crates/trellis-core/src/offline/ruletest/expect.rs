//! The `expect` block of a case, read and checked against the rule: ids
//! the rule has, a list for a forEach child and a mapping for any other,
//! condition statuses that exist.

use serde_json::Value;

use super::file::{EXPECT_KEYS, Expect, Reader, join, type_name};
use crate::rules::CompiledRule;

impl Reader<'_> {
    pub(super) fn expect(
        &mut self,
        value: &Value,
        at: &str,
        rule: &CompiledRule,
    ) -> Option<Expect> {
        let object = self.object(value, at)?;
        self.known_keys(object, at, EXPECT_KEYS);
        let before = self.diags.len();
        let mut expect = Expect::default();
        if let Some(v) = object.get("children") {
            let field = join(at, "children");
            if let Some(children) = self.object(v, &field) {
                for (id, want) in children {
                    let field = join(&field, id);
                    if self.known_id(rule, id, &field) {
                        self.child_shape(rule, id, want, &field);
                        expect.children.insert(id.clone(), want.clone());
                    }
                }
            }
        }
        if let Some(v) = object.get("absent") {
            expect.absent = self.ids(v, &join(at, "absent"), rule);
        }
        if let Some(v) = object.get("pending") {
            let field = join(at, "pending");
            if let Some(pending) = self.object(v, &field) {
                for (id, reason) in pending {
                    let field = join(&field, id);
                    if self.known_id(rule, id, &field)
                        && let Some(reason) = self.string(reason, &field)
                    {
                        expect.pending.insert(id.clone(), reason);
                    }
                }
            }
        }
        if let Some(v) = object.get("status")
            && self.object(v, &join(at, "status")).is_some()
        {
            expect.status = Some(v.clone());
        }
        if let Some(v) = object.get("conditions") {
            let field = join(at, "conditions");
            if let Some(conditions) = self.object(v, &field) {
                for (kind, want) in conditions {
                    if let Some(want) = self.condition(want, &join(&field, kind)) {
                        expect.conditions.insert(kind.clone(), want);
                    }
                }
            }
        }
        if let Some(v) = object.get("errors") {
            expect.errors = self.strings(v, &join(at, "errors"));
        }
        (self.diags.len() == before).then_some(expect)
    }

    fn known_id(&mut self, rule: &CompiledRule, id: &str, field: &str) -> bool {
        let ids: Vec<&str> = rule
            .children
            .iter()
            .chain(&rule.patches)
            .map(|c| c.spec.id.as_str())
            .collect();
        if ids.contains(&id) {
            return true;
        }
        self.error(
            field,
            format!(
                "rule `{}` has no child or patch `{id}` (ids: {})",
                rule.name,
                ids.join(", ")
            ),
        );
        false
    }

    /// A forEach child's objects are a list, any other's one mapping.
    fn child_shape(&mut self, rule: &CompiledRule, id: &str, want: &Value, field: &str) {
        let for_each = rule
            .children
            .iter()
            .any(|c| c.spec.id == id && c.spec.for_each.is_some());
        match (for_each, want) {
            (true, Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    self.object(item, &format!("{field}[{i}]"));
                }
            }
            (true, other) => self.error(
                field,
                format!(
                    "child `{id}` has forEach: expect a list of its objects in item order, \
                     not {}",
                    type_name(other)
                ),
            ),
            (false, Value::Object(_)) => {}
            (false, other) => self.error(
                field,
                format!(
                    "`{id}` renders one object: expect a mapping (a subset of it), not {}",
                    type_name(other)
                ),
            ),
        }
    }

    fn ids(&mut self, value: &Value, field: &str, rule: &CompiledRule) -> Vec<String> {
        let ids = self.strings(value, field).unwrap_or_default();
        ids.into_iter()
            .enumerate()
            .filter(|(i, id)| self.known_id(rule, id, &format!("{field}[{i}]")))
            .map(|(_, id)| id)
            .collect()
    }

    pub(super) fn strings(&mut self, value: &Value, field: &str) -> Option<Vec<String>> {
        let Some(items) = value.as_array() else {
            self.error(
                field,
                format!("must be a list of strings, not {}", type_name(value)),
            );
            return None;
        };
        items
            .iter()
            .enumerate()
            .map(|(i, v)| self.string(v, &format!("{field}[{i}]")))
            .collect()
    }

    /// `"True"`, `"False/Failed"`; a YAML boolean stands for its status.
    fn condition(&mut self, value: &Value, field: &str) -> Option<String> {
        let text = match value {
            Value::Bool(true) => "True".to_owned(),
            Value::Bool(false) => "False".to_owned(),
            other => self.string(other, field)?,
        };
        let status = text.split_once('/').map_or(text.as_str(), |(s, _)| s);
        if !["True", "False", "Unknown"].contains(&status) {
            self.error(
                field,
                format!(
                    "`{text}`: expected a condition status (True, False, Unknown), \
                     optionally with a reason: \"False/RenderError\""
                ),
            );
            return None;
        }
        Some(text)
    }
}
