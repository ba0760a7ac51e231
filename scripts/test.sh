#!/usr/bin/env bash
# The whole test suite: bash scripts/test.sh [more pytest arguments for every part]
#
# The parts run one after another, and each runs even when an earlier one failed, so one run shows every failure.
# All run in one random test order (pytest-randomly) whose seed is printed: TORCHSTAGE_TEST_SEED=N replays it
# (or `python3 -m pytest ... -p randomly --randomly-seed=N` for one test). A table of each part's exit code, time
# and pytest summary line ends the run; the exit code is non-zero when any part failed. Sourced (as .ci/run does,
# to add its docs build as one more part) it only defines `part`, `step`, `test_parts`, `adopt_rows` and `parts_summary`.
set -uo pipefail

PARTS_ROWS=()
PARTS_FAILED=0
TEST_SEED=
# The file .ci/run reads this run's rows from; kept from the commands the parts run (a test of this script run
# inside a part would otherwise add its stub rows to CI's table).
ROWS_FILE=${TORCHSTAGE_PARTS_ROWS:-}
unset TORCHSTAGE_PARTS_ROWS

# part NAME COMMAND...: run COMMAND (its output shown as it comes), record its exit code, time and last line.
part() {
    local name=$1 start=$SECONDS rc=0 log last
    shift
    log=$(mktemp)
    echo "==> $name: $*"
    "$@" 2>&1 | tee "$log" || rc=$?
    last=$(grep -v '^[[:space:]]*$' "$log" | tail -n 1 | sed -E 's/^=+ *//; s/ *=+$//' | cut -c1-110) || true
    rm -f "$log"
    record "$name" "$rc" "$start" "$last"
}

# step NAME COMMAND...: the same without reading the output (a command that may leave daemons holding it open).
step() {
    local name=$1 start=$SECONDS rc=0
    shift
    echo "==> $name: $*"
    "$@" || rc=$?
    record "$name" "$rc" "$start" ""
}

record() {
    local took=$(($SECONDS - $3)) row
    row=$(printf '%-16s %4s %5dm%02ds  %s' "$1" "$2" $((took / 60)) $((took % 60)) "$4")
    PARTS_ROWS+=("$row")
    [[ -z $ROWS_FILE ]] || printf '%s\t%s\n' "$2" "$row" >>"$ROWS_FILE"  # for .ci/run's table
    [[ $2 == 0 ]] || PARTS_FAILED=$((PARTS_FAILED + 1))
    return 0
}

# adopt_rows FILE: the rows another run of this script wrote (TORCHSTAGE_PARTS_ROWS=FILE) join this table.
adopt_rows() {
    local rc row
    while IFS=$'\t' read -r rc row; do
        PARTS_ROWS+=("$row")
        [[ $rc == 0 ]] || PARTS_FAILED=$((PARTS_FAILED + 1))
    done <"$1"
}

# The suite's parts under one seed: every test that times nothing on 3 workers (the SLURM tests one at a time: the
# local cluster has two nodes; on 2 cores two workers left the CPU idle 18 % of the time, waiting on their
# processes' starts and exits, and a third fills it: 1333 s became 1058 s); then those marked `waits` (timeouts
# of seconds; mostly idle) three at a time, each test on its own, never beside the CPU-bound first part; then
# those marked `alone` (they time what their processes do) one at a time.
test_parts() {
    TEST_SEED=${TORCHSTAGE_TEST_SEED:-$((RANDOM * 32768 + RANDOM))}
    local order=(-p randomly "--randomly-seed=$TEST_SEED")
    echo "==> test order seed $TEST_SEED"
    part parallel python3 -m pytest tests -q -n 3 --dist loadgroup "${order[@]}" -m "not alone and not waits" "$@"
    part waits python3 -m pytest tests -q -n 3 --dist loadgroup "${order[@]}" -m waits "$@"
    part alone python3 -m pytest tests -q "${order[@]}" -m alone "$@"
}

# The table of parts; returns 1 when any part failed.
parts_summary() {
    echo
    printf '%-16s %4s %9s  %s\n' part exit time summary
    printf '%s\n' "${PARTS_ROWS[@]}"
    [[ -z $TEST_SEED ]] || echo "test order seed $TEST_SEED: replay with TORCHSTAGE_TEST_SEED=$TEST_SEED bash scripts/test.sh"
    if [[ $PARTS_FAILED != 0 ]]; then
        echo "FAILED: $PARTS_FAILED part(s)"
        return 1
    fi
}

[[ ${BASH_SOURCE[0]} == "$0" ]] || return 0
cd "$(dirname "$0")/.."
# Each test process compiles torchstage and the tests once, not again in every process: a machine that sets
# PYTHONDONTWRITEBYTECODE (this project's CI images do) would have each pytest worker rewrite and compile every test
# module (2 s of CPU of its 7 s collection) and each fresh rank compile torchstage (0.1-0.2 s). __pycache__ is ignored.
unset PYTHONDONTWRITEBYTECODE
test_parts "$@"
parts_summary
