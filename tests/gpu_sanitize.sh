#!/usr/bin/env bash
# compute-sanitizer over tests/python/test_sanitize_selection.py: every registered op's kernels
# at least once, at the smallest shapes that reach them, in production configuration (the
# profile's kernel choices, family 90 and cuDNN included).  Run from the repo root with
# cutlass_ops installed in $PYTHON (default python3) and nvcc on PATH or in /usr/local/cuda:
#
#   bash tests/gpu_sanitize.sh                                  # memcheck racecheck initcheck synccheck
#   CUTLASS_OPS_SANITIZE_TOOLS="memcheck synccheck" bash tests/gpu_sanitize.sh
#
# 1. Negative controls first (tests/sanitize_controls/controls.cu, built here): a planted
#    out-of-bounds write (memcheck), shared-memory race (racecheck) and uninitialized read
#    (initcheck) must each be reported, and the clean program must pass every tool; else the
#    sanitizer setup is broken and the script stops (exit 2) before the selection.
# 2. Per tool, pytest runs ("passes"): "plain", the tests without CUDA graphs with the caching
#    allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1: memcheck sees every allocation's own
#    bounds), and "graph", the graph tests (-k graph) with it on (capture needs it).
#    initcheck runs them twice: "production" and "family80" (CUTLASS_OPS_SM90=0
#    CUTLASS_OPS_CUDNN=0: our family-80 kernels in place of family 90 and cuDNN).  initcheck
#    does not see TMA stores: before its production pass the TMA probes run under initcheck,
#    and each writer class whose output they find right while initcheck reports reading it is
#    passed to the selection (CUTLASS_OPS_SANITIZE_TMA_BLIND), whose tests then skip right after
#    such a writer ran, before anything reads its output.  The family-80 writer is the probes'
#    control: it must be seen (0 errors).
# A pass fails on: the sanitizer's own exit code (--error-exitcode), an error count in its log,
# pytest's exit status (a failing test, a crash, a collection error), fewer than MIN_TESTS
# (plain) or MIN_GRAPH_TESTS (graph) passed tests, or its time limit
# (CUTLASS_OPS_SANITIZE_TIMEOUT seconds).  Nothing is forgiven by kernel name.  Writes one line
# per pass to $OUT/sanitize_summary.txt (or gpu_results/ without $OUT), the logs beside it.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
SANITIZER=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
TOOLS=${CUTLASS_OPS_SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}
LIMIT=${CUTLASS_OPS_SANITIZE_TIMEOUT:-600}
DEST=${OUT:-gpu_results}
SELECTION=tests/python/test_sanitize_selection.py
SANITIZER_RC=86   # compute-sanitizer's exit status when it reported an error
MIN_TESTS=45      # passed tests a plain pass needs (every tool, initcheck's two passes)
MIN_GRAPH_TESTS=1 # passed tests a graph pass needs (test_cvt_ops_graph runs in every one)
PADDING=${CUTLASS_OPS_SANITIZE_PADDING:-1024}  # memcheck's --padding, bytes after each allocation
mkdir -p "$DEST"
SUMMARY="$DEST/sanitize_summary.txt"
status=0

if [ ! -x "$SANITIZER" ]; then
  SANITIZER=$(command -v compute-sanitizer || true)
  if [ -z "$SANITIZER" ]; then
    echo "compute-sanitizer not found at /usr/local/cuda/bin/compute-sanitizer nor on PATH" | tee "$SUMMARY"
    exit 2
  fi
fi
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)

{
  echo "# compute-sanitizer over $SELECTION"
  echo "# $("$SANITIZER" --version | tail -1)"
  echo "# GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "# torch: $("$PYTHON" -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null)"
} > "$SUMMARY"

fail() { echo "FAIL: $*" | tee -a "$SUMMARY"; status=1; }

# sanitize TOOL LOG COMMAND...: the one way this script runs compute-sanitizer
sanitize() {
  local tool=$1 log=$2 extra=()
  shift 2
  case "$tool" in
    # --padding: a gap after every allocation, so that a write just past one tensor's end is
    # out of bounds, not a silent write into the tensor allocated next to it (without it the
    # oob control, one element past a 1 KiB cudaMalloc, went unreported on an H100)
    memcheck) extra=(--leak-check no --padding "$PADDING") ;;
    racecheck) extra=(--racecheck-report analysis) ;;
    initcheck | synccheck) ;;
    *) echo "unknown tool $tool" >&2; exit 2 ;;
  esac
  timeout "$LIMIT" "$SANITIZER" --tool "$tool" --error-exitcode "$SANITIZER_RC" "${extra[@]}" --print-limit 200 --nvtx no "$@" >> "$log" 2>&1
}

# reported LOG: the errors the sanitizer's summaries in LOG count (racecheck: its hazards)
reported() {
  grep -Eo '(ERROR SUMMARY|RACECHECK SUMMARY): [0-9]+ (error|hazard)' "$1" | awk '{s += $3} END {print s + 0}'
}

# ---- 1. the negative controls -------------------------------------------------------------------
controls="$DEST/sanitize_controls"
if ! "$NVCC" -arch=native -lineinfo -o "$controls" tests/sanitize_controls/controls.cu > "$DEST/sanitize_controls_build.log" 2>&1; then
  fail "controls: nvcc -arch=native could not build tests/sanitize_controls/controls.cu ($DEST/sanitize_controls_build.log)"
  exit 2
fi
for check in "memcheck oob" "racecheck race" "initcheck uninit" "memcheck clean" "racecheck clean" \
             "initcheck clean" "synccheck clean"; do
  read -r tool mode <<< "$check"
  log="$DEST/sanitize_control_${tool}_$mode.log"
  : > "$log"
  sanitize "$tool" "$log" "$controls" "$mode"
  rc=$?
  n=$(reported "$log")
  if [ "$mode" = clean ]; then
    if [ $rc -eq 0 ] && [ "$n" -eq 0 ]; then verdict=ok; else verdict="BROKEN (a clean program flagged)"; fi
  elif [ $rc -eq "$SANITIZER_RC" ] && [ "$n" -gt 0 ]; then verdict="ok (caught)"
  else verdict="BROKEN (the planted bug was not reported)"; fi
  printf 'control   %-10s %-7s rc %-3s reported %-4s %s\n' "$tool" "$mode" "$rc" "$n" "$verdict" | tee -a "$SUMMARY"
  case "$verdict" in ok*) ;; *) status=1 ;; esac
done
if [ $status -ne 0 ]; then
  fail "the negative controls show a broken sanitizer setup: the selection is not run"
  exit 2
fi

# ---- 2. the selection -----------------------------------------------------------------------------
# run_pass TOOL LABEL [VAR=VALUE...]: the plain and graph runs of one pass, judged
run_pass() {
  local tool=$1 label=$2 kind sel min log rc n line passed failed errored skipped blind secs start
  shift 2
  for kind in plain graph; do
    log="$DEST/sanitize_${tool}_${label}_$kind.log"
    : > "$log"
    if [ $kind = plain ]; then sel="not graph and not static"; min=$MIN_TESTS; else sel="graph"; min=$MIN_GRAPH_TESTS; fi
    start=$(date +%s)
    (
      [ $# -gt 0 ] && export "$@"
      [ $kind = plain ] && export PYTORCH_NO_CUDA_MEMORY_CACHING=1
      export CUDA_MODULE_LOADING=LAZY
      sanitize "$tool" "$log" "$PYTHON" -P -m pytest -p no:cacheprovider -q -rs -x "$SELECTION" -k "$sel"
    )
    rc=$?
    secs=$(( $(date +%s) - start ))
    n=$(reported "$log")
    line=$(grep -E '[0-9]+ (passed|failed|skipped|deselected|errors?)|no tests ran' "$log" | tail -1)
    passed=$(grep -Eo '[0-9]+ passed' <<< "$line" | awk '{s += $1} END {print s + 0}')
    failed=$(grep -Eo '[0-9]+ failed' <<< "$line" | awk '{s += $1} END {print s + 0}')
    errored=$(grep -Eo '[0-9]+ errors?' <<< "$line" | awk '{s += $1} END {print s + 0}')
    skipped=$(grep -Eo '[0-9]+ skipped' <<< "$line" | awk '{s += $1} END {print s + 0}')
    blind=$(grep -E '^SKIPPED \[[0-9]+\].*initcheck TMA blind spot' "$log" | grep -Eo '^SKIPPED \[[0-9]+\]' \
            | grep -Eo '[0-9]+' | awk '{s += $1} END {print s + 0}')
    printf '%-10s %-11s %-5s rc %-3s sanitizer errors %-4s pytest passed %-3s (min %s) failed %s errors %s skipped %s (TMA blind spot %s)  %ss\n' \
      "$tool" "$label" "$kind" "$rc" "$n" "$passed" "$min" "$failed" "$errored" "$skipped" "$blind" "$secs" | tee -a "$SUMMARY"
    [ $rc -eq 124 ] && fail "$tool $label $kind: ran past ${LIMIT}s"
    [ $rc -eq "$SANITIZER_RC" ] && fail "$tool $label $kind: the sanitizer reported errors ($log)"
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne "$SANITIZER_RC" ] && fail "$tool $label $kind: pytest exited $rc (a failure, crash or collection error: $log)"
    [ "$n" -ne 0 ] && fail "$tool $label $kind: $n errors in the sanitizer's summaries ($log)"
    [ "$failed" -ne 0 ] || [ "$errored" -ne 0 ] && fail "$tool $label $kind: $failed failed, $errored errors in pytest"
    [ "$passed" -lt "$min" ] && fail "$tool $label $kind: $passed tests passed, fewer than $min"
    # the kernels the reports name (top 10), for triage
    grep -Eo '(in|at) [A-Za-z_][A-Za-z0-9_:<>, ]*\(' "$log" | sed -E 's/^(in|at) //; s/\($//' | sort | uniq -c \
      | sort -rn | head -10 | sed 's/^/    /' >> "$SUMMARY"
    grep -E '^SKIPPED \[' "$log" | sed 's/^/    /' >> "$SUMMARY"
  done
}

# probe CLASS SCRIPT ARGS...: initcheck over one TMA probe writer; prints blind, seen, absent or wrong
probe() {
  local class=$1 log="$DEST/sanitize_tma_probe_$1.log" n values
  shift
  : > "$log"
  ( export PYTORCH_NO_CUDA_MEMORY_CACHING=1; sanitize initcheck "$log" "$PYTHON" -P "$@" )
  n=$(reported "$log")
  values=$(grep -E '^writer ' "$log" | tail -1)
  if grep -Eq 'no .*kernel|sm90 writers only|none built' <<< "$values" || [ -z "$values" ]; then echo absent
  elif ! grep -Eq 'NaN 0 of' <<< "$values" || ! awk '{exit !($NF + 0 < 1e-2)}' <<< "${values%%: values*}"; then echo wrong
  elif [ "$n" -gt 0 ]; then echo blind
  else echo seen; fi
  printf '    TMA probe %-12s initcheck errors %-5s %s\n' "$class" "$n" "$values" >> "$SUMMARY"
}

for tool in $TOOLS; do
  if [ "$tool" != initcheck ]; then run_pass "$tool" production; continue; fi
  blind=""
  if "$PYTHON" -P -c 'import torch, sys; sys.exit(torch.cuda.get_device_capability() != (9, 0))'; then
    echo "initcheck TMA probes (values right while initcheck reports their reads: the blind spot)" | tee -a "$SUMMARY"
    control=$(probe fprop80 tests/sanitize_tma_probe.py --writer 80)
    [ "$control" = seen ] || fail "initcheck TMA probe control: the family-80 writer reads as '$control', not seen"
    for spec in "fprop90 tests/sanitize_tma_probe.py --writer 90" \
                "bwd90 tests/sanitize_controls/tma_probe.py --writer bwd90" \
                "linear_silu tests/sanitize_controls/tma_probe.py --writer linear_silu"; do
      read -r class args <<< "$spec"
      # shellcheck disable=SC2086
      result=$(probe "$class" $args)
      echo "    $class: $result" | tee -a "$SUMMARY"
      [ "$result" = wrong ] && fail "TMA probe $class: the writer's values are wrong (a kernel bug, not the tool)"
      [ "$result" = blind ] && blind="$blind $class"
    done
    # information: cuDNN's Hopper wgrad (docs/experiments/initcheck_cudnn_wgrad/); no test skips for it alone
    info=$(probe cudnn_sm90 tests/sanitize_tma_probe.py --writer cudnn --shape 2,512,512,2)
    echo "    cudnn_sm90 (information): $info" | tee -a "$SUMMARY"
  fi
  echo "initcheck production: blind-spot classes skipped:${blind:- none}" | tee -a "$SUMMARY"
  run_pass initcheck production "CUTLASS_OPS_SANITIZE_TMA_BLIND=${blind# }"
  run_pass initcheck family80 CUTLASS_OPS_SM90=0 CUTLASS_OPS_CUDNN=0
done
echo "summary: $SUMMARY"
[ $status -eq 0 ] && echo "RESULT: PASS" | tee -a "$SUMMARY"
[ $status -ne 0 ] && echo "RESULT: FAIL" | tee -a "$SUMMARY"
exit $status
