#!/usr/bin/env bash
# The GPU collector against a real NVIDIA driver (run where a GPU is lent: see
# docs/development.md). Writes under $OUT: nvidia-smi's own view (XML and CSV), the
# agent's /metrics page, and the agent's CPU and memory with collections every second
# and every minute, so that the cost of one collection is the difference of the two.
# Usage: OUT=dir tests/gpu/real-driver-check.sh path/to/neuron-node-agent [seconds]
# (NVML_LIBRARY=path: another NVML library, e.g. the fake one, for a dry run.)
set -u
agent=${1:?the agent binary}
seconds=${2:-40}
out=${OUT:?OUT names the output folder}

nvidia-smi -q -x > "$out/nvidia-smi.xml" 2>&1
fields=index,uuid,pci.bus_id,name,driver_version,utilization.gpu,utilization.memory,memory.total,memory.used,memory.free,temperature.gpu,power.draw,enforced.power.limit,clocks.sm,clocks.mem,clocks.gr,pcie.link.gen.current,pcie.link.width.current,ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total
# Newer drivers know two more fields; older ones refuse the whole query with them.
nvidia-smi --query-gpu="$fields,memory.reserved,temperature.memory" --format=csv > "$out/nvidia-smi.csv" 2>&1 ||
  nvidia-smi --query-gpu="$fields" --format=csv > "$out/nvidia-smi.csv" 2>&1
{ uname -a; nproc; ldd "$agent"; } > "$out/host.txt" 2>&1

# GET 127.0.0.1:PORT PATH, body only (bash alone: the lent machine may lack curl).
get() {
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' "$2" >&3
  sed '1,/^\r$/d' <&3
  exec 3>&-
}

# One run: the agent at a period, for `seconds`; prints its CPU ticks, RSS and threads.
run() {
  local name=$1 period=$2 port=$3 state
  state=$(mktemp -d)
  : > "$state/kmsg"
  "$agent" --state-dir "$state/agent" --kmsg-path "$state/kmsg" --listen "127.0.0.1:$port" --period "$period" --log info \
    ${NVML_LIBRARY:+--nvml-library "$NVML_LIBRARY"} \
    > "$out/agent-$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 60); do get "$port" /readyz 2>/dev/null | grep -q ok && break; sleep 0.25; done
  get "$port" /readyz > "$out/readyz-$name.txt"
  local ticks0 start
  ticks0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  start=$(date +%s%N)
  sleep "$seconds"
  local ticks1 end
  ticks1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  end=$(date +%s%N)
  get "$port" /metrics > "$out/metrics-$name.txt"
  {
    echo "name=$name period=$period"
    echo "cpu_ticks=$((ticks1 - ticks0)) clk_tck=$(getconf CLK_TCK) wall_ms=$(( (end - start) / 1000000 ))"
    grep -E '^(VmRSS|VmHWM|Threads)' "/proc/$pid/status"
    grep -E '^neuron_agent_gpu_(collections_total|collect_seconds|devices|read_failures_total)' "$out/metrics-$name.txt"
  } > "$out/cost-$name.txt"
  kill -TERM "$pid"
  wait "$pid"
  echo "exit=$?" >> "$out/cost-$name.txt"
}

run every-second 1s 19401
run every-minute 60s 19402
cat "$out"/cost-*.txt
grep -E '^DCGM_FI_DEV_(GPU_UTIL|FB_USED|GPU_TEMP|POWER_USAGE)' "$out/metrics-every-second.txt" | head -8
