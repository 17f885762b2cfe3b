#!/usr/bin/env bash
# build-agent.sh OUT_DIR: the node agent as the images ship it, and the simulator, into
# OUT_DIR (node-agent/Dockerfile runs it; tests/perf/agent-bench.sh PROFILE=dist too).
#
# The agent is built twice. First with counters in every branch (`-Cprofile-generate`),
# run on the simulator replaying the recorded reports, one a second and twenty a second,
# with its driver tree and a scrape of each format a second; then again with
# what the counters saw (`-Cprofile-use`). The linker then lays the code that ran side by
# side, away from the code that did not: the pages of the binary a running agent keeps
# resident are most of its memory, and it keeps far fewer (docs/performance.md), and the
# report path is compiled for the branches it takes. Code the run did not reach (the
# Kubernetes client, the CloudWatch and OTLP sinks, NVML) is compiled as cold code, for
# size; it works as before, a little slower.
#
# Both builds are the dist profile with deploy/image-build.toml's settings. Needs
# llvm-profdata (`rustup component add llvm-tools`) and curl. Environment:
#   CARGO_TARGET_DIR   as for cargo (default: target); the simulator is built there,
#                      the counting agent in pgo-train/ and the shipped one in pgo/
#                      under it (other flags, other copies of every crate)
#   TRAIN_SECONDS=20   how long the simulator reports at each pace
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
# Absolute before the cd (as given, relative to where it was run), and in the flags.
out=$(realpath -m "${1:?usage: build-agent.sh OUT_DIR}")
target=$(realpath -m "${CARGO_TARGET_DIR:-$repo/target}")
export CARGO_TARGET_DIR=$target
cd "$repo"
train_target=$target/pgo-train
use_target=$target/pgo
seconds=${TRAIN_SECONDS:-20}
profdata=$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin/llvm-profdata
if [[ ! -x $profdata ]]; then
    echo "build-agent.sh: no llvm-profdata in the toolchain; run: rustup component add llvm-tools" >&2
    exit 1
fi
work=$(mktemp -d)
agent_pid=
cleanup() {
    if [[ -n $agent_pid ]]; then kill "$agent_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

# dist_build [CARGO ARGS...]: a dist build of the agent with the images' settings.
dist_build() {
    cargo build --config deploy/image-build.toml --profile dist --locked "$@"
}

# rustflags FLAG: a --config value adding FLAG to the image settings' (joined to them:
# RUSTFLAGS would replace them).
rustflags() {
    echo "target.'cfg(target_os = \"linux\")'.rustflags = [\"$1\"]"
}

dist_build -p neuron-monitor-sim --bin neuron-monitor-sim
sim=$target/dist/neuron-monitor-sim

# Under the target directories, so that the flags naming them, and so the builds, stay
# the same from one run to the next.
counts=$train_target/counts
profile=$use_target/agent.profdata
CARGO_TARGET_DIR=$train_target dist_build --config "$(rustflags "-Cprofile-generate=$counts")" \
    -p neuron-node-agent --bin neuron-node-agent
# Build scripts and macros ran with counters too: only the agent's run is kept.
rm -rf "$counts"

# train INTERVAL FIXTURE: the counting agent on the simulator for $seconds.
train() {
    local dir=$work/run port= scrapes=0 format
    mkdir -p "$dir/tree"
    "$train_target/dist/neuron-node-agent" --monitor-command "$sim" \
        "--monitor-arg=--replay=$2" "--monitor-arg=--interval=$1" --monitor-arg=--instance-type=trn1n.32xlarge \
        "--monitor-arg=--sysfs-root=$dir/tree" --sysfs-root "$dir/tree" --kmsg-path /dev/null \
        --listen 127.0.0.1:0 --state-dir "$dir/state" --period 1s --log-format json 2>"$dir/agent.log" &
    agent_pid=$!
    # The port the system gave it, from its start-up line.
    for ((i = 0; i < 100; i++)); do
        port=$(sed -n 's/.*"listen":"127\.0\.0\.1:\([0-9]*\)".*/\1/p' "$dir/agent.log" | head -n 1)
        if [[ -n $port ]]; then break; fi
        sleep 0.1
    done
    for ((i = 0; i < seconds; i++)); do
        sleep 1
        for format in text/plain application/openmetrics-text; do
            curl -sf -o /dev/null -H "Accept: $format" "http://127.0.0.1:$port/metrics" && scrapes=$((scrapes + 1))
        done
        curl -sf -o /dev/null "http://127.0.0.1:$port/readyz" || true
    done
    # SIGTERM: the agent stops as on a node, and its counts are written at its exit.
    kill "$agent_pid"
    wait "$agent_pid" || { cat "$dir/agent.log" >&2; echo "build-agent.sh: the counting agent failed" >&2; exit 1; }
    agent_pid=
    if ((scrapes < seconds)); then
        cat "$dir/agent.log" >&2
        echo "build-agent.sh: $scrapes scrapes of $((2 * seconds)) answered in the training run" >&2
        exit 1
    fi
    rm -rf "$dir"
}
train 1s tests/fixtures/neuron-monitor/trn1n.32xlarge-32runtimes.json
train 50ms tests/fixtures/neuron-monitor/trn1.2xlarge-1runtime-errors.json

mkdir -p "$use_target"
"$profdata" merge -o "$profile" "$counts"
# A run that never applied a report would lay out the binary for its start-up only.
if ! "$profdata" show --counts --function=process_line "$profile" | grep -q 'Block counts: .*[1-9]'; then
    echo "build-agent.sh: the training run applied no report" >&2
    exit 1
fi
CARGO_TARGET_DIR=$use_target dist_build --config "$(rustflags "-Cprofile-use=$profile")" \
    -p neuron-node-agent --bin neuron-node-agent
mkdir -p "$out"
cp "$use_target/dist/neuron-node-agent" "$sim" "$out/"
