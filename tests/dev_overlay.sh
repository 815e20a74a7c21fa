#!/usr/bin/env bash
# Run the pure-Python parts of a source checkout against an already installed cutlass_ops op
# library, without rebuilding: makes an overlay package (this checkout's whole cutlass_ops/ Python tree,
# every subpackage included, copied, plus the installed package's compiled library,
# build_info.json and mlp_aot/) and runs the
# given command with it and python/ (cutlass_ops_gen) first on PYTHONPATH.  The installed
# library must come from a build of compatible C++ sources (e.g. main at the branch point).
#   PYTHON=/tmp/cutlass_ops_ci_venv/bin/python bash tests/dev_overlay.sh -m pytest -q tests/python/test_fused_mlp.py
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=${PYTHON:-python3}
INSTALLED=$(cd / && "$PYTHON" -P -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("cutlass_ops").origin))')
OVERLAY=$(mktemp -d /tmp/cutlass_ops_overlay.XXXXXX)
trap 'rm -rf "$OVERLAY"' EXIT
# copies, not links: _library.py finds the library beside its resolved path
(cd "$ROOT" && find cutlass_ops -name '*.py' -not -path '*/__pycache__/*' -print0) |
  while IFS= read -r -d '' f; do mkdir -p "$OVERLAY/$(dirname "$f")" && cp "$ROOT/$f" "$OVERLAY/$f"; done
# the compiled parts: the op library, its build facts and FusedMLP's ahead-of-time kernels (if any)
for f in "$INSTALLED"/libcutlass_ops_C*.so "$INSTALLED"/build_info.json "$INSTALLED"/mlp_aot; do
  [ -e "$f" ] && ln -s "$f" "$OVERLAY/cutlass_ops/"
done
cd "$ROOT"
# -P: the checkout root (cwd) stays off sys.path, so the overlay is what `import cutlass_ops` finds
PYTHONPATH="$OVERLAY:$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -P "$@"
