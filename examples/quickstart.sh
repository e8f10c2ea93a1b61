#!/usr/bin/env bash
# Quickstart: a local Kubernetes control plane with trellis's example CRDs.
#
#   examples/quickstart.sh            # build (first time: many minutes), start, install CRDs
#   TRELLIS_QUICKSTART_DIR=/some/dir examples/quickstart.sh
#
# The control plane is etcd + kube-apiserver + kube-controller-manager built
# from source by tests/cluster/cluster: objects, CRDs, RBAC, server-side apply
# and garbage collection are real, but there are no nodes, so Pods never run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLUSTER="$ROOT/tests/cluster/cluster"
DIR="${TRELLIS_QUICKSTART_DIR:-/tmp/trellis-quickstart}"

say() { printf '\n==> %s\n' "$*"; }

say "Building the control plane (cached after the first run)"
"$CLUSTER" build

say "Starting the control plane in $DIR"
"$CLUSTER" up "$DIR"
KUBECONFIG="$DIR/kubeconfig"
export KUBECONFIG
KUBECTL="$("$CLUSTER" bin)/kubectl"

"$KUBECTL" version
"$KUBECTL" get namespaces

shopt -s nullglob
crds=("$ROOT"/examples/crds/*.yaml)
if ((${#crds[@]})); then
    say "Installing example CRDs"
    for crd in "${crds[@]}"; do
        "$KUBECTL" apply --server-side -f "$crd"
    done
    "$KUBECTL" wait --for=condition=Established --timeout=60s crd --all
else
    say "No example CRDs in examples/crds/ yet; skipping"
fi

# ---------------------------------------------------------------------------
# OPERATOR: start trellis against the cluster here once `trellis run` exists:
#
#   say "Running the operator (Ctrl-C to stop)"
#   cargo run --manifest-path "$ROOT/Cargo.toml" -- run --rules "$ROOT/rules/"
#
# ---------------------------------------------------------------------------
say "The cluster is ready. The operator (\`trellis run\`) does not exist yet,"
echo "    so the quickstart stops here."

cat <<EOF

Use the cluster:
    export KUBECONFIG=$DIR/kubeconfig
    $KUBECTL get crds

Stop it and remove its state:
    $CLUSTER down $DIR
EOF
