#!/usr/bin/env bash
# The full test suite on a GPU machine, spread over its GPUs: pytest-xdist workers, worker k on
# GPU k mod G (CUTLASS_OPS_TEST_GPUS, read by tests/python/conftest.py), then ctest on the build
# tree when BUILD_DIR names one.  One process takes over 10 minutes on an H100; by default one
# worker per CPU core: most tests are small on the GPU and bound by their float64 CPU references.
#   bash tests/gpu_suite.sh                      # every test, a worker per core
#   WORKERS=8 BUILD_DIR=build bash tests/gpu_suite.sh tests/python/test_fuzz.py
#   SHARD=1/2 bash tests/gpu_suite.sh; SHARD=2/2 bash tests/gpu_suite.sh   # in two sittings
#   STRICT=1 bash tests/gpu_suite.sh             # strict mode: a fallback on CUDA fails the test
#                                                # (tests marked fallback excepted)
#   TIME_LIMIT=500 bash tests/gpu_suite.sh       # stop after 500 s (pytest interrupted: the tests it
#   SKIP_IDS=done1.txt TIME_LIMIT=500 bash ...   # did not reach are counted); $OUT/done_ids.txt lists
#                                                # every test with an outcome, SKIP_IDS leaves those out
#                                                # (conftest's --skip-ids): the next sitting runs the rest
#   RESUME=build-session/suite TIME_LIMIT=500 bash tests/gpu_suite.sh   # the same, kept in a folder:
#                                                # each sitting runs what earlier ones did not reach
# Scheduling: the tests marked long come first in the collection (conftest.py), and xdist hands
# them out two at a time (--maxschedchunk 2): its default first hands each worker a run of about
# tests/workers/4 consecutive tests, which put every long test on worker 0, one after another.
# A test that runs past TEST_TIMEOUT seconds (default 300; pytest-timeout, where installed) is
# stopped and counted as failed (its worker "crashed"), 30 s after every thread's stack went to
# $OUT/stacks (conftest.py's CUTLASS_OPS_TEST_STACKS; printed at the end): a hung kernel names
# itself instead of eating the sitting.  (32 workers on two H200s: 3,377 tests of a shard of 1/2 done in
# about 4 minutes; a 10-minute sitting takes a shard of 1/2.)
# Needs cutlass_ops installed for this GPU and pytest-xdist.  Fails loudly where the library has
# no CUDA kernels (every GPU test would skip), prints the counts and every distinct skip reason,
# and exits non-zero on a failure or on a GPU test skipped for want of a GPU.
# Writes $OUT/gpu_suite.log (default gpu_results/).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PYTHON=${PYTHON:-python3}
OUT=${OUT:-gpu_results}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
G=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
[ "$G" -ge 1 ] || { echo "gpu_suite: no GPU (nvidia-smi -L lists none)"; exit 1; }
WORKERS=${WORKERS:-$(nproc)}
export CUTLASS_OPS_TEST_GPUS=${CUTLASS_OPS_TEST_GPUS:-$(seq -s, 0 $((G - 1)))}
# CPU threads per worker: the machine's cores shared out (torch's default, every core in every
# worker, oversubscribes the cores many times over in the tests' CPU references)
THREADS=$(( $(nproc) / WORKERS )); [ "$THREADS" -ge 1 ] || THREADS=1
[ "${STRICT:-0}" = 1 ] && export CUTLASS_OPS_STRICT=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$THREADS} MKL_NUM_THREADS=${MKL_NUM_THREADS:-$THREADS}
(cd /tmp && "$PYTHON" -P -c '
import torch, cutlass_ops
assert torch.cuda.is_available(), "torch sees no GPU"
assert cutlass_ops.cuda_kernels_built(), "cutlass_ops was built without CUDA kernels: every GPU test would skip"
print("gpu_suite:", torch.cuda.get_device_name(), "x", torch.cuda.device_count(), "| torch", torch.__version__,
      "| build", cutlass_ops._library.build_info().get("archs"), "| strict mode:", cutlass_ops.paths.is_strict())') || exit 1
[ $# -gt 0 ] || set -- "$REPO/tests/python"
start=$(date +%s)
# -v: every test's outcome on its own line, so a run stopped by a time limit still names its failures
SHARD_ARGS=(); [ -n "${SHARD:-}" ] && SHARD_ARGS=(--shard "$SHARD")
if [ -n "${RESUME:-}" ]; then
  mkdir -p "$RESUME"; touch "$RESUME/done_ids.txt"; SKIP_IDS=$RESUME/done_ids.txt
  echo "gpu_suite: resuming: $(wc -l < "$RESUME/done_ids.txt") tests ran in earlier sittings ($RESUME)"
fi
[ -n "${SKIP_IDS:-}" ] && SHARD_ARGS+=(--skip-ids "$(cd "$(dirname "$SKIP_IDS")" && pwd)/$(basename "$SKIP_IDS")")
# TIME_LIMIT: SIGINT (pytest stops its workers and writes its summary), SIGKILL 30 s later
LIMIT_CMD=(); [ -n "${TIME_LIMIT:-}" ] && LIMIT_CMD=(timeout -s INT -k 30 "$TIME_LIMIT")
# (pytest-xdist 3.3 and later.)  The help is read whole before grep looks at it: under pipefail,
# `pytest --help | grep -q` fails whenever grep exits before pytest has written everything (pytest
# then dies of a broken pipe), and the option was silently left out.
SCHED_ARGS=()
pytest_help=$(cd /tmp && "$PYTHON" -P -m pytest -p no:cacheprovider --help 2>/dev/null)
grep -q -- --maxschedchunk <<< "$pytest_help" && SCHED_ARGS=(--maxschedchunk 2)
echo "gpu_suite: scheduling ${SCHED_ARGS[*]:-"xdist's default (this xdist has no --maxschedchunk: the long tests may share one worker)"}"
TIMEOUT_ARGS=()
if (cd /tmp && "$PYTHON" -P -c "import pytest_timeout" 2>/dev/null); then
  TIMEOUT_ARGS=(--timeout "${TEST_TIMEOUT:-300}" --timeout-method thread)
else
  echo "gpu_suite: pytest-timeout is not installed: a hung test holds its worker until the sitting ends"
fi
# each worker's test ids, and the stacks of a test past TEST_TIMEOUT - 30 s (conftest.py; a worker's
# stderr reaches no log under xdist)
export CUTLASS_OPS_TEST_STACKS="$OUT/stacks" CUTLASS_OPS_TEST_STACKS_AFTER=$(( ${TEST_TIMEOUT:-300} > 60 ? ${TEST_TIMEOUT:-300} - 30 : 30 ))
rm -rf "$CUTLASS_OPS_TEST_STACKS"; mkdir -p "$CUTLASS_OPS_TEST_STACKS"
(cd /tmp && "${LIMIT_CMD[@]}" "$PYTHON" -P -m pytest -p no:cacheprovider -p no:benchmark -v -rfEs --durations 0 -n "$WORKERS" --dist load \
  "${SCHED_ARGS[@]}" "${TIMEOUT_ARGS[@]}" "${SHARD_ARGS[@]}" "$@") \
  > "$OUT/gpu_suite.log" 2>&1
rc=$?
echo "gpu_suite: pytest rc=$rc in $(( $(date +%s) - start )) s on $G GPU(s), $WORKERS workers of $OMP_NUM_THREADS threads${SHARD:+, shard $SHARD}"
grep -oE "(^|\] )(FAILED|ERROR) [^ ]+" "$OUT/gpu_suite.log" | sed 's/^\] //' | sort -u | head -40
echo "outcomes: $(grep -oE "\] (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) " "$OUT/gpu_suite.log" | sort | uniq -c | tr -s ' \n' ' ')"
# every test with an outcome (the next sitting's SKIP_IDS), and how many were collected but not reached
# (the whole id to the end of the line: some parameter ids hold spaces)
sed -nE 's/^\[gw[0-9]+\] \[ *[0-9]+%\] (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) (.*[^ ]) *$/\2/p' "$OUT/gpu_suite.log" \
  | sort -u > "$OUT/done_ids.txt"
items=$(grep -oE "[0-9]+ workers \[[0-9]+ items?\]" "$OUT/gpu_suite.log" | grep -oE "\[[0-9]+" | tr -d '[' | head -1)
echo "collected ${items:-?}, with an outcome $(wc -l < "$OUT/done_ids.txt")${TIME_LIMIT:+ (time limit $TIME_LIMIT s)}"
[ -n "$items" ] && [ "$(wc -l < "$OUT/done_ids.txt")" -lt "$items" ] && { echo "gpu_suite: not every test ran"; rc=1; }
if [ -n "${RESUME:-}" ]; then
  sort -u "$RESUME/done_ids.txt" "$OUT/done_ids.txt" -o "$RESUME/done_ids.txt"
  echo "gpu_suite: $(wc -l < "$RESUME/done_ids.txt") tests ran over the sittings so far"
fi
echo "skip reasons (count, reason):"
grep -E "^SKIPPED \[" "$OUT/gpu_suite.log" | sed -E 's/^SKIPPED \[([0-9]+)\] [^ ]+: /\1 /' \
  | awk '{n=$1; $1=""; c[$0]+=n} END {for (r in c) printf "%7d %s\n", c[r], r}' | sort -rn | head -30
tail -1 "$OUT/gpu_suite.log"
# where the sitting's time went: the slowest tests, and the worker-seconds of each file (every
# test's setup, call and teardown; --durations 0 lists them all in the log)
sed -n '/slowest.*durations/,/^$/p' "$OUT/gpu_suite.log" | head -22
echo "worker-seconds by file (the top 12):"
sed -n '/slowest.*durations/,/short test summary/p' "$OUT/gpu_suite.log" \
  | awk '$1 ~ /^[0-9.]+s$/ {split($3, a, "::"); t[a[1]] += $1 + 0; all += $1 + 0}
         END {for (f in t) printf "%8.0f %s\n", t[f], f; printf "%8.0f (all files)\n", all}' | sort -rn | head -13
# the tests during which an op fell back on CUDA (conftest.py's fallbacks_<pid>.txt): an unmarked
# one fails in strict mode (STRICT=1), unless it turns strict mode off itself (test_paths.py does)
cat "$CUTLASS_OPS_TEST_STACKS"/fallbacks_*.txt 2>/dev/null | sort > "$OUT/fallbacks.txt"
if [ -s "$OUT/fallbacks.txt" ]; then
  echo "tests that fell back on CUDA: $(wc -l < "$OUT/fallbacks.txt"), $(grep -c $'\tunmarked\t' "$OUT/fallbacks.txt") not marked fallback ($OUT/fallbacks.txt); unmarked, by file:"
  awk -F'\t' '$2 == "unmarked" {split($1, a, "::"); n[a[1]]++} END {for (f in n) printf "%7d %s\n", n[f], f}' \
    "$OUT/fallbacks.txt" | sort -rn | head -15
  echo "unmarked, by op and reason (tests):"
  awk -F'\t' '$2 == "unmarked" {k = split($3, r, " [|] "); for (i = 1; i <= k; i++) {sub(/ x[0-9]+$/, "", r[i]); c[r[i]]++}}
               END {for (x in c) printf "%7d %s\n", c[x], x}' "$OUT/fallbacks.txt" | sort -rn | head -15
fi
for f in "$CUTLASS_OPS_TEST_STACKS"/*.txt; do  # hung tests' stacks and slow fuzz cases
  [ -e "$f" ] || continue
  case "$f" in
    */slow_fuzz_cases_*) echo "== $f"; cat "$f" ;;
    *) grep -q "^Thread 0x\|^Current thread 0x" "$f" && {
         echo "== $(basename "$f"): a test ran past ${CUTLASS_OPS_TEST_STACKS_AFTER} s: $(grep '^== ' "$f" | tail -1 | cut -c4-)"
         echo "   the dump's frames in this repository, by count (every thread's whole stack: stacks/ in \$OUT):"
         grep -E 'File "[^"]*(tests/python|cutlass_ops)/' "$f" | sed 's/^ *//' | sort | uniq -c | sort -rn | head -12; } ;;
  esac
done
if grep -qE "^SKIPPED .*no CUDA device" "$OUT/gpu_suite.log"; then
  echo "gpu_suite: FAILED: GPU tests skipped for want of a GPU on a machine that has one"; rc=1
fi
if [ -n "${BUILD_DIR:-}" ]; then
  ctest --test-dir "$BUILD_DIR" --output-on-failure > "$OUT/ctest.log" 2>&1 || rc=1
  tail -3 "$OUT/ctest.log"
fi
# the verdict last, where a caller's tail sees it
echo "gpu_suite: $(tail -1 "$OUT/gpu_suite.log" | tr -d '=' | sed 's/^ *//; s/ *$//') | strict mode ${STRICT:-0} | rc $rc"
exit $rc
