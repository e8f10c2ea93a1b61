//! Which line of a child's template writes a field of the rendered object.
//!
//! The template is not YAML until rendered (`{% %}` blocks, `{{ }}` in
//! keys), so it is read as lines: each key of the field's path is looked
//! for in order, below the line of the key before it and inside its block
//! (more indented, until a line that is not). A key the template does not
//! write (trellis adds `metadata.labels`; a loop writes `{{ key }}:`) is
//! passed over; the answer is the line of the last key when the template
//! writes that one, else none.

/// The 1-based line of `template` that writes the field at `keys`.
pub fn line_of(template: &str, keys: &[String]) -> Option<usize> {
    let lines: Vec<&str> = template.lines().collect();
    let mut from = 0;
    // The block the next key must be in: the column of its parent key.
    let mut parent_col: Option<usize> = None;
    // What follows the parent key on its own line (`ports: [{name: a}]`).
    let mut inline = "";
    let mut found_last = None;
    for key in keys {
        found_last = None;
        if let Some(at) = flow_key(inline, key) {
            inline = &inline[at..];
            found_last = Some(from);
            continue;
        }
        for (i, line) in lines.iter().enumerate().skip(from) {
            let indent = line.len() - line.trim_start().len();
            let text = line.trim_start();
            if text.is_empty() || is_tag_only(text) || text.starts_with('#') {
                continue;
            }
            // Out of the parent's block (a list may sit at its key's column).
            if parent_col.is_some_and(|p| indent < p || (indent == p && !text.starts_with('-'))) {
                break;
            }
            if let Some((col, rest)) = block_key(text, key)
                .map(|(col, rest)| (Some(col), rest))
                .or_else(|| flow_key(text, key).map(|at| (None, &text[at..])))
            {
                from = i + 1;
                if let Some(col) = col {
                    parent_col = Some(indent + col);
                }
                inline = rest;
                found_last = Some(i + 1);
                break;
            }
        }
        if found_last.is_none() {
            // Not written here: the keys below it are looked for from the
            // same place.
            inline = "";
        }
    }
    found_last
}

/// `key:` at the start of the line (after list dashes), plain or quoted:
/// the key's column within the text, and what follows its colon.
fn block_key<'t>(text: &'t str, key: &str) -> Option<(usize, &'t str)> {
    let mut col = 0;
    let mut rest = text;
    while let Some(r) = rest.strip_prefix("- ") {
        col += 2 + (r.len() - r.trim_start().len());
        rest = r.trim_start();
    }
    for quoted in [key.to_owned(), format!("\"{key}\""), format!("'{key}'")] {
        if let Some(after) = rest.strip_prefix(quoted.as_str())
            && let Some(value) = after.trim_start().strip_prefix(':')
        {
            return Some((col, value));
        }
    }
    None
}

/// `key:` in a flow mapping on the line (`{key: 1}`, `, key: 1`): the byte
/// offset just past its colon.
fn flow_key(text: &str, key: &str) -> Option<usize> {
    let mut start = 0;
    while let Some(at) = text[start..].find(['{', ',']) {
        let after_sep = start + at + 1;
        let rest = &text[after_sep..];
        let trimmed = rest.trim_start();
        if let Some(tail) = trimmed.strip_prefix(key) {
            let tail_trimmed = tail.trim_start();
            if let Some(value) = tail_trimmed.strip_prefix(':') {
                return Some(text.len() - value.len());
            }
        }
        start = after_sep;
    }
    None
}

/// A line holding only `{% ... %}` or `{# ... #}`: no YAML of its own.
fn is_tag_only(text: &str) -> bool {
    let t = text.trim_end();
    (t.starts_with("{%") && t.ends_with("%}")) || (t.starts_with("{#") && t.ends_with("#}"))
}

#[cfg(test)]
mod tests {
    use super::line_of;

    fn keys(path: &[&str]) -> Vec<String> {
        path.iter().map(|s| (*s).to_owned()).collect()
    }

    const DEPLOYMENT: &str = "metadata:
  name: {{ parent.metadata.name }}
spec:
  replica: 2
  template:
    spec:
      containers:
        - name: app
          image: nginx
          {%- if spec.debug %}
          imagePullPolicy: Always
          {%- endif %}
          ports: [{containerPort: 80, nmae: http}]
";

    #[test]
    fn finds_the_key_under_its_parents() {
        assert_eq!(line_of(DEPLOYMENT, &keys(&["spec", "replica"])), Some(4));
        assert_eq!(
            line_of(
                DEPLOYMENT,
                &keys(&["spec", "template", "spec", "containers", "image"])
            ),
            Some(9)
        );
        assert_eq!(
            line_of(
                DEPLOYMENT,
                &keys(&["spec", "template", "spec", "containers", "imagePullPolicy"])
            ),
            Some(11)
        );
    }

    #[test]
    fn flow_mappings_and_missing_keys() {
        assert_eq!(
            line_of(
                DEPLOYMENT,
                &keys(&["spec", "template", "spec", "containers", "ports", "nmae"])
            ),
            Some(13)
        );
        // Added by trellis, not written by the template.
        assert_eq!(
            line_of(DEPLOYMENT, &keys(&["metadata", "labels", "x"])),
            None
        );
        // `name` under metadata, not the container's.
        assert_eq!(line_of(DEPLOYMENT, &keys(&["metadata", "name"])), Some(2));
    }

    #[test]
    fn a_key_outside_its_parents_block_is_not_taken() {
        let t = "metadata:\n  name: a\nspec:\n  replicas: 1\n";
        assert_eq!(line_of(t, &keys(&["metadata", "replicas"])), None);
    }
}
