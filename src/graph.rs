//! `trellis graph`: the dependency graph of rules' children, as Graphviz DOT
//! or a Mermaid flowchart.
//!
//! ```text
//!  CompiledRule ──Graph::of──▶ Graph { nodes, edges }  ──to_dot / to_mermaid──▶ text
//! ```
//!
//! The graph is plain data built from a compiled rule; the two printers only
//! format it. A node has a [`NodeKind`] and an edge an [`EdgeKind`], so that a
//! new kind of node (related objects) or of edge (dependencies inferred from
//! templates) is one more variant and one more style, not a new printer.
//! Edges point from what must be ready first to what waits for it.

use std::fmt::Write;

use crate::rules::CompiledRule;
use crate::rules::model::Policy;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// A child the rule keeps in existence.
    Child,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeKind {
    /// Listed in `dependsOn`.
    Explicit,
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
    pub nodes: Vec<Node>,
    pub edges: Vec<Edge>,
}

impl Graph {
    pub fn of(rule: &CompiledRule) -> Graph {
        let spec = &rule.rule.spec;
        let nodes = spec
            .children
            .iter()
            .map(|c| Node {
                id: c.id.clone(),
                kind: NodeKind::Child,
                object_kind: c.kind.clone(),
                for_each: c.for_each.clone(),
                include_when: c.include_when.clone(),
                policy: (c.policy != Policy::Apply).then_some(c.policy),
            })
            .collect();
        let edges = spec
            .children
            .iter()
            .flat_map(|c| {
                c.depends_on.iter().map(|dep| Edge {
                    from: dep.clone(),
                    to: c.id.clone(),
                    kind: EdgeKind::Explicit,
                })
            })
            .collect();
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
    lines
}

/// A graph-wide node name: rules share one output.
fn node_name(graph: &Graph, id: &str) -> String {
    format!("{}__{}", graph.rule, id).replace('-', "_")
}

fn dot_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Graphviz DOT: one cluster per rule; dashed nodes are conditional
/// (`includeWhen`), 3-D boxes are one object per item (`forEach`).
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
            if n.for_each.is_some() {
                attrs.push("shape=box3d".into());
            }
            if n.include_when.is_some() {
                attrs.push("style=dashed".into());
            }
            let _ = writeln!(out, "    {} [{}];", node_name(g, &n.id), attrs.join(", "));
        }
        for e in &g.edges {
            let style = match e.kind {
                EdgeKind::Explicit => "",
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
/// rule; stadium-shaped nodes are conditional (`includeWhen`), double-edged
/// ones are one object per item (`forEach`).
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
            let (open, close) = match (n.for_each.is_some(), n.include_when.is_some()) {
                (true, _) => ("[[", "]]"),
                (false, true) => ("([", "])"),
                (false, false) => ("[", "]"),
            };
            let _ = writeln!(out, "    {}{open}\"{label}\"{close}", node_name(g, &n.id));
        }
        for e in &g.edges {
            let arrow = match e.kind {
                EdgeKind::Explicit => "-->",
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
  children:
    - id: config
      apiVersion: v1
      kind: ConfigMap
      policy: createOnly
      template: "metadata: {name: x}"
    - id: web-app
      apiVersion: apps/v1
      kind: Deployment
      dependsOn: [config]
      template: "metadata: {name: x}"
    - id: route
      apiVersion: networking.k8s.io/v1
      kind: Ingress
      dependsOn: [web-app]
      includeWhen: "spec.expose"
      forEach: "spec.hosts | select('ne', \"a<b\")"
      template: "metadata: {name: x}"
"#,
        );
        Graph::of(&rule)
    }

    #[test]
    fn nodes_are_children_with_their_markers_and_edges_their_dependencies() {
        let g = graph();
        assert_eq!(g.rule, "app");
        assert_eq!(
            g.nodes.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(),
            ["config", "web-app", "route"]
        );
        assert_eq!(g.nodes[0].policy, Some(Policy::CreateOnly));
        assert_eq!(g.nodes[1].policy, None);
        assert_eq!(g.nodes[2].include_when.as_deref(), Some("spec.expose"));
        assert_eq!(
            g.edges
                .iter()
                .map(|e| (e.from.as_str(), e.to.as_str()))
                .collect::<Vec<_>>(),
            [("config", "web-app"), ("web-app", "route")]
        );
    }

    #[test]
    fn dot_marks_conditional_and_repeated_children_and_escapes_quotes() {
        let dot = to_dot(&[graph()]);
        assert!(dot.starts_with("digraph trellis {"), "{dot}");
        assert!(
            dot.contains("app__config [label=\"config\\nConfigMap\\npolicy: createOnly\"];"),
            "{dot}"
        );
        assert!(dot.contains("app__config -> app__web_app;"), "{dot}");
        assert!(
            dot.contains("forEach: spec.hosts | select('ne', \\\"a<b\\\")"),
            "{dot}"
        );
        assert!(dot.contains("shape=box3d, style=dashed"), "{dot}");
    }

    #[test]
    fn mermaid_shapes_mark_conditional_and_repeated_children_and_labels_are_escaped() {
        let m = to_mermaid(&[graph()]);
        assert!(
            m.starts_with("flowchart LR\n  subgraph app[\"rule app (parent App)\"]\n"),
            "{m}"
        );
        assert!(
            m.contains("    app__config[\"config<br/>ConfigMap<br/>policy: createOnly\"]\n"),
            "{m}"
        );
        assert!(m.contains("    app__route[[\"route<br/>Ingress<br/>forEach: spec.hosts | select('ne', #quot;a#lt;b#quot;)<br/>includeWhen: spec.expose\"]]\n"), "{m}");
        assert!(m.contains("    app__web_app --> app__route\n"), "{m}");
        assert!(m.ends_with("  end\n"), "{m}");
    }
}
