//! `trellis graph`: the dependency graph of rules' children and related
//! entries, as Graphviz DOT or a Mermaid flowchart.
//!
//! ```text
//!  CompiledRule ──Graph::of──▶ Graph { nodes, edges }  ──to_dot / to_mermaid──▶ text
//! ```
//!
//! The graph is plain data built from a compiled rule; the two printers only
//! format it. A node is a child (an object the rule keeps), a related entry
//! (an object it only reads) or a patch (fields it contributes to an object
//! it does not own); an edge is explicit (`dependsOn`) or implicit (a
//! template or expression of the child reads `children.X` / `related.Y`). The
//! edges are the compiler's own dependency lists, so the graph shows exactly
//! the order the planner applies in. Edges point from what must be ready
//! first to what waits for it.

use std::fmt::Write;

use crate::rules::CompiledRule;
use crate::rules::model::{DeletionPolicy, Policy};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// A child the rule keeps in existence.
    Child,
    /// A `related` entry: read, never written.
    Related,
    /// A `patches` entry: fields contributed to an object the rule does not own.
    Patch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeKind {
    /// Listed in `dependsOn`.
    Explicit,
    /// Read by the child's template or expressions, not listed in `dependsOn`.
    Implicit,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub id: String,
    pub kind: NodeKind,
    /// The object's kind, e.g. `Deployment`.
    pub object_kind: String,
    pub for_each: Option<String>,
    pub include_when: Option<String>,
    /// Set when not the default `apply`.
    pub policy: Option<Policy>,
    /// Related entries: a `selector:` entry reads a list.
    pub selector: bool,
    /// Related entries: a missing object holds nothing back.
    pub optional: bool,
    /// Related entries: the entry has a `readyWhen`.
    pub ready_when: bool,
    /// Children: `deletionPolicy: retain`; patches: `force: true`.
    pub special: Option<&'static str>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    /// Must be ready first.
    pub from: String,
    /// Waits for `from`.
    pub to: String,
    pub kind: EdgeKind,
}

/// One rule's graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Graph {
    pub rule: String,
    pub parent_kind: String,
    /// Related entries first (in rule order), then children (in rule order).
    pub nodes: Vec<Node>,
    pub edges: Vec<Edge>,
}

impl Graph {
    pub fn of(rule: &CompiledRule) -> Graph {
        let related = rule.related.iter().map(|r| Node {
            id: r.spec.id.clone(),
            kind: NodeKind::Related,
            object_kind: r.spec.kind.clone(),
            for_each: None,
            include_when: None,
            policy: None,
            selector: r.spec.selector.is_some(),
            optional: r.spec.optional,
            ready_when: r.spec.ready_when.is_some(),
            special: None,
        });
        let children = rule.children.iter().map(|c| Node {
            id: c.spec.id.clone(),
            kind: NodeKind::Child,
            object_kind: c.spec.kind.clone(),
            for_each: c.spec.for_each.as_ref().map(ToString::to_string),
            include_when: c.spec.include_when.clone(),
            policy: (c.spec.policy != Policy::Apply).then_some(c.spec.policy),
            selector: false,
            optional: false,
            ready_when: false,
            special: (c.spec.deletion_policy == DeletionPolicy::Retain)
                .then_some("deletionPolicy: retain"),
        });
        let patches = rule.patches.iter().map(|c| Node {
            id: c.spec.id.clone(),
            kind: NodeKind::Patch,
            object_kind: c.spec.kind.clone(),
            for_each: c.spec.for_each.as_ref().map(ToString::to_string),
            include_when: c.spec.include_when.clone(),
            policy: None,
            selector: false,
            optional: false,
            ready_when: false,
            special: Some(
                if rule
                    .rule
                    .spec
                    .patches
                    .iter()
                    .any(|p| p.id == c.spec.id && p.force)
                {
                    "patch, force"
                } else {
                    "patch"
                },
            ),
        });
        let nodes = related.chain(children).chain(patches).collect();
        let mut edges = Vec::new();
        for c in rule.children.iter().chain(&rule.patches) {
            let deps = c
                .depends_on_related
                .iter()
                .filter_map(|&k| rule.related.get(k).map(|r| &r.spec.id))
                .chain(
                    c.depends_on
                        .iter()
                        .filter_map(|&k| rule.children.get(k).map(|d| &d.spec.id)),
                )
                .chain(
                    c.depends_on_patches
                        .iter()
                        .filter_map(|&k| rule.patches.get(k).map(|d| &d.spec.id)),
                );
            for dep in deps {
                let kind = if c.spec.depends_on.contains(dep) {
                    EdgeKind::Explicit
                } else {
                    EdgeKind::Implicit
                };
                edges.push(Edge {
                    from: dep.clone(),
                    to: c.spec.id.clone(),
                    kind,
                });
            }
        }
        Graph {
            rule: rule.name.clone(),
            parent_kind: rule.parent.kind.clone(),
            nodes,
            edges,
        }
    }
}

fn policy_name(p: Policy) -> &'static str {
    match p {
        Policy::Apply => "apply",
        Policy::CreateOnly => "createOnly",
        Policy::Recreate => "recreate",
    }
}

/// The lines of a node's label: id, kind, then what is special about it.
fn label_lines(node: &Node) -> Vec<String> {
    let mut lines = vec![node.id.clone(), node.object_kind.clone()];
    if let Some(e) = &node.for_each {
        lines.push(format!("forEach: {e}"));
    }
    if let Some(e) = &node.include_when {
        lines.push(format!("includeWhen: {e}"));
    }
    if let Some(p) = node.policy {
        lines.push(format!("policy: {}", policy_name(p)));
    }
    if let Some(special) = node.special {
        lines.push(special.into());
    }
    if node.kind == NodeKind::Related {
        lines.push(
            if node.selector {
                "read, by selector"
            } else {
                "read, by name"
            }
            .into(),
        );
        if node.optional {
            lines.push("optional".into());
        }
        if node.ready_when {
            lines.push("readyWhen".into());
        }
    }
    lines
}

/// A graph-wide node name: rules share one output.
fn node_name(graph: &Graph, id: &str) -> String {
    format!("{}__{}", graph.rule, id).replace('-', "_")
}

fn dot_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Graphviz DOT: one cluster per rule; cylinders are related entries (read,
/// never written), notes are patches (fields contributed to objects the
/// rule does not own), 3-D boxes are one object per item (`forEach`), dashed
/// nodes are conditional (`includeWhen`, or an `optional` related entry);
/// dotted edges are implicit dependencies (a read, not in `dependsOn`).
pub fn to_dot(graphs: &[Graph]) -> String {
    let mut out = String::from(
        "digraph trellis {\n  rankdir=LR;\n  node [shape=box, fontname=\"sans-serif\"];\n",
    );
    for g in graphs {
        let _ = writeln!(out, "  subgraph \"cluster_{}\" {{", dot_escape(&g.rule));
        let _ = writeln!(
            out,
            "    label=\"rule {} (parent {})\";",
            dot_escape(&g.rule),
            dot_escape(&g.parent_kind)
        );
        for n in &g.nodes {
            let label = label_lines(n)
                .iter()
                .map(|l| dot_escape(l))
                .collect::<Vec<_>>()
                .join("\\n");
            let mut attrs = vec![format!("label=\"{label}\"")];
            match n.kind {
                NodeKind::Related => attrs.push("shape=cylinder".into()),
                NodeKind::Patch => attrs.push("shape=note".into()),
                NodeKind::Child => {}
            }
            if n.for_each.is_some() {
                attrs.push("shape=box3d".into());
            }
            if n.include_when.is_some() || n.optional {
                attrs.push("style=dashed".into());
            }
            let _ = writeln!(out, "    {} [{}];", node_name(g, &n.id), attrs.join(", "));
        }
        for e in &g.edges {
            let style = match e.kind {
                EdgeKind::Explicit => "",
                EdgeKind::Implicit => " [style=dotted]",
            };
            let _ = writeln!(
                out,
                "    {} -> {}{style};",
                node_name(g, &e.from),
                node_name(g, &e.to)
            );
        }
        out.push_str("  }\n");
    }
    out.push_str("}\n");
    out
}

fn mermaid_escape(s: &str) -> String {
    s.replace('&', "#amp;")
        .replace('"', "#quot;")
        .replace('<', "#lt;")
        .replace('>', "#gt;")
}

/// A Mermaid flowchart (renders in GitHub's Markdown): one subgraph per
/// rule; cylinders are related entries (read, never written), flags are
/// patches, double-edged
/// nodes are one object per item (`forEach`), stadium-shaped ones are
/// conditional (`includeWhen`); dotted arrows are implicit dependencies.
pub fn to_mermaid(graphs: &[Graph]) -> String {
    let mut out = String::from("flowchart LR\n");
    for g in graphs {
        let _ = writeln!(
            out,
            "  subgraph {}[\"rule {} (parent {})\"]",
            g.rule.replace('-', "_"),
            mermaid_escape(&g.rule),
            mermaid_escape(&g.parent_kind)
        );
        for n in &g.nodes {
            let label = label_lines(n)
                .iter()
                .map(|l| mermaid_escape(l))
                .collect::<Vec<_>>()
                .join("<br/>");
            let (open, close) = match (n.kind, n.for_each.is_some(), n.include_when.is_some()) {
                (NodeKind::Related, _, _) => ("[(", ")]"),
                (NodeKind::Patch, _, _) => (">", "]"),
                (_, true, _) => ("[[", "]]"),
                (_, false, true) => ("([", "])"),
                (_, false, false) => ("[", "]"),
            };
            let _ = writeln!(out, "    {}{open}\"{label}\"{close}", node_name(g, &n.id));
        }
        for e in &g.edges {
            let arrow = match e.kind {
                EdgeKind::Explicit => "-->",
                EdgeKind::Implicit => "-.->",
            };
            let _ = writeln!(
                out,
                "    {} {arrow} {}",
                node_name(g, &e.from),
                node_name(g, &e.to)
            );
        }
        out.push_str("  end\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph() -> Graph {
        let rule = crate::rules::testing::rule_with_spec(
            r#"  parent: {apiVersion: demo.example.com/v1, kind: App}
  related:
    - id: settings
      apiVersion: v1
      kind: ConfigMap
      name: "{{ spec.settings }}"
      optional: true
    - id: nodes
      apiVersion: v1
      kind: Namespace
      selector: {}
      readyWhen: "self | length > 0"
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      policy: createOnly
      template: "metadata: {name: x}\ndata: {a: {{ related.settings.data.a | default('') }}}"
    - id: web-app
      apiVersion: apps/v1
      kind: Deployment
      dependsOn: [config]
      template: "metadata: {name: x}"
    - id: route
      apiVersion: networking.k8s.io/v1
      kind: Ingress
      dependsOn: [web-app, nodes]
      includeWhen: "spec.expose"
      forEach: "spec.hosts | select('ne', \"a<b\")"
      template: "metadata: {name: {{ children['config'].metadata.name }}}"
"#,
        );
        Graph::of(&rule)
    }

    fn edges(g: &Graph) -> Vec<(&str, &str, EdgeKind)> {
        g.edges
            .iter()
            .map(|e| (e.from.as_str(), e.to.as_str(), e.kind))
            .collect()
    }

    #[test]
    fn nodes_are_related_entries_then_children_with_their_markers() {
        let g = graph();
        assert_eq!(g.rule, "app");
        assert_eq!(
            g.nodes
                .iter()
                .map(|n| (n.id.as_str(), n.kind))
                .collect::<Vec<_>>(),
            [
                ("settings", NodeKind::Related),
                ("nodes", NodeKind::Related),
                ("config", NodeKind::Child),
                ("web-app", NodeKind::Child),
                ("route", NodeKind::Child)
            ]
        );
        assert!(g.nodes[0].optional && !g.nodes[0].selector && !g.nodes[0].ready_when);
        assert!(!g.nodes[1].optional && g.nodes[1].selector && g.nodes[1].ready_when);
        assert_eq!(g.nodes[2].policy, Some(Policy::CreateOnly));
        assert_eq!(g.nodes[3].policy, None);
        assert_eq!(g.nodes[4].include_when.as_deref(), Some("spec.expose"));
    }

    #[test]
    fn edges_are_dependson_entries_and_reads_of_children_and_related() {
        let g = graph();
        assert_eq!(
            edges(&g),
            [
                ("settings", "config", EdgeKind::Implicit),
                ("config", "web-app", EdgeKind::Explicit),
                ("nodes", "route", EdgeKind::Explicit),
                ("web-app", "route", EdgeKind::Explicit),
                ("config", "route", EdgeKind::Implicit),
            ]
        );
    }

    #[test]
    fn dot_marks_related_conditional_repeated_and_implicit_and_escapes_quotes() {
        let dot = to_dot(&[graph()]);
        assert!(dot.starts_with("digraph trellis {"), "{dot}");
        assert!(
            dot.contains("app__config [label=\"config\\nConfigMap\\npolicy: createOnly\"];"),
            "{dot}"
        );
        assert!(
            dot.contains(
                "app__settings [label=\"settings\\nConfigMap\\nread, by name\\noptional\", shape=cylinder, style=dashed];"
            ),
            "{dot}"
        );
        assert!(
            dot.contains(
                "app__nodes [label=\"nodes\\nNamespace\\nread, by selector\\nreadyWhen\", shape=cylinder];"
            ),
            "{dot}"
        );
        assert!(dot.contains("app__config -> app__web_app;"), "{dot}");
        assert!(
            dot.contains("app__settings -> app__config [style=dotted];"),
            "{dot}"
        );
        assert!(
            dot.contains("app__config -> app__route [style=dotted];"),
            "{dot}"
        );
        assert!(
            dot.contains("forEach: spec.hosts | select('ne', \\\"a<b\\\")"),
            "{dot}"
        );
        assert!(dot.contains("shape=box3d, style=dashed"), "{dot}");
    }

    #[test]
    fn mermaid_shapes_mark_related_conditional_repeated_and_implicit_and_labels_are_escaped() {
        let m = to_mermaid(&[graph()]);
        assert!(
            m.starts_with("flowchart LR\n  subgraph app[\"rule app (parent App)\"]\n"),
            "{m}"
        );
        assert!(
            m.contains(
                "    app__settings[(\"settings<br/>ConfigMap<br/>read, by name<br/>optional\")]\n"
            ),
            "{m}"
        );
        assert!(
            m.contains("    app__config[\"config<br/>ConfigMap<br/>policy: createOnly\"]\n"),
            "{m}"
        );
        assert!(m.contains("    app__route[[\"route<br/>Ingress<br/>forEach: spec.hosts | select('ne', #quot;a#lt;b#quot;)<br/>includeWhen: spec.expose\"]]\n"), "{m}");
        assert!(m.contains("    app__web_app --> app__route\n"), "{m}");
        assert!(m.contains("    app__settings -.-> app__config\n"), "{m}");
        assert!(m.ends_with("  end\n"), "{m}");
    }

    #[test]
    fn patches_are_note_nodes_after_the_children_with_their_edges() {
        let rule = crate::rules::testing::rule_with_spec(
            r#"  parent: {apiVersion: demo.example.com/v1, kind: App}
  children:
    - id: data
      apiVersion: v1
      kind: PersistentVolumeClaim
      deletionPolicy: retain
      template: "metadata: {name: x}"
  patches:
    - id: ns
      apiVersion: v1
      kind: Namespace
      allowCrossNamespace: true
      dependsOn: [data]
      template: "metadata: {name: x, labels: {a: b}}"
    - id: sa
      apiVersion: v1
      kind: ServiceAccount
      force: true
      template: "metadata: {name: {{ patches.ns.metadata.name }}, annotations: {a: b}}"
"#,
        );
        let g = Graph::of(&rule);
        assert_eq!(
            g.nodes
                .iter()
                .map(|n| (n.id.as_str(), n.kind, n.special))
                .collect::<Vec<_>>(),
            [
                ("data", NodeKind::Child, Some("deletionPolicy: retain")),
                ("ns", NodeKind::Patch, Some("patch")),
                ("sa", NodeKind::Patch, Some("patch, force")),
            ]
        );
        assert_eq!(
            edges(&g),
            [
                ("data", "ns", EdgeKind::Explicit),
                ("ns", "sa", EdgeKind::Implicit),
            ]
        );
        let dot = to_dot(std::slice::from_ref(&g));
        assert!(
            dot.contains("app__ns [label=\"ns\\nNamespace\\npatch\", shape=note];"),
            "{dot}"
        );
        let m = to_mermaid(&[g]);
        assert!(
            m.contains("    app__sa>\"sa<br/>ServiceAccount<br/>patch, force\"]\n"),
            "{m}"
        );
    }

    #[test]
    fn a_cartesian_for_each_is_one_node_per_combination_and_its_reads_are_edges() {
        let rule = crate::rules::testing::rule_with_spec(
            r#"  parent: {apiVersion: demo.trellis.dev/v1, kind: App}
  children:
    - id: zones
      apiVersion: v1
      kind: ConfigMap
      template: "metadata: {name: z}"
    - id: cell
      apiVersion: v1
      kind: ConfigMap
      forEach: {region: spec.regions, zone: "children.zones.data | list"}
      template: "metadata: {name: {{ item.region ~ item.zone }}}"
"#,
        );
        let g = Graph::of(&rule);
        assert_eq!(
            g.nodes[1].for_each.as_deref(),
            Some("{region: spec.regions, zone: children.zones.data | list}")
        );
        assert_eq!(edges(&g), [("zones", "cell", EdgeKind::Implicit)]);
        let mermaid = to_mermaid(&[g]);
        assert!(
            mermaid.contains("app__cell[[\"cell<br/>ConfigMap<br/>forEach: {region: spec.regions, zone: children.zones.data | list}\"]]"),
            "{mermaid}"
        );
    }
}
