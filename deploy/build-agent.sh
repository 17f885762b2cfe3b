#!/usr/bin/env bash
# build-agent.sh OUT_DIR: the node agent as the images ship it, and the simulator, into
# OUT_DIR (node-agent/Dockerfile runs it; tests/perf/agent-bench.sh PROFILE=dist too).
#
# The agent is built twice. First with counters in every branch (`-Cprofile-generate`),
# run on the simulator (deploy/train-agent.sh: the recorded reports, the driver tree,
# scrapes); then again with what the counters saw (`-Cprofile-use`). The linker then
# lays the code that ran side by side, away from the code that did not: the pages of the
# binary a running agent keeps resident are most of its memory, and it keeps far fewer
# (docs/performance.md), and the report path is compiled for the branches it takes. Code
# the run did not reach (the Kubernetes client, the CloudWatch and OTLP sinks, NVML) is
# compiled as cold code, for size; it works as before, a little slower.
#
# Both builds are the dist profile with deploy/image-build.toml's settings. Needs
# llvm-profdata (`rustup component add llvm-tools`) and curl. Environment:
#   CARGO_TARGET_DIR   as for cargo (default: target); the simulator is built there,
#                      the counting agent in pgo-train/ and the shipped one in pgo/
#                      under it (other flags, other copies of every crate)
#   TRAIN_SECONDS=20   how long the training runs at each pace (train-agent.sh)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
# Absolute before the cd (as given, relative to where it was run), and in the flags.
out=$(realpath -m "${1:?usage: build-agent.sh OUT_DIR}")
target=$(realpath -m "${CARGO_TARGET_DIR:-$repo/target}")
export CARGO_TARGET_DIR=$target
cd "$repo"
train_target=$target/pgo-train
use_target=$target/pgo
profdata=$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin/llvm-profdata
if [[ ! -x $profdata ]]; then
    echo "build-agent.sh: no llvm-profdata in the toolchain; run: rustup component add llvm-tools" >&2
    exit 1
fi

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

deploy/train-agent.sh "$train_target/dist/neuron-node-agent" "$sim"

mkdir -p "$use_target"
"$profdata" merge -o "$profile" "$counts"
CARGO_TARGET_DIR=$use_target dist_build --config "$(rustflags "-Cprofile-use=$profile")" \
    -p neuron-node-agent --bin neuron-node-agent
mkdir -p "$out"
cp "$use_target/dist/neuron-node-agent" "$sim" "$out/"
