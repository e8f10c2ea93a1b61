#!/usr/bin/env bash
# Quickstart: a local Kubernetes control plane, the example CRDs and rules,
# the trellis operator, and the sample parents.
#
#   examples/quickstart.sh            # build (first time: ~7 min), start, run trellis, apply parents
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

say "Building trellis"
cargo build --quiet --manifest-path "$ROOT/Cargo.toml" --bin trellis
TRELLIS="$ROOT/target/debug/trellis"

say "Checking the example rules"
"$TRELLIS" check --rules "$ROOT/rules"

say "Starting the operator (log: $DIR/trellis.log)"
if [[ -f "$DIR/trellis.pid" ]] && kill -0 "$(cat "$DIR/trellis.pid")" 2>/dev/null; then
    kill "$(cat "$DIR/trellis.pid")" && sleep 1
fi
"$TRELLIS" run --rules "$ROOT/rules" >"$DIR/trellis.log" 2>&1 &
echo $! >"$DIR/trellis.pid"
sleep 2

say "Creating the sample parents"
for ns in team-a team-b; do
    "$KUBECTL" create namespace "$ns" --dry-run=client -o yaml | "$KUBECTL" apply -f - >/dev/null
done
for parent in "$ROOT"/examples/parents/*.yaml; do
    case "$parent" in *-invalid.yaml) continue ;; esac
    "$KUBECTL" apply -f "$parent"
done

say "Waiting for children and status (no nodes here: Pods never run, so Deployments stay unready)"
for _ in $(seq 1 30); do
    if "$KUBECTL" get configmap -n team-a shop-config >/dev/null 2>&1; then break; fi
    sleep 1
done
sleep 3
"$KUBECTL" get webapps,databases -A
"$KUBECTL" get tenants
echo
"$KUBECTL" get configmaps,services,deployments,statefulsets,ingresses,secrets -n team-a -l app.kubernetes.io/managed-by=trellis
echo
"$KUBECTL" get webapp -n team-a shop -o jsonpath='{range .status.conditions[*]}{.type}={.status} ({.reason}): {.message}{"\n"}{end}'

say "What the operator did (last lines of $DIR/trellis.log)"
tail -n 15 "$DIR/trellis.log"

cat <<EOF

The operator keeps running in the background (pid $(cat "$DIR/trellis.pid")).
Try: delete a child and watch it come back, or edit a parent:
    export KUBECONFIG=$DIR/kubeconfig
    $KUBECTL delete configmap -n team-a shop-config; sleep 2; $KUBECTL get configmap -n team-a shop-config
    $KUBECTL patch webapp -n team-a shop --type merge -p '{"spec":{"replicas":3}}'
    tail -f $DIR/trellis.log

Stop everything and remove the state:
    kill \$(cat $DIR/trellis.pid); $CLUSTER down $DIR
EOF
