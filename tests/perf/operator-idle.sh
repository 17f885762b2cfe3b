#!/usr/bin/env bash
# operator-idle.sh OPERATOR [BASELINE_OPERATOR]: what an idle operator costs, on the test
# control plane (tests/tools/install.sh), without leader election (--leader-election=false,
# as one replica runs it) and with it: CPU a second and passes a second over IDLE seconds
# (default 10), once on an empty cluster and once with one GPU node and one config. Given a
# baseline binary, it is measured in the same run, alternately. Loopback only; every
# process is stopped at the end.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=../tools/env.sh
. "$repo/tests/tools/env.sh"
IDLE=${IDLE:-10}
[[ $# -ge 1 ]] || { sed -n '2,6p' "$0" >&2; exit 2; }

dir=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

controlplane >"$dir/ready" 2>"$dir/controlplane.log" &
pids+=($!)
for _ in $(seq 600); do [[ -s $dir/ready ]] && break; sleep 0.1; done
export KUBECONFIG
KUBECONFIG=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["kubeconfig"])' "$dir/ready")
kubectl apply -f "$repo/crds/neuronmonitorconfigs.neuronmonitor.io.yaml" >/dev/null
kubectl wait --for condition=established crd/neuronmonitorconfigs.neuronmonitor.io >/dev/null
kubectl create namespace idle >/dev/null

# idle BINARY ARGS…: prints "<CPU ms a second> <passes a second>" over IDLE seconds, once
# the operator has synced and made its first pass.
idle() {
    local binary=$1 port=$((20000 + RANDOM % 20000)) pid
    shift
    "$binary" --namespace idle --listen "127.0.0.1:$port" "$@" >"$dir/operator.log" 2>&1 &
    pid=$!
    local url=http://127.0.0.1:$port/metrics
    passes() { curl -sf "$url" | awk '$1 == "neuron_operator_reconciles_total" { print $2 }'; }
    cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
    for _ in $(seq 300); do [[ $(passes 2>/dev/null || echo 0) -ge 1 ]] 2>/dev/null && break; sleep 0.1; done
    local p0 c0 p1 c1
    p0=$(passes) c0=$(cpu_ticks)
    sleep "$IDLE"
    p1=$(passes) c1=$(cpu_ticks)
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    awk -v c="$((c1 - c0))" -v p="$((p1 - p0))" -v t="$IDLE" -v hz="$(getconf CLK_TCK)" \
        'BEGIN { printf "%.1f %.1f\n", c * 1000 / hz / t, p / t }'
}

report() {
    local what=$1
    shift
    for binary in "$@"; do
        for election in false true; do
            read -r cpu rate < <(idle "$binary" --leader-election="$election")
            printf '%-28s %-12s election=%-5s CPU %7.1f ms/s, %8.1f passes/s\n' "$what" "$(basename "$(dirname "$binary")")/$(basename "$binary")" "$election" "$cpu" "$rate"
        done
    done
}

report "empty cluster" "$@"
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: idle-gpu
  labels: { node.kubernetes.io/instance-type: p5.48xlarge }
---
apiVersion: neuronmonitor.io/v1alpha1
kind: NeuronMonitorConfig
metadata: { name: cluster, namespace: idle }
spec: { period: 10s }
EOF
report "one GPU node, one config" "$@"
