# shellcheck shell=bash
# One real node for the control plane of tests/cluster/cluster (sourced by it):
# containerd + runc + the CNI bridge plugin from Debian packages, and the
# kubelet, kube-proxy and kube-scheduler v1.35.4 that `cluster build` makes.
# It follows ../../shared notes' measured recipe (real-node.md); each setting
# that differs from a default says why.
#
# Only one node can run per machine: its runtime state (/run/trellis-node),
# its bridge and its iptables chain have fixed names. The node is called
# "localhost"; the API server reaches its kubelet at localhost:<port>.
#
# Layout: DIR/node/ holds configs, certificates, kubelet and containerd roots
# and images; DIR/logs/ its logs; DIR/pids and DIR/cmd/ its processes, like the
# control plane's (so `cluster kill/start` work on node components too).

NODE_NAME=localhost
NODE_STATE=/run/trellis-node # short: containerd's socket path must fit a sockaddr
NODE_SOCK="$NODE_STATE/containerd.sock"
NODE_BRIDGE=trellis-cni0
NODE_POD_CIDR=198.19.0.0/24 # this node's share of POD_RANGE
NODE_HOST_IP=198.19.0.1     # the bridge's address: API server and kubelet's node IP
NODE_CHAIN=TRELLIS-NODE     # mangle FORWARD: the pod network never leaves the machine
NODE_COMPONENTS=(containerd kubelet kube-proxy kube-scheduler)
# Paths the kubelet, containerd's shim and the CNI plugins use whatever their
# configuration says. `down` removes those that did not exist before `up`.
NODE_FIXED_PATHS=(/var/lib/kubelet /var/lib/cni /run/containerd /var/log/containers /run/netns)

ctr_() { ctr -a "$NODE_SOCK" -n k8s.io "$@"; }

# No node possible here: exit 3, before anything started, so a caller (the
# test harness) can tell this from a failed start and go on without a node.
no_node() {
    printf '[cluster] no node: %s\n' "$*" >&2
    exit 3
}

node_preflight() {
    [[ "$(id -u)" == 0 ]] || no_node "a node needs root (cgroups, network namespaces, a bridge, iptables)"
    local tool
    for tool in containerd runc ctr iptables ip6tables python3 go gcc; do
        command -v "$tool" >/dev/null 2>&1 ||
            no_node "'$tool' is not installed (Debian: apt-get install containerd runc containernetworking-plugins iptables gcc)"
    done
    [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local ]] ||
        no_node "no CNI plugins in /usr/lib/cni (apt-get install containernetworking-plugins)"
    node_cached || do_build
    if [[ -f "$NODE_STATE/owner" ]]; then
        local owner
        owner="$(cat "$NODE_STATE/owner")"
        if [[ -f "$owner/pids" ]] && grep -q '^containerd ' "$owner/pids" &&
            ours "$(awk '$1 == "containerd" { print $2 }' "$owner/pids")" "$owner"; then
            no_node "a node already runs on this machine, for the control plane in $owner (one node per machine; stop it with 'cluster down $owner', or start this control plane without a node)"
        fi
        log "removing the remains of a node for $owner"
        node_cleanup_host "$owner"
    fi
}

# node_network_up DIR: the pod bridge with the host's address on it, and the
# forwarding rule, before the API server starts (it listens on that address).
node_network_up() {
    local dir="$1" p
    mkdir -p "$dir/node" "$NODE_STATE"
    echo "$dir" >"$NODE_STATE/owner"
    cat /proc/sys/net/ipv4/ip_forward >"$dir/node/ip_forward.orig"
    # kube-proxy's --cleanup leaves some chains (KUBE-FIREWALL): down removes
    # every KUBE-* chain that was not there before.
    iptables-save 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p' | sort -u >"$dir/node/iptables-chains.orig"
    ip6tables-save 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p' | sort -u >"$dir/node/ip6tables-chains.orig"
    : >"$dir/node/created-paths"
    for p in "${NODE_FIXED_PATHS[@]}"; do
        [[ -e "$p" ]] || echo "$p" >>"$dir/node/created-paths"
    done
    ip link add "$NODE_BRIDGE" type bridge || return 1
    ip addr add "$NODE_HOST_IP/${NODE_POD_CIDR#*/}" dev "$NODE_BRIDGE" || return 1
    ip link set "$NODE_BRIDGE" up || return 1
    # Only bridge-internal forwarding: a packet from the pod network to any
    # other interface (and from any other interface into it) is dropped. The
    # mangle table runs before filter, where kube-proxy puts its ACCEPTs.
    # Pod -> API server (a local address) is INPUT, not FORWARD.
    local t
    for t in iptables ip6tables; do
        $t -w -t mangle -N "$NODE_CHAIN" || return 1
        $t -w -t mangle -A "$NODE_CHAIN" -i "$NODE_BRIDGE" -o "$NODE_BRIDGE" -j RETURN
        $t -w -t mangle -A "$NODE_CHAIN" -i "$NODE_BRIDGE" -j DROP
        $t -w -t mangle -A "$NODE_CHAIN" -o "$NODE_BRIDGE" -j DROP
        $t -w -t mangle -I FORWARD 1 -j "$NODE_CHAIN" || return 1
    done
}

node_client_cert() { # dir name subject
    local pki="$1/pki" out="$1/node/pki"
    mkdir -p "$out"
    cp "$pki/ca.crt" "$out/ca.crt"
    (
        umask 077
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$out/$2.key" \
            -out "$out/$2.csr" -subj "$3" 2>/dev/null &&
            openssl x509 -req -in "$out/$2.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
                -out "$out/$2.crt" -days 3650 -extfile "$pki/client.ext" 2>/dev/null
    ) || die "signing a certificate for $3 failed"
    rm -f "$out/$2.csr"
    write_kubeconfig "$1/node/$2.kubeconfig" "$(cat "$1/server")" "$out" "$2"
}

node_kubectl() { "$CACHE/kubectl" --kubeconfig="$1/kubeconfig" --request-timeout=10s "${@:2}"; }

node_healthy() { # dir name
    case "$2" in
    containerd) ctr_ version ;;
    kubelet | kube-proxy | kube-scheduler)
        curl -ksSf --max-time 2 "$(cat "$1/node/$2.healthz-url")" >/dev/null
        ;;
    *) return 1 ;;
    esac
}

node_ready() {
    [[ "$(node_kubectl "$1" get node "$NODE_NAME" \
        -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}

# node_image DIR TAR: import an OCI archive into the node's containerd.
node_image() {
    ctr_ images import "$2" >/dev/null
}

# cluster image DIR TAR: import an image archive (images/pack.py) into the node.
do_image() {
    local dir tar="${2:-}"
    dir="$(state_dir "${1:-}")"
    [[ -f "$tar" ]] || die "usage: cluster image DIR IMAGE.tar (no file '$tar')"
    [[ -f "$dir/node/up" ]] || die "no node in $dir (start it with: cluster up $dir --node)"
    node_image "$dir" "$tar" || die "importing $tar into the node's containerd failed"
    log "imported $tar"
}

node_up() {
    local dir="$1" nd="$1/node" t0=$SECONDS
    mkdir -p "$nd"/{pki,cni,containerd,kubelet,pod-logs,volume-plugins,img}
    # ---- containerd ---------------------------------------------------------
    cat >"$nd/containerd/config.toml" <<EOF
version = 2
root = "$nd/containerd/root"
state = "$NODE_STATE"
[grpc]
  address = "$NODE_SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10.1"
  # No CAP_SYS_RESOURCE on these machines: runc may not lower oom_score_adj
  # (pause asks for -998), so clamp to containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$nd/cni"
EOF
    # The bridge exists already (node_network_up) with the gateway address.
    cat >"$nd/cni/10-pods.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "trellis-pods", "plugins": [{
  "type": "bridge", "bridge": "$NODE_BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
  "ipam": {"type": "host-local", "dataDir": "$NODE_STATE/ipam",
           "ranges": [[{"subnet": "$NODE_POD_CIDR", "gateway": "$NODE_HOST_IP"}]],
           "routes": [{"dst": "0.0.0.0/0"}]}}]}
EOF
    start containerd "$dir" containerd --config "$nd/containerd/config.toml"
    wait_for "$dir" 20 "containerd did not answer" ctr_ version
    log "containerd up"

    # ---- images: pause, and the project's app image (images/app) ------------
    local pack="$HERE/../../images/pack.py"
    python3 "$pack" --ref registry.k8s.io/pause:3.10.1 --out "$nd/img/pause.tar" \
        --entrypoint '["/pause"]' --user 65535:65535 --file "$CACHE/pause:/pause:0755" ||
        fail_up "$dir" "packing the pause image failed"
    node_image "$dir" "$nd/img/pause.tar" || fail_up "$dir" "importing the pause image failed"
    "$HERE/../../images/app/build" "$nd/img" >/dev/null || fail_up "$dir" "building the app image failed"
    node_image "$dir" "$nd/img/app.tar" || fail_up "$dir" "importing the app image failed"
    log "images imported: pause, $(cat "$nd/img/app.ref")"

    # ---- identities: RBAC only (no Node authorizer in this control plane) ----
    node_client_cert "$dir" kubelet "/O=system:nodes/CN=system:node:$NODE_NAME"
    node_client_cert "$dir" kube-scheduler "/CN=system:kube-scheduler"
    node_client_cert "$dir" kube-proxy "/CN=system:kube-proxy"
    node_kubectl "$dir" create clusterrolebinding trellis-test-nodes --clusterrole=system:node \
        --group=system:nodes >/dev/null || fail_up "$dir" "binding system:node failed"

    # ---- kubelet --------------------------------------------------------------
    local kubelet_port kubelet_hz proxy_hz proxy_metrics sched_port
    read -r kubelet_port kubelet_hz proxy_hz proxy_metrics sched_port <<<"$(free_ports 5)"
    echo "nameserver 127.0.0.1" >"$nd/resolv.conf" # no DNS in this cluster
    cat >"$nd/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false              # 1.35 refuses cgroup v1 by default; these VMs are v1 (+ unified)
cgroupDriver: cgroupfs           # no systemd here
containerRuntimeEndpoint: unix://$NODE_SOCK
address: 127.0.0.1               # the API server dials localhost:<port> (node name, Hostname address)
port: $kubelet_port
healthzBindAddress: 127.0.0.1
healthzPort: $kubelet_hz
readOnlyPort: 0
# Only the API server calls the kubelet, with its client certificate (CA-signed).
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: $dir/pki/ca.crt}}
authorization: {mode: AlwaysAllow}
syncFrequency: 1s                # ConfigMap volume updates in ~2 s (default 1m: 60-75 s)
oomScoreAdj: 0                   # no CAP_SYS_RESOURCE
makeIPTablesUtilChains: false    # no KUBE-FIREWALL & co. left in iptables
failSwapOn: false
resolvConf: $nd/resolv.conf
podLogsDir: $nd/pod-logs         # else /var/log/pods
volumePluginDir: $nd/volume-plugins  # else /usr/libexec/kubernetes
imageGCHighThresholdPercent: 100 # never collect the imported images: nothing could pull them again
imageGCLowThresholdPercent: 99
# No eviction, no image reclaim under disk pressure: the machine's disk is
# shared with builds that fill it for minutes, and an evicted pause image
# could never be pulled again.
evictionHard: {memory.available: "0%", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%", imagefs.inodesFree: "0%"}
EOF
    echo "http://127.0.0.1:$kubelet_hz/healthz" >"$nd/kubelet.healthz-url"
    echo "http://127.0.0.1:$proxy_hz/healthz" >"$nd/kube-proxy.healthz-url"
    echo "https://127.0.0.1:$sched_port/healthz" >"$nd/kube-scheduler.healthz-url"
    # A Node object from an earlier run would read Ready from stale status.
    node_kubectl "$dir" delete node "$NODE_NAME" --ignore-not-found >/dev/null 2>&1 || true
    start kubelet "$dir" "$CACHE/kubelet" --config="$nd/kubelet.yaml" --kubeconfig="$nd/kubelet.kubeconfig" \
        --hostname-override="$NODE_NAME" --node-ip="$NODE_HOST_IP" \
        --root-dir="$nd/kubelet" --cert-dir="$nd/pki/serving" --v=1
    wait_for "$dir" 60 "node $NODE_NAME did not become Ready" node_ready "$dir"
    log "node $NODE_NAME Ready"

    # ---- kube-proxy: ClusterIP traffic (Pods reach the API server via the
    # `kubernetes` Service). Leave host-wide conntrack and sysctls alone.
    start kube-proxy "$dir" "$CACHE/kube-proxy" --kubeconfig="$nd/kube-proxy.kubeconfig" \
        --hostname-override="$NODE_NAME" --proxy-mode=iptables --cluster-cidr="$POD_RANGE" \
        --conntrack-max-per-core=0 --conntrack-tcp-timeout-established=0 \
        --conntrack-tcp-timeout-close-wait=0 --iptables-localhost-nodeports=false \
        --nodeport-addresses="$NODE_HOST_IP/32" \
        --healthz-bind-address="127.0.0.1:$proxy_hz" --metrics-bind-address="127.0.0.1:$proxy_metrics" \
        --v=1
    wait_for "$dir" 60 "kube-proxy did not become healthy" node_healthy "$dir" kube-proxy

    # ---- kube-scheduler ---------------------------------------------------------
    start kube-scheduler "$dir" "$CACHE/kube-scheduler" --kubeconfig="$nd/kube-scheduler.kubeconfig" \
        --authentication-kubeconfig="$nd/kube-scheduler.kubeconfig" \
        --authorization-kubeconfig="$nd/kube-scheduler.kubeconfig" \
        --leader-elect=false --bind-address=127.0.0.1 --secure-port="$sched_port" \
        --cert-dir="$nd/pki/kube-scheduler" --v=1
    wait_for "$dir" 60 "kube-scheduler did not become healthy" node_healthy "$dir" kube-scheduler
    : >"$nd/up"
    log "node up in $((SECONDS - t0))s (containerd, kubelet, kube-proxy, kube-scheduler; pods in $NODE_POD_CIDR)"
}

node_pid() { awk -v n="$2" '$1 == n { print $2 }' "$1/pids" 2>/dev/null; }

# Stop one recorded node component, SIGTERM then SIGKILL; drop it from pids.
node_stop() { # dir name
    local pid i
    pid="$(node_pid "$1" "$2")"
    if [[ -n "$pid" ]] && ours "$pid" "$1"; then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do
            alive "$pid" || break
            sleep 0.1
        done
        alive "$pid" && kill -KILL "$pid" 2>/dev/null
        for ((i = 0; i < 50; i++)); do
            alive "$pid" || break
            sleep 0.1
        done
    fi
    if [[ -f "$1/pids" ]]; then
        awk -v n="$2" '$1 != n' "$1/pids" >"$1/pids.new" && mv -f "$1/pids.new" "$1/pids"
    fi
}

# node_down DIR: stop the node and undo every side effect on the host. Safe to
# run on a half-started node and more than once.
node_down() {
    local dir="$1" nd="$1/node" i
    [[ -d "$nd" ]] || return 0
    # No new pods (a ReplicaSet would refill the node) ...
    node_stop "$dir" kube-scheduler
    # ... then delete the node's pods while the kubelet runs: that runs CNI DEL.
    if ours "$(node_pid "$dir" kubelet)" "$dir" && api_ready "$dir" 2>/dev/null; then
        node_kubectl "$dir" delete pods -A --field-selector "spec.nodeName=$NODE_NAME" \
            --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
        for ((i = 0; i < 300; i++)); do
            [[ -z "$(ctr_ tasks ls -q 2>/dev/null)" ]] && break
            sleep 0.1
        done
    fi
    node_stop "$dir" kubelet
    if [[ -x "$CACHE/kube-proxy" ]] && [[ -n "$(node_pid "$dir" kube-proxy)" || -f "$nd/up" ]]; then
        node_stop "$dir" kube-proxy
        # kube-proxy's chains, in iptables and ip6tables.
        "$CACHE/kube-proxy" --cleanup --v=0 >>"$dir/logs/kube-proxy.log" 2>&1 || true
    fi
    if api_ready "$dir" 2>/dev/null; then
        node_kubectl "$dir" delete node "$NODE_NAME" --ignore-not-found >/dev/null 2>&1 || true
    fi
    # Whatever is left (the API server was gone): kill tasks and shims.
    local t
    for t in $(ctr_ tasks ls -q 2>/dev/null); do
        ctr_ tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true
        ctr_ tasks delete -f "$t" >/dev/null 2>&1 || true
    done
    # Pod sandboxes' shims outlive containerd unless deleted; the CRI removes
    # sandboxes only through the kubelet, so kill any shim of ours by name.
    local pid
    for pid in $(pgrep -f "containerd-shim-runc-v2 -namespace k8s.io .*-address $NODE_SOCK" 2>/dev/null); do
        kill -KILL "$pid" 2>/dev/null || true
    done
    node_stop "$dir" containerd
    node_cleanup_host "$dir"
    rm -rf "$nd"
}

# node_remove_kube_chains iptables|ip6tables FILE: remove the KUBE-* chains
# not listed in FILE, and the rules that jump to them, in every table.
node_remove_kube_chains() {
    local t="$1" orig="$2" table chain rule
    for table in filter nat mangle raw; do
        for chain in $("$t-save" -t "$table" 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p'); do
            grep -qx -- "$chain" "$orig" && continue
            "$t-save" -t "$table" | grep -E -- "^-A [^ ]+ .*-j $chain( |\$)" | while read -r rule; do
                eval "$t -w -t $table -D ${rule#-A }" 2>/dev/null || true
            done
        done
        for chain in $("$t-save" -t "$table" 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p'); do
            grep -qx -- "$chain" "$orig" && continue
            $t -w -t "$table" -F "$chain" 2>/dev/null || true
        done
        for chain in $("$t-save" -t "$table" 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p'); do
            grep -qx -- "$chain" "$orig" && continue
            $t -w -t "$table" -X "$chain" 2>/dev/null || true
        done
    done
}

# The host side: mounts, network namespaces, bridge, iptables, cgroups,
# fixed paths, ip_forward. Needs no process to run.
node_cleanup_host() {
    local dir="$1" nd="$1/node" m h c t p
    findmnt -rn -o TARGET | awk -v a="$nd/" -v b="$NODE_STATE" '
        index($0, a) == 1 || index($0, b) == 1 || index($0, "/run/netns/cni-") == 1 ||
        index($0, "/run/containerd/io.containerd.") == 1' | sort -r | while read -r m; do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
    rm -f /run/netns/cni-* 2>/dev/null || true
    ip link del "$NODE_BRIDGE" 2>/dev/null || true
    for t in iptables ip6tables; do
        [[ -f "$nd/$t-chains.orig" ]] && node_remove_kube_chains "$t" "$nd/$t-chains.orig"
        while $t -w -t mangle -D FORWARD -j "$NODE_CHAIN" 2>/dev/null; do :; done
        $t -w -t mangle -F "$NODE_CHAIN" 2>/dev/null || true
        $t -w -t mangle -X "$NODE_CHAIN" 2>/dev/null || true
    done
    for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
        for c in kubepods k8s.io; do
            [[ -d "$h$c" ]] && find "$h$c" -depth -type d -exec rmdir {} + 2>/dev/null
        done
    done
    if [[ -f "$nd/created-paths" ]]; then
        while read -r p; do
            [[ -n "$p" ]] && rm -rf "$p"
        done <"$nd/created-paths"
    fi
    if [[ -f "$nd/ip_forward.orig" ]]; then
        cat "$nd/ip_forward.orig" >/proc/sys/net/ipv4/ip_forward
    fi
    rm -rf "$NODE_STATE"
}
