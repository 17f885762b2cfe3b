#!/usr/bin/env bash
# The per-process GPU series against a real NVIDIA driver (run where a GPU is lent): two
# compute processes hold 256 and 512 MiB (cuda-hold.c), the second running a kernel, and
# the agent's gpu_process_memory_used_bytes and gpu_process_sm_utilization_percent are
# compared with nvidia-smi's compute apps and its per-process monitor (pmon). The agent runs
# with attribution on (an unreachable ECS agent stands in for a cluster), so each
# process's cgroup file is read as on a node. Writes under $OUT.
# Usage: OUT=dir tests/gpu/process-check.sh path/to/neuron-node-agent path/to/cuda-hold
# (cuda-hold: `cc -O1 -o cuda-hold tests/gpu/cuda-hold.c -ldl`, no CUDA toolkit needed).
set -u
agent=${1:?the agent binary}
hold=${2:?the cuda-hold binary}
out=${OUT:?OUT names the output folder}

get() {
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' "$2" >&3
  sed '1,/^\r$/d' <&3
  exec 3>&-
}

"$hold" 256 60 > "$out/hold-256.txt" 2>&1 &
h1=$!
"$hold" 512 60 busy > "$out/hold-512.txt" 2>&1 &
h2=$!
sleep 4
for pid in $h1 $h2; do echo "$pid: $(cat /proc/$pid/cgroup 2>&1 | head -3)"; done > "$out/cgroups.txt"
nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits > "$out/apps.csv" 2>&1
state=$(mktemp -d)
: > "$state/kmsg"
"$agent" --state-dir "$state/agent" --kmsg-path "$state/kmsg" --listen 127.0.0.1:19411 --period 1s --log info \
  --ecs-agent-uri http://127.0.0.1:9 > "$out/agent.log" 2>&1 &
agent_pid=$!
for _ in $(seq 1 60); do get 19411 /readyz 2>/dev/null | grep -q ok && break; sleep 0.25; done
sleep 3
get 19411 /metrics > "$out/metrics.txt"
nvidia-smi pmon -c 1 -s u > "$out/pmon.txt" 2>&1
kill -TERM "$agent_pid" "$h1" "$h2"
wait "$agent_pid"
echo "agent exit=$?" >> "$out/agent.log"
echo "== nvidia-smi compute apps (pid, uuid, MiB)"; cat "$out/apps.csv"
echo "== nvidia-smi pmon (sm %)"; cat "$out/pmon.txt"
echo "== agent"; grep -E '^(gpu_process_memory_used_bytes|gpu_process_sm_utilization_percent|neuron_agent_cgroup_unknown_layouts)' "$out/metrics.txt"
echo "== holders"; cat "$out"/hold-*.txt; cat "$out/cgroups.txt"
