#!/usr/bin/env bash
# Runs the node agent locally on the built-in neuron-monitor simulator: a simulated
# trn1.32xlarge with three applications, one of them idle, and an uncorrected ECC event
# now and then. No Neuron hardware, cluster or AWS account needed. Ctrl-C stops it all.
#
#   tests/demo.sh            agent on 127.0.0.1:9010
#   PORT=9100 tests/demo.sh  another port
set -euo pipefail
cd "$(dirname "$0")/.."
port=${PORT:-9010}
cargo build --quiet -p neuron-node-agent --bins
bin=${CARGO_TARGET_DIR:-target}/debug
state=$(mktemp -d)
cleanup() {
  kill "$agent" 2>/dev/null || true
  wait "$agent" 2>/dev/null || true
  rm -rf "$state"
}
trap cleanup EXIT
trap 'exit 0' INT TERM

export NEURON_SIM_INSTANCE_TYPE=trn1.32xlarge
export NEURON_SIM_APPS='tag=llama-train,cores=0-15,util=85,rps=40,errors=1;tag=bert-serve,cores=16-17,util=30,rps=250;tag=warm-spare,cores=18,util=0'
export NEURON_SIM_ECC_EVERY=30
"$bin/neuron-node-agent" --monitor-command "$bin/neuron-monitor-sim" --listen "127.0.0.1:$port" \
  --period 2s --state-dir "$state" &
agent=$!

for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
cat <<MSG

  neuron-node-agent is running on a simulated trn1.32xlarge (3 applications, 32 NeuronCores).

    metrics:    curl -s http://127.0.0.1:$port/metrics
    per core:   curl -s http://127.0.0.1:$port/metrics | grep '^neuroncore_utilization_ratio'
    health:     curl -s http://127.0.0.1:$port/healthz   readiness: /readyz

  Ctrl-C stops the agent and the simulator.

MSG
curl -sf "http://127.0.0.1:$port/metrics" | grep -E '^(neuroncore_utilization_ratio|neuron_agent_reports_total)' | head -5 || true
wait "$agent"
