#!/usr/bin/env bash
# Quickstart: a local Kubernetes control plane, the example CRDs and rules,
# the trellis operator, and the sample parents.
#
#   examples/quickstart.sh            # build (first time: ~10 min), start, deploy trellis, apply parents
#   TRELLIS_QUICKSTART_DIR=/some/dir examples/quickstart.sh
#   TRELLIS_QUICKSTART_NODE=0 examples/quickstart.sh   # never start a node: trellis as a local process
#   TRELLIS_QUICKSTART_BINARY=path/to/trellis ...      # use this binary instead of building one
#
# The control plane is etcd + kube-apiserver + kube-controller-manager built
# from source by tests/cluster/cluster. As root, with the node's Debian
# packages (tests/cluster/README.md), it also gets one real node (containerd,
# kubelet, kube-proxy, kube-scheduler): trellis is then deployed into the
# cluster from examples/deploy/ (2 replicas, one leader, rules from a
# ConfigMap) and the sample parents' Pods run the project's tiny app image.
# Without a node, trellis runs as a local process and Pods never run. The
# script says which it did, ends with `trellis tree` of every sample parent
# (examples/samples.sh), and says which cannot be Ready here and why.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLUSTER="$ROOT/tests/cluster/cluster"
DIR="${TRELLIS_QUICKSTART_DIR:-/tmp/trellis-quickstart}"
APP_IMAGE=trellis.test/app:v1

say() { printf '\n==> %s\n' "$*"; }

say "Building the control plane (cached after the first run)"
"$CLUSTER" build

MODE=local
if [[ "${TRELLIS_QUICKSTART_NODE:-1}" != 0 ]]; then
    say "Starting the control plane with a node in $DIR"
    set +e
    "$CLUSTER" up "$DIR" --node
    rc=$?
    set -e
    if ((rc == 0)); then
        [[ -f "$DIR/node/up" ]] && MODE=cluster
    elif ((rc != 3)); then
        exit "$rc"
    fi
fi
if [[ "$MODE" == local ]]; then
    say "Starting the control plane in $DIR (no node: trellis will run as a local process)"
    "$CLUSTER" up "$DIR"
fi
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

if [[ -n "${TRELLIS_QUICKSTART_BINARY:-}" ]]; then
    # tests/quickstart.rs: the binary cargo built for the test run.
    TRELLIS="$TRELLIS_QUICKSTART_BINARY"
else
    say "Building trellis"
    cargo build --quiet --manifest-path "$ROOT/Cargo.toml" --bin trellis
    TRELLIS="$ROOT/target/debug/trellis"
fi

say "Checking the example rules"
"$TRELLIS" check --rules "$ROOT/rules"

if [[ "$MODE" == cluster ]]; then
    say "Deploying trellis into the cluster from examples/deploy/ (image packed locally, no registry)"
    image="$("$ROOT/images/trellis/build" "$TRELLIS" "$DIR/images")"
    "$CLUSTER" image "$DIR" "$DIR/images/trellis.tar"
    # examples/deploy as it is; an overlay sets only the image.
    mkdir -p "$DIR/deploy"
    cat >"$DIR/deploy/kustomization.yaml" <<EOF
resources: [$(python3 -c 'import os,sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$ROOT/examples/deploy" "$DIR/deploy")]
images:
  - name: trellis
    newName: ${image%:*}
    newTag: "${image##*:}"
EOF
    "$KUBECTL" apply --server-side --force-conflicts -k "$DIR/deploy"
    "$KUBECTL" -n trellis-system rollout status deployment/trellis --timeout=120s
    "$KUBECTL" -n trellis-system get pods,lease
else
    say "Starting the operator as a local process (log: $DIR/trellis.log)"
    if [[ -f "$DIR/trellis.pid" ]] && kill -0 "$(cat "$DIR/trellis.pid")" 2>/dev/null; then
        kill "$(cat "$DIR/trellis.pid")" && sleep 1
    fi
    # --manage-crds with --webhook-url: the WebApp's v2alpha1 is converted by this
    # process (its certificate in the Secret trellis-webhook-tls of
    # `default`, its CA written into the CRD), on loopback only.
    "$TRELLIS" run --rules "$ROOT/rules" --manage-crds --operator-namespace default \
        --webhook-addr 127.0.0.1:9443 --webhook-url https://127.0.0.1:9443 \
        >"$DIR/trellis.log" 2>&1 &
    echo $! >"$DIR/trellis.pid"
    sleep 2
fi

# The sample parents, each waited for and shown with `trellis tree` (the
# last step); the script says which cannot be Ready on this machine, and why.
"$ROOT/examples/samples.sh" "$KUBECTL" "$TRELLIS" "$MODE"

if [[ "$MODE" == cluster ]]; then
    leader="$("$KUBECTL" -n trellis-system get lease trellis -o jsonpath='{.spec.holderIdentity}')"
    say "What the operator did (the leader ${leader%_*}'s last log lines, JSON)"
    "$KUBECTL" -n trellis-system logs "${leader%_*}" --tail=8
    say "The last reload, seen from outside the Pod (the API server's pod proxy)"
    "$KUBECTL" get --raw "/api/v1/namespaces/trellis-system/pods/${leader%_*}:8080/proxy/status"
    echo
    cat <<EOF

Done: trellis runs IN THE CLUSTER (examples/deploy/: 2 replicas, leader ${leader%_*}).
Try: edit the rules ConfigMap and watch the children change:
    export KUBECONFIG=$DIR/kubeconfig
    $TRELLIS tree --rules $ROOT/rules webapp/shop -n team-a --watch
    $KUBECTL -n trellis-system edit configmap trellis-rules
    $KUBECTL get --raw /api/v1/namespaces/trellis-system/pods/${leader%_*}:8080/proxy/status
    $KUBECTL -n trellis-system logs -f deploy/trellis

Stop everything (node included) and remove the state:
    $CLUSTER down $DIR
EOF
else
    say "What the operator did (last lines of $DIR/trellis.log)"
    tail -n 15 "$DIR/trellis.log"
    cat <<EOF

Done: trellis runs as a LOCAL PROCESS (pid $(cat "$DIR/trellis.pid")): no node could be started
(a node needs root and the packages in tests/cluster/README.md; one node per machine).
Try: delete a child and watch it come back, or edit a parent:
    export KUBECONFIG=$DIR/kubeconfig
    $TRELLIS tree --rules $ROOT/rules webapp/shop -n team-a --watch     # in another terminal
    $KUBECTL delete configmap -n team-a shop-config; sleep 2; $KUBECTL get configmap -n team-a shop-config
    $KUBECTL patch webapp -n team-a shop --type merge -p '{"spec":{"replicas":3}}'
    tail -f $DIR/trellis.log

Stop everything and remove the state:
    kill \$(cat $DIR/trellis.pid); $CLUSTER down $DIR
EOF
fi
