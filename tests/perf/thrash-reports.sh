#!/usr/bin/env bash
# thrash-reports.sh AGENT [BASELINE_AGENT]: reports an agent applies while a config file
# is edited in a loop (12.5 edits a second for 30 s, each changing what neuron-monitor
# collects, as one tenant's config rewritten without end), against the same agent left
# alone, and, given one, a baseline binary measured the same way in the same run.
# Standalone agent (--config) on the workspace's simulator (cargo build --workspace
# --bins), a report a second. Loopback only; each agent runs ~40 s and is stopped.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
sim=$target/debug/neuron-monitor-sim
[[ -x $sim ]] || { echo "thrash-reports.sh: no simulator at $sim (cargo build --workspace --bins)" >&2; exit 1; }

doc() { # doc N: a config whose runtime filter (part of neuron-monitor's config) is new.
    printf 'apiVersion: neuronmonitor.io/v1alpha1\nkind: NeuronMonitorConfig\nmetadata: { name: team, namespace: ops }\nspec:\n  period: 1s\n  runtimes:\n  - tagFilter: "^app-|^edit-%s$"\n    metrics: [{type: neuroncore_counters}]\n' "$1"
}

metric() { # metric URL NAME: the sum of a metric's samples.
    curl -sf "$1/metrics" | awk -v n="$2" '$1 == n || index($1, n "{") == 1 { s += $2 } END { print s + 0 }'
}

# run AGENT EDIT(0|1): prints "<reports in 30 s> <neuron-monitor restarts>".
run() {
    local agent=$1 edit=$2 dir port pid url
    dir=$(mktemp -d)
    port=$((20000 + RANDOM % 20000))
    url=http://127.0.0.1:$port
    doc 0 >"$dir/config.yaml"
    "$agent" --monitor-command "$sim" --monitor-arg=--instance-type=trn1.2xlarge \
        --monitor-arg=--app=tag=app-0,cores=0,util=40 --monitor-arg=--app=tag=app-1,cores=1,util=60 \
        --config "$dir/config.yaml" --listen "127.0.0.1:$port" --state-dir "$dir/state" \
        --kmsg-path /dev/null --sysfs-root "$dir/no-sysfs" >"$dir/agent.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do curl -sf "$url/readyz" >/dev/null && break; sleep 0.2; done
    sleep 3
    local r0 r1 x0 x1
    r0=$(metric "$url" neuron_agent_reports_total)
    x0=$(metric "$url" neuron_agent_monitor_restarts_total)
    for i in $(seq 375); do
        if [[ $edit == 1 ]]; then doc "$i" >"$dir/next.yaml" && mv "$dir/next.yaml" "$dir/config.yaml"; fi
        sleep 0.08
    done
    r1=$(metric "$url" neuron_agent_reports_total)
    x1=$(metric "$url" neuron_agent_monitor_restarts_total)
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    rm -rf "$dir"
    echo "$((r1 - r0)) $((x1 - x0))"
}

for binary in "$@"; do
    read -r quiet _ < <(run "$binary" 0)
    read -r reports restarts < <(run "$binary" 1)
    echo "$binary: reports in 30 s left alone $quiet, edited in a loop $reports ($restarts restarts of neuron-monitor)"
done
