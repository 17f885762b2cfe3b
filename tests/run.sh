#!/usr/bin/env bash
# The project's test command: installs the test tools (cached by version), builds the
# binaries the end-to-end tests start, then runs every test of the workspace
# (benchmarks included, in test mode: each runs once). Format and clippy (warnings are
# errors) are checked first. At its end it prints the time of each phase and the ten
# slowest test binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
phases=()
# phase NAME COMMAND…: runs the command, its time recorded under NAME.
phase() {
  local name=$1 t=$SECONDS rc=0
  shift
  "$@" || rc=$?
  phases+=("$(printf '%-16s %5ds' "$name" $((SECONDS - t)))")
  return "$rc"
}

# The tools install beside the Rust build, whose serial stretches (a crate chain, a link)
# leave a core idle: cold, the two took ~37 min one after the other and ~23 min side by
# side. Its output is shown once it is done; an early exit still waits for it (never
# an apt or go install cut in the middle).
tools_log=$(mktemp)
tools_started=$SECONDS
tests/tools/install.sh >"$tools_log" 2>&1 &
tools_pid=$!
log=$(mktemp)
trap 'wait "$tools_pid" 2>/dev/null; rm -f "$tools_log" "$log"' EXIT
tools_done() {
  local rc=0
  wait "$tools_pid" || rc=$?
  cat "$tools_log"
  phases+=("$(printf '%-16s %5ds (beside the build)' tools $((SECONDS - tools_started)))")
  return "$rc"
}

phase fmt cargo fmt --all -- --check
phase clippy cargo clippy --workspace --all-targets --locked -- -D warnings
# The binaries the end-to-end tests start, and (--lib) the fake NVIDIA driver library the
# GPU tests load (a cdylib), all with the workspace's features.
phase build cargo build --workspace --bins --lib --locked
phase build-tests cargo test --workspace --locked --all-targets --no-run
phase tools-wait tools_done
# shellcheck source=tools/env.sh
. tests/tools/env.sh

# Every test target, two at a time, longest first (tests/run-tests.sh); each one's output
# is kept, to time it from its own summary line.
status=0
phase test tests/run-tests.sh "$log" || status=$?

echo
echo "tests/run.sh: time per phase"
printf '  %s\n' "${phases[@]}"
echo "tests/run.sh: the ten slowest test binaries"
# "Running <source> (<executable>)" is followed by its "test result: … finished in Ns".
awk '/^ +Running /{name=$0; sub(/^ +Running /, "", name); sub(/-[0-9a-f]+\)$/, ")", name)}
  /^test result: .* finished in /{sub(/s$/, "", $NF); printf "%8.1fs  %s\n", $NF, name}' "$log" |
  sort -rn | head -10 | sed 's/^/  /'
grep -E '^test result: ' "$log" | awk '{p+=$4; f+=$6} END {printf "tests/run.sh: %d passed, %d failed\n", p, f}'
echo "tests/run.sh: done in $((SECONDS - started))s"
exit "$status"
