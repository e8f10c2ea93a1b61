//! Where each entry's lines go in the printed tree.

use super::{Entry, Line};

/// The entries' lines in print order, each entry nested under one of its
/// dependencies, the others named in `after`. Entries come in a dependency
/// order; each goes at the end of the subtree of the dependency printed
/// last so far, so every line still comes after everything it depends on
/// (later insertions never move a line printed before).
pub(super) fn nest(entries: Vec<Entry>) -> Vec<Line> {
    let mut out: Vec<Line> = Vec::new();
    for entry in entries {
        // The dependency printed last, by the index of its last line.
        let last_line = |id: &str| out.iter().rposition(|l| l.id == id);
        let under = entry
            .deps
            .iter()
            .filter_map(|d| last_line(d).map(|at| (at, d)))
            .max_by_key(|(at, _)| *at);
        let (at, depth, after) = match under {
            None => (out.len(), 1, entry.deps.clone()),
            Some((last, dep)) => {
                let depth = out[last].depth;
                let end = out[last + 1..]
                    .iter()
                    .position(|l| l.depth <= depth)
                    .map_or(out.len(), |p| last + 1 + p);
                let after = entry.deps.iter().filter(|d| *d != dep).cloned().collect();
                (end, depth + 1, after)
            }
        };
        let lines = entry.lines.into_iter().map(|mut l| {
            l.depth = depth;
            l.after.clone_from(&after);
            l
        });
        out.splice(at..at, lines);
    }
    out
}
