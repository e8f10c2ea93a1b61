//! Subset matching, as the contract defines it: every key given must be
//! there with that value, keys not given are not checked, lists compare
//! element by element and must have the same length. Numbers compare by
//! value (`1` matches `1.0`); everything else by equality.

use serde::Serialize;
use serde_json::Value;

/// One place where the pass differs from the expectation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mismatch {
    /// Where, e.g. `children.web.spec.replicas` or `conditions.Ready`.
    pub path: String,
    pub expected: Value,
    /// `None`: nothing is there (left out of the JSON report).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actual: Option<Value>,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let actual = match &self.actual {
            Some(a) => show(a),
            None => "nothing (missing)".to_owned(),
        };
        write!(
            f,
            "{}: expected {}, got {actual}",
            self.path,
            show(&self.expected)
        )
    }
}

/// A value as one line of JSON (strings quoted).
fn show(value: &Value) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// Pushes a [`Mismatch`] for every way `actual` fails to hold `expected`.
pub fn subset(expected: &Value, actual: &Value, path: &str, out: &mut Vec<Mismatch>) {
    match (expected, actual) {
        (Value::Object(want), Value::Object(have)) => {
            for (key, want) in want {
                let at = key_path(path, key);
                match have.get(key) {
                    Some(have) => subset(want, have, &at, out),
                    None => out.push(Mismatch {
                        path: at,
                        expected: want.clone(),
                        actual: None,
                    }),
                }
            }
        }
        (Value::Array(want), Value::Array(have)) if want.len() == have.len() => {
            for (i, (want, have)) in want.iter().zip(have).enumerate() {
                subset(want, have, &format!("{path}[{i}]"), out);
            }
        }
        (Value::Number(want), Value::Number(have)) if want.as_f64() == have.as_f64() => {}
        (want, have) if want == have => {}
        (want, have) => out.push(Mismatch {
            path: path.to_owned(),
            expected: want.clone(),
            actual: Some(have.clone()),
        }),
    }
}

/// `path.key`, or `path["key.with.dots"]` for a key a dot would split.
pub fn key_path(path: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    match (path.is_empty(), plain) {
        (true, true) => key.to_owned(),
        (false, true) => format!("{path}.{key}"),
        (_, false) => format!("{path}[{}]", show(&Value::String(key.to_owned()))),
    }
}

/// Pairs each expected substring with a distinct error containing it
/// (a bipartite matching: a substring that fits several errors does not
/// take the one another needs). Returns the expected substrings left
/// unmatched and the errors left unmatched, by index.
pub fn match_errors(expected: &[String], errors: &[String]) -> (Vec<usize>, Vec<usize>) {
    // error index → expected index holding it.
    let mut owner: Vec<Option<usize>> = vec![None; errors.len()];
    fn augment(
        e: usize,
        expected: &[String],
        errors: &[String],
        owner: &mut Vec<Option<usize>>,
        seen: &mut Vec<bool>,
    ) -> bool {
        for (j, error) in errors.iter().enumerate() {
            if seen[j] || !error.contains(expected[e].as_str()) {
                continue;
            }
            seen[j] = true;
            let free = match owner[j] {
                None => true,
                Some(other) => augment(other, expected, errors, owner, seen),
            };
            if free {
                owner[j] = Some(e);
                return true;
            }
        }
        false
    }
    let unmatched_expected = (0..expected.len())
        .filter(|&e| {
            let mut seen = vec![false; errors.len()];
            !augment(e, expected, errors, &mut owner, &mut seen)
        })
        .collect();
    let unmatched_errors = owner
        .iter()
        .enumerate()
        .filter(|(_, o)| o.is_none())
        .map(|(j, _)| j)
        .collect();
    (unmatched_expected, unmatched_errors)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn mismatches(expected: Value, actual: Value) -> Vec<Mismatch> {
        let mut out = Vec::new();
        subset(&expected, &actual, "x", &mut out);
        out
    }

    #[test]
    fn keys_not_given_are_not_checked() {
        let actual = json!({"spec": {"replicas": 2, "image": "nginx"}, "kind": "Deployment"});
        assert_eq!(
            mismatches(json!({"spec": {"replicas": 2}}), actual.clone()),
            []
        );
        assert_eq!(mismatches(json!({}), actual), []);
    }

    #[test]
    fn a_key_given_must_be_there_with_that_value() {
        let actual = json!({"spec": {"replicas": 1}});
        assert_eq!(
            mismatches(json!({"spec": {"replicas": 2, "paused": false}}), actual),
            [
                Mismatch {
                    path: "x.spec.replicas".into(),
                    expected: json!(2),
                    actual: Some(json!(1))
                },
                Mismatch {
                    path: "x.spec.paused".into(),
                    expected: json!(false),
                    actual: None
                },
            ]
        );
    }

    #[test]
    fn lists_compare_element_by_element_with_the_same_length() {
        let actual = json!({"rules": [{"host": "a", "http": {}}, {"host": "b"}]});
        assert_eq!(
            mismatches(
                json!({"rules": [{"host": "a"}, {"host": "b"}]}),
                actual.clone()
            ),
            []
        );
        let short = mismatches(json!({"rules": [{"host": "a"}]}), actual.clone());
        assert_eq!(short.len(), 1, "{short:?}");
        assert_eq!(short[0].path, "x.rules");
        let wrong = mismatches(json!({"rules": [{"host": "a"}, {"host": "c"}]}), actual);
        assert_eq!(wrong[0].path, "x.rules[1].host");
        assert_eq!(wrong[0].actual, Some(json!("b")));
    }

    #[test]
    fn numbers_compare_by_value_and_types_must_agree() {
        assert_eq!(mismatches(json!(1), json!(1.0)), []);
        assert_eq!(mismatches(json!("1"), json!(1)).len(), 1);
        assert_eq!(mismatches(json!(null), json!(null)), []);
        assert_eq!(mismatches(json!({"a": 1}), json!([1])).len(), 1);
    }

    #[test]
    fn keys_with_dots_are_quoted_in_paths() {
        let out = mismatches(
            json!({"labels": {"app.kubernetes.io/name": "web"}}),
            json!({"labels": {}}),
        );
        assert_eq!(out[0].path, "x.labels[\"app.kubernetes.io/name\"]");
        assert_eq!(
            out[0].to_string(),
            "x.labels[\"app.kubernetes.io/name\"]: expected \"web\", got nothing (missing)"
        );
    }

    #[test]
    fn each_expected_error_takes_a_distinct_error() {
        let errors = vec![
            "template of child \"a\": boom".to_owned(),
            "boom".to_owned(),
        ];
        // "boom" fits both; "child" only the first: the matching gives each its own.
        let expected = vec!["boom".to_owned(), "child".to_owned()];
        assert_eq!(match_errors(&expected, &errors), (vec![], vec![]));
        let one = vec!["boom".to_owned()];
        assert_eq!(match_errors(&one, &errors), (vec![], vec![1]));
        let twice = vec!["child".to_owned(), "child".to_owned()];
        assert_eq!(match_errors(&twice, &errors), (vec![1], vec![1]));
        assert_eq!(match_errors(&[], &[]), (vec![], vec![]));
    }
}
