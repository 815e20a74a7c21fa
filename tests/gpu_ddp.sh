#!/usr/bin/env bash
# FusedResNet under DDP on GPUs: the evidence the CPU machine cannot give.
# Needs cutlass_ops installed for these GPUs (pip install --no-build-isolation .) and matplotlib.
#   2 GPUs:  bash tests/gpu_ddp.sh            (gradients, throughput 1 vs 2 GPUs, loss curves)
#   1 GPU:   ONE_GPU=1 bash tests/gpu_ddp.sh  (two processes sharing the GPU through gloo)
# Results: $OUT (default gpu_results/ddp): one JSON per run, summary.json, loss_curves_1_vs_2_gpus.png,
# each run's log, and gpu_clocks.csv (clocks, heat, power) beside launches.txt (when each run started).
# A run that fails is recorded (its log) and the script goes on.  About 15 minutes on two H200s, 2 of
# them test_ddp.py's (each launch starts its processes anew: 15-25 s); COMPILE=1 adds torch.compile's
# runs.  PHASES picks the parts, in this order (default all of them), so that one build's evidence
# can be gathered in sittings of a few minutes into one OUT:
#   checks (gradients), rounds (throughput, 1 vs 2 GPUs at N), small (at N/4), eager, curves, report,
#   pytest (test_ddp.py's 2-GPU tests; PYTEST=0 leaves them out too)
# ROUNDS (3) or ROUND_LIST (e.g. "2 3"), VARIANTS, CTAS: below.
# RUN_TIMEOUT (default 300 s) stops a run that hangs.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and its relatives, below, unless already set).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-gpu_results/ddp}
N=${N:-2048}
STEPS=${STEPS:-60}
CURVE_STEPS=${CURVE_STEPS:-200}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1} \
  NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
run() {  # run NAME NPROC ARGS...
  local name=$1 nproc=$2; shift 2
  echo "== $name: $nproc process(es): $*"
  echo "$(date -u '+%Y/%m/%d %H:%M:%S') start $name" >> "$OUT/launches.txt"
  timeout "${RUN_TIMEOUT:-300}" "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$nproc" examples/ddp_ppo.py "$@" \
    --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "   rc=$? ; $(grep -E 'PASSED|FAILED|step: median|throughput:|paired|GPU timeline|all-reduce|adds' "$OUT/$name.log" | tr '\n' ' ')"
}
"$PYTHON" -P -m cutlass_ops info > "$OUT/info.json" 2>&1
nvidia-smi -L > "$OUT/gpus.txt" 2>&1
# every GPU's SM clock, temperature, power and clock-event reasons twice a second, beside the launch
# times in launches.txt: whether a slower launch ran at lower clocks (heat, power) or not
Q=timestamp,index,clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_event_reasons.active
nvidia-smi --query-gpu=$Q --format=csv >/dev/null 2>&1 || Q=timestamp,index,clocks.sm,clocks.mem,temperature.gpu,power.draw
nvidia-smi --query-gpu=$Q --format=csv -lms 500 >> "$OUT/gpu_clocks.csv" 2>&1 &
SAMPLER=$!
trap 'kill $SAMPLER 2>/dev/null' EXIT
trap 'exit 143' TERM INT
PHASES=" ${PHASES:-checks rounds small eager curves report pytest} "
phase() { [[ "$PHASES" == *" $1 "* ]]; }

if [ "${ONE_GPU:-0}" = 1 ]; then
  export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
  run share_check_fp32 2 --check-grads --dtype float32 --batch 64
  run share_check_fp16 2 --check-grads --dtype float16 --batch 256
  run share_check_compile 2 --check-grads --dtype float16 --batch 256 --compile
  run share_train 2 --batch $((N / 2)) --steps "$STEPS" --measure-allreduce 5
  "$PYTHON" -P -m pytest -p no:cacheprovider -ra tests/python/test_ddp.py 2>&1 | tail -20 | tee "$OUT/pytest.txt"
  exit 0
fi

# 1. gradients: NCCL, one step (two, with the rebuilt buckets) vs one process on the concatenated batch
if phase checks; then
  run check_fp16 2 --check-grads --dtype float16 --batch 256
  run check_bf16 2 --check-grads --dtype bfloat16 --batch 256
  run check_fp32 2 --check-grads --dtype float32 --batch 64
  run check_fp16_static 2 --check-grads --dtype float16 --batch 256 --static-graph
  run check_fp16_bucketview 2 --check-grads --dtype float16 --batch 256 --grad-as-bucket-view
  run check_fp16_flat 2 --check-grads --dtype float16 --batch 256 --flat-params stages --bucket-cap-mb 1 \
    --grad-as-bucket-view
  run check_ref_fp16 2 --check-grads --dtype float16 --batch 256 --model reference
fi
# 2. throughput at N per GPU against 1 GPU at N (its baseline), in ROUNDS rounds of launches side by side:
# 1 GPU, 2 GPUs with DDP's default 25 MiB buckets, 2 GPUs in each of VARIANTS (below).  Launches of one
# run differed by up to 15% on an H200, so each round's 2-GPU runs are compared with that round's 1-GPU
# run and the report takes the median round.
# Round 1 also profiles (--profile-steps: each step's GPU time split into compute, NCCL exposed and idle,
# per rank, and a table of kernels by name: the report's kernel_diff_rank0 names what DDP adds to a
# step).  Every 2-GPU run also times one process on GPU 0 in windows alternating with its own
# (--paired-baseline: paired_speedup_median, the scaling with the machine's drift taken out).
# VARIANTS: the 2-GPU configurations besides DDP's defaults, NAME:FLAGS each (FLAGS comma-separated):
# 8 MiB buckets with gradient bucket views (one copy a parameter less); the agent flattened into
# one parameter (--flat-params one: one gradient to copy, no overlap); and into one per encoder
# stage (--flat-params stages, 1 MiB buckets: a bucket each, the last stages' all-reduces beside
# the first stages' backward); both with views.
# CTAS (e.g. "4") adds runs with at most that many NCCL CTAs beside the convs (8 MiB buckets).
DEFAULT_VARIANTS="bucket8mb_view:--bucket-cap-mb,8,--grad-as-bucket-view flat_view:--flat-params,one,--grad-as-bucket-view
  flat_stages_view:--flat-params,stages,--bucket-cap-mb,1,--grad-as-bucket-view"
if phase rounds; then
  for r in ${ROUND_LIST:-$(seq 1 "${ROUNDS:-3}")}; do  # ROUND_LIST (e.g. "2 3"): the rounds of a later sitting
    prof=(); [ "$r" = 1 ] && prof=(--profile-steps 5)
    run "fused_graph_n${N}_round${r}_1gpu" 1 --batch "$N" --steps "$STEPS" --graph --static-graph --no-ddp "${prof[@]}"
    run "fused_graph_n${N}_round${r}_2gpu" 2 --batch "$N" --steps "$STEPS" --graph --static-graph --paired-baseline \
      "${prof[@]}"
    for v in ${VARIANTS:-$DEFAULT_VARIANTS}; do
      IFS=, read -r -a flags <<< "${v#*:}"
      run "fused_graph_${v%%:*}_n${N}_round${r}_2gpu" 2 --batch "$N" --steps "$STEPS" --graph --static-graph \
        "${flags[@]}" --paired-baseline "${prof[@]}"
    done
    for c in ${CTAS:-}; do
      run "fused_graph_bucket8mb_ctas${c}_n${N}_round${r}_2gpu" 2 --batch "$N" --steps "$STEPS" --graph \
        --static-graph --bucket-cap-mb 8 --nccl-max-ctas "$c" "${prof[@]}"
    done
  done
fi
if phase small; then
  run "fused_graph_n$((N / 4))_1gpu" 1 --batch $((N / 4)) --steps "$STEPS" --graph --static-graph --no-ddp
  run "fused_graph_n$((N / 4))_2gpu" 2 --batch $((N / 4)) --steps "$STEPS" --graph --static-graph --paired-baseline
fi
# eager (host-bound at this size): the all-reduce timed, overlap and exposed time, and what it adds
if phase eager; then
  run "fused_eager_n${N}_2gpu" 2 --batch "$N" --steps "$STEPS" --measure-allreduce 5
  run "fused_eager_n${N}_1gpu" 1 --batch "$N" --steps "$STEPS" --no-ddp
fi
# torch.compile under DDP (minutes of compiling): COMPILE=1
if [ "${COMPILE:-0}" = 1 ]; then
  run "fused_compile_n${N}_2gpu" 2 --batch "$N" --steps "$STEPS" --compile
  run "fused_compile_n${N}_1gpu" 1 --batch "$N" --steps "$STEPS" --compile --no-ddp
fi
# 3. loss curves: 2 GPUs at N against 1 GPU at 2N (the same global batch), CURVE_STEPS updates
if phase curves; then
  run curve_2gpu 2 --batch "$N" --steps "$CURVE_STEPS" --graph --static-graph
  run curve_flat_view_2gpu 2 --batch "$N" --steps "$CURVE_STEPS" --graph --static-graph --flat-params one \
    --grad-as-bucket-view
  run curve_flat_stages_view_2gpu 2 --batch "$N" --steps "$CURVE_STEPS" --graph --static-graph --flat-params stages \
    --bucket-cap-mb 1 --grad-as-bucket-view
  run curve_1gpu_samebatch 1 --batch $((2 * N)) --steps "$CURVE_STEPS" --graph --static-graph --no-ddp
fi
phase report && "$PYTHON" examples/ddp_ppo_report.py "$OUT"
# the 2-GPU tests of test_ddp.py (about 2 minutes; PYTEST=0 leaves them out)
if phase pytest && [ "${PYTEST:-1}" = 1 ]; then
  "$PYTHON" -P -m pytest -p no:cacheprovider -ra tests/python/test_ddp.py 2>&1 | tail -20 | tee "$OUT/pytest.txt"
fi
