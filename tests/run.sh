#!/usr/bin/env bash
# The project's test command: installs the test tools (cached by version), then builds
# and runs every test of the workspace, benchmarks included in test mode.
set -euo pipefail
cd "$(dirname "$0")/.."
tests/tools/install.sh
# shellcheck source=tools/env.sh
. tests/tools/env.sh
cargo fmt --all -- --check
cargo test --workspace --locked --all-targets --no-fail-fast
