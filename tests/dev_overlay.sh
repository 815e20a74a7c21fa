#!/usr/bin/env bash
# Run the pure-Python parts of a source checkout against an already installed cutlass_ops op
# library, without rebuilding: makes an overlay package (this checkout's cutlass_ops/*.py, tools/*.py and models/*.py,
# copied, plus the installed package's compiled library, build_info.json and mlp_aot/) and runs the
# given command with it and python/ (cutlass_ops_gen) first on PYTHONPATH.  The installed
# library must come from a build of compatible C++ sources (e.g. main at the branch point).
#   PYTHON=/tmp/cutlass_ops_ci_venv/bin/python bash tests/dev_overlay.sh -m pytest -q tests/python/test_fused_mlp.py
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=${PYTHON:-python3}
INSTALLED=$(cd / && "$PYTHON" -P -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("cutlass_ops").origin))')
OVERLAY=$(mktemp -d /tmp/cutlass_ops_overlay.XXXXXX)
trap 'rm -rf "$OVERLAY"' EXIT
mkdir "$OVERLAY/cutlass_ops"
cp "$ROOT"/cutlass_ops/*.py "$OVERLAY/cutlass_ops/"  # copies: _library.py finds the library beside its resolved path
for sub in tools models; do mkdir "$OVERLAY/cutlass_ops/$sub" && cp "$ROOT/cutlass_ops/$sub"/*.py "$OVERLAY/cutlass_ops/$sub/"; done
# the compiled parts: the op library, its build facts and FusedMLP's ahead-of-time kernels (if any)
for f in "$INSTALLED"/libcutlass_ops_C*.so "$INSTALLED"/build_info.json "$INSTALLED"/mlp_aot; do
  [ -e "$f" ] && ln -s "$f" "$OVERLAY/cutlass_ops/"
done
cd "$ROOT"
# -P: the checkout root (cwd) stays off sys.path, so the overlay is what `import cutlass_ops` finds
PYTHONPATH="$OVERLAY:$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -P "$@"
