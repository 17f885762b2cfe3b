#!/usr/bin/env bash
# train-agent.sh AGENT SIMULATOR: the run deploy/build-agent.sh lays the agent out from.
# AGENT runs on SIMULATOR replaying the recorded reports, the 32-runtime trn1n.32xlarge
# once a second and the 1-runtime trn1.2xlarge with errors twenty times a second, with
# the simulator's driver tree and a scrape of each format a second, then stops on SIGTERM
# as on a node (a counting build writes its counts then). Fails, with the agent's log,
# when the agent ends badly, leaves a scrape a second unanswered or applied no report: a
# build laid out from such a run would serve start-up, not reports.
# Environment: TRAIN_SECONDS=20, how long each pace runs. Loopback only.
set -euo pipefail
agent=${1:?usage: train-agent.sh AGENT SIMULATOR}
sim=${2:?usage: train-agent.sh AGENT SIMULATOR}
seconds=${TRAIN_SECONDS:-20}
fixtures=$(cd "$(dirname "$0")/../tests/fixtures/neuron-monitor" && pwd)
work=$(mktemp -d)
agent_pid=
cleanup() {
    if [[ -n $agent_pid ]]; then kill "$agent_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

fail() { # fail WHY: the agent's log and WHY, then exit.
    cat "$work/agent.log" >&2
    echo "train-agent.sh: $1" >&2
    exit 1
}

# train INTERVAL FIXTURE: one run of the agent for $seconds.
train() {
    local port= scrapes=0 reports started format
    # The log emptied, not removed: the port is read from it, maybe before the agent's shell
    # has opened it, and must not be the previous run's.
    rm -rf "$work/tree" "$work/state"
    : >"$work/agent.log"
    # The 16-EFA-device trn1n tree under both reports: the EFA reader is trained too.
    "$agent" --monitor-command "$sim" \
        "--monitor-arg=--replay=$fixtures/$2" "--monitor-arg=--interval=$1" --monitor-arg=--instance-type=trn1n.32xlarge \
        "--monitor-arg=--sysfs-root=$work/tree" --sysfs-root "$work/tree" --kmsg-path /dev/null \
        --listen 127.0.0.1:0 --state-dir "$work/state" --period 1s --log-format json 2>"$work/agent.log" &
    agent_pid=$!
    # The port the system gave it, from its start-up line.
    for ((i = 0; i < 100; i++)); do
        port=$(sed -n 's/.*"listen":"127\.0\.0\.1:\([0-9]*\)".*/\1/p' "$work/agent.log" | head -n 1)
        if [[ -n $port ]]; then break; fi
        sleep 0.1
    done
    if [[ -z $port ]]; then fail "the agent logged no listening port within 10 s ($2)"; fi
    # The pace starts at the first report (the simulator writes the driver tree first,
    # which a loaded machine takes seconds for), or at the first restart of a monitor that
    # reports nothing.
    for ((i = 0; i < 600; i++)); do
        started=$(curl -sf "http://127.0.0.1:$port/metrics" |
            awk '$1 == "neuron_agent_reports_total" || $1 ~ /^neuron_agent_monitor_restarts_total/ { n += $2 } END { print n + 0 }' || true)
        if [[ ${started:-0} != 0 ]]; then break; fi
        sleep 0.1
    done
    for ((i = 0; i < seconds; i++)); do
        sleep 1
        for format in text/plain application/openmetrics-text; do
            curl -sf -o /dev/null -H "Accept: $format" "http://127.0.0.1:$port/metrics" && scrapes=$((scrapes + 1))
        done
        curl -sf -o /dev/null "http://127.0.0.1:$port/readyz" || true
    done
    reports=$(curl -sf "http://127.0.0.1:$port/metrics" | awk '$1 == "neuron_agent_reports_total" { print $2 }' || true)
    kill "$agent_pid"
    wait "$agent_pid" || fail "the agent ended badly on SIGTERM ($2)"
    agent_pid=
    if ((scrapes < seconds)); then fail "$scrapes scrapes of $((2 * seconds)) answered ($2)"; fi
    if [[ ${reports:-0} == 0 ]]; then fail "the agent applied no report of $2"; fi
}
train 1s trn1n.32xlarge-32runtimes.json
train 50ms trn1.2xlarge-1runtime-errors.json
