"""What the build instantiates: op families x dtype x arch family x alignment x tile.

An *arch family* is the CUTLASS architecture tag the kernels are written for.  Family 80
(Ampere ``mma.sync`` 16x8x16, cp.async pipelines) is compiled for every requested arch
>= 80 (sm80, sm86, sm90 all run it).  Family 70 (Volta ``mma`` 8x8x4, two-stage pipeline)
is compiled for sm70..sm75 (Turing runs the Volta mma too); sm70 needs a CUDA 11.8/12.x
toolkit (CUDA 13 dropped sm70/sm72).  Family 90 (Hopper: CUTLASS 3.x, TMA im2col + wgmma,
warp-specialized) is built when the archs contain 90, for sm_90a only (its code runs on
sm90 and nothing else); on sm90 the dispatcher tries it where the profile measured it faster,
then family 80.  It has conv2d_fused, fp16/bf16 at alignment 8 (TMA needs 16-byte aligned
channels), and with ``sm90_backward`` (the generator's --sm90-backward, which CMake passes
unless CUTLASS_OPS_SM90_BACKWARD=OFF) conv2d_dgrad and conv2d_wgrad too.

Kernel sets:
  ``all`` - every dtype and alignment, the default tiles (or the profiled winners).
  ``ci``  - the smallest set that still exercises the build and the alignment fallback:
            fp16 and bf16, alignments 8 and 1, one tile each; family 90: one fp16 kernel.
  ``sweep`` - ``all`` plus the profiler's candidate tiles (tiles.SWEEP_TILES) for fp16,
            alignment 8: what ``python -m cutlass_ops profile`` measures.
Family 70 has fp16 only (Volta has no bf16 tensor cores) and alignment 8 only.

The conv backward families (conv2d_dgrad, conv2d_wgrad; the training path) are built for
family 80 at alignment 8 only, in every kernel set, and for family 90 (alignment 8) only with
``sm90_backward``; other shapes and GPUs take the ATen (cuDNN) composite.
"""
from __future__ import annotations

from dataclasses import dataclass

# Element types the fused conv supports, by the name the dispatch table uses.
DTYPES = ("f16", "bf16")

# Channel alignments (elements) with one instance set each.  The op picks the largest one
# that divides both the input and the output channel count (and the pointers' alignment).
ALIGNMENTS = (8, 4, 2, 1)

KERNEL_SETS = ("all", "ci", "sweep")


def arch_families(archs: list[int]) -> list[int]:
    """The kernel families needed to cover the requested SM archs."""
    families = set()
    for arch in archs:
        if arch == 90:
            families.add(90)  # sm_90a code; sm90 runs the family-80 kernels too
        if arch >= 80:
            families.add(80)
        elif arch >= 70:
            families.add(70)
        else:
            raise ValueError(f"sm{arch} is not supported: cutlass_ops needs sm70 or newer")
    return sorted(families)


@dataclass(frozen=True)
class OpFamily:
    """One op family: its name in the dispatch tables, the CUTLASS conv kind, the epilogue,
    and which arch families / channel alignments it is instantiated for (None: all)."""
    name: str
    conv_kind: str  # "fprop", "dgrad" or "wgrad"
    epilogue: str
    doc: str
    families: tuple[int, ...] | None = None
    alignments: tuple[int, ...] | None = None


CONV2D_FUSED = OpFamily(
    name="conv2d_fused",
    conv_kind="fprop",
    epilogue="cutlass_ops::epilogue::FusedConvEpilogue",  # family 90: the EVT in conv2d_fused_sm90_epilogue.h
    doc="implicit-GEMM conv2d fprop, NHWC, y = act(scale*conv + bias [+ residual]) + post_bias",
)

# The training path's convs.  Stock LinearCombination epilogues: dgrad's alpha is read from
# a device pointer (the FixUp scale), wgrad writes float32 partial sums per split-K slice.
CONV2D_DGRAD = OpFamily(
    name="conv2d_dgrad",
    conv_kind="dgrad",
    epilogue="cutlass::epilogue::thread::LinearCombination",
    doc="implicit-GEMM conv2d dgrad, NHWC, dx = scale * dgrad(dy, w)",
    families=(80, 90),  # family 90 only with sm90_backward
    alignments=(8,),
)

CONV2D_WGRAD = OpFamily(
    name="conv2d_wgrad",
    conv_kind="wgrad",
    epilogue="cutlass::epilogue::thread::LinearCombination",
    doc="implicit-GEMM conv2d wgrad, NHWC, float32 dw (one partial sum per split-K slice)",
    families=(80, 90),  # family 90 only with sm90_backward
    alignments=(8,),
)

OP_FAMILIES = (CONV2D_FUSED, CONV2D_DGRAD, CONV2D_WGRAD)
OP_FAMILY = {op.name: op for op in OP_FAMILIES}


@dataclass(frozen=True)
class InstanceKey:
    """What the run-time dispatch matches on before it looks at tile shapes."""
    op: str
    family: int
    dtype: str
    alignment: int


def instance_keys(archs: list[int], kernel_set: str, sm90_backward: bool = False) -> list[InstanceKey]:
    """The keys a build instantiates.  ``sm90_backward`` adds family 90's conv2d_dgrad and
    conv2d_wgrad (only when the archs contain 90)."""
    if kernel_set not in KERNEL_SETS:
        raise ValueError(f"unknown kernel set {kernel_set!r}; choose one of {KERNEL_SETS}")
    keys = []
    for family in arch_families(archs):
        # Volta tensor cores have no bf16; the CI set compiles one (fp16) Hopper kernel.
        dtypes = ("f16",) if family == 70 or (family == 90 and kernel_set == "ci") else DTYPES
        if family in (70, 90):
            # CUTLASS's Volta conv kernels are written for 128-bit accesses only, and TMA needs
            # 16-byte aligned channels; other channel counts take family 80 (sm90) or the
            # ATen fallback (Volta).
            alignments = (8,)
        else:
            alignments = (8, 1) if kernel_set == "ci" else ALIGNMENTS
        for op in OP_FAMILIES:
            if op.families is not None and family not in op.families:
                continue
            if family == 90 and op.conv_kind != "fprop" and not sm90_backward:
                continue
            for dtype in dtypes:
                for alignment in op.alignments or alignments:
                    keys.append(InstanceKey(op.name, family, dtype, alignment))
    return keys
