#!/usr/bin/env bash
# GPU health against a real NVIDIA driver (where a GPU is lent): the GPUs healthy, an Xid
# record with the first GPU's real PCI address making it unhealthy (XID_79) while a forged
# one (user facility) is refused, whether NVML's event set was registered, and how long
# the agent takes to stop (the event thread waits at most 500 ms at a time).
# Usage: OUT=dir tests/gpu/health-real-driver-check.sh path/to/neuron-node-agent
set -u
agent=${1:?the agent binary}
out=${OUT:?OUT names the output folder}
nvidia-smi --query-gpu=index,pci.bus_id,uuid,driver_version --format=csv,noheader > "$out/smi.txt" 2>&1
cat "$out/smi.txt"
bus=$(head -1 "$out/smi.txt" | cut -d, -f2 | tr -d ' ')
# 00000000:53:00.0 as the kernel log writes it: 0000:53:00
kaddr=$(echo "$bus" | awk -F: '{printf "%s:%s:%s", substr($1,5), tolower($2), tolower(substr($3,1,2))}')
echo "kernel address: $kaddr"
get() {
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' "$2" >&3
  sed '1,/^\r$/d' <&3
  exec 3>&-
}
state=$(mktemp -d)
: > "$state/kmsg"
"$agent" --state-dir "$state/agent" --kmsg-path "$state/kmsg" --listen 127.0.0.1:19501 --period 1s --log info \
  ${NVML_LIBRARY:+--nvml-library "$NVML_LIBRARY"} > "$out/agent.log" 2>&1 &
pid=$!
for _ in $(seq 1 120); do get 19501 /metrics 2>/dev/null | grep -q 'state="healthy"} 1' && break; sleep 0.25; done
get 19501 /metrics > "$out/metrics-before.txt"
echo "12,99,1000000,-;NVRM: Xid (PCI:$kaddr): 79, pid=1, name=user, forged" >> "$state/kmsg"
echo "3,100,1000000,-;NVRM: Xid (PCI:$kaddr): 79, pid=1, name=check, GPU has fallen off the bus." >> "$state/kmsg"
sleep 2
get 19501 /metrics > "$out/metrics-after.txt"
cp "$state/agent/neuron-health.json" "$out/" 2>/dev/null
t0=$(date +%s%N)
kill -TERM "$pid"
wait "$pid"
rc=$?
echo "exit=$rc stop_ms=$(( ($(date +%s%N) - t0) / 1000000 ))" | tee "$out/stop.txt"
echo "--- before"; grep -E '^gpu_health_state' "$out/metrics-before.txt" | grep ' 1$'
echo "--- after"
grep -E '^(gpu_health_state|DCGM_FI_DEV_XID_ERRORS|gpu_xid_errors_total|neuron_agent_health_kmsg_refused_total)' \
  "$out/metrics-after.txt" | grep -v ' 0$'
echo "--- log"; grep -iE 'xid|event set|nvml' "$out/agent.log" | cut -c1-300 | head -20
