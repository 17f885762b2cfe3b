#!/usr/bin/env bash
# Memory of the real agent binary under load: the 32-runtime trn1n.32xlarge report
# (442 kB a line) replayed by the simulator at 1 ms intervals, i.e. as fast as the
# agent takes it. Reads the agent's VmRSS after 1,000 reports (warm) and after 10,000,
# and prints both and the growth ratio. Target: at most 15 MiB, no growth.
#
# Usage: node-agent/benches/agent_rss.sh [REPORTS]   (default 10000)
set -euo pipefail
cd "$(dirname "$0")/../.."
reports=${1:-10000}
fixtures=${NEURON_FIXTURES:-tests/fixtures/neuron-monitor}
cargo build --release --quiet -p neuron-node-agent -p neuron-monitor-sim --bins
target=${CARGO_TARGET_DIR:-target}/release
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
state=$(mktemp -d)
"$target/neuron-node-agent" --listen "127.0.0.1:$port" --state-dir "$state" \
  --monitor-command "$target/neuron-monitor-sim" \
  --monitor-arg="--replay=$fixtures/trn1n.32xlarge-32runtimes.json" --monitor-arg=--interval=1ms \
  --log warn 2>"$state/agent.log" &
agent=$!
trap 'kill $agent 2>/dev/null; wait $agent 2>/dev/null; rm -rf "$state"' EXIT

count() { curl -sf "http://127.0.0.1:$port/metrics" | awk '$1 == "neuron_agent_reports_total" {print int($2)}'; }
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$agent/status"; }
wait_for() {
  local want=$1 deadline=$((SECONDS + 300))
  while :; do
    local n; n=$(count || echo 0)
    [ "${n:-0}" -ge "$want" ] && return 0
    [ $SECONDS -lt $deadline ] || { echo "timed out at ${n:-0} of $want reports" >&2; exit 1; }
    sleep 0.2
  done
}

start=$SECONDS
wait_for 1000
warm=$(rss_kib)
wait_for "$reports"
final=$(rss_kib)
elapsed=$((SECONDS - start))
echo "reports: $(count) in ~${elapsed}s"
echo "rss after 1000 reports:  $((warm / 1024)) MiB ($warm KiB)"
echo "rss after $reports reports: $((final / 1024)) MiB ($final KiB)"
python3 -c "print(f'growth ratio (final/warm): {$final/$warm:.3f}')"
echo "rejected lines: $(curl -sf "http://127.0.0.1:$port/metrics" | awk '$1 ~ /^neuron_agent_lines_rejected_total/ {s += $2} END {print s + 0}')"
