#!/usr/bin/env bash
# run-tests.sh LOG: runs every test executable of `cargo test --workspace --all-targets`
# (the unit tests of libraries and binaries, the integration tests, the benchmarks once in
# test mode) two at a time (TEST_LANES), the longest first by the previous run's times
# (kept in the target dir). Many test binaries mostly wait (a kubelet starting pods, a
# control plane, time-outs under test): one after the other, the suite left a core idle
# for much of its run.
#
# Each executable runs as cargo runs it (in its package's directory, with its package's
# variables), built by cargo with the workspace's features (a `cargo test -p` per target
# would resolve them per package and build much again). Its output is printed whole when
# it ends, never interleaved, and appended to LOG. Every executable runs whatever failed
# before it; the exit status is 0 only when all passed.
set -euo pipefail
cd "$(dirname "$0")/.."
log=$1
lanes=${TEST_LANES:-2}
target_dir=${CARGO_TARGET_DIR:-target}
times=$target_dir/test-times.txt
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# "<package dir> <package> <source> <executable>" of every test executable (built now if
# it is not yet).
executables() {
  cargo test --workspace --all-targets --locked --no-run --message-format=json 2>/dev/null | python3 -c '
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["profile"]["test"] and m.get("executable"):
        pkg_dir = os.path.dirname(m["manifest_path"])
        source = os.path.relpath(m["target"]["src_path"], pkg_dir)
        kind = "unittests " if m["target"]["kind"][0] in ("lib", "bin", "cdylib", "rlib") else ""
        print(pkg_dir, m["package_id"].split("#")[-1].split("@")[0].split("/")[-1], kind + source, m["executable"], sep="\t")
'
}

# The executables, longest first by the previous run (unknown ones first: they may be long).
ordered() {
  executables | while IFS=$'\t' read -r dir pkg source exe; do
    secs=$(awk -F'\t' -v k="$pkg $source" '$2 == k { print $1; exit }' "$times" 2>/dev/null || true)
    printf '%s\t%s\t%s\t%s\t%s\n' "${secs:-100000}" "$dir" "$pkg" "$source" "$exe"
  done | sort -t$'\t' -k1,1rn | cut -f2-
}

# One executable: its output in a file, printed whole at its end; its time and status kept.
run_one() {
  local dir=$1 pkg=$2 source=$3 exe=$4 t=$SECONDS status=0 file
  file=$out/$(basename "$exe")
  {
    echo "     Running $source ($exe)"
    (cd "$dir" && CARGO_MANIFEST_DIR=$dir CARGO_PKG_NAME=$pkg CARGO=${CARGO:-$(command -v cargo)} "$exe") 2>&1 ||
      status=$?
  } >"$file.log"
  printf '%s\t%s\n' $((SECONDS - t)) "$pkg $source" >"$file.time"
  [[ $status == 0 ]] || echo "$pkg $source ($exe): exit $status" >"$file.failed"
  cat "$file.log"
}
export -f run_one
export out

ordered | tr '\t' '\n' | xargs -d '\n' -n 4 -P "$lanes" bash -c 'run_one "$@"' _ | tee -a "$log"

cat "$out"/*.time | sort -t$'\t' -k1,1rn >"$times.new" && mv "$times.new" "$times"
if compgen -G "$out/*.failed" >/dev/null; then
  sed 's/^/run-tests.sh: FAILED: /' "$out"/*.failed
  exit 1
fi
