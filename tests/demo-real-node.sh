#!/usr/bin/env bash
# The demo on a real node (tests/demo.sh with DEMO_REAL_NODE=1, which installs the tools
# and builds the binaries first): tests/realnode.sh starts a one-node cluster, the chart
# is installed with helm, a cluster-wide and a team config are applied, and two workload
# pods run simulated Neuron applications on NeuronCores of the test device plugin. It
# prints where to look; Ctrl-C stops the node (and so everything on it), leaving the
# machine as it was.
set -euo pipefail
cd "$(dirname "$0")/.."
. tests/tools/env.sh
[ "$(id -u)" = 0 ] || { echo "demo: the real node needs root (mounts, cgroups, iptables)" >&2; exit 1; }
dir=$(mktemp -d -t neuron-demo-node.XXXXXX)
cleanup() {
  trap - EXIT INT TERM
  kill $(jobs -p) 2>/dev/null || true
  echo
  echo "stopping the node..."
  tests/realnode.sh down "$dir" || true
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 0' INT TERM

echo "starting a real node (about a minute)..."
info=$(tests/realnode.sh up "$dir" | tail -n 1)
field() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(eval("d" + sys.argv[1]))' "$1" <<<"$info"; }
export KUBECONFIG=$(field '["kubeconfig"]')
agent_image=$(field '["images"]["agent"]')
faults=$(field '["health_control"]')
k() { kubectl --kubeconfig "$KUBECONFIG" "$@"; }

echo "installing the chart..."
helm install neuron-monitor charts/neuron-monitor --namespace neuron-monitor --create-namespace \
  --values "$(field '["values"]')" --wait --timeout 180s --kubeconfig "$KUBECONFIG" >/dev/null
k create namespace team-a >/dev/null
k apply -f - >/dev/null <<YAML
apiVersion: neuronmonitor.io/v1alpha1
kind: NeuronMonitorConfig
metadata:
  name: serving
  namespace: team-a
spec:
  runtimes:
  - tagFilter: '^serve-'
    period: 1s
    metrics:
    - type: neuroncore_counters
    - type: execution_stats
---
apiVersion: v1
kind: Pod
metadata: { name: llama-train, namespace: team-a }
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: train
    image: $agent_image
    imagePullPolicy: Never
    command: [neuron-monitor-sim, app, --tag, llama-train, --util, "85"]
    resources: { limits: { aws.amazon.com/neuroncore: "8" } }
---
apiVersion: v1
kind: Pod
metadata: { name: serve-bert, namespace: team-a }
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: serve
    image: $agent_image
    imagePullPolicy: Never
    command: [neuron-monitor-sim, app, --tag, serve-bert, --util, "30", --rps, "250"]
    resources: { limits: { aws.amazon.com/neuroncore: "2" } }
YAML
k -n team-a wait --for condition=Ready pod/llama-train pod/serve-bert --timeout 120s >/dev/null

# A ServiceAccount allowed to read /metrics, as Prometheus's would be.
k -n team-a create serviceaccount demo-reader >/dev/null
k create clusterrolebinding demo-reader --clusterrole neuron-monitor-metrics-reader \
  --serviceaccount team-a:demo-reader >/dev/null
token=$(k -n team-a create token demo-reader --duration 24h)
k -n neuron-monitor get configmap neuron-monitor-metrics-ca -o jsonpath='{.data.ca\.crt}' >"$dir/metrics-ca.crt"
agent_ip=$(k -n neuron-monitor get pod -l app.kubernetes.io/component=node-agent -o jsonpath='{.items[0].status.podIP}')
echo "$token" >"$dir/token"
scrape="curl -s --cacert $dir/metrics-ca.crt --resolve neuron-monitor-node-agent.neuron-monitor.svc:9010:$agent_ip -H \"Authorization: Bearer \$(cat $dir/token)\" https://neuron-monitor-node-agent.neuron-monitor.svc:9010/metrics"

cat <<MSG

  The chart runs on a real node ($(field '["node"]'), kubelet + containerd), with two
  workload pods holding NeuronCores of the test device plugin. Try:

    export KUBECONFIG=$KUBECONFIG
    kubectl get pods -A -o wide
    kubectl get nmc -A
    kubectl describe node $(field '["node"]') | grep -A4 Allocated
    $scrape | grep '^neuroncore_utilization_ratio.*team-a'

  Break a Neuron device (an uncorrectable HBM error on device 0) and see it in the
  metrics, the Node condition and an Event naming the pod that holds it:
    echo hbm-ue:0 >> $faults
    kubectl get node $(field '["node"]') -o jsonpath='{.status.conditions[?(@.type=="NeuronHealth")]}'
    kubectl get events -A --field-selector reason=NeuronHasError_HBM_UNCORRECTABLE_ERROR

  Pod logs are under $(field '["logs"]')/../pod-logs (kubectl logs does not reach this
  kubelet). Ctrl-C stops the node and restores the machine.

MSG
# A wait, unlike a foreground sleep, is interrupted by the INT and TERM traps.
while :; do sleep 3600 & wait $!; done
