#!/usr/bin/env bash
# Build the stable-ABI PoC and the regular-API control against torch 2.11,
# then load both into torch 2.11 and torch 2.14.1.  CPU only, one compile at a
# time.  Override the venvs with VENV_BUILD / VENV_NEW.
set -u
cd "$(dirname "$0")"
VENV_BUILD=${VENV_BUILD:-/tmp/venv211}
VENV_NEW=${VENV_NEW:-/tmp/cutlass_ops_ci_venv}
T=$("$VENV_BUILD/bin/python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
mkdir -p build
# 2.11 as a 64-bit TORCH_ABI_VERSION: [major][minor][patch][...abi tag].
# With this defined, every non-stable torch header #errors if included.
TARGET=0x020b000000000000

echo "== build against $("$VENV_BUILD/bin/python" -c 'import torch; print(torch.__version__)') ($T)"
set -x
g++ -std=c++17 -O2 -fPIC -shared -DTORCH_TARGET_VERSION=$TARGET \
    -I"$T/include" stable_op.cpp -o build/libstable_op.so -L"$T/lib" -ltorch_cpu || exit 1
/usr/local/cuda/bin/nvcc -std=c++17 -O2 -Xcompiler -fPIC -shared -arch=sm_90 -DUSE_CUDA \
    -DTORCH_TARGET_VERSION=$TARGET -I"$T/include" stable_op_cuda.cu \
    -o build/libstable_op_cuda.so -L"$T/lib" -ltorch_cuda -ltorch_cpu || exit 1
g++ -std=c++17 -O2 -fPIC -shared \
    -I"$T/include" -I"$T/include/torch/csrc/api/include" unstable_op.cpp \
    -o build/libunstable_op.so -L"$T/lib" -ltorch_cpu -lc10 || exit 1
set +x

echo "== undefined C++ (mangled) torch symbols each library needs"
for l in stable_op stable_op_cuda unstable_op; do
  u=$(nm -D --undefined-only build/lib$l.so | awk '{print $2}')
  n=$(echo "$u" | c++filt | grep -cE '(^|[ *&(<])(c10|at|torch|caffe2)::')
  c=$(echo "$u" | grep -cE '^(aoti_torch_|torch_)')
  echo "lib$l.so: $n C++ c10::/at::/torch:: symbols, $c C shim symbols (aoti_torch_*/torch_*)"
done

echo "== check a non-stable header is refused under TORCH_TARGET_VERSION"
printf '#include <ATen/ATen.h>\n' > build/probe.cpp
g++ -std=c++17 -fsyntax-only -DTORCH_TARGET_VERSION=$TARGET -I"$T/include" \
    -I"$T/include/torch/csrc/api/include" build/probe.cpp 2>&1 | grep -m1 'error' || echo "(no error?)"

rc=0
for py in "$VENV_BUILD/bin/python" "$VENV_NEW/bin/python"; do
  for l in stable unstable; do
    echo "== $l op in $("$py" -c 'import torch; print(torch.__version__)')"
    extra=; [ $l = stable ] && extra="$PWD/build/libstable_op_cuda.so"
    "$py" check.py $l "$PWD/build/lib${l}_op.so" $extra 2>&1
    echo "   (exit ${PIPESTATUS[0]})"
  done
done
