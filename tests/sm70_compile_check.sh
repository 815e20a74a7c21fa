#!/usr/bin/env bash
# Compile-only check for sm_70 of the generator's Volta (Sm70, mma 8x8x4) kernel instances
# and of the hand-written kernels (kernels/*/*_kernel.cu, built for every arch).
# CUDA 13 (/usr/local/cuda) dropped sm_70, so this uses Debian bookworm's CUDA 11.8
# (non-free `nvidia-cuda-toolkit`, nvcc in /usr/bin) with g++-11: with gcc 12 its host pass
# fails.  Nothing is run; no GPU needed.
#   usage: tests/sm70_compile_check.sh [--install [--keep]]
#   --install: apt-get the toolchain (root) when missing, and remove what it installed when
#   done: its packages put CUDA 11.8's headers (cusparse.h among them) into /usr/include,
#   where every later build would find them, so a second CI run on this machine would no
#   longer test a clean one.  --keep leaves them installed.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# Any Python with the nvidia-cutlass wheel (for its headers).
PYTHON=${PYTHON:-python3}
# An absolute path: /usr/local/bin/nvcc (CUDA 13) comes first on PATH.
NVCC=${SM70_NVCC:-/usr/bin/nvcc}

have_toolchain() {
  [ -x "$NVCC" ] && grep -q 'release 11\.8' <<< "$("$NVCC" --version)" && command -v g++-11 >/dev/null
}

installed_by_us=
if ! have_toolchain; then
  if [ "${1:-}" != --install ]; then
    echo "error: needs CUDA 11.8 nvcc at $NVCC and g++-11; rerun with --install (as root), i.e." >&2
    echo "  enable Debian 'contrib non-free' and: apt-get install nvidia-cuda-toolkit g++-11" >&2
    exit 2
  fi
  # The toolkit is in non-free; add the components in a file of our own rather than
  # editing the distribution's sources.
  src=/etc/apt/sources.list.d/debian-nonfree.sources
  if ! grep -q 'Candidate: 11\.8' <<< "$(apt-cache policy nvidia-cuda-toolkit 2>/dev/null)"; then
    printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' \
      'Suites: bookworm bookworm-updates' 'Components: contrib non-free non-free-firmware' \
      'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' > "$src"
    apt-get update -q
  fi
  before=$(mktemp)
  dpkg-query -W -f='${Package}\n' | sort > "$before"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    nvidia-cuda-toolkit g++-11
  installed_by_us=$(dpkg-query -W -f='${Package}\n' | sort | comm -13 "$before" -)
  rm -f "$before"
  if [ "${2:-}" != --keep ] && [ -n "$installed_by_us" ]; then
    remove_toolchain() {
      echo "== removing the $(echo "$installed_by_us" | wc -l) packages this check installed (--keep keeps them)"
      # shellcheck disable=SC2086 # one package name per word
      DEBIAN_FRONTEND=noninteractive apt-get purge -y -q $installed_by_us > /dev/null
    }
    trap remove_toolchain EXIT
  fi
  have_toolchain || { echo "error: CUDA 11.8 nvcc / g++-11 still missing after install" >&2; exit 2; }
fi
"$NVCC" --version | grep release

CUTLASS=$("$PYTHON" -c 'import cutlass_library,os;print(os.path.dirname(cutlass_library.__file__))')/source
OUT=$(mktemp -d)
if [ -n "$installed_by_us" ] && [ "${2:-}" != --keep ]; then
  trap 'rm -rf "$OUT"; remove_toolchain' EXIT
else
  trap 'rm -rf "$OUT"' EXIT
fi
PYTHONPATH="$REPO/python" "$PYTHON" -m cutlass_ops_gen --archs 70 --kernels all --out "$OUT/gen" \
  > "$OUT/gen.log" 2>&1 || { cat "$OUT/gen.log" >&2; exit 1; }
tail -n 1 "$OUT/gen.log"

shopt -s nullglob
passed=0 failed=0
# The generated Sm70 CUTLASS instances, and the hand-written kernels (built for every arch).
for cu in "$OUT"/gen/*_sm70_*.cu "$REPO"/kernels/*/*_kernel.cu; do
  name=$(basename "$cu" .cu)
  start=$SECONDS
  # nvcc finds ptxas/cudafe++/fatbinary on PATH, where /usr/local/bin has CUDA 13 wrappers
  # that reject sm_70: put 11.8's directory first, for this call only.
  if PATH="$(dirname "$NVCC"):$PATH" "$NVCC" -std=c++17 -O3 --expt-relaxed-constexpr -DNDEBUG \
       -gencode arch=compute_70,code=sm_70 -ccbin g++-11 \
       -I"$CUTLASS/include" -I"$CUTLASS/tools/util/include" -I"$REPO/kernels" \
       -c "$cu" -o "$OUT/$name.o" > "$OUT/$name.log" 2>&1; then
    echo "ok   $name ($((SECONDS - start)) s)"; passed=$((passed + 1))
  else
    echo "FAIL $name ($((SECONDS - start)) s)"; failed=$((failed + 1))
    head -c 4000 "$OUT/$name.log"   # the first errors are the useful ones
  fi
done
# A generator that emits no Sm70 instance would otherwise "pass".
[ $((passed + failed)) -gt 0 ] || { echo "error: no *_sm70_*.cu emitted" >&2; failed=1; }
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
