#!/usr/bin/env bash
# The sample parents (examples/parents/) on a cluster where trellis serves
# the rules of rules/: what other teams made first
# (examples/prerequisites.yaml), then every sample parent, then each one
# waited for and shown with `trellis tree`. examples/quickstart.sh ends
# with it; tests/deploy.rs runs it on the test cluster's node.
#
#   KUBECONFIG=... examples/samples.sh KUBECTL TRELLIS cluster|local
#
# `cluster`: the cluster has a node but no registry (images are packed
# locally), so every `image:` of the samples is swapped for the project's
# app image, trellis.test/app:v1. `local`: no node, Pods never run.
#
# Some sample parents cannot be Ready on this machine; the script says which
# and why, and exits 1 only when one that can be Ready is not within
# TRELLIS_SAMPLES_TIMEOUT seconds (default 240 with a node, 60 without).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KUBECTL="${1:?usage: examples/samples.sh KUBECTL TRELLIS cluster|local}"
TRELLIS="${2:?usage: examples/samples.sh KUBECTL TRELLIS cluster|local}"
MODE="${3:?usage: examples/samples.sh KUBECTL TRELLIS cluster|local}"
APP_IMAGE=trellis.test/app:v1

say() { printf '\n==> %s\n' "$*"; }

# The sample parent files the script applies.
parents=()
for parent in "$ROOT"/examples/parents/*.yaml; do
    case "$parent" in *-invalid.yaml) continue ;; esac
    parents+=("$parent")
done

# `kind/name` and the namespace (empty: cluster-scoped) of a parent file.
target_of() { printf '%s/%s' "$(sed -n 's/^kind: *//p' "$1" | tr '[:upper:]' '[:lower:]')" "$(sed -n 's/^  name: *//p' "$1" | head -n 1)"; }
namespace_of() { sed -n 's/^  namespace: *//p' "$1" | head -n 1; }

# What keeps a sample parent from being Ready here, by kind/name.
declare -A CANNOT=(
    [database/orders]="its StatefulSet runs postgres:16, an image from a registry, and this machine has none (images are packed locally; nothing is pulled); its 5Gi volume claim would also wait for a volume provisioner, which this one-node cluster does not run"
    [tlsservice/storefront]="it reads a cert-manager Certificate, and cert-manager is not installed here (the Certificate kind is not served), so its Ingress is held back"
)
if [[ "$MODE" != cluster ]]; then
    for parent in "${parents[@]}"; do
        if grep -q '^kind: WebApp' "$parent"; then
            CANNOT[$(target_of "$parent")]="no node: its Deployment's Pods never run"
        elif grep -q '^kind: Deployment' "$parent"; then
            CANNOT[$(target_of "$parent")]="no node: its Pods never run, so it is never Available"
        fi
    done
fi

say "Creating the sample parents (and what other teams made first: examples/prerequisites.yaml)"
# Every namespace a sample parent lives in, as the platform team would have
# made it (a Team moves into a Namespace someone else made).
for ns in $(sed -n 's/^  namespace: *//p' "${parents[@]}" | sort -u); do
    "$KUBECTL" create namespace "$ns" --dry-run=client -o yaml | "$KUBECTL" apply --server-side -f - >/dev/null
done
"$KUBECTL" apply --server-side -f "$ROOT/examples/prerequisites.yaml"
for parent in "${parents[@]}"; do
    # The files carry a uid and generation for offline `trellis render`;
    # the API server sets its own (and a second run must not clash).
    edits=(-e '/^  uid: /d' -e '/^  generation: /d')
    if [[ "$MODE" == cluster ]]; then
        # No registry here: every container runs the project's app image
        # (a WebApp's spec.image, a Deployment's containers).
        edits+=(-e "s#^([[:space:]-]*image:)[[:space:]].*#\\1 $APP_IMAGE#")
    fi
    sed -E "${edits[@]}" "$parent" | "$KUBECTL" apply --server-side -f -
done

# `trellis tree` of one parent file; its exit code (0 Ready, 1 not, 2 error).
show_tree() {
    local ns
    ns="$(namespace_of "$1")"
    "$TRELLIS" tree --rules "$ROOT/rules" "$(target_of "$1")" ${ns:+-n "$ns"} "${@:2}"
}

timeout="${TRELLIS_SAMPLES_TIMEOUT:-$([[ "$MODE" == cluster ]] && echo 240 || echo 60)}"
say "Waiting up to ${timeout}s for every sample parent that can be Ready here"
deadline=$((SECONDS + timeout))
waiting=()
for parent in "${parents[@]}"; do
    [[ -n "${CANNOT[$(target_of "$parent")]:-}" ]] || waiting+=("$parent")
done
while ((${#waiting[@]})) && ((SECONDS < deadline)); do
    still=()
    for parent in "${waiting[@]}"; do
        # 0: Ready (a Deployment parent, which gets no status from trellis:
        # its own Available condition, and its rule's children).
        show_tree "$parent" >/dev/null 2>&1 || still+=("$parent")
    done
    waiting=("${still[@]+"${still[@]}"}")
    if ((${#waiting[@]})); then sleep 2; fi
done

say "Every sample parent, as trellis sees it (trellis tree KIND/NAME)"
for parent in "${parents[@]}"; do
    ns="$(namespace_of "$parent")"
    echo
    echo "\$ trellis tree --rules rules $(target_of "$parent")${ns:+ -n $ns}"
    show_tree "$parent" || true
done

echo
ready=$((${#parents[@]} - ${#CANNOT[@]} - ${#waiting[@]}))
echo "Ready: $ready of ${#parents[@]} sample parents."
for target in $(printf '%s\n' "${!CANNOT[@]}" | sort); do
    echo "Not Ready here, as expected: $target: ${CANNOT[$target]}."
done
if ((${#waiting[@]})); then
    for parent in "${waiting[@]}"; do
        echo "error: $(target_of "$parent") is not Ready after ${timeout}s (its tree is above)" >&2
    done
    exit 1
fi
echo "Every sample parent that can be Ready here is Ready."
