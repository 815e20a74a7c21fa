#!/usr/bin/env bash
# The test command (README): builds and installs cutlass_ops into the current Python with
# the C++ tests, then runs pytest (numerics, errors, registration) and ctest (a generated
# kernel vs CUTLASS's host reference; the generator's unit tests).  GPU tests skip without
# a GPU.  Honours CUTLASS_OPS_ARCHS / CUTLASS_OPS_KERNELS / MAX_JOBS (see README).
# Set CUTLASS_OPS_SKIP_BUILD=1 to test an already built tree in ./build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
BUILD_DIR=${BUILD_DIR:-build}

if [ "${CUTLASS_OPS_SKIP_BUILD:-0}" != 1 ]; then
  echo "== build and install (archs: ${CUTLASS_OPS_ARCHS:-auto}, kernels: ${CUTLASS_OPS_KERNELS:-all})"
  start=$(date +%s)
  CUTLASS_OPS_BUILD_TESTS=ON "$PYTHON" -m pip install --no-build-isolation --no-deps -q . \
    -Cbuild-dir="$BUILD_DIR" -Cbuild.verbose=true
  echo "== build took $(( $(date +%s) - start )) s"
fi

echo "== pytest"
# -P: keep the source folder (which has no compiled library) off sys.path, so the
# installed package is the one imported.
"$PYTHON" -P -m pytest -p no:cacheprovider -ra "$@" || rc_py=$?

echo "== ctest"
ctest --test-dir "$BUILD_DIR" --output-on-failure || rc_ct=$?

exit $(( ${rc_py:-0} || ${rc_ct:-0} ))
