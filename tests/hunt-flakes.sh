#!/usr/bin/env bash
# The flaky-test hunt: runs every integration test binary of the workspace RUNS times with
# the machine's cores kept busy beside it (one busy loop per core), then once more with no
# load but the tests' own parallelism, and lists every failure by binary and test name.
# A test that fails here fails some day in CI: fix it (a wait for the condition it
# asserts, or the product's race it found) and hunt again until the list is empty.
#
#   tests/hunt-flakes.sh [-n RUNS] [-l LOOPS] [-o DIR] [FILTER]
#     -n RUNS   runs of each binary under load (default 3)
#     -l LOOPS  busy loops beside them (default: the machine's cores)
#     -o DIR    where each run's output is kept (default target/flake-hunt)
#     FILTER    only the test binaries whose "<package>/<test>" name matches this
#               extended regular expression (e.g. 'node-agent/health')
#
# Needs the test tools and the built binaries, as tests/run.sh leaves them (it builds
# them again if needed). Exit status: 0 when nothing failed. Bounded: each binary run is
# stopped after TEST_TIMEOUT seconds (default 1200), counted as a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=3 loops=$(nproc) out=target/flake-hunt filter=.
while getopts "n:l:o:" opt; do
  case $opt in
  n) runs=$OPTARG ;;
  l) loops=$OPTARG ;;
  o) out=$OPTARG ;;
  *) sed -n '2,/^set -e/p' "$0" | sed '$d' >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] && filter=$1
timeout_s=${TEST_TIMEOUT:-1200}

tests/tools/install.sh
# shellcheck source=tools/env.sh
. tests/tools/env.sh
cargo build --workspace --bins --lib --locked --quiet

# "<package> <test>" of every integration test target (a `tests/*.rs` file).
mapfile -t targets < <(
  cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if t["kind"] == ["test"]:
            print(p["name"], t["name"])
' | sort | while read -r pkg test; do
    if [[ "$pkg/$test" =~ $filter ]]; then echo "$pkg $test"; fi
  done
)
[ ${#targets[@]} -gt 0 ] || { echo "no test binary matches '$filter'" >&2; exit 2; }
echo "hunt: ${#targets[@]} test binaries, $runs runs each under $loops busy loops, then one without"
cargo test --workspace --tests --locked --no-run --quiet 2>/dev/null || cargo test --workspace --tests --locked --no-run

mkdir -p "$out"
rm -f "$out"/*.log "$out/failures"
busy=()
stop_load() {
  [ ${#busy[@]} -gt 0 ] && kill "${busy[@]}" 2>/dev/null || true
  busy=()
}
trap stop_load EXIT INT TERM
start_load() {
  for _ in $(seq "$loops"); do
    (while :; do :; done) &
    busy+=($!)
  done
}

# One run of one binary; its failed tests appended to $out/failures as
# "<package>/<test> <run> <test name>".
run_one() {
  local pkg=$1 test=$2 run=$3 log=$out/$1.$2.$3.log status=0
  timeout --kill-after=10 "$timeout_s" cargo test -p "$pkg" --test "$test" --locked --quiet -- --color never \
    >"$log" 2>&1 || status=$?
  local failed
  failed=$(sed -n 's/^test \(.*\) \.\.\. FAILED$/\1/p' "$log")
  if [ -n "$failed" ]; then
    while read -r name; do echo "$pkg/$test $run $name" >>"$out/failures"; done <<<"$failed"
  elif [ "$status" -ne 0 ]; then
    # Timed out, crashed, or failed outside a test (a panic in a support thread).
    echo "$pkg/$test $run (the binary: exit $status, see $log)" >>"$out/failures"
  fi
  [ "$status" -eq 0 ]
}

declare -A passed
started=$SECONDS
for target in "${targets[@]}"; do
  read -r pkg test <<<"$target"
  passed[$pkg/$test]=0
  for run in $(seq "$runs"); do
    start_load
    if run_one "$pkg" "$test" "load$run"; then passed[$pkg/$test]=$((passed[$pkg/$test] + 1)); fi
    stop_load
  done
  unloaded=fail
  run_one "$pkg" "$test" unloaded && unloaded=pass
  printf '%-44s %d/%d under load, unloaded %s (%ds so far)\n' "$pkg/$test" "${passed[$pkg/$test]}" "$runs" \
    "$unloaded" $((SECONDS - started))
done

if [ -s "$out/failures" ]; then
  echo "hunt: failures (binary, run, test):"
  sort "$out/failures" | sed 's/^/  /'
  exit 1
fi
echo "hunt: no failure in $((SECONDS - started))s; logs in $out"
