#!/usr/bin/env bash
# FusedResNet under DDP on GPUs: the evidence the CPU machine cannot give.
# Needs cutlass_ops installed for these GPUs (pip install --no-build-isolation .) and matplotlib.
#   2 GPUs:  bash tests/gpu_ddp.sh            (gradients, throughput 1 vs 2 GPUs, loss curves)
#   1 GPU:   ONE_GPU=1 bash tests/gpu_ddp.sh  (two processes sharing the GPU through gloo)
# Results: $OUT (default gpu_results/ddp): one JSON per run, summary.json, loss_curves_1_vs_2_gpus.png,
# and each run's log.  A run that fails is recorded (its log) and the script goes on.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-gpu_results/ddp}
N=${N:-2048}
STEPS=${STEPS:-20}
mkdir -p "$OUT"
run() {  # run NAME NPROC ARGS...
  local name=$1 nproc=$2; shift 2
  echo "== $name: $nproc process(es): $*"
  "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$nproc" examples/ddp_ppo.py "$@" \
    --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "   rc=$? ; $(grep -E 'PASSED|FAILED|step: median|all-reduce|adds' "$OUT/$name.log" | tr '\n' ' ')"
}
"$PYTHON" -P -m cutlass_ops info > "$OUT/info.json" 2>&1
nvidia-smi -L > "$OUT/gpus.txt" 2>&1

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
run check_fp16 2 --check-grads --dtype float16 --batch 256
run check_fp16_static 2 --check-grads --dtype float16 --batch 256 --static-graph
run check_fp16_compile 2 --check-grads --dtype float16 --batch 256 --compile
run check_fp32 2 --check-grads --dtype float32 --batch 64
run check_ref_fp16 2 --check-grads --dtype float16 --batch 256 --model reference
# 2. throughput at N per GPU (1 GPU at N: the baseline), loss curves (1 GPU at 2N: same global batch)
for model in fused reference; do
  for mode in eager graph compile; do
    flags=""
    [ "$mode" = graph ] && flags="--graph --static-graph"
    [ "$mode" = compile ] && flags="--compile"
    [ "$model" = reference ] && [ "$mode" = compile ] && continue
    run "${model}_${mode}_2gpu" 2 --model $model --batch "$N" --steps "$STEPS" $flags \
      $([ "$mode" = eager ] && echo --measure-allreduce 5)
    run "${model}_${mode}_1gpu" 1 --model $model --batch "$N" --steps "$STEPS" $flags --no-ddp
    run "${model}_${mode}_1gpu_samebatch" 1 --model $model --batch $((2 * N)) --steps "$STEPS" $flags --no-ddp
  done
done
# smaller buckets: more all-reduces beside the backward
run fused_eager_bucket4mb_2gpu 2 --batch "$N" --steps "$STEPS" --bucket-cap-mb 4 --measure-allreduce 5
"$PYTHON" examples/ddp_ppo_report.py "$OUT"
"$PYTHON" -P -m pytest -p no:cacheprovider -ra tests/python/test_ddp.py 2>&1 | tail -20 | tee "$OUT/pytest.txt"
