#!/usr/bin/env bash
# A real one-node Kubernetes cluster on this machine, for the tests and the demo:
#
#   tests/realnode.sh up DIR     start it (state, logs and images under DIR); the last line
#                                of stdout is a JSON object: kubeconfig, values (a Helm
#                                values file pointing the chart at the local images),
#                                images {agent, operator, pause}, node, health_control
#                                (a line appended, like `hbm-ue:3` or
#                                `xid:79:00000000:00:1E.0`, injects that fault into the
#                                simulated driver), kind (neuron|gpu), gpus and
#                                nvml_config (GPU nodes: the fake NVML's GPUs as JSON,
#                                and its configuration file), allocation, timings
#   tests/realnode.sh down DIR   stop everything `up` started and restore the machine
#
# What runs: the test control plane (tests/controlplane with --node-name: ServiceAccount
# admission, bound tokens, the controllers pods need), containerd and runc (Debian
# packages) with their own config, root, state and socket under DIR, a CNI bridge, the
# kubelet (root dir /var/lib/kubelet, as the chart's hostPaths expect), kube-scheduler and
# kube-proxy (iptables mode: the `kubernetes` Service reaches the API server at the node's
# address). Neuron devices are allocated by the test device plugin (the default) or, with
# REALNODE_ALLOCATION=dra, by the test DRA driver instead (tests/controlplane/dradriver:
# DeviceClass neuron.aws.com, the devices in a ResourceSlice, claims prepared through CDI
# specs under DIR/dra/cdi; the EFA devices as AWS's EFA DRA driver publishes them, driver
# dra.net, DeviceClass efa.networking.k8s.aws; containerd 1.6 has no CDI support, so on
# such a node its runc is the driver's wrapper, which applies a pod's CDI devices before
# runc creates its containers); with REALNODE_ALLOCATION=mixed, by both, as on a node
# migrating to DRA: the device plugin advertises the first half of the devices (and the
# EFA devices), the DRA driver publishes the other half. The images (agent with the simulator as its neuron-monitor, operator, pause)
# are built with umoci from the workspace's binaries and imported into containerd: no
# registry, no container engine.
#
# One node per machine (the kubelet's device-plugin socket is a fixed host path):
# /run/neuron-realnode names the DIR of the node that runs. `up` refuses, with one line
# on stderr, a machine that cannot host a node; every wait is bounded; a failed `up`
# runs `down` before it exits. `down` stops the processes by their recorded PIDs (and the
# pods' processes and shims it finds by its containerd socket and cgroups), unmounts what
# the kubelet and runtime mounted, removes the bridge, the KUBE-* iptables chains, the
# kubepods/k8s.io cgroups and the host directories that did not exist before, and puts
# back the sysctls recorded at `up`. docs/real-node.md says more.
#
# Environment: NEURON_TOOLS_DIR (tests/tools/install.sh's tools), REALNODE_BIN_DIR (the
# workspace's binaries, `cargo build --workspace --bins`; default
# $CARGO_TARGET_DIR/debug, else target/debug), REALNODE_NODE_IP (default: the
# address of the default route), REALNODE_TIMEOUT (seconds for each start-up wait, 90),
# REALNODE_INSTANCE_TYPE (trn1.32xlarge; a GPU type the fake NVML library knows, like
# g5.12xlarge, makes a GPU node: no Neuron device, the fake library as the node's driver),
# REALNODE_ALLOCATION (deviceplugin; dra or mixed: Neuron nodes on Kubernetes >= 1.34,
# where resource.k8s.io/v1 is served).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=tools/env.sh
. "$repo/tests/tools/env.sh"

NODE_NAME=neuron-realnode
# A Neuron instance type, so that the chart's agent DaemonSet (node affinity on
# node.kubernetes.io/instance-type) and the operator take the node as a Neuron node; the
# simulator and the test device plugin simulate its devices, cores and EFA devices. A GPU
# instance type makes a GPU node instead (node_kind).
INSTANCE_TYPE=${REALNODE_INSTANCE_TYPE:-trn1.32xlarge}
[[ $INSTANCE_TYPE =~ ^[a-z0-9.-]{1,32}$ ]] || { echo "realnode: REALNODE_INSTANCE_TYPE ${INSTANCE_TYPE@Q}: an instance type" >&2; exit 1; }
# Who allocates the Neuron devices (start_allocation).
ALLOCATION=${REALNODE_ALLOCATION:-deviceplugin}
[[ $ALLOCATION == deviceplugin || $ALLOCATION == dra || $ALLOCATION == mixed ]] ||
    { echo "realnode: REALNODE_ALLOCATION ${ALLOCATION@Q}: deviceplugin (the default), dra or mixed" >&2; exit 1; }
POD_CIDR=10.244.0.0/24
BRIDGE=nmrealnode0
KUBELET_ROOT=/var/lib/kubelet
IMAGE_TAG=realnode
AGENT_IMAGE=localhost/neuron-monitor/neuron-node-agent:$IMAGE_TAG
OPERATOR_IMAGE=localhost/neuron-monitor/neuron-operator:$IMAGE_TAG
PAUSE_IMAGE=localhost/pause:$IMAGE_TAG
OWNER=/run/neuron-realnode
TIMEOUT=${REALNODE_TIMEOUT:-90}
# What the kubelet (kernel tunables), the bridge plugin (forwarding) and kube-proxy may
# change; recorded at `up`, put back at `down`.
SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
    kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward
    net.ipv4.conf.all.forwarding net.ipv4.conf.all.route_localnet
    net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
    net.netfilter.nf_conntrack_max net.netfilter.nf_conntrack_tcp_timeout_established
    net.netfilter.nf_conntrack_tcp_timeout_close_wait)
# Host directories the kubelet and the runtime create outside DIR; `down` removes those
# that did not exist at `up`.
HOST_PATHS=(/var/lib/kubelet /var/log/pods /var/log/containers /run/netns /run/containerd
    /var/lib/cni /run/kubernetes /etc/kubernetes)
# Commands a node needs, and where they come from.
NEEDED=(controlplane:install.sh kubelet:install.sh kube-scheduler:install.sh
    kube-proxy:install.sh pause:install.sh containerd:install.sh
    containerd-shim-runc-v2:install.sh runc:install.sh ctr:install.sh umoci:install.sh
    iptables:install.sh ip6tables:install.sh ip:iproute2 curl:curl setsid:util-linux
    findmnt:util-linux strip:binutils ldd:libc-bin ss:iproute2 sysctl:procps
    neuron-sim-deviceplugin:install.sh)

die() {
    echo "realnode: $*" >&2
    exit 1
}

main() {
    [[ $# == 2 ]] || die "usage: tests/realnode.sh up|down DIR"
    [[ $2 =~ ^[A-Za-z0-9/._-]+$ ]] || die "DIR may hold only letters, digits and / . _ - (it goes into TOML, YAML and socket paths)"
    mkdir -p "$2"
    dir=$(cd "$2" && pwd)
    case $1 in
    up) up ;;
    down) down ;;
    *) die "usage: tests/realnode.sh up|down DIR" ;;
    esac
}

# --- checks --------------------------------------------------------------------------

# cannot_host: the first reason this machine cannot host a node, or nothing.
cannot_host() {
    local need cmd
    [[ $(id -u) == 0 ]] || { echo "needs root (mounts, cgroups, iptables, /var/lib/kubelet)"; return; }
    local caps
    caps=$(awk '$1 == "CapEff:" { print $2 }' /proc/self/status)
    # CAP_NET_ADMIN (12: bridge, iptables) and CAP_SYS_ADMIN (21: mounts, namespaces).
    (((0x$caps >> 12) & 1 && (0x$caps >> 21) & 1)) ||
        { echo "root lacks CAP_NET_ADMIN or CAP_SYS_ADMIN (capabilities $caps)"; return; }
    for need in "${NEEDED[@]}"; do
        cmd=${need%%:*}
        command -v "$cmd" >/dev/null || { echo "$cmd not found (from ${need#*:}; tests/tools/install.sh installs the node's tools)"; return; }
    done
    [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] ||
        { echo "CNI plugins missing in /usr/lib/cni (Debian's containernetworking-plugins)"; return; }
    grep -qw overlay /proc/filesystems || { echo "the kernel has no overlayfs (containerd's snapshotter)"; return; }
    cgroup_problem && return
    if [[ -e $OWNER ]]; then
        echo "a node already runs on this machine (its DIR: $(<"$OWNER")); tests/realnode.sh down it first"
        return
    fi
    [[ ! -e $KUBELET_ROOT/device-plugins/kubelet.sock ]] ||
        { echo "$KUBELET_ROOT/device-plugins/kubelet.sock exists: another kubelet runs or ran here"; return; }
    if [[ -n $(kube_chains iptables) || -n $(kube_chains ip6tables) ]]; then
        echo "KUBE-* iptables chains exist: another kube-proxy or kubelet runs or ran here"
        return
    fi
    ! ip link show "$BRIDGE" >/dev/null 2>&1 || { echo "the bridge $BRIDGE exists: another node runs or ran here"; return; }
    command -v iptables-restore >/dev/null && command -v ip6tables-restore >/dev/null ||
        { echo "iptables-restore not found (Debian's iptables)"; return; }
    local sock=$dir/containerd/containerd.sock.ttrpc
    ((${#sock} < 100)) || { echo "DIR is too long for a unix socket path ($sock)"; return; }
    local b
    for b in neuron-node-agent neuron-operator neuron-monitor-sim nvidia-ml-fake-gpus; do
        [[ -x $(workspace_bin)/$b ]] || { echo "$(workspace_bin)/$b missing: cargo build --workspace --bins first"; return; }
    done
    local kind
    kind=$(node_kind) || { echo "instance type $INSTANCE_TYPE: neither the simulator nor the fake NVML library knows it"; return; }
    # A cdylib: `cargo build --workspace --bins` does not build it.
    [[ $kind != gpu || -f $(workspace_bin)/libnvidia_ml_fake.so ]] ||
        { echo "$(workspace_bin)/libnvidia_ml_fake.so missing: cargo build -p nvidia-ml-fake first"; return; }
    [[ $ALLOCATION == deviceplugin ]] || dra_problem
    node_ip >/dev/null || echo "no IPv4 address for the node (set REALNODE_NODE_IP)"
}

# dra_problem: prints why this node cannot allocate through the test DRA driver.
dra_problem() {
    local version minor
    command -v neuron-sim-dradriver >/dev/null ||
        { echo "neuron-sim-dradriver not found (tests/tools/install.sh builds it)"; return; }
    [[ $(node_kind) == neuron ]] || { echo "REALNODE_ALLOCATION=$ALLOCATION is for Neuron nodes, not $INSTANCE_TYPE"; return; }
    version=$(kubelet --version 2>/dev/null | awk '{ print $2 }')
    minor=$(cut -d. -f2 <<<"$version")
    [[ $minor =~ ^[0-9]+$ ]] && ((minor >= 34)) ||
        echo "REALNODE_ALLOCATION=$ALLOCATION needs Kubernetes >= 1.34 (resource.k8s.io/v1); the node's kubelet is ${version:-unknown}"
}

# cgroup_problem: prints why the cgroup layout cannot host the kubelet (and succeeds).
cgroup_problem() {
    local c
    if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
        for c in cpu memory pids; do
            grep -qw "$c" /sys/fs/cgroup/cgroup.controllers || { echo "cgroup v2 without the $c controller"; return 0; }
        done
        [[ ! -e /sys/fs/cgroup/kubepods ]] || { echo "the cgroup kubepods exists: another kubelet runs or ran here"; return 0; }
    else
        # cgroup v1 (the kubelet runs with failCgroupV1: false, see docs/real-node.md).
        for c in cpu cpuacct cpuset memory pids devices freezer; do
            [[ -d /sys/fs/cgroup/$c ]] || { echo "cgroup v1 without the $c hierarchy at /sys/fs/cgroup/$c"; return 0; }
        done
        [[ ! -e /sys/fs/cgroup/memory/kubepods && ! -e /sys/fs/cgroup/memory/k8s.io ]] ||
            { echo "the cgroup kubepods or k8s.io exists: another kubelet runs or ran here"; return 0; }
    fi
    return 1
}

workspace_bin() { echo "${REALNODE_BIN_DIR:-${CARGO_TARGET_DIR:-$repo/target}/debug}"; }

# node_kind: neuron (the simulator knows the instance type) or gpu (the fake NVML library
# does); fails for neither.
node_kind() {
    if "$(workspace_bin)/neuron-monitor-sim" hardware --instance-type "$INSTANCE_TYPE" >/dev/null 2>&1; then
        echo neuron
    elif "$(workspace_bin)/nvidia-ml-fake-gpus" <(echo "instance_type: $INSTANCE_TYPE") >/dev/null 2>&1; then
        echo gpu
    else
        return 1
    fi
}

node_ip() {
    local ip=${REALNODE_NODE_IP:-}
    [[ -n $ip ]] || ip=$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
    [[ -n $ip ]] || ip=$(ip -4 -o addr show scope global | awk '{ split($4, a, "/"); print a[1]; exit }')
    [[ -n $ip ]] && echo "$ip"
}

kube_chains() {
    local t
    for t in filter nat mangle raw; do
        "$1" -w 5 -t "$t" -S 2>/dev/null | awk -v t="$t" '$1 == "-N" && $2 ~ /^KUBE-/ { print t, $2 }'
    done
}

# free_port: a port nobody listens on, below the kernel's ephemeral range (where ports
# bound to 0 and outgoing connections come from, and a port found free can be taken
# before the kubelet binds it).
free_port() {
    local p low
    low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range)
    ((low > 21000)) || low=61000
    while :; do
        p=$((20000 + RANDOM % (low - 20000)))
        [[ -z $(ss -Hltn "sport = :$p") ]] && { echo "$p"; return; }
    done
}

now() { echo "${EPOCHREALTIME/,/.}"; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

# --- up ------------------------------------------------------------------------------

up() {
    local reason
    [[ ! -e $dir/pids ]] || die "$dir already holds a node (tests/realnode.sh down $dir first)"
    clean_stale_node
    reason=$(cannot_host) || true
    [[ -z $reason ]] || die "cannot host a node: $reason"
    echo "$dir" >"$OWNER"
    mkdir -p "$dir/pids" "$dir/logs" "$dir/host"
    kind=$(node_kind)
    trap up_failed EXIT
    local t0 t
    t0=$(now)
    record_host
    write_configs
    t=$(now)
    start_controlplane
    local cp_s
    cp_s=$(since "$t")
    t=$(now)
    start_containerd
    build_images
    local images_s
    images_s=$(since "$t")
    t=$(now)
    start_kubelet
    start_kube_proxy
    start_scheduler
    wait_node_ready
    start_driver
    start_allocation
    local node_s
    node_s=$(since "$t")
    write_values
    trap - EXIT
    local gpus='' nvml_config=''
    [[ $kind != gpu ]] || gpus=$dir/host/gpus.json nvml_config=$dir/nvidia/fake-nvml.yaml
    printf '{"kubeconfig":"%s","values":"%s","images":{"agent":"%s","operator":"%s","pause":"%s"},"node":"%s","node_ip":"%s","server":"%s","ca":"%s","kubelet_root":"%s","bridge":"%s","logs":"%s","health_control":"%s","kind":"%s","gpus":"%s","nvml_config":"%s","allocation":"%s","timings":{"controlplane_s":%s,"images_s":%s,"node_ready_s":%s,"total_s":%s}}\n' \
        "$dir/cp/admin.kubeconfig" "$dir/values.yaml" "$AGENT_IMAGE" "$OPERATOR_IMAGE" "$PAUSE_IMAGE" \
        "$NODE_NAME" "$(<"$dir/host/node-ip")" "$(server)" "$dir/cp/pki/ca.crt" "$KUBELET_ROOT" "$BRIDGE" "$dir/logs" "$dir/health-control" \
        "$kind" "$gpus" "$nvml_config" "$ALLOCATION" \
        "$cp_s" "$images_s" "$node_s" "$(since "$t0")"
}

# clean_stale_node: a node whose recorded processes are all gone (its test was killed
# before it could run down) is taken down, so that it does not block every later node.
clean_stale_node() {
    local owner pid
    [[ -f $OWNER ]] || return 0
    owner=$(<"$OWNER")
    [[ -d $owner/host ]] && compgen -G "$owner/pids/*" >/dev/null || return 0
    for pid in $(cat "$owner"/pids/*); do
        ! running "$pid" || return 0
    done
    echo "realnode: the node of $owner is stale (its processes are gone): taking it down" >&2
    "$repo/tests/realnode.sh" down "$owner" >&2 || true
}

# up_failed: a failed `up` leaves nothing running; its reason stays the last line.
up_failed() {
    local rc=$?
    local reason=${failure:-"up failed (rc $rc); logs in $dir/logs"}
    trap - EXIT
    echo "realnode: up failed, restoring the machine" >&2
    down >&2 || true
    echo "realnode: $reason" >&2
    exit $((rc == 0 ? 1 : rc))
}

fail() {
    failure=$1
    exit 1
}

record_host() {
    local s p
    node_ip >"$dir/host/node-ip"
    for s in "${SYSCTLS[@]}"; do
        if v=$(sysctl -n "$s" 2>/dev/null); then echo "$s=$v"; fi
    done >"$dir/host/sysctls"
    for p in "${HOST_PATHS[@]}"; do
        [[ -e $p ]] || echo "$p"
    done >"$dir/host/created-paths"
    ls -1 /run/netns 2>/dev/null >"$dir/host/netns" || true
}

write_configs() {
    mkdir -p "$dir/cni/net.d" "$dir/containerd" "$dir/kubelet" "$dir/manifests" "$dir/pod-logs"
    # A bridge with host-local addresses; no masquerade: pods reach the API server at the
    # node's address directly, and the host reaches the pods through the bridge.
    cat >"$dir/cni/net.d/10-realnode.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "realnode",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "$POD_CIDR" }]],
        "routes": [{ "dst": "0.0.0.0/0" }],
        "dataDir": "$dir/cni/ipam"
      }
    },
    { "type": "loopback" }
  ]
}
EOF
    # restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE, so runc cannot set the
    # negative OOM scores the kubelet asks for; they are clamped to 0 instead.
    cat >"$dir/containerd/config.toml" <<EOF
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "$dir/containerd/containerd.sock"

[ttrpc]
  address = "$dir/containerd/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$dir/containerd/runc"
$(runc_binary)

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni/net.d"
    max_conf_num = 1
EOF
    # cgroup v1 is what these machines have (failCgroupV1: false); the kernel defaults
    # are changed (and recorded, and restored by down), not enforced. Eviction only when
    # the disk is really full: the tests share the disk with builds.
    cat >"$dir/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$dir/containerd/containerd.sock
address: 127.0.0.1
port: $(free_port)
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $(free_port)
authentication:
  anonymous: { enabled: false }
  webhook: { enabled: true }
  x509: { clientCAFile: $dir/cp/pki/ca.crt }
authorization:
  mode: Webhook
staticPodPath: $dir/manifests
podLogsDir: $dir/pod-logs
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
protectKernelDefaults: false
rotateCertificates: false
serverTLSBootstrap: false
registerNode: true
EOF
    cat >"$dir/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $dir/cp/admin.kubeconfig
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $POD_CIDR
healthzBindAddress: 127.0.0.1:$(free_port)
metricsBindAddress: 127.0.0.1:$(free_port)
iptables:
  localhostNodePorts: false
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
}

# runc_binary: on a DRA node, the test DRA driver's runc wrapper as containerd's runc
# (it applies the CDI devices containerd 1.6 cannot), written to DIR/dra/runc.
runc_binary() {
    [[ $ALLOCATION != deviceplugin ]] || return 0
    mkdir -p "$dir/dra/cdi" "$dir/dra/consumers"
    printf '#!/bin/sh\nexec %s runc --runc %s --cdi-dir %s --consumers-dir %s -- "$@"\n' \
        "$(command -v neuron-sim-dradriver)" "$(command -v runc)" "$dir/dra/cdi" "$dir/dra/consumers" >"$dir/dra/runc"
    chmod +x "$dir/dra/runc"
    echo "        BinaryName = \"$dir/dra/runc\""
}

# start NAME CMD...: runs CMD in its own session, output in logs/NAME.log, PID recorded.
start() {
    local name=$1
    shift
    setsid "$@" >"$dir/logs/$name.log" 2>&1 </dev/null &
    echo $! >"$dir/pids/$name"
}

alive() { [[ -f $dir/pids/$1 ]] && running "$(<"$dir/pids/$1")"; }

# running PID: the process exists and is not a zombie (its parent, init here, reaps the
# node's processes a second or two after they exit).
running() {
    local state
    state=$(sed -n 's/.*) \(.\).*/\1/p' "/proc/$1/stat" 2>/dev/null)
    [[ -n $state && $state != Z ]]
}

# wait_until NAME WHAT CMD...: polls CMD until it succeeds; fails when NAME's process
# exits or after TIMEOUT seconds, with the last lines of NAME's log.
wait_until() {
    local name=$1 what=$2 deadline=$((SECONDS + TIMEOUT))
    shift 2
    until "$@" >/dev/null 2>&1; do
        if ! alive "$name"; then
            tail -n 20 "$dir/logs/$name.log" >&2 || true
            fail "$name exited before $what (log: $dir/logs/$name.log)"
        fi
        if ((SECONDS >= deadline)); then
            tail -n 20 "$dir/logs/$name.log" >&2 || true
            fail "$name: no $what after ${TIMEOUT}s (log: $dir/logs/$name.log)"
        fi
        sleep 0.2
    done
}

start_controlplane() {
    start controlplane controlplane --state-dir "$dir/cp" --node-name "$NODE_NAME" \
        --node-ip "$(<"$dir/host/node-ip")" --ready-timeout "${TIMEOUT}s" --log-file "$dir/logs/controlplane.klog"
    wait_until controlplane "ready line" grep -q '"ready_seconds"' "$dir/logs/controlplane.log"
}

server() { sed -n 's/.*"server":"\([^"]*\)".*/\1/p' "$dir/logs/controlplane.log"; }

# api PATH: GET on the API server as admin, the JSON without blanks.
api() {
    curl -sSf --max-time 5 --cacert "$dir/cp/pki/ca.crt" --cert "$dir/cp/pki/admin.crt" \
        --key "$dir/cp/pki/admin.key" "$(server)$1" | tr -d ' \n'
}

start_containerd() {
    start containerd containerd --config "$dir/containerd/config.toml"
    wait_until containerd "socket" ctr --address "$dir/containerd/containerd.sock" version
}

ctr_() { timeout 120 ctr --address "$dir/containerd/containerd.sock" --namespace k8s.io "$@"; }

start_kubelet() {
    start kubelet kubelet --config "$dir/kubelet/config.yaml" --kubeconfig "$dir/cp/kubelet.kubeconfig" \
        --root-dir "$KUBELET_ROOT" --cert-dir "$dir/kubelet/pki" --hostname-override "$NODE_NAME" \
        --node-ip "$(<"$dir/host/node-ip")" --node-labels "node.kubernetes.io/instance-type=$INSTANCE_TYPE"
}

start_kube_proxy() {
    start kube-proxy kube-proxy --config "$dir/kube-proxy.yaml"
}

start_scheduler() {
    start kube-scheduler kube-scheduler --kubeconfig "$dir/cp/admin.kubeconfig" --leader-elect=false \
        --secure-port=0
}

# node_ready: the Node is Ready and the node-lifecycle controller lifted the not-ready
# taint (else nothing schedules).
node_ready() {
    local node
    node=$(api "/api/v1/nodes/$NODE_NAME") || return 1
    grep -q '"type":"Ready","status":"True"' <<<"$node" || return 1
    ! grep -q 'node.kubernetes.io/not-ready' <<<"$node"
}

# kubernetes_endpoint: the kubernetes Service's endpoints point at the node's address
# (what kube-proxy sends pods' API calls to).
kubernetes_endpoint() {
    [[ $(api /api/v1/namespaces/default/endpoints/kubernetes) == *"\"ip\":\"$(<"$dir/host/node-ip")\""* ]]
}

wait_node_ready() {
    wait_until kubelet "Ready node" node_ready
    wait_until kube-proxy "kubernetes Service endpoint" kubernetes_endpoint
    wait_until kube-proxy "KUBE-SERVICES chain" iptables -w 5 -t nat -S KUBE-SERVICES
    alive kube-scheduler || fail "kube-scheduler exited (log: $dir/logs/kube-scheduler.log)"
}

# start_allocation: what allocates the node's devices (REALNODE_ALLOCATION): the device
# plugin, the DRA driver, or both (mixed: the plugin the first half of the devices and
# the EFA devices, the DRA driver the other half).
start_allocation() {
    local half
    if [[ $kind == gpu ]]; then
        start_gpu_device_plugin
        return
    fi
    write_hardware
    case $ALLOCATION in
        dra) start_dra_driver ;;
        mixed)
            half=$(($(grep -o '"devices":[0-9]*' "$dir/host/hardware.json" | cut -d: -f2) / 2))
            ((half > 0)) || fail "REALNODE_ALLOCATION=mixed needs an instance type of 2 Neuron devices or more"
            start_device_plugin --devices "$half"
            start_dra_driver --first-device "$half" --efa=false
            ;;
        *) start_device_plugin ;;
    esac
}

# write_hardware: the simulated instance's hardware as the simulator describes it, for
# the device plugin and the DRA driver (DIR/host/hardware.json, which both read).
write_hardware() {
    "$(workspace_bin)/neuron-monitor-sim" hardware --instance-type "$INSTANCE_TYPE" >"$dir/host/hardware.json" ||
        fail "the simulator does not know the instance type $INSTANCE_TYPE"
}

# start_dra_driver [FLAGS...]: the test DRA driver, for the simulated instance's
# hardware, with the simulated driver's version and FLAGS; waits until its ResourceSlices
# are published (the EFA devices' too, where the instance type has some and FLAGS do not
# say --efa=false).
start_dra_driver() {
    start dradriver neuron-sim-dradriver --hardware "$dir/host/hardware.json" --node-name "$NODE_NAME" \
        --kubeconfig "$dir/cp/admin.kubeconfig" --driver-version "$(<"$dir/node-sys/module/neuron/version")" \
        --cdi-dir "$dir/dra/cdi" --consumers-dir "$dir/dra/consumers" "$@"
    wait_until dradriver "neuron.aws.com ResourceSlice of the node" node_has_slice neuron.aws.com
    if [[ " $* " != *" --efa=false "* ]] && ! grep -q '"efa_devices":\[\]' "$dir/host/hardware.json"; then
        wait_until dradriver "dra.net (EFA) ResourceSlice of the node" node_has_slice dra.net
    fi
}

# node_has_slice DRIVER: the node has a ResourceSlice of DRIVER.
node_has_slice() {
    [[ $(api "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName=$NODE_NAME") == *"\"driver\":\"$1\""* ]]
}

# start_device_plugin [FLAGS...]: the test device plugin, for the simulated instance's
# hardware, with FLAGS, registered once the kubelet's socket exists; waits until the Node
# advertises NeuronCores.
start_device_plugin() {
    start deviceplugin neuron-sim-deviceplugin --hardware "$dir/host/hardware.json" \
        --socket-dir "$KUBELET_ROOT/device-plugins" "$@"
    wait_until deviceplugin "aws.amazon.com/neuroncore on the Node" node_has_neuroncores
}

# start_gpu_device_plugin: the fake NVML library as the node's driver (DIR/nvidia, which
# the chart mounts as gpu.libraryDir: libnvidia-ml.so.1 and its configuration), and the
# test device plugin advertising its GPUs by UUID (one, the last, shared by two replicas).
start_gpu_device_plugin() {
    mkdir -p "$dir/nvidia"
    strip --strip-debug -o "$dir/nvidia/libnvidia-ml.so.1" "$(workspace_bin)/libnvidia_ml_fake.so"
    echo "instance_type: $INSTANCE_TYPE" >"$dir/nvidia/fake-nvml.yaml"
    "$(workspace_bin)/nvidia-ml-fake-gpus" "$dir/nvidia/fake-nvml.yaml" >"$dir/host/gpus.json" ||
        fail "the fake NVML library refuses the instance type $INSTANCE_TYPE"
    start deviceplugin neuron-sim-deviceplugin --gpus "$dir/host/gpus.json" --gpu-shared-replicas 2 \
        --socket-dir "$KUBELET_ROOT/device-plugins"
    wait_until deviceplugin "nvidia.com/gpu on the Node" node_has_gpus
}

# start_driver: the simulator as the node's Neuron driver only (no report written): its
# sysfs tree (devices, EFA devices) under DIR/node-sys, which the agent mounts as the
# node's sysfs, its kernel log in that tree (DIR/node-sys/kmsg, the agent's --kmsg-path),
# and faults injected by appending lines to DIR/health-control. On a GPU node the tree is
# empty (no Neuron device) and only the kernel log is kept, for Xid records.
start_driver() {
    touch "$dir/health-control"
    if [[ $kind == gpu ]]; then
        mkdir -p "$dir/node-sys"
        start driver "$(workspace_bin)/neuron-monitor-sim" --no-devices --kmsg "$dir/node-sys/kmsg" \
            --health-control "$dir/health-control"
        wait_until driver "a kernel log" test -f "$dir/node-sys/kmsg"
        return
    fi
    start driver "$(workspace_bin)/neuron-monitor-sim" --instance-type "$INSTANCE_TYPE" --hang-after 0 \
        --sysfs-root "$dir/node-sys" --kmsg "$dir/node-sys/kmsg" --health-control "$dir/health-control"
    wait_until driver "a driver tree" test -f "$dir/node-sys/module/neuron/version"
}

node_has_neuroncores() { [[ $(api "/api/v1/nodes/$NODE_NAME") == *'"allocatable":{'*'"aws.amazon.com/neuroncore":"'* ]]; }
node_has_gpus() { [[ $(api "/api/v1/nodes/$NODE_NAME") == *'"allocatable":{'*'"nvidia.com/gpu":"'* ]]; }

write_values() {
    # Only what this node needs: the local images (never pulled), no Neuron device to
    # open, the simulated driver's tree (tests/realnode.sh's start_driver) as the node's
    # sysfs (on a GPU node an empty tree) and its kernel log (no /dev/kmsg in this
    # container); then what the kind of node adds under `agent`.
    cat >"$dir/values.yaml" <<EOF
image:
  registry: localhost
  pullPolicy: Never
operator:
  image:
    tag: $IMAGE_TAG
agent:
  image:
    tag: $IMAGE_TAG
  deviceAccess: none
  sysfsHostPath: $dir/node-sys
  extraArgs:
    - --kmsg-path=/host/sys/kmsg
EOF
    if [[ $kind == gpu ]]; then
        write_gpu_values
    else
        write_neuron_values
    fi
}

# write_neuron_values: the simulator as neuron-monitor: the node's instance type, and the
# applications of the workload pods (neuron-monitor-sim app), found through the host's
# PID namespace.
write_neuron_values() {
    cat >>"$dir/values.yaml" <<EOF
  extraEnv:
    - name: NEURON_SIM_INSTANCE_TYPE
      value: $INSTANCE_TYPE
    - name: NEURON_SIM_DISCOVER_APPS
      value: "true"
EOF
}

# write_gpu_values: the chart's GPU side as a GPU node's operator would set it, the
# driver directory being the fake library's (which reads its configuration from there).
write_gpu_values() {
    cat >>"$dir/values.yaml" <<EOF
  extraEnv:
    - name: FAKE_NVML_CONFIG
      value: /host/nvidia-lib/fake-nvml.yaml
gpu:
  enabled: true
  access: hostPath
  libraryDir: $dir/nvidia
EOF
}

# --- images --------------------------------------------------------------------------

# add_binary ROOTFS SRC DEST: the executable (debug info stripped) and the libraries
# ldd lists for it.
add_binary() {
    local rootfs=$1 src=$2 dest=$3 lib
    mkdir -p "$rootfs/$(dirname "$dest")"
    strip --strip-debug -o "$rootfs/$dest" "$src"
    for lib in $(ldd "$src" | grep -o '/[^ ]*'); do
        cp -L --parents -n "$lib" "$rootfs/"
    done
}

# add_base ROOTFS: users (root, nonroot 65532), CA certificates, /tmp.
add_base() {
    local rootfs=$1
    mkdir -p "$rootfs/etc/ssl/certs" "$rootfs/tmp" "$rootfs/home/nonroot"
    chmod 1777 "$rootfs/tmp"
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$rootfs/etc/passwd"
    printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
    cp -L /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"
}

# oci_image NAME REF USER ENTRYPOINT FILL INPUT...: an OCI image from the root file
# system that FILL (a function) populates from the INPUT files, imported into containerd
# as REF. Kept beside the workspace's binaries, keyed by the inputs and this script: a
# run with the same binaries imports it without building it again.
oci_image() {
    local name=$1 ref=$2 user=$3 entrypoint=$4 fill=$5
    shift 5
    local key cache
    key=$(cat "$@" "${BASH_SOURCE[0]}" <(echo "$name $user $entrypoint") | sha256sum | cut -c1-16)
    cache=$(workspace_bin)/realnode-images/$name-$key.tar
    if [[ ! -f $cache ]]; then
        build_oci "$name" "$user" "$entrypoint" "$fill"
        rm -f "$(workspace_bin)/realnode-images/$name-"*.tar
        mkdir -p "$(workspace_bin)/realnode-images"
        mv "$dir/images/$name.tar" "$cache"
    fi
    ctr_ images import --base-name "${ref%:*}" "$cache" >/dev/null
}

# build_oci NAME USER ENTRYPOINT FILL: the image's OCI layout, as DIR/images/NAME.tar.
build_oci() {
    local name=$1 user=$2 entrypoint=$3 fill=$4
    local work=$dir/images/$name layout=$dir/images/$name/oci
    rm -rf "$work"
    mkdir -p "$work"
    umoci init --layout "$layout"
    umoci new --image "$layout:$IMAGE_TAG"
    umoci unpack --image "$layout:$IMAGE_TAG" "$work/bundle" >/dev/null
    "$fill" "$work/bundle/rootfs"
    umoci repack --image "$layout:$IMAGE_TAG" "$work/bundle"
    umoci config --image "$layout:$IMAGE_TAG" --config.user "$user" --config.entrypoint "$entrypoint" \
        --config.workingdir / --config.label "org.opencontainers.image.title=$name"
    umoci gc --layout "$layout"
    tar -C "$layout" -cf "$work.tar" .
    rm -rf "$work"
}

fill_pause() { install -D -m 0755 "$(command -v pause)" "$1/pause"; }

fill_agent() {
    local bin
    bin=$(workspace_bin)
    add_base "$1"
    add_binary "$1" "$bin/neuron-node-agent" /usr/local/bin/neuron-node-agent
    # The simulator stands in for AWS's neuron-monitor where the chart runs it.
    add_binary "$1" "$bin/neuron-monitor-sim" /opt/aws/neuron/bin/neuron-monitor
    ln -s /opt/aws/neuron/bin/neuron-monitor "$1/usr/local/bin/neuron-monitor-sim"
}

fill_operator() {
    add_base "$1"
    add_binary "$1" "$(workspace_bin)/neuron-operator" /usr/local/bin/neuron-operator
}

build_images() {
    (
        set -e
        local bin
        bin=$(workspace_bin)
        oci_image pause "$PAUSE_IMAGE" 65535:65535 /pause fill_pause "$(command -v pause)"
        oci_image agent "$AGENT_IMAGE" 65532:65532 /usr/local/bin/neuron-node-agent fill_agent \
            "$bin/neuron-node-agent" "$bin/neuron-monitor-sim"
        oci_image operator "$OPERATOR_IMAGE" 65532:65532 /usr/local/bin/neuron-operator fill_operator \
            "$bin/neuron-operator"
    ) >"$dir/logs/images.log" 2>&1 || { tail -n 20 "$dir/logs/images.log" >&2; fail "building the images failed (log: $dir/logs/images.log)"; }
}

# timed CMD...: runs CMD, its seconds added to steps (NAME=SECONDS).
timed() {
    local t
    t=$(now)
    "$@"
    steps+=("$1${2:+-$2}=$(since "$t")")
}

# --- down ----------------------------------------------------------------------------

# stop NAME...: SIGTERM to the recorded PIDs together, SIGKILL to those alive after 15 s.
stop() {
    local name pids=() i
    for name in "$@"; do
        [[ -f $dir/pids/$name ]] && pids+=("$(<"$dir/pids/$name")")
    done
    ((${#pids[@]})) || return 0
    kill -TERM "${pids[@]}" 2>/dev/null
    for ((i = 0; i < 150; i++)); do
        local pid alive=0
        for pid in "${pids[@]}"; do running "$pid" && alive=1; done
        ((alive)) || break
        sleep 0.1
    done
    kill -KILL "${pids[@]}" 2>/dev/null
    for name in "$@"; do rm -f "$dir/pids/$name"; done
}

# pod_cgroups: every kubepods and k8s.io cgroup directory, deepest first.
pod_cgroups() {
    local root
    for root in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
        for top in "$root"kubepods* "$root"k8s.io; do
            [[ -d $top ]] && find "$top" -depth -type d
        done
    done 2>/dev/null || true
}

# kill_pods: the pods' processes (found by their cgroups) and this node's containerd
# shims (found by their -address argument).
kill_pods() {
    local cg pid sock=$dir/containerd/containerd.sock
    for cg in $(pod_cgroups); do
        for pid in $(cat "$cg/cgroup.procs" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    done
    # A shim's command line: containerd-shim-runc-v2 -namespace k8s.io -id ID -address SOCK
    for pid in $(pgrep -f containerd-shim-runc-v2); do
        grep -qaF -- "$sock" "/proc/$pid/cmdline" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    done
}

# remove_chains: per table, one iptables-restore deletes the jumps into KUBE-* chains
# from the other chains, then flushes and deletes the KUBE-* chains (rule by rule if the
# restore is refused).
remove_chains() {
    local cmd t rules
    for cmd in iptables ip6tables; do
        command -v "$cmd" >/dev/null || continue
        for t in filter nat mangle raw; do
            rules=$("$cmd" -w 5 -t "$t" -S 2>/dev/null) || continue
            [[ $rules == *KUBE-* ]] || continue
            {
                echo "*$t"
                grep -E '^-A [^ ]+ .*-j KUBE-' <<<"$rules" | grep -vE '^-A KUBE-' | sed 's/^-A /-D /'
                awk '$1 == "-N" && $2 ~ /^KUBE-/ { print "-F", $2 }' <<<"$rules"
                awk '$1 == "-N" && $2 ~ /^KUBE-/ { print "-X", $2 }' <<<"$rules"
                echo COMMIT
            } | "$cmd-restore" -w 5 --noflush 2>/dev/null || remove_table_chains "$cmd" "$t" "$rules"
        done
    done
}

remove_table_chains() {
    local cmd=$1 t=$2 rules=$3 rule chain
    grep -E '^-A [^ ]+ .*-j KUBE-' <<<"$rules" | grep -vE '^-A KUBE-' | while read -r rule; do
        # A rule is words as iptables -S prints them (comments quoted).
        eval "$cmd -w 5 -t $t -D ${rule#-A }" 2>/dev/null
    done
    for chain in $(awk '$1 == "-N" && $2 ~ /^KUBE-/ { print $2 }' <<<"$rules"); do
        "$cmd" -w 5 -t "$t" -F "$chain" 2>/dev/null
    done
    for chain in $(awk '$1 == "-N" && $2 ~ /^KUBE-/ { print $2 }' <<<"$rules"); do
        "$cmd" -w 5 -t "$t" -X "$chain" 2>/dev/null
    done
}

# our_mounts: mount points the node made (under the kubelet root, /run/netns, DIR and
# containerd's shim directory), deepest first.
our_mounts() {
    findmnt -rn -o TARGET | awk -v d="$dir" -v k="$KUBELET_ROOT" '
        index($0, k "/") == 1 || $0 == k || index($0, d "/") == 1 || index($0, "/run/netns/") == 1 ||
        index($0, "/run/containerd/") == 1 { print length($0), $0 }' | sort -rn | cut -d' ' -f2-
}

unmount_all() {
    local m i
    for ((i = 0; i < 3; i++)); do
        while read -r m; do
            [[ -n $m ]] || continue
            # findmnt escapes blanks as \x20.
            umount "$(printf '%b' "$m")" 2>/dev/null || umount -l "$(printf '%b' "$m")" 2>/dev/null || true
        done < <(our_mounts)
        [[ -z $(our_mounts) ]] && return
    done
}

remove_netns() {
    local ns
    for ns in $(ls -1 /run/netns 2>/dev/null); do
        grep -qxF "$ns" "$dir/host/netns" 2>/dev/null || rm -f "/run/netns/$ns"
    done
}

remove_cgroups() {
    local cg i
    for ((i = 0; i < 25; i++)); do
        for cg in $(pod_cgroups); do rmdir "$cg" 2>/dev/null || true; done
        [[ -z $(pod_cgroups) ]] && return
        kill_pods
        sleep 0.2
    done
}

remove_created_paths() {
    local p
    [[ -f $dir/host/created-paths ]] || return 0
    while read -r p; do
        [[ -n $p && -e $p ]] || continue
        # Never across a mount that is still there (a volume's files are not ours).
        rm -rf --one-file-system "$p" 2>/dev/null || true
    done <"$dir/host/created-paths"
}

restore_sysctls() {
    local line name value
    [[ -f $dir/host/sysctls ]] || return 0
    while IFS= read -r line; do
        name=${line%%=*} value=${line#*=}
        [[ "$(sysctl -n "$name" 2>/dev/null)" == "$value" ]] || sysctl -q -w "$name=$value" >/dev/null 2>&1 || true
    done <"$dir/host/sysctls"
}

# leftovers: what of the node is still on the machine, one line each.
leftovers() {
    local name line name value
    for name in kubelet kube-proxy kube-scheduler containerd controlplane; do
        ! alive "$name" || echo "process $name ($(<"$dir/pids/$name"))"
    done
    our_mounts | sed 's/^/mount /'
    pod_cgroups | sed 's/^/cgroup /'
    kube_chains iptables | sed 's/^/iptables /'
    kube_chains ip6tables | sed 's/^/ip6tables /'
    ! ip link show "$BRIDGE" >/dev/null 2>&1 || echo "bridge $BRIDGE"
    if [[ -f $dir/host/sysctls ]]; then
        while IFS= read -r line; do
            name=${line%%=*} value=${line#*=}
            [[ "$(sysctl -n "$name" 2>/dev/null)" == "$value" ]] || echo "sysctl $name=$(sysctl -n "$name") (was $value)"
        done <"$dir/host/sysctls"
    fi
}

down() {
    local t0 left
    # Every step is best effort: what is left is listed at the end.
    set +e +o pipefail
    t0=$(now)
    [[ -d $dir/host ]] || { echo "realnode: no node state in $dir"; return 0; }
    steps=()
    # The kubelet first (it would restart what is killed), then the pods, then the rest.
    timed stop kubelet deviceplugin dradriver driver
    timed kill_pods
    timed stop kube-proxy kube-scheduler containerd controlplane
    timed kill_pods
    timed remove_chains
    timed unmount_all
    timed remove_netns
    timed ip link del "$BRIDGE" 2>/dev/null
    timed remove_cgroups
    timed unmount_all
    timed remove_created_paths
    timed restore_sysctls
    timed true
    left=$(leftovers)
    if [[ -n $left ]]; then
        echo "realnode: down left behind:" >&2
        sed 's/^/  /' <<<"$left" >&2
        return 1
    fi
    rm -rf "$dir/pids"
    [[ ! -f $OWNER || $(<"$OWNER") != "$dir" ]] || rm -f "$OWNER"
    echo "realnode: down in $(since "$t0")s, machine restored (slowest: $(printf '%s\n' "${steps[@]}" | sort -t= -k2 -rn | head -4 | paste -sd' '))"
}

main "$@"
