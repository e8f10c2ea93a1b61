//! The rollout order and the step arithmetic.
//!
//! Canary parents come first, then every other parent; within each group
//! parents sort by sha256(`<rule>/<uid>`), so the order is the same on every
//! replica and after a restart, and a parent created during a rollout takes
//! its place without moving anyone else's relative position.

/// The sort key of a parent: sha256 of `<rule>/<uid>`, as hex.
pub fn order_key(rule: &str, uid: &str) -> String {
    crate::render::sha256_hex(format!("{rule}/{uid}").as_bytes())
}

/// `parents` as (uid, is canary), in rollout order.
pub fn order(rule: &str, parents: &[(String, bool)]) -> Vec<String> {
    let mut keyed: Vec<(bool, String, &str)> = parents
        .iter()
        .map(|(uid, canary)| (!canary, order_key(rule, uid), uid.as_str()))
        .collect();
    keyed.sort();
    keyed
        .into_iter()
        .map(|(_, _, uid)| uid.to_owned())
        .collect()
}

/// How many of `total` parents are on the new version at `percent`:
/// ⌈percent · total / 100⌉.
pub fn step_count(percent: u32, total: usize) -> usize {
    (percent as usize * total).div_ceil(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uids(n: usize) -> Vec<(String, bool)> {
        (0..n).map(|i| (format!("uid-{i}"), false)).collect()
    }

    #[test]
    fn step_arithmetic_rounds_up() {
        assert_eq!(step_count(10, 1000), 100);
        assert_eq!(step_count(10, 7), 1);
        assert_eq!(step_count(50, 7), 4);
        assert_eq!(step_count(1, 1), 1);
        assert_eq!(step_count(100, 7), 7);
        assert_eq!(step_count(33, 3), 1);
        assert_eq!(step_count(34, 3), 2);
        assert_eq!(step_count(10, 0), 0);
    }

    #[test]
    fn the_order_is_fixed_by_the_hash_of_rule_and_uid() {
        // Stable across processes: a fixed input gives a fixed answer, with
        // no hasher seed involved.
        assert_eq!(order_key("web", "u1"), crate::render::sha256_hex(b"web/u1"));
        let a = order("web", &uids(20));
        let mut shuffled = uids(20);
        shuffled.reverse();
        assert_eq!(a, order("web", &shuffled), "input order does not matter");
        assert_ne!(a, order("other", &uids(20)), "each rule has its own order");
        let mut sorted = a.clone();
        sorted.sort_by_key(|u| order_key("web", u));
        assert_eq!(a, sorted);
    }

    #[test]
    fn canaries_come_first() {
        let mut parents = uids(10);
        parents[7].1 = true;
        parents[3].1 = true;
        let o = order("web", &parents);
        let first: std::collections::BTreeSet<&str> = o[..2].iter().map(String::as_str).collect();
        assert_eq!(first, ["uid-3", "uid-7"].into());
    }

    #[test]
    fn a_new_parent_takes_its_place_without_reordering_the_others() {
        let before = order("web", &uids(10));
        let mut more = uids(10);
        more.push(("uid-new".into(), false));
        let after = order("web", &more);
        let without: Vec<&String> = after.iter().filter(|u| *u != "uid-new").collect();
        assert_eq!(without, before.iter().collect::<Vec<_>>());
    }
}
