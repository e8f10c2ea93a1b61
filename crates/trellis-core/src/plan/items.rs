//! The items of a `forEach` (a child's, a patch's, a condition's): the
//! elements of one list, or every combination of several named lists, the
//! first name varying slowest. Both are bounded by [`MAX_FOR_EACH_ITEMS`]
//! — for combinations, the product of the lists' lengths, checked before
//! any combination is built.

use minijinja::value::ValueKind;

use super::child::Item;
use crate::render::{Engine, RenderError};
use crate::rules::CompiledForEach;

/// Most items one `forEach` may yield (combinations included).
pub const MAX_FOR_EACH_ITEMS: usize = 1_000;

/// The items of `for_each` evaluated in `ctx`, each with its index; `what`
/// names the `forEach` in errors.
pub(super) fn for_each_items(
    engine: &Engine,
    for_each: &CompiledForEach,
    ctx: &minijinja::Value,
    what: &str,
) -> Result<Vec<Item>, RenderError> {
    let fail = |message: String| RenderError {
        what: what.to_owned(),
        message,
    };
    let items: Vec<minijinja::Value> = match for_each {
        CompiledForEach::List(expr) => {
            let items = list(engine, *expr, ctx, what, None)?;
            if items.len() > MAX_FOR_EACH_ITEMS {
                return Err(fail(format!(
                    "yields {} items, more than the limit of {MAX_FOR_EACH_ITEMS}",
                    items.len()
                )));
            }
            items
        }
        CompiledForEach::Product(named) => {
            let mut lists = Vec::with_capacity(named.len());
            for (name, expr) in named {
                lists.push((name.as_str(), list(engine, *expr, ctx, what, Some(name))?));
            }
            let total = lists
                .iter()
                .try_fold(1usize, |n, (_, l)| n.checked_mul(l.len()));
            match total {
                Some(n) if n <= MAX_FOR_EACH_ITEMS => combinations(&lists),
                _ => {
                    let sizes: Vec<String> = lists
                        .iter()
                        .map(|(n, l)| format!("{n}: {}", l.len()))
                        .collect();
                    return Err(fail(format!(
                        "yields more than the limit of {MAX_FOR_EACH_ITEMS} combinations ({})",
                        sizes.join(" × ")
                    )));
                }
            }
        }
    };
    Ok(items.into_iter().enumerate().map(|(i, v)| (v, i)).collect())
}

/// One list of a `forEach` (`name`: its name in a combination).
fn list(
    engine: &Engine,
    expr: crate::render::ExprId,
    ctx: &minijinja::Value,
    what: &str,
    name: Option<&str>,
) -> Result<Vec<minijinja::Value>, RenderError> {
    let what = match name {
        Some(name) => format!("{what} ({name})"),
        None => what.to_owned(),
    };
    let value = engine.eval(expr, ctx, &what)?;
    if !matches!(value.kind(), ValueKind::Seq | ValueKind::Iterable) {
        return Err(RenderError {
            what,
            message: format!("must yield a list, got {}", value.kind()),
        });
    }
    let items = value.try_iter().map_err(|e| RenderError {
        what: what.clone(),
        message: e.to_string(),
    })?;
    // Bounded before collecting: a lazy iterable can be long.
    let items: Vec<minijinja::Value> = items.take(MAX_FOR_EACH_ITEMS + 1).collect();
    if items.len() > MAX_FOR_EACH_ITEMS {
        return Err(RenderError {
            what,
            message: format!("yields more than the limit of {MAX_FOR_EACH_ITEMS} items"),
        });
    }
    Ok(items)
}

/// Every combination of `lists`, the first list varying slowest, each a
/// mapping of the lists' names to one element of each.
fn combinations(lists: &[(&str, Vec<minijinja::Value>)]) -> Vec<minijinja::Value> {
    let mut out: Vec<Vec<(&str, minijinja::Value)>> = vec![Vec::new()];
    for (name, elements) in lists {
        out = out
            .into_iter()
            .flat_map(|prefix| {
                elements.iter().map(move |e| {
                    let mut next = prefix.clone();
                    next.push((*name, e.clone()));
                    next
                })
            })
            .collect();
    }
    out.into_iter()
        .map(|pairs| {
            let map: std::collections::BTreeMap<String, minijinja::Value> =
                pairs.into_iter().map(|(n, v)| (n.to_owned(), v)).collect();
            minijinja::Value::from(map)
        })
        .collect()
}
