//! The text `trellis tree` prints: the parent and its conditions, then a
//! table with one row per line of the tree, drawn nested under the parent.
//!
//! ```text
//! rule webapp: WebApp team-a/shop
//!   Ready=False  DependencyNotReady  waiting for child "web": …
//!   Synced=True  Applied
//!
//! ENTRY          KIND        OBJECT              READY  SYNCED  STATUS
//! WebApp/shop    WebApp      team-a/shop         False  True    DependencyNotReady
//! ├─ config      ConfigMap   team-a/shop-config  True   True
//! │  └─ web      Deployment  team-a/shop         False  True    not ready: …
//! └─ route       Ingress     -                   -      -       excluded: includeWhen is false …
//! ```

use std::fmt::Write;

use super::{Line, ReadyFrom, Role, State, Tree};

/// Every tree, one block each, separated by a blank line.
pub fn print(trees: &[Tree]) -> String {
    trees.iter().map(print_one).collect::<Vec<_>>().join("\n")
}

fn print_one(tree: &Tree) -> String {
    let mut out = String::new();
    let p = &tree.parent;
    let _ = writeln!(
        out,
        "rule {}: {} {}",
        tree.rule,
        p.kind,
        object(&p.namespace, Some(&p.name))
    );
    if p.conditions.is_empty() {
        let _ = writeln!(out, "  (no conditions)");
    }
    let width = p
        .conditions
        .iter()
        .map(|c| c.type_.len() + c.status.len() + 1)
        .max()
        .unwrap_or(0);
    let reason_width = p
        .conditions
        .iter()
        .map(|c| c.reason.as_deref().map_or(0, str::len))
        .max()
        .unwrap_or(0);
    for c in &p.conditions {
        let head = format!("{}={}", c.type_, c.status);
        let row = format!(
            "  {head:width$}  {:reason_width$}  {}",
            c.reason.as_deref().unwrap_or(""),
            one_line(c.message.as_deref().unwrap_or(""))
        );
        let _ = writeln!(out, "{}", row.trim_end());
    }
    if let Some(why) = &tree.skipped {
        let _ = writeln!(out, "skipped: {why}");
        return out;
    }
    let condition = |t: &str| p.conditions.iter().find(|c| c.type_ == t);
    let mut rows = vec![[
        "ENTRY".to_owned(),
        "KIND".to_owned(),
        "OBJECT".to_owned(),
        "READY".to_owned(),
        "SYNCED".to_owned(),
        "STATUS".to_owned(),
    ]];
    rows.push([
        format!("{}/{}", p.kind, p.name),
        p.kind.clone(),
        object(&p.namespace, Some(&p.name)),
        flag(Some(p.ready)),
        condition("Synced").map_or("-".into(), |c| c.status.clone()),
        match p.ready_from {
            ReadyFrom::Condition => condition("Ready")
                .filter(|c| c.status != "True")
                .and_then(|c| c.reason.clone())
                .unwrap_or_default(),
            // Built-in kinds get no status from trellis: say where READY
            // comes from.
            ReadyFrom::Children => {
                "READY: its own conditions and its rule's entries (built-in kind: no trellis status)"
                    .into()
            }
        },
    ]);
    for (i, line) in tree.lines.iter().enumerate() {
        rows.push([
            format!("{}{}", prefix(&tree.lines, i), entry(line)),
            line.kind.clone(),
            match line.matched {
                Some(n) => format!("selector: {n} object(s)"),
                None => match &line.cluster {
                    Some(c) => format!(
                        "{} (cluster {c})",
                        object(&line.namespace, line.name.as_deref())
                    ),
                    None => object(&line.namespace, line.name.as_deref()),
                },
            },
            flag(line.ready),
            flag(line.synced),
            status(line),
        ]);
    }
    out.push('\n');
    let widths: Vec<usize> = (0..6)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let mut text = String::new();
        for (c, cell) in row.iter().enumerate() {
            let pad = widths[c] - cell.chars().count();
            text.push_str(cell);
            if c + 1 < row.len() {
                text.push_str(&" ".repeat(pad + 2));
            }
        }
        let _ = writeln!(out, "{}", text.trim_end());
    }
    if !tree.errors.is_empty() {
        let _ = writeln!(out, "\nerrors:");
        for e in &tree.errors {
            let _ = writeln!(out, "  {}", one_line(e));
        }
    }
    out
}

fn entry(line: &Line) -> String {
    match line.role {
        Role::Child => line.id.clone(),
        Role::Patch => format!("{} (patch)", line.id),
        Role::Related => format!("{} (related)", line.id),
    }
}

/// The tree drawing before line `i`: a bar for every open level above it,
/// then its own branch (the last of its siblings ends the branch).
fn prefix(lines: &[Line], i: usize) -> String {
    let depth = lines[i].depth;
    // Whether another line at `depth` follows before the level closes.
    let continues = |depth: usize| {
        lines[i + 1..]
            .iter()
            .take_while(|l| l.depth >= depth)
            .any(|l| l.depth == depth)
    };
    let mut out = String::new();
    for level in 1..depth {
        out.push_str(if continues(level) { "│  " } else { "   " });
    }
    out.push_str(if continues(depth) {
        "├─ "
    } else {
        "└─ "
    });
    out
}

fn object(namespace: &Option<String>, name: Option<&str>) -> String {
    match (namespace, name) {
        (_, None) => "-".into(),
        (Some(ns), Some(name)) => format!("{ns}/{name}"),
        (None, Some(name)) => name.to_owned(),
    }
}

fn flag(value: Option<bool>) -> String {
    match value {
        Some(true) => "True".into(),
        Some(false) => "False".into(),
        None => "-".into(),
    }
}

fn status(line: &Line) -> String {
    let reason = line.reason.as_deref().map(one_line).unwrap_or_default();
    let with = |what: &str| {
        if reason.is_empty() {
            what.to_owned()
        } else {
            format!("{what}: {reason}")
        }
    };
    let mut text = match line.state {
        State::Present if line.ready == Some(false) => with("not ready"),
        State::Present => String::new(),
        State::Missing => with("missing"),
        State::Excluded => with("excluded"),
        State::Pending => with("held back"),
        State::Failed => with("failed"),
        State::Absent => with("absent"),
        State::Pruning => with("pruned"),
    };
    if !line.after.is_empty() {
        if !text.is_empty() {
            text.push(' ');
        }
        let _ = write!(text, "(also after {})", line.after.join(", "));
    }
    text
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
