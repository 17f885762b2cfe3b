#!/usr/bin/env bash
# scrape-faults.sh AGENT [BASELINE_AGENT]: page faults and size of /metrics on a simulated
# 32-runtime trn1.32xlarge node, per scrape, for an agent binary and, given one, a
# baseline binary measured in the same run, alternately (a ratio, not an absolute figure).
# The simulator is the workspace's (cargo build --workspace --bins). Loopback only; each
# agent runs ~10 s and is stopped.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
sim=$target/debug/neuron-monitor-sim
[[ -x $sim ]] || { echo "scrape-faults.sh: no simulator at $sim (cargo build --workspace --bins)" >&2; exit 1; }
SCRAPES=${SCRAPES:-200}

# faults AGENT: prints "<page bytes> <minor faults per scrape>".
faults() {
    local agent=$1 state port pid args=(--monitor-arg=--instance-type=trn1.32xlarge)
    for i in $(seq 0 31); do args+=("--monitor-arg=--app=tag=app-$i,cores=$i,util=$((10 + i)),rps=10"); done
    state=$(mktemp -d)
    port=$((20000 + RANDOM % 20000))
    "$agent" --monitor-command "$sim" --listen "127.0.0.1:$port" --state-dir "$state" --period 1s \
        --kmsg-path /dev/null --sysfs-root "$state/no-sysfs" "${args[@]}" >"$state/agent.log" 2>&1 &
    pid=$!
    local url=http://127.0.0.1:$port
    for _ in $(seq 100); do curl -sf "$url/readyz" >/dev/null && break; sleep 0.2; done
    # Warm: the page at its full size once, buffers grown.
    for _ in $(seq 20); do curl -sf "$url/metrics" >/dev/null; done
    local bytes f0 f1
    bytes=$(curl -sf "$url/metrics" | wc -c)
    f0=$(awk '{ print $10 }' "/proc/$pid/stat")
    for _ in $(seq "$SCRAPES"); do curl -sf "$url/metrics" >/dev/null; done
    f1=$(awk '{ print $10 }' "/proc/$pid/stat")
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    rm -rf "$state"
    echo "$bytes $(((f1 - f0) / SCRAPES))"
}

for round in 1 2; do
    read -r bytes per < <(faults "$1")
    line="round $round: page $bytes bytes, $per minor faults per scrape"
    if [[ $# -gt 1 ]]; then
        read -r base_bytes base_per < <(faults "$2")
        line+="; baseline: page $base_bytes bytes, $base_per per scrape"
    fi
    echo "$line"
done
