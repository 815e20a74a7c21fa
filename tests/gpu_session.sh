#!/usr/bin/env bash
# One device call that gathers the FusedResNet evidence within the device tool's 10-minute
# limit: build (all kernels, this GPU's arch, committed profiles) unless already built in
# this warm machine, the test command, the gradient table, then benchmark steps, each under
# its own timeout so that a slow one still leaves the others' results:
#   STEPS="train:512 train:2048 resnet:128 resnet:512 resnet:2048"
# and for the Hopper-native kernels: sm90-tests, sm90-sweep, halo-sweep (docs/experiments/sm90_halo_conv:
# build and run its variants against the persistent baseline and cuDNN), profile90 (profile the family-90
# kernels into profiles/<gpu>/sm90.csv, returned as $OUT/sm90.csv, and rebuild with it),
# resnet-sm90:N, train-sm90:N (CUTLASS_OPS_SM90=1; into resnet_sm90.json / train_sm90.json),
# resnet-sm80:N, train-sm80:N (CUTLASS_OPS_SM90=0); wheel-tests[:1|2|3] (the GPU tests, or a third, against a
# wheel carried in gpu_carry/, installed into a folder of its own), sdist-tests (likewise
# for an sdist in gpu_carry/, built on the device); reliability (fuzz, large
# tensors, concurrency, bad input) and sanitize:TOOL,TOOL (tests/gpu_sanitize.sh); mlp-tests
# (FusedMLP's GPU tests) and mlp:ROWS (bench mlp; BENCH_ARGS="--systems FusedMLP eager" etc.);
# b2b:N (bench b2b, conv2d_b2b at batch N; into b2b_nN.json); se-excite:N (bench se-excite at batch N);
# CvT: cvt-tests, cvt:N (bench cvt inference at batch N), cvt-train:N (a training
# step), train-check-cvt.  suite (tests/gpu_suite.sh up to the deadline, resumed over the calls
# of one warm machine: each runs what the earlier ones did not reach), grads (the 16-bit gradient
# tables of FusedResNet and FusedCvT), block0 (docs/experiments/block0_fused/run.py: its three
# kernels, the stream one last), se-gate (conv2d_fused_se_gate's kernel and FusedResNet(fuse_se_gate=True)
# against float64, strict).
# The family-90 dgrad/wgrad kernels (built unless CUTLASS_OPS_SM90_BACKWARD=OFF is in the environment
# of this script): sm90-backward-tests (test_conv2d_backward_sm90.py, then test_conv2d_backward.py
# under the same build), profile90-backward (profile --backward --family 90 into
# profiles/<gpu>/sm90.csv, returned as $OUT/sm90.csv, and rebuild with it).
# Results merge into $OUT/train.json and $OUT/resnet.json (+ .png).  Between calls on
# different machines, copy the returned files into ./gpu_carry/ and carry it: the JSONs
# merge on, and inductor_cache.tgz (torch.compile's FX-graph and autotune caches) lets the
# peers' max-autotune compile from cache instead of autotuning again.
#   OUT=dir STEPS="train:512" SKIP_TESTS=1 bash tests/gpu_session.sh
#   OUT=dir FROM_WHEEL=1 STEPS="sm90-tests reliability" bash tests/gpu_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_results}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
PYTHON=${PYTHON:-python3}
REPO=$PWD
export MAX_JOBS=${MAX_JOBS:-16} CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16} PYTHONUNBUFFERED=1
# The system compiler: see tests/gpu_acceptance.sh on statically linked libstdc++.
if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ CC=/usr/bin/gcc; fi
if ! (cd /tmp && "$PYTHON" -c "import cutlass_library" 2>/dev/null); then
  ls .whl/nvidia_cutlass-*.whl > /dev/null 2>&1 || { echo "nvidia-cutlass is not importable and .whl/ has no wheel"; exit 1; }
  "$PYTHON" -m pip install -q --no-index --no-deps --target /tmp/site .whl/nvidia_cutlass-*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
ARCH=${ARCH:-$(cd /tmp && "$PYTHON" -P -c 'import torch; print("%d%d" % torch.cuda.get_device_capability())')}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
start=$(date +%s)
# Steps stop by this many seconds after the start, leaving time to pack the cache (the
# device tool ends a call at 600 s).
DEADLINE=$(( start + ${BUDGET_S:-560} ))

export TORCHINDUCTOR_CACHE_DIR=$REPO/build-session/inductor_cache
mkdir -p "$TORCHINDUCTOR_CACHE_DIR"
if [ -f gpu_carry/inductor_cache.tgz ] && [ ! -f "$TORCHINDUCTOR_CACHE_DIR/.from_carry" ]; then
  tar -xzf gpu_carry/inductor_cache.tgz -C "$TORCHINDUCTOR_CACHE_DIR" && touch "$TORCHINDUCTOR_CACHE_DIR/.from_carry"
fi
for f in train.json resnet.json cvt.json; do [ -f "gpu_carry/$f" ] && [ ! -f "$OUT/$f" ] && cp "gpu_carry/$f" "$OUT/$f"; done

# FROM_WHEEL=1: no build; every step runs the wheel in gpu_carry/ (built elsewhere, e.g. on the
# CPU machine against the same torch), installed into a folder of its own.
if [ "${FROM_WHEEL:-0}" = 1 ]; then
  whl=$(ls gpu_carry/cutlass_ops-*.whl 2>/dev/null | head -1)
  [ -n "$whl" ] || { echo "FROM_WHEEL=1 but gpu_carry/ has no cutlass_ops-*.whl"; exit 1; }
  rm -rf /tmp/wheel_site && "$PYTHON" -m pip install -q --no-deps --target /tmp/wheel_site "$whl" || exit 1
  export PYTHONPATH=/tmp/wheel_site${PYTHONPATH:+:$PYTHONPATH}
  echo "== from $(basename "$whl"): $(cd /tmp && "$PYTHON" -P -c 'import json, cutlass_ops; print(json.dumps(cutlass_ops._library.build_info()))')"
  SKIP_BUILD=1 SKIP_TESTS=1
fi
# Always (re)install: in a warm machine's build-session/ only what changed recompiles.
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  bstart=$(date +%s)
  CUTLASS_OPS_ARCHS=$ARCH CUTLASS_OPS_BUILD_TESTS=ON "$PYTHON" -m pip install -q --no-build-isolation --no-deps . \
    -Cbuild-dir=build-session > /tmp/gpu_session_build.log 2>&1 || { tail -30 /tmp/gpu_session_build.log; exit 1; }
  echo "== built (archs $ARCH, all kernels) in $(( $(date +%s) - bstart )) s"
fi
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  CUTLASS_OPS_SKIP_BUILD=1 BUILD_DIR=build-session PYTHON="$PYTHON" timeout 400 bash tests/run.sh -q > "$OUT/tests.log" 2>&1
  grep -E "passed|failed|^FAILED|tests passed" "$OUT/tests.log" | tail -12
  (cd /tmp && timeout 90 "$PYTHON" -P -m pytest -q -s -p no:cacheprovider "$REPO/tests/python/test_autograd.py" \
     -k "low_precision and cuda" > "$OUT/grads.txt" 2>&1)
  grep -E "^over|passed|failed" "$OUT/grads.txt"
fi
echo "== ready after $(( $(date +%s) - start )) s"

# The GPU test suite takes about 10 minutes on an H100 (2026-11-25, ~4960 tests), more than one
# device call: wheel-tests:K / sdist-tests:K run part K of three (1: the files up to
# test_ddp.py, about 4 minutes; 2: the rest but FusedMLP's, 4-5 minutes; 3: test_fused_mlp.py,
# whose kernels compile at first use); no part: all of it.
test_files() {
  local all f part=0
  all=$(cd "$REPO/tests/python" && ls test_*.py)
  case $1 in 1|2|3) ;; *) echo "$REPO/tests/python"; return ;; esac
  for f in $all; do
    if [ "$f" = test_fused_mlp.py ]; then [ "$1" = 3 ] && echo "$REPO/tests/python/$f"
    elif [ "$part" = 0 ]; then [ "$1" = 1 ] && echo "$REPO/tests/python/$f"; [ "$f" = test_ddp.py ] && part=2
    else [ "$1" = 2 ] && echo "$REPO/tests/python/$f"; fi
  done
}
part_suffix() { case $1 in 1|2|3) echo "_part$1" ;; esac; }

# After a profile step: rebuild so that the dispatch tables take the new rows (FROM_WHEEL=1:
# not here; the returned sm90.csv goes into profiles/ and the wheel is rebuilt where it was built).
rebuild_with_profiles() {
  if [ "${FROM_WHEEL:-0}" = 1 ]; then echo "(FROM_WHEEL=1: not rebuilt; commit \$OUT/sm90.csv and rebuild the wheel)"; return; fi
  CUTLASS_OPS_ARCHS=$ARCH CUTLASS_OPS_BUILD_TESTS=ON "$PYTHON" -m pip install -q --no-build-isolation --no-deps . -Cbuild-dir=build-session \
    > /tmp/gpu_session_build.log 2>&1 || { tail -30 /tmp/gpu_session_build.log; exit 1; }
  grep -o "cutlass_ops_gen: .*profile rules.*" /tmp/gpu_session_build.log
}

for step in ${STEPS:-}; do
  what=${step%%:*}; n=${step#*:}
  t0=$(date +%s)
  left=$(( DEADLINE - t0 )); limit=$(( left < ${STEP_TIMEOUT:-420} ? left : ${STEP_TIMEOUT:-420} ))
  [ "$limit" -gt 30 ] || { echo "$step: skipped, no time left"; continue; }
  case $what in
    suite)  # the whole suite (tests/gpu_suite.sh) up to the deadline, resumed over calls on this machine
      OUT=$OUT/suite RESUME=$REPO/build-session/suite TIME_LIMIT=$(( left - 25 )) PYTHON=$PYTHON \
        bash tests/gpu_suite.sh 2>&1 | tail -80
      # one file for the per-worker stack files (the device tool returns at most 8 files)
      tar -czf "$OUT/suite/stacks.tgz" -C "$OUT/suite" stacks && rm -rf "$OUT/suite/stacks"
      echo "== $step took $(( $(date +%s) - t0 )) s"; continue ;;
    grads)  # the 16-bit gradient tables, tensor by tensor: FusedResNet (four seeds) and FusedCvT
      (cd /tmp && timeout "$limit" "$PYTHON" -P -m pytest -q -s -p no:cacheprovider -k cuda \
         "$REPO/tests/python/test_autograd.py::test_fused_resnet_gradients_low_precision" \
         "$REPO/tests/python/test_fused_cvt.py::test_fused_cvt_cuda_training" > "$OUT/grads.txt" 2>&1)
      grep -E "passed|failed|^FAILED|RMS" "$OUT/grads.txt" | tail -20
      echo "== $step took $(( $(date +%s) - t0 )) s"; continue ;;
    block0)  # docs/experiments/block0_fused/run.py: block 0 as one kernel (mma.sync, wgmma) against FusedResNet's three
      # gpu_carry/block0_fused_ext.so: compiled beforehand (run.py --build-only), not here
      ext_args=(); [ -f gpu_carry/block0_fused_ext.so ] && ext_args=(--ext gpu_carry/block0_fused_ext.so)
      timeout "$limit" "$PYTHON" docs/experiments/block0_fused/run.py --out "$OUT/block0_results.json" \
        ${ext_args[@]+"${ext_args[@]}"} > "$OUT/block0.log" 2>&1
      echo "block0 run.py: rc $?"; tail -60 "$OUT/block0.log"
      echo "== $step took $(( $(date +%s) - t0 )) s"; continue ;;
    se-gate)  # conv2d_fused_se_gate's sm90 kernel and FusedResNet(fuse_se_gate=True), strict, against float64
      (cd /tmp && CUTLASS_OPS_STRICT=1 timeout "$limit" "$PYTHON" -P -m pytest -q -p no:cacheprovider -rs \
         "$REPO/tests/python/test_conv2d_fused_se_gate.py" "$REPO/tests/python/test_halo_pipeline.py" \
         "$REPO/tests/python/test_conv2d_fused_sm90_halo.py" "$REPO/tests/python/test_fused_resnet.py" \
         > "$OUT/se_gate_tests.log" 2>&1)
      grep -E "passed|failed|^FAILED|^ERROR|SKIPPED" "$OUT/se_gate_tests.log" | tail -15
      echo "== $step took $(( $(date +%s) - t0 )) s"; continue ;;
    sm90-tests)  # the family-90 kernels against float64 (forced one by one)
      (cd /tmp && timeout "$limit" "$PYTHON" -P -m pytest -q -p no:cacheprovider \
         "$REPO/tests/python/test_conv2d_fused_sm90.py" > "$OUT/sm90_tests.log" 2>&1)
      grep -E "passed|failed|^FAILED|^ERROR" "$OUT/sm90_tests.log" | tail -15
      echo "== $step took $(( $(date +%s) - t0 )) s"; continue ;;
    sm90-backward-tests)  # the family-90 dgrad/wgrad kernels against float64 (forced one by one), then family 80's tests
      (cd /tmp && "$PYTHON" -P -c 'import cutlass_ops; n = cutlass_ops.ops.conv2d_backward_kernels(90); print(len(n), "family-90 dgrad/wgrad kernels"); assert n, "a build without CUTLASS_OPS_SM90_BACKWARD=OFF"') \
        || { echo "$step: no family-90 dgrad/wgrad kernels in this build (CUTLASS_OPS_SM90_BACKWARD=OFF?)"; continue; }
      (cd /tmp && timeout "$limit" "$PYTHON" -P -m pytest -q -p no:cacheprovider --maxfail=50 -rs \
         "$REPO/tests/python/test_conv2d_backward_sm90.py" "$REPO/tests/python/test_conv2d_backward.py" \
         > "$OUT/sm90_backward_tests.log" 2>&1)
      grep -E "passed|failed|^FAILED|^ERROR|SKIPPED" "$OUT/sm90_backward_tests.log" | tail -15
      echo "== $step took $(( $(date +%s) - t0 )) s"; continue ;;
    profile90-backward)  # family-90 dgrad/wgrad on FusedResNet's training convs -> sm90.csv, then rebuild
      gpu=$(cd /tmp && "$PYTHON" -P -c 'import torch; from cutlass_ops.tools.profiler import gpu_slug; print(gpu_slug(torch.cuda.get_device_name()))')
      (cd /tmp && timeout "$limit" "$PYTHON" -P -m cutlass_ops profile --backward --family 90 --profiles "$REPO/profiles" \
         ${PROFILE_ARGS:---batch 512 2048} 2> "$OUT/profile90_backward.log" | tail -2) || echo "$step: stopped (rc $?)"
      cp "profiles/$gpu/sm90.csv" "$OUT/sm90.csv" 2>/dev/null
      rebuild_with_profiles
      echo "== $step took $(( $(date +%s) - t0 )) s"; continue ;;
    profile90)  # the family-90 kernels on FusedResNet's convs -> profiles/<gpu>/sm90.csv, then rebuild with it
      gpu=$(cd /tmp && "$PYTHON" -P -c 'import torch; from cutlass_ops.tools.profiler import gpu_slug; print(gpu_slug(torch.cuda.get_device_name()))')
      (cd /tmp && timeout "$limit" "$PYTHON" -P -m cutlass_ops profile --family 90 --profiles "$REPO/profiles" \
         2> "$OUT/profile90.log" | tail -2) || echo "$step: stopped (rc $?)"
      cp "profiles/$gpu/sm90.csv" "$OUT/sm90.csv" 2>/dev/null
      rebuild_with_profiles
      echo "== $step took $(( $(date +%s) - t0 )) s"; continue ;;
    wheel-tests)  # the wheel in gpu_carry/ (built elsewhere), installed on its own, under the GPU tests (wheel-tests:1|2|3: a part)
      whl=$(ls gpu_carry/cutlass_ops-*.whl 2>/dev/null | head -1)
      [ -n "$whl" ] || { echo "$step: no gpu_carry/cutlass_ops-*.whl"; continue; }
      rm -rf /tmp/wheel_site && "$PYTHON" -m pip install -q --no-deps --target /tmp/wheel_site "$whl"
      echo "$step: $(basename "$whl") ($(du -m "$whl" | cut -f1) MiB)"
      (cd /tmp && PYTHONPATH=/tmp/wheel_site${PYTHONPATH:+:$PYTHONPATH} timeout "$limit" "$PYTHON" -P -c \
         "import cutlass_ops, json; print('imported from', cutlass_ops.__file__); print(json.dumps(cutlass_ops._library.build_info()))" \
       && PYTHONPATH=/tmp/wheel_site${PYTHONPATH:+:$PYTHONPATH} timeout "$limit" "$PYTHON" -P -m pytest -q -p no:cacheprovider \
         -rfE $(test_files "$n") > "$OUT/wheel_tests$(part_suffix "$n").log" 2>&1)
      grep -E "passed|failed|^FAILED|^ERROR" "$OUT/wheel_tests$(part_suffix "$n").log" | tail -8
      echo "== $step took $(( $(date +%s) - t0 )) s"; continue ;;
    sdist-tests)  # the sdist in gpu_carry/ (made elsewhere), built here (this GPU's arch; SDIST_KERNELS, default ci) into a folder of its own, under the GPU tests (sdist-tests:1|2|3: a part)
      sd=$(ls gpu_carry/cutlass_ops-*.tar.gz 2>/dev/null | head -1)
      [ -n "$sd" ] || { echo "$step: no gpu_carry/cutlass_ops-*.tar.gz"; continue; }
      rm -rf /tmp/sdist_site
      CUTLASS_OPS_ARCHS=$ARCH CUTLASS_OPS_KERNELS=${SDIST_KERNELS:-ci} timeout "$limit" "$PYTHON" -m pip install -q \
        --no-build-isolation --no-deps --target /tmp/sdist_site "$sd" > "$OUT/sdist_build.log" 2>&1 \
        || { echo "$step: the sdist did not build"; tail -20 "$OUT/sdist_build.log"; continue; }
      echo "$step: built $(basename "$sd") (archs $ARCH, kernels ${SDIST_KERNELS:-ci}) in $(( $(date +%s) - t0 )) s"
      left=$(( DEADLINE - $(date +%s) ))
      (cd /tmp && PYTHONPATH=/tmp/sdist_site${PYTHONPATH:+:$PYTHONPATH} timeout "$left" "$PYTHON" -P -m pytest -q \
         -p no:cacheprovider -rfE $(test_files "$n") > "$OUT/sdist_tests$(part_suffix "$n").log" 2>&1)
      grep -E "passed|failed|^FAILED|^ERROR" "$OUT/sdist_tests$(part_suffix "$n").log" | tail -8
      echo "== $step took $(( $(date +%s) - t0 )) s"; continue ;;
    mlp-tests)  # FusedMLP's GPU tests (kernels JIT-compiled into a fresh cache: compile times included)
      (cd /tmp && CUTLASS_OPS_CACHE=/tmp/mlp_cache timeout "$limit" "$PYTHON" -P -m pytest -q -p no:cacheprovider -rf \
         "$REPO/tests/python/test_fused_mlp.py" > "$OUT/mlp_tests.log" 2>&1)
      grep -E "passed|failed|^FAILED|^ERROR" "$OUT/mlp_tests.log" | tail -8
      echo "== $step took $(( $(date +%s) - t0 )) s"; continue ;;
    reliability)  # the reliability GPU tests: the fuzz (CUTLASS_OPS_FUZZ_CASES per op), large tensors, concurrency, bad input
      (cd /tmp && timeout "$limit" "$PYTHON" -P -m pytest -q -p no:cacheprovider -rs \
         "$REPO/tests/python/test_fuzz.py" "$REPO/tests/python/test_large_tensors.py" \
         "$REPO/tests/python/test_concurrency.py" "$REPO/tests/python/test_bad_input.py" > "$OUT/reliability.log" 2>&1)
      grep -E "passed|failed|^FAILED|^ERROR|^fuzz .* raised|SKIPPED" "$OUT/reliability.log" | tail -15
      echo "== $step took $(( $(date +%s) - t0 )) s"; continue ;;
    sanitize)  # compute-sanitizer; tools from the step's value, e.g. sanitize:memcheck,initcheck
      tools=${n//,/ }; [ "$tools" = sanitize ] && tools="memcheck racecheck initcheck synccheck"
      OUT=$OUT PYTHON=$PYTHON CUTLASS_OPS_SANITIZE_TOOLS="$tools" timeout "$limit" bash tests/gpu_sanitize.sh 2>&1 | tail -8
      echo "== $step took $(( $(date +%s) - t0 )) s"; continue ;;
    b2b)  # bench b2b at batch N (B2B_ARGS: the problem, default a ResNet-50 bottleneck pair at 56x56)
      (cd /tmp && timeout "$limit" "$PYTHON" -P -m cutlass_ops bench b2b --n "$n" ${B2B_ARGS:---hw 56 --c 64 --k 64 --k1 256} \
         --out "$OUT/b2b_n$n.json" ${BENCH_ARGS:-} 2> "$OUT/b2b_progress.log" | tee -a "$OUT/bench.txt") \
        || { echo "bench b2b N=$n: stopped (rc $?)"; tail -3 "$OUT/b2b_progress.log"; }
      echo "== $step took $(( $(date +%s) - t0 )) s"; continue ;;
    se-excite)  # bench se-excite at batch N: FusedResNet's SE gates, the excite loop vs a B2B GEMM, se_gate's map cache
      (cd /tmp && timeout "$limit" "$PYTHON" -P -m cutlass_ops bench se-excite --batch "$n" \
         --out "$OUT/se_excite_n$n.json" ${BENCH_ARGS:-} 2> "$OUT/se_excite_progress.log" | tee -a "$OUT/bench.txt") \
        || { echo "bench se-excite N=$n: stopped (rc $?)"; tail -3 "$OUT/se_excite_progress.log"; }
      echo "== $step took $(( $(date +%s) - t0 )) s"; continue ;;
    cvt-tests)  # FusedCvT and the CvT reference (CPU and CUDA tests)
      (cd /tmp && timeout "$limit" "$PYTHON" -P -m pytest -q -p no:cacheprovider -rs -k cvt \
         "$REPO/tests/python" > "$OUT/cvt_tests.log" 2>&1)
      grep -E "passed|failed|^FAILED|^ERROR|SKIPPED" "$OUT/cvt_tests.log" | tail -15
      echo "== $step took $(( $(date +%s) - t0 )) s"; continue ;;
    cvt|cvt-train)  # bench cvt: cvt:N inference at batch N, cvt-train:N a training step; merged into cvt.json
      if [ "$what" = cvt ]; then batches="--infer-batch $n --train-batch"; else batches="--infer-batch --train-batch $n"; fi
      (cd /tmp && timeout "$limit" "$PYTHON" -X faulthandler -P -m cutlass_ops bench cvt $batches --merge \
         --out "$OUT/cvt.json" ${BENCH_ARGS:-} 2> "$OUT/cvt_progress.log" > /tmp/bench_step.txt) \
        || { echo "bench $step: stopped (rc $?, timeout $limit s); last progress:"; tail -3 "$OUT/cvt_progress.log"; }
      tee -a "$OUT/bench.txt" < /tmp/bench_step.txt
      echo "== $step took $(( $(date +%s) - t0 )) s"; continue ;;
    train-check-cvt)  # 50 steps, FusedCvT vs the reference, float32 weights + fp16 autocast
      (cd /tmp && timeout "$limit" "$PYTHON" -P -m cutlass_ops train-check-cvt --steps 50 --n 16 --amp fp16 \
         --out "$OUT/train_check_cvt" 2>&1 | tail -4)
      echo "== $step took $(( $(date +%s) - t0 )) s"; continue ;;
    halo-sweep)  # docs/experiments/sm90_halo_conv: the halo variants, the persistent baseline, cuDNN
      { B=/tmp/halo_build PYTHON=$PYTHON timeout "$limit" bash docs/experiments/sm90_halo_conv/build.sh &&
        /tmp/halo_build/sweep_bench --variant haloT_t128x64_s6_w0,haloT_t128x64_s6,halo_t128x64_s6,pp_t128x64_s6_tmav \
          --out "$OUT/halo_sweep.jsonl" &&
        "$PYTHON" docs/experiments/sm90_conv3x_fprop/cudnn_fprop.py --json "$OUT/halo_cudnn.json"; } \
        > /tmp/halo_sweep.txt 2>&1 || echo "$step: stopped (rc $?)"
      grep -v "cannot implement\|ptxas\|bytes stack\|Compile time\|Function properties" /tmp/halo_sweep.txt | tail -30
      echo "== $step took $(( $(date +%s) - t0 )) s"; continue ;;
    sm90-sweep)  # docs/experiments/sm90_conv3x_fprop: stock sm90 fprop variants vs cuDNN
      OUT=$OUT timeout "$limit" bash docs/experiments/sm90_conv3x_fprop/run_sweep.sh > /tmp/sm90_sweep.txt 2>&1 \
        || echo "$step: stopped (rc $?)"
      tail -40 /tmp/sm90_sweep.txt
      echo "== $step took $(( $(date +%s) - t0 )) s"; continue ;;
  esac
  # resnet:N / train:N run what the profiles decide per conv (CUTLASS_OPS_SM90 unset);
  # resnet-sm90:N / train-sm90:N the family-90 kernels first (CUTLASS_OPS_SM90=1), -sm80 none.
  unset CUTLASS_OPS_SM90
  case $what in *-sm90) what=${what%-sm90}; export CUTLASS_OPS_SM90=1; out="$OUT/${what}_sm90.json" ;;
                *-sm80) what=${what%-sm80}; export CUTLASS_OPS_SM90=0; out="$OUT/${what}_sm80.json" ;;
                *) out="$OUT/$what.json" ;; esac
  (cd /tmp && timeout "$limit" "$PYTHON" -X faulthandler -P -m cutlass_ops bench "$what" --batch $n --merge \
     --out "$out" ${BENCH_ARGS:-} 2> "$OUT/${what}_progress.log" > /tmp/bench_step.txt) \
    || { echo "bench $what N=$n: stopped (rc $?, timeout $limit s); last progress:"; grep -v "^ *$" "$OUT/${what}_progress.log" | tail -${PROGRESS_TAIL:-3}; }
  grep -v "^ \{5,\}[0-9.]\+ \+_ZN7cutlass" /tmp/bench_step.txt | tee -a "$OUT/bench.txt"
  echo "== bench $what N=$n took $(( $(date +%s) - t0 )) s"
done
rm -f "$OUT"/*_progress.log
# PACK_CACHE=1 (packing a GiB takes a minute): the device tool returns files of up to 16 MiB: the whole cache if it fits, else without
# the compiled code (triton/, fxgraph/: rebuilt in seconds) but with the autotuning results
# (what saves the compile's minutes).
[ "${PACK_CACHE:-0}" = 1 ] && (cd "$TORCHINDUCTOR_CACHE_DIR" && tar -czf "$OUT/inductor_cache.tgz" --exclude=.from_carry . 2>/dev/null
 [ "$(stat -c %s "$OUT/inductor_cache.tgz")" -lt 16000000 ] \
   || tar -czf "$OUT/inductor_cache.tgz" --exclude=.from_carry --exclude=./triton --exclude=./fxgraph . 2>/dev/null
 [ "$(stat -c %s "$OUT/inductor_cache.tgz")" -lt 16000000 ] || rm -f "$OUT/inductor_cache.tgz")
ls -la "$OUT"
echo "== done in $(( $(date +%s) - start )) s"
