//! Entries (children, or patches) in the order they are planned:
//! dependencies first, stable by declaration, or the cycle that forbids it.

/// Entries (children, or patches) in dependency order (Kahn's algorithm,
/// stable by declaration): `deps[i]` are the indexes `i` waits for; on a
/// cycle, the ids along it.
pub(super) fn topological_order(
    deps: &[&[usize]],
    ids: &[&str],
) -> Result<Vec<usize>, Vec<String>> {
    let n = deps.len();
    let mut done = vec![false; n];
    let mut order = Vec::with_capacity(n);
    while order.len() < n {
        let next = (0..n).find(|&i| !done[i] && deps[i].iter().all(|&d| done[d]));
        match next {
            Some(i) => {
                done[i] = true;
                order.push(i);
            }
            None => return Err(find_cycle(deps, ids, &done)),
        }
    }
    Ok(order)
}

fn find_cycle(deps: &[&[usize]], ids: &[&str], done: &[bool]) -> Vec<String> {
    // Walk unfinished dependencies until a node repeats.
    let start = done.iter().position(|d| !d).unwrap_or(0);
    let mut path = vec![start];
    let mut current = start;
    loop {
        let next = deps[current]
            .iter()
            .copied()
            .find(|&d| !done[d])
            .unwrap_or(start);
        if let Some(pos) = path.iter().position(|&p| p == next) {
            let mut cycle: Vec<String> = path[pos..].iter().map(|&i| ids[i].to_owned()).collect();
            cycle.push(ids[next].to_owned());
            return cycle;
        }
        path.push(next);
        current = next;
    }
}
