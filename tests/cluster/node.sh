# shellcheck shell=bash
# One real node for the control plane of tests/cluster/cluster: sourced by it.
node_preflight() { die "cluster up --node: the node is not in this version of the script yet"; }
node_healthy() { return 1; }
