#!/usr/bin/env bash
# agent-bench.sh [BASELINE_REV]: the release agent on the 32-runtime trn1n.32xlarge fixture,
# one report a second (the simulator replaying it) and one /metrics scrape a second, for
# the working tree and for BASELINE_REV (default HEAD~1) side by side in the same run:
# both run at once, their scrapes alternating half a second apart, so that the machine's
# load falls on both alike. Prints for each: scrape latency p50/p99, CPU per report
# (agent, simulator, together: utime+stime over the window divided by the reports the
# agent counted; the simulator's fake-kernel threads, which write the driver's tree and
# log, apart, and "node": the total without them, since on a node the kernel writes no
# files), the agent's CPU per report by thread (on-CPU nanoseconds from
# /proc/PID/task/*/schedstat: the EFA reader's and the health sysfs reader's threads, the
# tokio threads with the report path, the scrapes and the processes reader, the rest),
# parse + update per report (the agent's own histogram, wall time), RSS at the end
# (anonymous and file-backed: the binary's pages) and its peak, threads, the /metrics
# page's bytes and samples; then new/baseline ratios.
#
# Environment:
#   DURATION=120        seconds measured (after WARMUP=10 s); 20 is enough for a CI run
#   PROFILE=release     the cargo profile both are built with; dist: the images' build
#                       (deploy/build-agent.sh: whole-program optimization, the images' link
#                       settings, profile-guided; ~20 minutes a build here), for the shipped
#                       figures; a baseline from before the dist profile existed needs BASE_BIN
#   NEW_BIN=DIR         a dir holding neuron-node-agent and neuron-monitor-sim: no build
#   BASE_BIN=DIR        the same for the baseline (BASELINE_REV is then only a label)
#   SYSFS=sim|none      sim (default): the simulator's driver tree and 16 EFA devices, so
#                       the health and EFA collectors have work; none: no tree
#   TREES=DIR           where the simulators write their trees (default: a directory in
#                       /dev/shm, in memory as sysfs is; else the work directory)
#   AGENT_ARGS="..."    extra flags for both agents (e.g. --config FILE)
#   SIM_ARGS="..."      extra flags for both simulators (e.g. --efa-devices=0)
#   INTERVAL=1s         time between reports (e.g. 1ms: as fast as the agent takes them)
#   MAX_THREADS=16      fail when the new agent ends with more threads (its bound: 14,
#                       16 with NVML; docs/performance.md); 0: no check
# The baseline is built from a `git worktree` in a temporary directory, with a target
# directory of its own under CARGO_TARGET_DIR (both removed afterwards). Loopback only;
# everything it starts is stopped on exit.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
fixture=$repo/tests/fixtures/neuron-monitor/trn1n.32xlarge-32runtimes.json
DURATION=${DURATION:-120}
WARMUP=${WARMUP:-10}
SYSFS=${SYSFS:-sim}
base_rev=${1:-HEAD~1}
work=$(mktemp -d)
# The simulator's driver trees: in memory where /dev/shm is, as sysfs is (on a disk file
# system each read of a counter the simulator rewrote also updates its access time).
trees=${TREES:-$work}
if [[ -z ${TREES:-} && -d /dev/shm && -w /dev/shm ]]; then trees=$(mktemp -d /dev/shm/agent-bench.XXXXXX); fi
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [[ -d $work/base-src ]]; then git -C "$repo" worktree remove --force "$work/base-src" || true; fi
    rm -rf "$work" "$target/agent-bench-base"
    if [[ $trees != "$work" && -z ${TREES:-} ]]; then rm -rf "$trees"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

PROFILE=${PROFILE:-release}
build() { # build SRC TARGET_DIR OUT_DIR: the agent and simulator of SRC into OUT_DIR.
    # dist is the images' build: profile-guided where SRC has the images' script.
    if [[ $PROFILE == dist && -x $1/deploy/build-agent.sh ]]; then
        (cd "$1" && CARGO_TARGET_DIR=$2 deploy/build-agent.sh "$3" >/dev/null)
        return
    fi
    local config=()
    # Before that script: the images' link settings, where SRC has them.
    if [[ $PROFILE == dist && -f $1/deploy/image-build.toml ]]; then config=(--config deploy/image-build.toml); fi
    (cd "$1" && CARGO_TARGET_DIR=$2 cargo build "${config[@]}" --profile "$PROFILE" --quiet -p neuron-node-agent -p neuron-monitor-sim --bins)
    mkdir -p "$3"
    cp "$2/$PROFILE/neuron-node-agent" "$2/$PROFILE/neuron-monitor-sim" "$3/"
}

new_bin=${NEW_BIN:-}
if [[ -z $new_bin ]]; then
    echo "building the working tree ($PROFILE)" >&2
    build "$repo" "$target" "$work/new-bin"
    new_bin=$work/new-bin
fi
base_bin=${BASE_BIN:-}
if [[ -z $base_bin ]]; then
    rev=$(git -C "$repo" rev-parse --verify "$base_rev^{commit}")
    echo "building $base_rev ($rev) ($PROFILE)" >&2
    git -C "$repo" worktree add --quiet --detach "$work/base-src" "$rev"
    build "$work/base-src" "$target/agent-bench-base" "$work/base-bin"
    base_bin=$work/base-bin
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# start NAME BIN: starts an agent (its simulator under it) in $work/NAME; records its port and PID.
start() {
    local name=$1 bin=$2 dir=$work/$1 port
    mkdir -p "$dir"
    port=$(free_port)
    local sysfs=(--sysfs-root "$dir/no-sysfs") monitor=()
    if [[ $SYSFS == sim ]]; then
        local tree=$trees/$1
        sysfs=(--sysfs-root "$tree")
        monitor=(--monitor-arg=--instance-type=trn1n.32xlarge "--monitor-arg=--sysfs-root=$tree")
    fi
    local arg
    for arg in ${SIM_ARGS:-}; do monitor+=("--monitor-arg=$arg"); done
    # shellcheck disable=SC2086 # AGENT_ARGS is a list of flags
    "$bin/neuron-node-agent" --monitor-command "$bin/neuron-monitor-sim" \
        "--monitor-arg=--replay=$fixture" "--monitor-arg=--interval=${INTERVAL:-1s}" "${monitor[@]}" \
        --listen "127.0.0.1:$port" --state-dir "$dir/state" --period 1s --kmsg-path /dev/null "${sysfs[@]}" \
        --log warn ${AGENT_ARGS:-} >"$dir/agent.log" 2>&1 &
    pids+=($!)
    echo "$port" >"$dir/port"
    echo $! >"$dir/pid"
}

ready() { # ready NAME: waits for the agent's first report.
    local url=http://127.0.0.1:$(cat "$work/$1/port")
    for _ in $(seq 150); do
        [[ $(curl -sf "$url/metrics" | metric neuron_agent_reports_total) -gt 0 ]] && return 0
        sleep 0.2
    done
    echo "agent-bench.sh: $1 applied no report in 30 s; its log:" >&2
    cat "$work/$1/agent.log" >&2
    exit 1
}

metric() { # metric NAME (page on stdin): the sum of a metric's samples.
    awk -v n="$1" '$1 == n || index($1, n "{") == 1 { s += $2 } END { printf "%.9g\n", s + 0 }'
}

cpu_ticks() { # cpu_ticks PID: utime + stime, in clock ticks (fields 14 and 15).
    sed 's/.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'
}

simulator_pid() { # simulator_pid AGENT_PID: its neuron-monitor-sim child.
    local child
    for child in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
        [[ $(cat "/proc/$child/comm" 2>/dev/null) == neuron-monitor-* ]] && { echo "$child"; return 0; }
    done
    return 1
}

# snapshot NAME TAG: the counters the figures are differences of, into $work/NAME/TAG.
snapshot() {
    local dir=$work/$1 pid sim
    pid=$(cat "$dir/pid")
    sim=$(simulator_pid "$pid")
    curl -sf "http://127.0.0.1:$(cat "$dir/port")/metrics" >"$dir/$2.page"
    {
        echo "agent_cpu $(cpu_ticks "$pid")"
        echo "sim_cpu $(cpu_ticks "$sim")"
        echo "reports $(metric neuron_agent_reports_total <"$dir/$2.page")"
        echo "proc_sum $(metric neuron_agent_report_processing_seconds_sum <"$dir/$2.page")"
        echo "proc_count $(metric neuron_agent_report_processing_seconds_count <"$dir/$2.page")"
        echo "restarts $(metric neuron_agent_monitor_restarts_total <"$dir/$2.page")"
        awk '/^(VmRSS|VmHWM|RssAnon|RssFile|Threads):/ { print $1, $2 }' "/proc/$pid/status" | tr -d :
    } >"$dir/$2"
    thread_cpu "$pid" >"$dir/$2.threads"
    thread_cpu "$sim" >"$dir/$2.sim-threads"
}

thread_cpu() { # thread_cpu PID: "TID NAME NANOSECONDS" of each of its threads, on-CPU time.
    local task
    for task in /proc/"$1"/task/*; do
        printf '%s %s %s\n' "${task##*/}" "$(tr ' ' _ <"$task/comm")" "$(cut -d' ' -f1 "$task/schedstat")"
    done 2>/dev/null | sort
}

# thread_shares NAME REPORTS: ms of CPU per report by thread group, of the threads alive
# at the end (one that ended between the snapshots is not counted; the totals above
# count it): efa (efa-read), health (health-sysfs-*), tokio (the runtime's workers and
# blocking threads), other.
thread_shares() {
    join -a 2 "$work/$1/start.threads" "$work/$1/end.threads" | awk -v r="$2" '
        { ns = (NF == 5) ? $5 - $3 : $3; name = (NF == 5) ? $4 : $2
          group = name ~ /^efa-read/ ? "efa" : name ~ /^health-sysfs/ ? "health" : name ~ /^tokio-rt/ ? "tokio" : "other"
          ms[group] += ns / 1e6 }
        END { split("efa health tokio other", g, " ")
              for (i = 1; i <= 4; i++) printf "cpu_%s_ms_per_report %.3f\n", g[i], ms[g[i]] / r }'
}

# fake_kernel_ms NAME: ms of CPU of the simulator's threads that stand in for the kernel
# (fake-efa, fake-driver: writing the driver's tree and log), between the snapshots.
fake_kernel_ms() {
    join -a 2 "$work/$1/start.sim-threads" "$work/$1/end.sim-threads" | awk '
        { ns = (NF == 5) ? $5 - $3 : $3; name = (NF == 5) ? $4 : $2 }
        name ~ /^fake-/ { ms += ns / 1e6 }
        END { printf "%.3f\n", ms }'
}

scrape() { # scrape NAME: one scrape, its time appended to NAME/latency (ms).
    local dir=$work/$1
    curl -sf -o /dev/null -w '%{time_total}\n' "http://127.0.0.1:$(cat "$dir/port")/metrics" |
        awk '{ printf "%.3f\n", $1 * 1000 }' >>"$dir/latency"
}

# Both binaries run from copies written the same way, here, then dropped from the page
# cache, so that each starts as on a node, reading its binary from the disk: the
# file-backed RSS of one binary differs by a MiB or more between two files of it written
# differently, and between a file just written and one read (the page cache's folios,
# which the kernel maps whole around a touched page).
fresh_copy() { # fresh_copy DIR NAME: DIR's binaries copied to $work/NAME; prints that dir.
    mkdir -p "$work/$2"
    cp "$1/neuron-node-agent" "$1/neuron-monitor-sim" "$work/$2/"
    python3 -c 'import os, sys
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)' "$work/$2/neuron-node-agent" "$work/$2/neuron-monitor-sim"
    echo "$work/$2"
}
new_bin=$(fresh_copy "$new_bin" new-run)
base_bin=$(fresh_copy "$base_bin" base-run)
start new "$new_bin"
start base "$base_bin"
ready new
ready base
echo "warming up ${WARMUP}s, then measuring ${DURATION}s (new: $new_bin, baseline: $base_rev at $base_bin)" >&2
for _ in $(seq "$WARMUP"); do scrape new; sleep 0.5; scrape base; sleep 0.5; done
rm -f "$work/new/latency" "$work/base/latency"
snapshot new start
snapshot base start
for _ in $(seq "$DURATION"); do scrape new; sleep 0.5; scrape base; sleep 0.5; done
snapshot new end
snapshot base end

get() { awk -v k="$2" '$1 == k { print $2 }' "$1"; }
percentile() { sort -n "$1" | awk -v p="$2" '{ v[NR] = $1 } END { i = int(NR * p + 0.999999); if (i < 1) i = 1; print v[i] }'; }

# figures NAME: "key value" lines of NAME's figures.
figures() {
    local dir=$work/$1 hz reports
    hz=$(getconf CLK_TCK)
    reports=$(awk "BEGIN { print $(get "$dir/end" reports) - $(get "$dir/start" reports) }")
    local agent_ms sim_ms kernel_ms
    agent_ms=$(awk "BEGIN { print ($(get "$dir/end" agent_cpu) - $(get "$dir/start" agent_cpu)) * 1000 / $hz }")
    sim_ms=$(awk "BEGIN { print ($(get "$dir/end" sim_cpu) - $(get "$dir/start" sim_cpu)) * 1000 / $hz }")
    kernel_ms=$(fake_kernel_ms "$1")
    # total: agent and simulator; node: without the simulator's fake kernel, what a node
    # pays in user space for the agent and neuron-monitor (the real kernel writes no files).
    awk -v r="$reports" -v a="$agent_ms" -v s="$sim_ms" -v k="$kernel_ms" 'BEGIN {
        print "reports", r
        printf "cpu_agent_ms_per_report %.3f\n", a / r
        printf "cpu_sim_ms_per_report %.3f\n", s / r
        printf "cpu_sim_fake_kernel_ms_per_report %.3f\n", k / r
        printf "cpu_total_ms_per_report %.3f\n", (a + s) / r
        printf "cpu_node_ms_per_report %.3f\n", (a + s - k) / r }'
    thread_shares "$1" "$reports"
    awk "BEGIN { printf \"parse_update_ms %.3f\n\", ($(get "$dir/end" proc_sum) - $(get "$dir/start" proc_sum)) * 1000 / \
        ($(get "$dir/end" proc_count) - $(get "$dir/start" proc_count)) }"
    echo "scrape_p50_ms $(percentile "$dir/latency" 0.5)"
    echo "scrape_p99_ms $(percentile "$dir/latency" 0.99)"
    echo "rss_end_mib $(awk "BEGIN { printf \"%.1f\", $(get "$dir/end" VmRSS) / 1024 }")"
    echo "rss_max_mib $(awk "BEGIN { printf \"%.1f\", $(get "$dir/end" VmHWM) / 1024 }")"
    # The agent's own memory, and the pages of its binary (and libraries) mapped in.
    echo "rss_anon_mib $(awk "BEGIN { printf \"%.1f\", $(get "$dir/end" RssAnon) / 1024 }")"
    echo "rss_file_mib $(awk "BEGIN { printf \"%.1f\", $(get "$dir/end" RssFile) / 1024 }")"
    echo "threads $(get "$dir/end" Threads)"
    echo "page_bytes $(wc -c <"$dir/end.page")"
    echo "page_samples $(grep -cv '^#' "$dir/end.page")"
    echo "monitor_restarts $(awk "BEGIN { print $(get "$dir/end" restarts) - $(get "$dir/start" restarts) }")"
}

figures new >"$work/new.fig"
figures base >"$work/base.fig"
echo "agent-bench: ${DURATION}s, a report every ${INTERVAL:-1s}, 1 scrape/s each, SYSFS=$SYSFS, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-26s %12s %12s %9s\n' figure new baseline new/base
awk 'NR == FNR { b[$1] = $2; next } {
        ratio = (b[$1] + 0 != 0) ? sprintf("%.2f", $2 / b[$1]) : "-"
        printf "%-26s %12s %12s %9s\n", $1, $2, b[$1], ratio
    }' "$work/base.fig" "$work/new.fig"
threads=$(get "$work/new.fig" threads)
MAX_THREADS=${MAX_THREADS:-16}
if [[ $MAX_THREADS -gt 0 && $threads -gt $MAX_THREADS ]]; then
    echo "agent-bench.sh: the agent ended with $threads threads, more than MAX_THREADS=$MAX_THREADS" >&2
    exit 1
fi
