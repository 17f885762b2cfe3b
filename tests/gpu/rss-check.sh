#!/usr/bin/env bash
# What the agent's memory is with the NVIDIA driver's NVML loaded, against the same agent
# without it, on one machine: VmRSS of each after a few collections, and the largest
# mappings of the first (smaps: which library holds what).
# Usage: OUT=dir tests/gpu/rss-check.sh path/to/neuron-node-agent
set -u
agent=${1:?the agent binary}
out=${OUT:?OUT names the output folder}
state=$(mktemp -d)
: > "$state/kmsg"
start() { # name, extra flags...
  local name=$1
  shift
  "$agent" --state-dir "$state/$name" --kmsg-path "$state/kmsg" --period 1s --log warn "$@" > "$out/rss-$name.log" 2>&1 &
  echo $!
}
with=$(start with-nvml --listen 127.0.0.1:19701)
# Without a driver library the agent supervises neuron-monitor: /bin/cat exits at once
# and is restarted with backoff, which is all the baseline needs.
without=$(start without-nvml --listen 127.0.0.1:19702 --nvml-library /nonexistent/libnvidia-ml.so.1 --monitor-command /bin/cat)
sleep 10
{
  for pair in "with-nvml $with" "without-nvml $without"; do
    set -- $pair
    echo "$1: $(grep -E '^(VmRSS|Threads)' "/proc/$2/status" | tr -s ' \t' ' ' | tr '\n' ' ')"
  done
  echo "largest mappings (kB Rss) of the agent with NVML:"
  awk '/^[0-9a-f]+-[0-9a-f]+ /{name=($6 == "" ? "[anon]" : $6)} /^Rss:/{rss[name]+=$2} END{for (n in rss) if (rss[n] >= 256) print rss[n], n}' \
    "/proc/$with/smaps" | sort -rn | head -12
} | tee "$out/rss.txt"
kill -TERM "$with" "$without"
wait
