#!/usr/bin/env bash
# Children in other clusters, on one machine: two local control planes (a
# hub and a spoke named eu-west), the spoke registered with the hub the way
# docs/operations.md describes (a ServiceAccount in the spoke, allowed what
# `trellis rbac --cluster eu-west` prints, its token in a kubeconfig, that
# kubeconfig in a Secret of the hub), trellis running on the hub with the
# rule of rules/workspace.yaml, and the sample Workspace: its Namespace and
# ConfigMap made in the spoke, its status read back into the hub.
#
#   examples/fleet/run.sh                          # build what is missing, start, wait for the Workspace
#   TRELLIS_FLEET_DIR=/some/dir examples/fleet/run.sh
#   TRELLIS_FLEET_BINARY=path/to/trellis ...       # use this binary instead of building one
#
# No node is needed (a Namespace and a ConfigMap run nowhere). Tested as
# written by tests/examples_fleet.rs.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CLUSTER="$ROOT/tests/cluster/cluster"
DIR="${TRELLIS_FLEET_DIR:-/tmp/trellis-fleet}"
SPOKE=eu-west

say() { printf '\n==> %s\n' "$*"; }

say "Building the control plane (cached after the first run)"
"$CLUSTER" build
KUBECTL="$("$CLUSTER" bin)/kubectl"

if [[ -n "${TRELLIS_FLEET_BINARY:-}" ]]; then
    TRELLIS="$TRELLIS_FLEET_BINARY"
else
    say "Building trellis"
    cargo build --quiet --manifest-path "$ROOT/Cargo.toml" --bin trellis
    TRELLIS="$ROOT/target/debug/trellis"
fi

say "Checking the rule (examples/fleet/rules)"
"$TRELLIS" check --rules "$HERE/rules"

say "Starting two control planes: the hub in $DIR/hub, the spoke $SPOKE in $DIR/spoke"
"$CLUSTER" up "$DIR/hub"
"$CLUSTER" up "$DIR/spoke"
hub() { KUBECONFIG="$DIR/hub/kubeconfig" "$KUBECTL" "$@"; }
spoke() { KUBECONFIG="$DIR/spoke/kubeconfig" "$KUBECTL" "$@"; }

say "In the spoke: an account for the hub, allowed what the rules place there"
spoke create namespace trellis-system --dry-run=client -o yaml | spoke apply --server-side -f -
spoke -n trellis-system create serviceaccount trellis-hub --dry-run=client -o yaml |
    spoke apply --server-side -f -
"$TRELLIS" rbac --rules "$HERE/rules" --cluster "$SPOKE" | tee "$DIR/spoke-role.yaml" |
    spoke apply --server-side -f -
spoke create clusterrolebinding trellis-hub --clusterrole="trellis-spoke-$SPOKE" \
    --serviceaccount=trellis-system:trellis-hub --dry-run=client -o yaml |
    spoke apply --server-side -f -

say "A token for it, and a kubeconfig around it ($DIR/spoke.kubeconfig)"
TOKEN="$(spoke -n trellis-system create token trellis-hub --duration=24h)"
SERVER="$(spoke config view --minify -o jsonpath='{.clusters[0].cluster.server}')"
spoke config view --raw --minify \
    -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d >"$DIR/spoke-ca.crt"
rm -f "$DIR/spoke.kubeconfig"
export KUBECONFIG="$DIR/spoke.kubeconfig"
"$KUBECTL" config set-cluster "$SPOKE" --server="$SERVER" \
    --certificate-authority="$DIR/spoke-ca.crt" --embed-certs >/dev/null
"$KUBECTL" config set-credentials trellis-hub --token="$TOKEN" >/dev/null
"$KUBECTL" config set-context "$SPOKE" --cluster="$SPOKE" --user=trellis-hub >/dev/null
"$KUBECTL" config use-context "$SPOKE" >/dev/null
unset KUBECONFIG
# What the hub's credentials may do there, and no more.
echo "the hub's account in the spoke may create ConfigMaps: $(KUBECONFIG="$DIR/spoke.kubeconfig" "$KUBECTL" auth can-i create configmaps -n default)"
echo "... and read Secrets: $(KUBECONFIG="$DIR/spoke.kubeconfig" "$KUBECTL" auth can-i get secrets -n default || true)"

say "In the hub: the Secret registering the spoke, the CRD, the parent's namespace"
hub create namespace trellis-system --dry-run=client -o yaml | hub apply --server-side -f -
hub -n trellis-system create secret generic "$SPOKE" --from-file=kubeconfig="$DIR/spoke.kubeconfig" \
    --dry-run=client -o yaml | hub apply --server-side -f -
hub -n trellis-system label secret "$SPOKE" trellis.dev/cluster="$SPOKE" --overwrite
"$TRELLIS" crd --rules "$HERE/rules" | hub apply --server-side -f -
hub wait --for=condition=Established --timeout=60s crd/workspaces.demo.trellis.dev
hub create namespace platform --dry-run=client -o yaml | hub apply --server-side -f -

say "Starting trellis on the hub as a local process (log: $DIR/trellis.log)"
if [[ -f "$DIR/trellis.pid" ]] && kill -0 "$(cat "$DIR/trellis.pid")" 2>/dev/null; then
    kill "$(cat "$DIR/trellis.pid")" && sleep 1
fi
PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
KUBECONFIG="$DIR/hub/kubeconfig" "$TRELLIS" run --rules "$HERE/rules" \
    --operator-namespace trellis-system --cluster-name hub \
    --metrics-addr "127.0.0.1:$PORT" >"$DIR/trellis.log" 2>&1 &
echo $! >"$DIR/trellis.pid"

say "The sample Workspace (examples/fleet/workspace.yaml)"
hub apply --server-side -f "$HERE/workspace.yaml"
if ! hub -n platform wait --for=condition=Ready --timeout=90s workspace/payments; then
    hub -n platform get workspace payments -o yaml
    tail -n 30 "$DIR/trellis.log"
    exit 1
fi
hub -n platform get workspace payments

say "In the spoke: the Workspace's Namespace and ConfigMap (labelled with the hub's name, no ownerReference)"
spoke get namespace ws-payments --show-labels
spoke -n ws-payments get configmap workspace-settings -o yaml

say "What the operator tells of the spoke (/status -> clusters)"
curl -s "http://127.0.0.1:$PORT/status" | python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["clusters"], indent=2))'

cat <<EOF

Done: trellis runs on the hub (pid $(cat "$DIR/trellis.pid")) and keeps workspace/payments's
children in the spoke $SPOKE. Try:
    alias hub='KUBECONFIG=$DIR/hub/kubeconfig $KUBECTL' spoke='KUBECONFIG=$DIR/spoke/kubeconfig $KUBECTL'
    spoke -n ws-payments delete configmap workspace-settings; sleep 2; spoke -n ws-payments get configmap
    hub -n platform patch workspace payments --type merge -p '{"spec":{"settings":{"tier":"platinum"}}}'
    "$CLUSTER" kill $DIR/spoke kube-apiserver KILL; sleep 3; hub -n platform get workspace payments   # ClusterUnreachable
    "$CLUSTER" start $DIR/spoke kube-apiserver
    hub -n platform delete workspace payments; spoke get namespace ws-payments   # deleted in the spoke first

Stop everything and remove the state:
    kill \$(cat $DIR/trellis.pid); $CLUSTER down $DIR/hub; $CLUSTER down $DIR/spoke
EOF
