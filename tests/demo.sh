#!/usr/bin/env bash
# The whole product, locally, with no AWS account, cluster or Neuron hardware:
#   - a real control plane (etcd + kube-apiserver + GC, from tests/controlplane),
#   - the NeuronMonitorConfig CRD, the operator,
#   - two fake Neuron nodes (Node objects: a trn1.32xlarge and an inf2.xlarge), each with
#     its own node agent running the neuron-monitor simulator,
#   - a cluster-wide config and a team config in namespace team-a,
#   - Prometheus scraping both agents (when the `prometheus` binary is installed).
# It prints where to look. Ctrl-C stops everything and leaves nothing running.
#
#   tests/demo.sh                  (ports: agents 9010/9011, operator 8080, Prometheus 9090)
#   PORT_BASE=19000 tests/demo.sh  (agents 19010/19011, operator 19080, Prometheus 19090)
#   DEMO_REAL_NODE=1 tests/demo.sh (as root: the same product on a real node, see below)
#
# With DEMO_REAL_NODE=1 the product runs as deployed instead: tests/realnode.sh starts a
# real one-node cluster (kubelet, containerd, the test device plugin), the chart is
# installed with helm, and two workload pods run simulated Neuron applications on the
# NeuronCores the kubelet gave them. Ctrl-C uninstalls and stops the node, leaving the
# machine as it was.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${PORT_BASE:-}
if [ -n "$base" ]; then
  agent_ports=($((base + 10)) $((base + 11))); operator_port=$((base + 80)); prom_port=$((base + 90))
else
  agent_ports=(9010 9011); operator_port=8080; prom_port=9090
fi

tests/tools/install.sh
. tests/tools/env.sh
echo "building the workspace binaries..."
cargo build --quiet --workspace --bins
bin=${CARGO_TARGET_DIR:-target}/debug
if [ -n "${DEMO_REAL_NODE:-}" ]; then
  exec tests/demo-real-node.sh
fi
run=$(mktemp -d -t neuron-demo.XXXXXX)
pids=()
cleanup() {
  trap - EXIT INT TERM
  echo
  echo "stopping..."
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$run"
}
trap cleanup EXIT
trap 'exit 0' INT TERM

# Control plane: it prints one JSON line once ready.
mkfifo "$run/ready"
controlplane --state-dir "$run/controlplane" --kubeconfig-out "$run/kubeconfig" >"$run/ready" &
pids+=($!)
read -r ready <"$run/ready"
export KUBECONFIG=$run/kubeconfig
k() { kubectl --kubeconfig "$KUBECONFIG" "$@"; }
echo "control plane ready: $(echo "$ready" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["server"], "in", d["ready_seconds"], "s")')"

k apply -f crds/ >/dev/null
k wait --for condition=Established crd/neuronmonitorconfigs.neuronmonitor.io >/dev/null
k create namespace neuron-monitor >/dev/null
k create namespace team-a >/dev/null
nodes=(sim-trn1-32xl sim-inf2-xl)
types=(trn1.32xlarge inf2.xlarge)
for i in 0 1; do
  k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata:
  name: ${nodes[$i]}
  labels:
    node.kubernetes.io/instance-type: ${types[$i]}
    eks.amazonaws.com/nodegroup: demo
YAML
done

RUST_LOG= "$bin/neuron-operator" --namespace neuron-monitor --listen "127.0.0.1:$operator_port" \
  --log warn 2>"$run/operator.log" &
pids+=($!)

apps=(
  'tag=llama-train,cores=0-15,util=85,rps=40,errors=1;tag=serve-bert,cores=16-17,util=30,rps=250;tag=warm-spare,cores=18,util=0'
  'tag=serve-llama,cores=0-1,util=60,rps=120'
)
# Each simulated node has a fake Neuron driver (sysfs tree, kernel log); a line appended
# to its faults file injects a hardware fault (see neuron-monitor-sim --help).
for i in 0 1; do
  touch "$run/kmsg-$i" "$run/faults-$i"
  NEURON_SIM_INSTANCE_TYPE=${types[$i]} NEURON_SIM_APPS=${apps[$i]} NEURON_SIM_ECC_EVERY=30 \
    NEURON_SIM_SYSFS_ROOT=$run/sysfs-$i NEURON_SIM_KMSG=$run/kmsg-$i NEURON_SIM_HEALTH_CONTROL=$run/faults-$i \
    "$bin/neuron-node-agent" --node-name "${nodes[$i]}" --config-namespace neuron-monitor \
    --monitor-command "$bin/neuron-monitor-sim" --listen "127.0.0.1:${agent_ports[$i]}" \
    --sysfs-root "$run/sysfs-$i" --kmsg-path "$run/kmsg-$i" \
    --state-dir "$run/agent-$i" --cluster-name demo --log warn 2>"$run/agent-$i.log" &
  pids+=($!)
done

k apply -f - >/dev/null <<'YAML'
apiVersion: neuronmonitor.io/v1alpha1
kind: NeuronMonitorConfig
metadata:
  name: cluster
  namespace: neuron-monitor
spec:
  period: 2s
---
apiVersion: neuronmonitor.io/v1alpha1
kind: NeuronMonitorConfig
metadata:
  name: serving
  namespace: team-a
spec:
  nodeSelector:
    matchLabels:
      node.kubernetes.io/instance-type: trn1.32xlarge
  runtimes:
  - tagFilter: '^serve-'
    period: 1s
    metrics:
    - type: neuroncore_counters
    - type: execution_stats
YAML

prometheus_line="  Prometheus:  not installed (tests/tools/install.sh installs it)"
if command -v prometheus >/dev/null; then
  cat >"$run/prometheus.yml" <<YAML
global: { scrape_interval: 2s }
scrape_configs:
  - job_name: neuron-node-agent
    static_configs: [{ targets: ['127.0.0.1:${agent_ports[0]}', '127.0.0.1:${agent_ports[1]}'] }]
  - job_name: neuron-operator
    static_configs: [{ targets: ['127.0.0.1:$operator_port'] }]
YAML
  prometheus --config.file="$run/prometheus.yml" --storage.tsdb.path="$run/prometheus" \
    --web.listen-address="127.0.0.1:$prom_port" --log.level=warn 2>"$run/prometheus.log" &
  pids+=($!)
  prometheus_line="  Prometheus:  http://127.0.0.1:$prom_port/graph?g0.expr=sum%20by%20(runtime_tag)%20(neuroncore_utilization_ratio)"
fi

# Wait until both agents run the configuration the operator rendered for them.
for _ in $(seq 150); do
  applied=$(k get nmc cluster -n neuron-monitor -o jsonpath='{.status.appliedNodes}' 2>/dev/null || true)
  [ "$applied" = 2 ] && break
  sleep 0.2
done

cat <<MSG

  The Neuron monitoring stack runs locally (2 simulated nodes). Try:

    export KUBECONFIG=$KUBECONFIG
    kubectl get nmc -A
    kubectl get configmaps -n neuron-monitor
    kubectl get --raw /readyz
    curl -s http://127.0.0.1:${agent_ports[0]}/metrics | grep '^neuroncore_utilization_ratio'
    curl -s http://127.0.0.1:${agent_ports[1]}/metrics | grep '^neuron_agent_config'
    curl -s http://127.0.0.1:$operator_port/metrics

  Agents:      http://127.0.0.1:${agent_ports[0]}/metrics  http://127.0.0.1:${agent_ports[1]}/metrics
  Operator:    http://127.0.0.1:$operator_port/metrics
$prometheus_line
  Logs:        $run/*.log

  Edit a config and watch the agents reload within a second:
    kubectl patch nmc cluster -n neuron-monitor --type merge -p '{"spec":{"period":"3s"}}'

  Break a Neuron device (an uncorrectable HBM error on device 3 of ${nodes[0]}) and see it
  in the metrics, the Node condition and an Event:
    echo hbm-ue:3 >> $run/faults-0
    curl -s http://127.0.0.1:${agent_ports[0]}/metrics | grep '^neuron_device_health_state.*unhealthy'
    kubectl get node ${nodes[0]} -o jsonpath='{.status.conditions[?(@.type=="NeuronHealth")]}'
    kubectl get events --field-selector involvedObject.name=${nodes[0]}

  Ctrl-C stops everything.

MSG
k get nmc -A
wait "${pids[0]}"
