#!/usr/bin/env bash
# Sweep of CUTLASS 3.x sm90 conv fprop configurations (stages, tile, cluster, epilogue, NDEBUG, launch bounds)
# on FusedResNet's forward conv shapes, each checked against a GPU reference, then cuDNN (torch) on the
# same problems. See README.md in this folder.
#
# Usage (from any directory; needs nvcc, a Hopper GPU, and cutlass_library importable):
#   bash docs/experiments/sm90_conv3x_fprop/run_sweep.sh               # build + run + cuDNN + tables
#   bash docs/experiments/sm90_conv3x_fprop/run_sweep.sh --build-only  # compile every variant, no GPU
# Environment: OUT (if set: sm90_sweep.json, sm90_sweep_table.txt, sweep_run.log, sweep_build.log go there),
#   BUILD_DIR (default /tmp/sm90_sweep_build), JOBS (parallel compiles, default nproc), VARIANTS_RE (regex
#   filter on variant ids), REPS/LAUNCHES/WARMUP (timing: REPS batches of LAUNCHES launches, default 15/10/10),
#   NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc), SKIP_CUDNN=1.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD_ONLY=0
[[ "${1:-}" == "--build-only" ]] && BUILD_ONLY=1
B="${BUILD_DIR:-/tmp/sm90_sweep_build}"
JOBS="${JOBS:-$(nproc)}"
REPS="${REPS:-15}" LAUNCHES="${LAUNCHES:-10}" WARMUP="${WARMUP:-10}"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
PY="${PYTHON:-python3}"

die() { echo "run_sweep.sh: ERROR: $*" >&2; exit 1; }
[[ -x "$NVCC" ]] || die "nvcc not found (set NVCC=/path/to/nvcc)"
S=$("$PY" -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source'))" 2>/dev/null) \
  || die "python module cutlass_library is not importable. Install the nvidia-cutlass 4.2 wheel, e.g.
    python3 -m pip install --no-deps --target /tmp/cutlass_site nvidia_cutlass-4.2.0.0-py3-none-any.whl && export PYTHONPATH=/tmp/cutlass_site
  (its headers are at cutlass_library/source/include)."
[[ -f "$S/include/cutlass/conv/collective/collective_builder.hpp" ]] || die "no CUTLASS 3.x headers under $S/include"
[[ -d "$S/tools/util/include/cutlass/util" ]] || die "no cutlass/util headers under $S/tools/util/include"

# ---------------------------------------------------------------------------------------------------
# Variants: "id  flags". ND = -DNDEBUG (CUTLASS's own CMake Release builds define it; without it an
# assert in cute/pointer_flagged.hpp leaves __assertfail calls in the kernel and ptxas serializes the
# wgmma pipeline: warning C7510). orig_t128x64 (the old run.sh's "128 64 64 1", NoSmem epilogue, no
# C7510) and assert_t128x64_s4_tmav (= t128x64_s4_tmav without NDEBUG, which has C7510) omit it.
# TM/TN tile (TK 64), CM/CN cluster, STAGES 0 = StageCountAutoCarveout, EPI 0 = EpilogueScheduleAuto
# (= NoSmemWarpSpecialized), EPI 1 = TmaWarpSpecialized, EPI_N epilogue subtile N, CVOID 1 = no C tensor,
# MINB = __launch_bounds__ min blocks per SM.
ND=-DNDEBUG
T=-DEPI=1        # TMA warp-specialized epilogue
V="-DEPI=1 -DCVOID=1"
VARIANTS=(
  "orig_t128x64           -DTM=128 -DTN=64  -DSTAGES=0 -DEPI=0"
  "assert_t128x64_s4_tmav -DTM=128 -DTN=64  -DSTAGES=4 $V"
  "t128x64_s2             $ND -DTM=128 -DTN=64  -DSTAGES=2 -DEPI=0"
  "t128x64_s4             $ND -DTM=128 -DTN=64  -DSTAGES=4 -DEPI=0"
  "t128x64_s4_tma         $ND -DTM=128 -DTN=64  -DSTAGES=4 $T"
  "t128x64_s4_tmav        $ND -DTM=128 -DTN=64  -DSTAGES=4 $V"
  "t128x64_s4_tmav_e64    $ND -DTM=128 -DTN=64  -DSTAGES=4 $V -DEPI_N=64"
  "t128x64_auto_tmav      $ND -DTM=128 -DTN=64  -DSTAGES=0 $V"
  "t128x64_s4_tmav_c1x2   $ND -DTM=128 -DTN=64  -DSTAGES=4 $V -DCN=2"
  "t128x64_s4_tmav_c2x1   $ND -DTM=128 -DTN=64  -DSTAGES=4 $V -DCM=2"
  "t64x64_s4_tmav         $ND -DTM=64  -DTN=64  -DSTAGES=4 $V"
  "t64x64_s3_mb4          $ND -DTM=64  -DTN=64  -DSTAGES=3 -DEPI=0 -DMINB=4"
  "t64x64_s3_tmav_mb4     $ND -DTM=64  -DTN=64  -DSTAGES=3 $V -DMINB=4"
  "t64x64_s3_tmav_mb4_c1x2 $ND -DTM=64 -DTN=64  -DSTAGES=3 $V -DMINB=4 -DCN=2"
  "t64x128_auto           $ND -DTM=64  -DTN=128 -DSTAGES=0 -DEPI=0"
  "t64x128_s4             $ND -DTM=64  -DTN=128 -DSTAGES=4 -DEPI=0"
  "t64x128_s4_tmav        $ND -DTM=64  -DTN=128 -DSTAGES=4 $V"
  "t64x128_s4_tmav_c2x1   $ND -DTM=64  -DTN=128 -DSTAGES=4 $V -DCM=2"
  "t64x128_s4_tmav_c1x2   $ND -DTM=64  -DTN=128 -DSTAGES=4 $V -DCN=2"
  "t128x128_auto          $ND -DTM=128 -DTN=128 -DSTAGES=0 -DEPI=0"
  "t128x128_s4_tmav       $ND -DTM=128 -DTN=128 -DSTAGES=4 $V"
  "t128x128_s4_tmav_c2x1  $ND -DTM=128 -DTN=128 -DSTAGES=4 $V -DCM=2"
  "t64x256_auto           $ND -DTM=64  -DTN=256 -DSTAGES=0 -DEPI=0"
  "t64x256_s3_tmav        $ND -DTM=64  -DTN=256 -DSTAGES=3 $V"
  # Persistent kernels (sm90_conv_persistent.hpp: the conv mainloop inside CUTLASS's GEMM cooperative /
  # ping-pong kernels, 384 threads, PersistentTileSchedulerSm90, grid = #SMs). SCHED=1 cooperative (two
  # consumer warp groups split the tile along M, TM >= 128), SCHED=2 ping-pong (each warp group its own tile,
  # one's epilogue overlaps the other's MMA). SWZ = scheduler max_swizzle_size. Only these:
  # VARIANTS_RE='^(coop|pp)_'
  "coop_t128x128_s4_tmav  $ND -DTM=128 -DTN=128 -DSTAGES=4 $V -DSCHED=1"
  "coop_t128x128_s6_tmav  $ND -DTM=128 -DTN=128 -DSTAGES=6 $V -DSCHED=1"
  "coop_t128x64_s6_tmav   $ND -DTM=128 -DTN=64  -DSTAGES=6 $V -DSCHED=1"
  "coop_t256x128_s4_tmav  $ND -DTM=256 -DTN=128 -DSTAGES=4 $V -DSCHED=1"
  "coop_t128x256_s4_tmav  $ND -DTM=128 -DTN=256 -DSTAGES=4 $V -DSCHED=1"
  "coop_t128x128_s4_tmav_swz4 $ND -DTM=128 -DTN=128 -DSTAGES=4 $V -DSCHED=1 -DSWZ=4"
  "pp_t64x128_s6_tmav     $ND -DTM=64  -DTN=128 -DSTAGES=6 $V -DSCHED=2"
  "pp_t128x64_s6_tmav     $ND -DTM=128 -DTN=64  -DSTAGES=6 $V -DSCHED=2"
  "pp_t128x128_s4_tmav    $ND -DTM=128 -DTN=128 -DSTAGES=4 $V -DSCHED=2"
)
# Not swept (compiled once with nvcc 13.0 while preparing this; see README.md):
#  - 128x256 / 256x128 tiles with fp32 accumulators: the only sm90 conv kernel schedule has ONE consumer
#    warpgroup, so they need 256 accumulator registers/thread: 255 registers, 4.6 KB spills, C7511.
#    (With two consumer warp groups they fit: coop_t256x128_s4_tmav / coop_t128x256_s4_tmav above.)
#  - 128x128 with MINB=2 (<= 128 registers): 2.5 KB spills and C7511 (wgmma serialized).
#  - 128x64 with MINB=3 (<= 80 registers): 1.2 KB spills and C7512 (wgmma serialized).
#  - 64x128 with MINB=3: ptxas fatal C7602 "Insufficient registers (80)".

CXXFLAGS=(-std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr
          -I"$S/include" -I"$S/tools/util/include" -I"$HERE" -Xptxas -v)
mkdir -p "$B" || die "cannot create $B"
rm -f "$B"/*.o "$B"/*.status "$B"/results.jsonl "$B"/cudnn.json "$B"/sweep_bench
: > "$B/build_summary.tsv"

sel=()
for v in "${VARIANTS[@]}"; do
  id=${v%% *}
  [[ -n "${VARIANTS_RE:-}" && ! "$id" =~ $VARIANTS_RE ]] && continue
  sel+=("$v")
done
echo "== building ${#sel[@]} variants + driver with $JOBS parallel nvcc ($("$NVCC" --version | tail -1)); headers $S"
t_build0=$(date +%s)

compile() {  # id, output, flags...
  local id=$1 out=$2; shift 2
  local t0=$(date +%s.%N)
  "$NVCC" "${CXXFLAGS[@]}" "$@" -c -o "$out" > "$B/$id.log" 2>&1
  local rc=$?
  local t1=$(date +%s.%N)
  echo "$rc $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')" > "$B/$id.status"
}

compile driver "$B/sweep_main.o" -DNDEBUG "$HERE/sweep_main.cu" &
# TMA-epilogue TUs compile ~1.5x slower than NoSmem ones: start them first.
order=()
for v in "${sel[@]}"; do [[ "$v" == *"-DEPI=1"* ]] && order+=("$v"); done
for v in "${sel[@]}"; do [[ "$v" != *"-DEPI=1"* ]] && order+=("$v"); done
for v in "${order[@]}"; do
  id=${v%% *}
  read -r -a flags <<< "${v#* }"
  while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n; done
  compile "$id" "$B/$id.o" -DVID="$id" "${flags[@]}" "$HERE/sweep_variant.cu" &
done
wait

objs=()
nfail=0
{
  printf "id\trc\tseconds\tregs\tspill_stores\twarnings\n"
  for v in "${sel[@]}" "driver"; do
    id=${v%% *}
    read -r rc secs < "$B/$id.status" || { rc=99; secs=0; }
    regs=$(grep -o 'Used [0-9]* registers' "$B/$id.log" | tail -1 | awk '{print $2}')
    spill=$(grep -o '[0-9]* bytes spill stores' "$B/$id.log" | tail -1 | awk '{print $1}')
    warn=$(grep -o 'C75[0-9][0-9]' "$B/$id.log" | sort -u | tr '\n' ' ')
    printf "%s\t%s\t%.0f\t%s\t%s\t%s\n" "$id" "$rc" "$secs" "${regs:--}" "${spill:--}" "${warn:--}"
    if [[ "$rc" == 0 ]]; then
      [[ $id != driver ]] && objs+=("$B/$id.o")
    else
      nfail=$((nfail + 1))
      echo "---- $id FAILED to compile; last lines of $B/$id.log:" >&2
      tail -25 "$B/$id.log" >&2
    fi
  done
} > "$B/build_summary.tsv"
awk -F'\t' '{ printf "  %-22s %-3s %-8s %-5s %-13s %s\n", $1, $2, $3, $4, $5, $6 }' "$B/build_summary.tsv"
t_build1=$(date +%s)
echo "== build wall time $((t_build1 - t_build0)) s, $nfail failed"
{ cat "$B/build_summary.tsv"; for f in "$B"/*.log; do echo "=== $f"; grep -E 'error|warning|C75[0-9][0-9]|registers|spill' "$f" | head -20; done; } > "$B/sweep_build.log"
[[ -n "${OUT:-}" ]] && mkdir -p "$OUT" && cp "$B/sweep_build.log" "$OUT/sweep_build.log"
[[ -f "$B/sweep_main.o" ]] || die "driver sweep_main.cu failed to compile (see $B/driver.log)"
(( ${#objs[@]} > 0 )) || die "no variant compiled"
"$NVCC" -gencode arch=compute_90a,code=sm_90a "$B/sweep_main.o" "${objs[@]}" -o "$B/sweep_bench" > "$B/link.log" 2>&1 \
  || { cat "$B/link.log"; die "link failed"; }

# SASS instruction counts per variant (where a cuobjdump that knows sm_90a exists): HGMMA = wgmma,
# DEPBAR = wgmma waits, STG = global stores (NoSmem epilogue), UTMASTG/UTMALDG = TMA store/load,
# CALL (e.g. __assertfail), STL = local-memory stores (spills).
CUOBJDUMP="${CUOBJDUMP:-$(dirname "$NVCC")/cuobjdump}"
[[ -x "$CUOBJDUMP" ]] || CUOBJDUMP="$(command -v cuobjdump || true)"
sass_stats() {
  [[ -n "$CUOBJDUMP" ]] || { echo "no cuobjdump: no SASS counts"; return; }
  printf "id\tHGMMA\tWARPGROUP.DEPBAR\tWARPGROUP.ARRIVE\tSTG\tUTMASTG\tUTMALDG\tCALL\tSTL\n"
  for o in "${objs[@]}"; do
    local id; id=$(basename "$o" .o)
    "$CUOBJDUMP" -sass "$o" > "$B/$id.sass" 2> /dev/null || { echo "$id: cuobjdump -sass failed"; continue; }
    printf "%s" "$id"
    for pat in 'HGMMA' 'WARPGROUP.DEPBAR' 'WARPGROUP.ARRIVE' ' STG' 'UTMASTG' 'UTMALDG' ' CALL' ' STL'; do
      printf "\t%s" "$(grep -c -- "$pat" "$B/$id.sass")"
    done
    printf "\n"
  done
}
if (( BUILD_ONLY )); then
  sass_stats > "$B/sass_counts.tsv" 2>&1; cat "$B/sass_counts.tsv" >> "$B/sweep_build.log"
  echo "== build only: $B/sweep_bench"; exit $(( nfail > 0 ))
fi
sass_stats > "$B/sass_counts.tsv" 2>&1 &
sass_pid=$!

# ---------------------------------------------------------------------------------------------------
echo "== running (one process per variant; REPS=$REPS x LAUNCHES=$LAUNCHES after WARMUP=$WARMUP); log $B/sweep_run.log"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader | tee "$B/sweep_run.log"
t_run0=$(date +%s)
for id in $("$B/sweep_bench" --list); do
  timeout 45 "$B/sweep_bench" --variant "$id" --out "$B/results.jsonl" --reps "$REPS" --launches "$LAUNCHES" \
    --warmup "$WARMUP" >> "$B/sweep_run.log" 2>&1
  rc=$?
  nok=$(grep "\"variant\":\"$id\"" "$B/results.jsonl" 2>/dev/null | grep -c '"status":"ok"')
  nbad=$(grep "\"variant\":\"$id\"" "$B/results.jsonl" 2>/dev/null | grep -c '"status":"\(wrong\|error\)"')
  ncan=$(grep "\"variant\":\"$id\"" "$B/results.jsonl" 2>/dev/null | grep -c '"status":"cannot"')
  printf "  %-22s rc %-3s ok %2s  wrong/error %2s  cannot %2s\n" "$id" "$rc" "$nok" "$nbad" "$ncan"
done
echo "== variants ran in $(( $(date +%s) - t_run0 )) s"

if [[ "${SKIP_CUDNN:-0}" != 1 ]]; then
  echo "== cuDNN (torch F.conv2d, channels_last fp16, cudnn.benchmark)"
  "$PY" "$HERE/cudnn_fprop.py" --json "$B/cudnn.json" --reps "$REPS" --launches "$LAUNCHES" >> "$B/sweep_run.log" 2>&1 \
    || echo "  cuDNN script failed (see $B/sweep_run.log); tables will lack the cuDNN column"
fi
[[ -n "${OUT:-}" ]] && cp "$B/sweep_run.log" "$OUT/sweep_run.log"
wait "$sass_pid" 2> /dev/null
{ echo "=== SASS counts"; cat "$B/sass_counts.tsv"; } >> "$B/sweep_build.log"
[[ -n "${OUT:-}" ]] && cp "$B/sweep_build.log" "$OUT/sweep_build.log"

args=(--results "$B/results.jsonl" --build "$B/build_summary.tsv" --sass "$B/sass_counts.tsv" --table "$B/sm90_sweep_table.txt"
      --json-out "$B/sm90_sweep.json")
[[ -f "$B/cudnn.json" ]] && args+=(--cudnn "$B/cudnn.json")
"$PY" "$HERE/summarize_sweep.py" "${args[@]}" || die "summarize_sweep.py failed"
if [[ -n "${OUT:-}" ]]; then
  cp "$B/sm90_sweep.json" "$B/sm90_sweep_table.txt" "$OUT/"
  echo "== wrote $OUT/sm90_sweep.json $OUT/sm90_sweep_table.txt $OUT/sweep_run.log $OUT/sweep_build.log"
fi
nok=$(grep -c '"status":"ok"' "$B/results.jsonl" 2>/dev/null)
nwrong=$(grep -c '"status":"\(wrong\|error\)"' "$B/results.jsonl" 2>/dev/null)
if [[ "${nok:-0}" == 0 ]]; then die "no verified result at all (see $B/sweep_run.log)"; fi
echo "== done: ${nok} verified (variant, problem) results, ${nwrong:-0} wrong or failed"
