#!/usr/bin/env bash
# The project's test command: installs the test tools (cached by version), builds the
# binaries the end-to-end tests start, then runs every test of the workspace
# (benchmarks included, in test mode: each runs once). Format and clippy (warnings are
# errors) are checked first.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
tests/tools/install.sh
# shellcheck source=tools/env.sh
. tests/tools/env.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo build --workspace --bins --locked
# The fake NVIDIA driver library the GPU tests load (a cdylib: not a bin).
cargo build -p nvidia-ml-fake --locked
cargo test --workspace --locked --all-targets --no-fail-fast
echo "tests/run.sh: done in $((SECONDS - started))s"
