#!/usr/bin/env bash
# The agent's memory and scrape cost on the worst reports of issue 10, after its limits:
#   hardware  neuron_device_count = neuroncore_per_device_count = 65535 (item 2)
#   region    a 2 MB instance_region on the 32-runtime fixture (item 3)
#   runtimes  80,000 runtime entries in one report (item 5)
#   cores     1,024 runtimes each claiming 190 busy cores: 7.8 MB, under the default
#             8 MiB line limit (194,560 per-core values; 4,096 kept)
#   labels    60 configurations × 16 extra labels matching all 32 runtimes (item 10)
# Each case runs the release agent on a fake neuron-monitor that prints the report every
# 500 ms; after 5 reports it prints the agent's VmRSS, one scrape's time and size, and
# /healthz's time. Baseline: the plain fixture, measured the same way.
#
# Usage: node-agent/benches/hostile_inputs.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
fixtures=${NEURON_FIXTURES:-tests/fixtures/neuron-monitor}
cargo build --release --quiet -p neuron-node-agent --bins
agent_bin=${CARGO_TARGET_DIR:-target}/release/neuron-node-agent
work=$(mktemp -d)
agent=
cleanup() { [ -n "$agent" ] && kill "$agent" 2>/dev/null && wait "$agent" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

python3 - "$fixtures/trn1n.32xlarge-32runtimes.json" "$work" <<'EOF'
import json, sys
fixture, work = sys.argv[1], sys.argv[2]
base = json.load(open(fixture))
def write(name, doc):
    with open(f"{work}/{name}.ndjson", "w") as f:
        f.write(json.dumps(doc, separators=(",", ":")) + "\n")
write("baseline", base)
doc = json.loads(json.dumps(base))
doc["neuron_hardware_info"].update(neuron_device_count=65535, neuroncore_per_device_count=65535)
write("hardware", doc)
doc = json.loads(json.dumps(base))
doc["instance_info"]["instance_region"] = "r" * (2 << 20)
write("region", doc)
doc = json.loads(json.dumps(base))
doc["neuron_runtime_data"] = [
    {"pid": i, "neuron_runtime_tag": f"rt-{i}", "error": "", "report": {"neuroncore_counters": {
        "error": "", "neuroncores_in_use": {str(i % 32): {"neuroncore_utilization": 12.5}}}}}
    for i in range(1, 80001)]
write("runtimes", doc)
doc = json.loads(json.dumps(base))
doc["neuron_hardware_info"].update(neuron_device_count=32, neuroncore_per_device_count=16)
doc["neuron_runtime_data"] = [
    {"pid": 10000 + i, "neuron_runtime_tag": f"t{i:04}-" + "x" * 249, "error": "", "report": {"neuroncore_counters": {
        "period": 1.0, "error": "", "neuroncores_in_use": {
            str((i * 7 + c) % 512): {"neuroncore_utilization": 12.5} for c in range(190)}}}}
    for i in range(1024)]
write("cores", doc)
write("labels", base)
routes = [{"config": f"team/config-{c:02}", "runtimes": [{"groups": ["neuroncore_counters", "memory_used",
           "neuron_runtime_vcpu_usage", "execution_stats"]}],
           "prometheus": {"extraLabels": {f"c{c:02}_label_{l:02}": f"value-{c}-{l}" for l in range(16)}}}
          for c in range(60)]
json.dump({"monitor": {"period": "1s"}, "routes": routes}, open(f"{work}/labels-config.json", "w"))
EOF

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

printf '%-9s %9s %10s %12s %12s %10s\n' case "line kB" "RSS MiB" "scrape ms" "scrape kB" "healthz ms"
for case in baseline hardware region runtimes cores labels; do
  line="$work/$case.ndjson"
  cat >"$work/monitor-$case" <<EOF
#!/bin/sh
while :; do cat '$line'; sleep 0.5; done
EOF
  chmod +x "$work/monitor-$case"
  extra=()
  [ "$case" = labels ] && extra=(--node-config-file "$work/labels-config.json")
  p=$(port)
  "$agent_bin" --listen "127.0.0.1:$p" --state-dir "$work/state-$case" --monitor-command "$work/monitor-$case" \
    --max-line-bytes 33554432 --log error "${extra[@]}" 2>"$work/$case.log" &
  agent=$!
  deadline=$((SECONDS + 120))
  until [ "$(curl -sf "http://127.0.0.1:$p/metrics" | awk '$1 == "neuron_agent_reports_total" {print int($2)}')" -ge 5 ] 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || { echo "$case: no 5 reports in 120 s" >&2; break; }
    kill -0 "$agent" 2>/dev/null || { echo "$case: the agent died" >&2; break; }
    sleep 0.2
  done
  scrape=$(curl -sf -o "$work/$case.scrape" -w '%{time_total}' "http://127.0.0.1:$p/metrics" || echo 0)
  health=$(curl -sf -o /dev/null -w '%{time_total}' "http://127.0.0.1:$p/healthz" || echo 0)
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$agent/status" 2>/dev/null || echo 0)
  printf '%-9s %9d %10.1f %12.1f %12d %10.1f\n' "$case" $(($(stat -c %s "$line") / 1000)) \
    "$(echo "$rss / 1024" | bc -l)" "$(echo "$scrape * 1000" | bc -l)" $(($(stat -c %s "$work/$case.scrape" 2>/dev/null || echo 0) / 1000)) \
    "$(echo "$health * 1000" | bc -l)"
  kill "$agent" 2>/dev/null; wait "$agent" 2>/dev/null || true
  agent=
done
