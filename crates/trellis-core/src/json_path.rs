//! JSONPath queries as trellis reads them (status fields' `jsonPath`): a
//! singular query in RFC 9535's sense yields one value or none, any other
//! query a list. A fact about queries, so the compiler (which checks a
//! field's default against it) and `status` (which evaluates fields) share
//! it without one depending on the other.

use jsonpath_rust::parser::model::{JpQuery, Segment, Selector};
use jsonpath_rust::query::js_path_process;
use serde_json::Value;

/// The value of a parsed query on `observed`: the one match of a singular
/// query (`None` without one), else every match as a list.
pub fn query_value(query: &JpQuery, observed: &Value) -> Option<Value> {
    let matches = js_path_process(query, observed).ok()?;
    let mut values = matches.into_iter().map(|m| m.val.clone());
    if is_singular(query) {
        values.next()
    } else {
        Some(Value::Array(values.collect()))
    }
}

/// Whether a query is singular in RFC 9535's sense.
pub fn is_singular(query: &JpQuery) -> bool {
    let one = |s: &Selector| matches!(s, Selector::Name(_) | Selector::Index(_));
    query.segments.iter().all(|segment| match segment {
        Segment::Selector(s) => one(s),
        Segment::Selectors(list) => list.len() == 1 && list.iter().all(one),
        Segment::Descendant(_) => false,
    })
}
