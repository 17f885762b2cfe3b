#!/usr/bin/env bash
# Fault-to-signal latency of the agent's hardware health: the real agent binary reads the
# fake driver tree and kernel log that the simulator writes (trn2.48xlarge, 16 devices),
# and this script injects N faults (default 20) of each of two kinds, timing each from
# its write to the first /metrics scrape (polled every 5 ms) that shows it:
# - kernel: a `NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=<d>` record appended to the
#   kernel-log file -> `neuron_hardware_errors_total{neuron_device_index=<d>}` + 1;
# - sysfs: `mem_ecc_repairable_uncorrected` of device <d> raised (file replaced
#   atomically) -> `neuron_device_ecc_errors_total{kind="repairable_uncorrected"}`.
#   A regular file never notifies (no POLLPRI), so this path is bounded by the re-read
#   interval (`--health-interval`, given here as INTERVAL, default 1s); the real driver
#   wakes the reader through `hw_error_event` at once.
# Prints p50, p95 and max per kind.
#
# Usage: node-agent/benches/health_latency.sh [N] [INTERVAL]
set -euo pipefail
cd "$(dirname "$0")/../.."
faults=${1:-20}
interval=${2:-1s}
cargo build --release --quiet -p neuron-node-agent -p neuron-monitor-sim --bins
target=${CARGO_TARGET_DIR:-target}/release
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
work=$(mktemp -d)
"$target/neuron-monitor-sim" --instance-type=trn2.48xlarge --sysfs-root "$work/sys" --kmsg "$work/kmsg" \
  >/dev/null 2>"$work/sim.log" &
sim=$!
while [ ! -e "$work/sys/module/neuron/version" ]; do sleep 0.05; done
"$target/neuron-node-agent" --listen "127.0.0.1:$port" --state-dir "$work/state" \
  --monitor-command "$target/neuron-monitor-sim" --monitor-arg=--instance-type=trn2.48xlarge \
  --sysfs-root "$work/sys" --kmsg-path "$work/kmsg" --health-interval "$interval" \
  --log warn 2>"$work/agent.log" &
agent=$!
trap 'kill $agent $sim 2>/dev/null; wait $agent $sim 2>/dev/null; rm -rf "$work"' EXIT

python3 - "$port" "$work" "$faults" "$interval" <<'EOF'
import os, re, sys, time, urllib.request

port, work, n, interval = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
url = f"http://127.0.0.1:{port}/metrics"

def scrape():
    try:
        return urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return ""

def value(text, name, labels):
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None

def wait(check, limit=30.0):
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if check(scrape()):
            return time.monotonic()
        time.sleep(0.005)
    raise SystemExit("timed out")

wait(lambda t: value(t, "neuron_device_health_state", {"neuron_device_index": "15", "state": "healthy"}) == 1.0)
uptime = lambda: float(open("/proc/uptime").read().split()[0])
seq = 1000

def kernel(i):
    global seq
    d = str(i % 16)
    before = value(scrape(), "neuron_hardware_errors_total", {"neuron_device_index": d}) or 0.0
    seq += 1
    line = f"3,{seq},{int(uptime() * 1e6)},-;NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id={d} nc-id=0\n"
    t0 = time.monotonic()
    with open(f"{work}/kmsg", "a") as f:
        f.write(line)
    return wait(lambda t: (value(t, "neuron_hardware_errors_total", {"neuron_device_index": d}) or 0) > before) - t0

def sysfs(i):
    d = str(i % 16)
    path = f"{work}/sys/devices/virtual/neuron_device/neuron{d}/stats/hardware/mem_ecc_repairable_uncorrected"
    new = int(open(path).read()) + 1
    labels = {"neuron_device_index": d, "kind": "repairable_uncorrected"}
    t0 = time.monotonic()
    with open(path + ".tmp", "w") as f:
        f.write(f"{new}\n")
    os.rename(path + ".tmp", path)
    return wait(lambda t: (value(t, "neuron_device_ecc_errors_total", labels) or 0) >= new) - t0

def report(kind, samples):
    s = sorted(samples)
    pick = lambda q: s[min(len(s) - 1, int(round(q * (len(s) - 1))))]
    print(f"{kind:7} n={len(s)} p50={pick(0.5) * 1000:.0f} ms p95={pick(0.95) * 1000:.0f} ms max={s[-1] * 1000:.0f} ms")

kernel_samples = []
for i in range(n):
    kernel_samples.append(kernel(i))
    time.sleep(0.05 + (i % 7) * 0.031)  # spread the writes over the follower's tick
sysfs_samples = []
for i in range(n):
    sysfs_samples.append(sysfs(i))
    time.sleep(0.05 + (i % 7) * 0.113)  # spread the writes over the re-read interval
print(f"agent: --health-interval {interval}; kernel log followed as a regular file (100 ms tick)")
report("kernel", kernel_samples)
report("sysfs", sysfs_samples)
EOF
