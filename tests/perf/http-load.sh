#!/usr/bin/env bash
# http-load.sh AGENT [BASELINE_AGENT]: the agent's HTTP limits under the attack report's
# loads, for an agent binary and, given one, a baseline binary measured the same way in
# the same run:
#   unread  256 clients (32 from each of 127.0.0.2-9) ask for /metrics PIPELINED times
#           (default 2), pipelined, and never read, for HOLD seconds (default 15): the
#           agent's RSS before and at its peak, the peak of the kernel's send queues of
#           its connections, and how many scrapes of 127.0.0.1 meanwhile were answered 200;
#   flood   32 keep-alive HTTPS scrapers on the token-free port: main-port scrape latency
#           p50/p95 alone (1.1 s apart, so that each renders) and during the flood
#           (SAMPLES scrapes each, default 20), the flood's rate and the agent's CPU.
# The node: a simulated 32-application trn1.32xlarge (a ~400 kB page), a report a
# second. The simulator is the workspace's debug build (cargo build --workspace --bins);
# the agents are whatever binaries are given (the issue's figures were of debug builds).
# CASES picks the cases (default "unread flood"). Loopback only (127.0.0.1-9); each agent
# runs ~30 s per case and is stopped.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
sim=$target/debug/neuron-monitor-sim
[[ -x $sim ]] || { echo "http-load.sh: no simulator at $sim (cargo build --workspace --bins)" >&2; exit 1; }
HOLD=${HOLD:-15}
PIPELINED=${PIPELINED:-2}
SAMPLES=${SAMPLES:-20}
testdata=$repo/service/testdata
pid=
state=
cleanup() {
    [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    [[ -n $state ]] && rm -rf "$state"
    pid= state=
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# start AGENT [ARGS…]: starts it on the simulated node, waits for a first report; sets
# pid, state and port.
start() {
    local agent=$1 args=(--monitor-arg=--instance-type=trn1.32xlarge)
    shift
    for i in $(seq 0 31); do args+=("--monitor-arg=--app=tag=app-$i,cores=$i,util=$((10 + i)),rps=10"); done
    state=$(mktemp -d)
    port=$(free_port)
    "$agent" --monitor-command "$sim" --listen "127.0.0.1:$port" --state-dir "$state" --period 1s \
        --kmsg-path /dev/null --sysfs-root "$state/no-sysfs" --log warn "${args[@]}" "$@" >"$state/agent.log" 2>&1 &
    pid=$!
    for _ in $(seq 150); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && return 0; sleep 0.2; done
    echo "http-load.sh: $agent not ready" >&2
    exit 1
}

unread() {
    start "$1"
    python3 "$repo/tests/perf/http_load.py" unread "$pid" "$port" "$HOLD" "$PIPELINED"
    cleanup
}

flood() {
    local tokenless
    tokenless=$(free_port)
    start "$1" --tokenless-listen "127.0.0.1:$tokenless" \
        --tokenless-tls-cert-file "$testdata/a.crt" --tokenless-tls-key-file "$testdata/a.key"
    python3 "$repo/tests/perf/http_load.py" flood "$pid" "$port" "$tokenless" "$testdata/a.crt" "$SAMPLES"
    cleanup
}

for case in ${CASES:-unread flood}; do
    printf '%s, %s: ' "$case" "$1"
    "$case" "$1"
    if [[ $# -gt 1 ]]; then
        printf '%s, baseline %s: ' "$case" "$2"
        "$case" "$2"
    fi
done
