"""Turns instance keys + tiles into CUTLASS operation descriptions and CUDA sources.

The CUTLASS emitter (``EmitConv2dInstance``) writes the ``DefaultConv2dFprop<...>::Kernel``
alias.  Two adjustments make it emit our fused kernels:
  * its kernel template is swapped for ``DefaultConv2dFpropWithBroadcast`` (same parameter
    list), whose epilogue also streams a per-output-channel vector (the bias);
  * our epilogue functor is registered in its ``EpilogueFunctorTag`` table.
Its ``procedural_name()`` leaves the epilogue (and the op) out, so names are ours.

Family 90 (Hopper, CUTLASS 3.x) instances are not emitted through cutlass_library: each
names ``Sm90FusedConv<element, tile, cluster, stages>`` from
kernels/conv2d_fused/conv2d_fused_sm90_instance.cuh (the 3.x conv builders plus the fused
epilogue visitor tree), with one launcher function like the family-80 instances'; a tile with a
schedule (coop, pp: off by default) names ``Sm90FusedConvPersistent<..., kernel schedule>`` from
conv2d_fused_sm90_persistent_instance.cuh instead (CUTLASS's persistent GEMM kernels running the
conv mainloop, same epilogue).

Family-90 dgrad/wgrad instances (only with --sm90-backward) name ``Sm90BackwardConv<element,
kDgrad|kWgrad, tile, cluster, stages>`` from kernels/conv2d_backward/conv2d_backward_sm90_instance.cuh
(CUTLASS 4.2's stock sm90 conv kernels; dgrad unity stride only, so its names carry ``_unity``).

The backward families (conv2d_dgrad, conv2d_wgrad) keep the stock ``DefaultConv2dDgrad`` /
``DefaultConv2dWgrad`` kernels and ``LinearCombination``; dgrad comes as a unity-stride
kernel and a strided one (CUTLASS's strided-dgrad kernel with its own swizzle, which runs
one sub-GEMM per stride phase instead of multiplying the zeros a stride inserts).
"""
from __future__ import annotations

from dataclasses import dataclass

from cutlass_library import library as cl
from cutlass_library.conv2d_operation import Conv2dOperation, EmitConv2dInstance

from .manifest import CONV2D_FUSED, OP_FAMILY, InstanceKey
from .tiles import SM90_SCHEDULES, Sm90Tile, Tile

_DTYPE = {"f16": cl.DataType.f16, "bf16": cl.DataType.bf16}
_DTYPE_ENUM = {"f16": "DType::kF16", "bf16": "DType::kBF16"}
_CUTLASS_ELEMENT = {"f16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t"}
_ITERATOR = {"optimized": cl.IteratorAlgorithm.Optimized, "analytic": cl.IteratorAlgorithm.Analytic}


class FusedEpilogue:
    """Keys for cl.EpilogueFunctorTag: the emitter only looks the functor's C++ name up."""
    CONV2D_FUSED = "cutlass_ops.conv2d_fused"


cl.EpilogueFunctorTag[FusedEpilogue.CONV2D_FUSED] = CONV2D_FUSED.epilogue


def _math_instruction(family: int, dtype: str) -> cl.MathInstruction:
    element = _DTYPE[dtype]
    shape = [8, 8, 4] if family == 70 else [16, 8, 16]
    return cl.MathInstruction(shape, element, element, cl.DataType.f32,
                              cl.OpcodeClass.TensorOp, cl.MathOperation.multiply_add)


def kernel_name(key: InstanceKey, tile: Tile | Sm90Tile, strided_dgrad: bool | None = None) -> str:
    """Unique C++ name: op, dtype, family, tile, [dgrad stride support,] alignment
    (profiles match on this too)."""
    variant = "" if strided_dgrad is None else ("_strided" if strided_dgrad else "_unity")
    return f"cutlass_ops_{key.op}_{key.dtype}_sm{key.family}_{tile.name}{variant}_align{key.alignment}"


def conv_kind(key: InstanceKey) -> str:
    return OP_FAMILY[key.op].conv_kind


def dgrad_variants(key: InstanceKey) -> list[bool | None]:
    """Per tile: [False, True] (unity-stride and strided kernels) for dgrad, else [None].
    Family 90's dgrad is unity-stride only (CUTLASS 4.2 has no sm90 strided dgrad): [False]."""
    if conv_kind(key) != "dgrad":
        return [None]
    return [False] if key.family == 90 else [False, True]


def conv2d_operation(key: InstanceKey, tile: Tile, strided_dgrad: bool | None = None) -> Conv2dOperation:
    math = _math_instruction(key.family, key.dtype)
    td = cl.TileDescription(list(tile.threadblock), tile.stages, list(tile.warps), math,
                            key.family, 1024)
    element = _DTYPE[key.dtype]
    a = cl.TensorDescription(element, cl.LayoutType.TensorNHWC, key.alignment)
    b = cl.TensorDescription(element, cl.LayoutType.TensorNHWC, key.alignment)
    kind = conv_kind(key)
    if kind == "fprop":
        c = cl.TensorDescription(element, cl.LayoutType.TensorNHWC, key.alignment)
        return Conv2dOperation(cl.ConvKind.Fprop, _ITERATOR[tile.iterator], key.family, td, a, b, c,
                               cl.DataType.f32, cl.StrideSupport.Strided,
                               epilogue_functor=FusedEpilogue.CONV2D_FUSED,
                               swizzling_functor=cl.SwizzlingFunctor.Identity4)
    if kind == "dgrad":
        c = cl.TensorDescription(element, cl.LayoutType.TensorNHWC, key.alignment)
        stride = cl.StrideSupport.Strided if strided_dgrad else cl.StrideSupport.Unity
        swizzle = cl.SwizzlingFunctor.StridedDgradIdentity1 if strided_dgrad else cl.SwizzlingFunctor.Identity4
        return Conv2dOperation(cl.ConvKind.Dgrad, _ITERATOR[tile.iterator], key.family, td, a, b, c,
                               cl.DataType.f32, stride, epilogue_functor=cl.EpilogueFunctor.LinearCombination,
                               swizzling_functor=swizzle)
    # wgrad: float32 output (4 floats per 128-bit access), so dw is not rounded to 16 bits.
    c = cl.TensorDescription(cl.DataType.f32, cl.LayoutType.TensorNHWC, 4)
    return Conv2dOperation(cl.ConvKind.Wgrad, _ITERATOR[tile.iterator], key.family, td, a, b, c,
                           cl.DataType.f32, cl.StrideSupport.Strided,
                           epilogue_functor=cl.EpilogueFunctor.LinearCombination,
                           swizzling_functor=cl.SwizzlingFunctor.Identity4)


def _emitter(kind: str = "fprop") -> EmitConv2dInstance:
    em = EmitConv2dInstance()
    default = "cutlass::conv::kernel::DefaultConv2d${conv_kind_name}<"
    if default not in em.template:
        raise RuntimeError("cutlass_library's conv2d template changed; update emitter.py")
    if kind == "fprop":
        em.template = em.template.replace(default, "cutlass::conv::kernel::DefaultConv2dFpropWithBroadcast<")
    return em


@dataclass
class Instance:
    key: InstanceKey
    tile: Tile | Sm90Tile
    name: str
    source: str          # file name inside the output directory
    tile_origin: str     # "default" or "profile <gpu>"
    strided_dgrad: bool | None = None  # dgrad only: the strided kernel (else unity stride)

    @property
    def conv_kind(self) -> str:
        return conv_kind(self.key)


_INSTANCE_TEMPLATE = """\
// Generated by cutlass_ops_gen from the op manifest; do not edit.
// {doc}
// tiles: {origin}
#include "conv2d_fused/conv2d_fused_instance.cuh"

{emitted}
namespace cutlass_ops {{
namespace conv2d_fused {{

cutlass::Status {name}(Conv2dFusedArgs const& args, cudaStream_t stream) {{
  return run_instance<{name}_base>(args, stream);
}}

}}  // namespace conv2d_fused
}}  // namespace cutlass_ops
"""


_SM90_INSTANCE_TEMPLATE = """\
// Generated by cutlass_ops_gen from the op manifest; do not edit.
// {doc}
// family 90 (sm_90a, CUTLASS 3.x TMA + wgmma); tiles: {origin}
#include "conv2d_fused/conv2d_fused_sm90_instance.cuh"

namespace cutlass_ops {{
namespace conv2d_fused {{

// element, tile M, N, K, cluster M, N, stages (0: automatic), epilogue schedule
using {name}_base = Sm90FusedConv<{element}, {m}, {n}, {k}, {cluster_m}, {cluster_n}, {stages},
                                  cutlass::epilogue::TmaWarpSpecialized>;

cutlass::Status {name}(Conv2dFusedArgs const& args, cudaStream_t stream) {{
  return run_sm90_instance<{name}_base>(args, stream);
}}

}}  // namespace conv2d_fused
}}  // namespace cutlass_ops
"""


_BACKWARD_INSTANCE_TEMPLATE = """\
// Generated by cutlass_ops_gen from the op manifest; do not edit.
// {doc}
// tiles: {origin}
#include "conv2d_backward/conv2d_backward_instance.cuh"

{emitted}
namespace cutlass_ops {{
namespace conv2d_backward {{

cutlass::Status {name}(Conv2dBackwardArgs const& args, cudaStream_t stream, bool query) {{
  return run_instance<{name}_base>(args, stream, query);
}}

}}  // namespace conv2d_backward
}}  // namespace cutlass_ops
"""


_SM90_PERSISTENT_INSTANCE_TEMPLATE = """\
// Generated by cutlass_ops_gen from the op manifest; do not edit.
// {doc}
// family 90 (sm_90a, CUTLASS 3.x TMA + wgmma), persistent {schedule} kernel; tiles: {origin}
#include "conv2d_fused/conv2d_fused_sm90_persistent_instance.cuh"

namespace cutlass_ops {{
namespace conv2d_fused {{

// element, tile M, N, K, cluster M, N, stages (0: automatic), kernel schedule
using {name}_base = Sm90FusedConvPersistent<{element}, {m}, {n}, {k}, {cluster_m}, {cluster_n}, {stages},
                                            {kernel_schedule}>;

cutlass::Status {name}(Conv2dFusedArgs const& args, cudaStream_t stream) {{
  return run_sm90_instance<{name}_base>(args, stream);
}}

}}  // namespace conv2d_fused
}}  // namespace cutlass_ops
"""


_SM90_BACKWARD_INSTANCE_TEMPLATE = """\
// Generated by cutlass_ops_gen from the op manifest; do not edit.
// {doc}
// family 90 (sm_90a, CUTLASS 3.x TMA + wgmma; built with CUTLASS_OPS_SM90_BACKWARD=1); tiles: {origin}
#include "conv2d_backward/conv2d_backward_sm90_instance.cuh"

namespace cutlass_ops {{
namespace conv2d_backward {{

// element, conv kind, tile M, N, K, cluster M, N, stages (0: automatic)
using {name}_base = Sm90BackwardConv<{element}, cutlass::conv::Operator::{conv_op}, {m}, {n}, {k},
                                     {cluster_m}, {cluster_n}, {stages}>;

cutlass::Status {name}(Conv2dBackwardArgs const& args, cudaStream_t stream, bool query) {{
  return run_sm90_instance<{name}_base>(args, stream, query);
}}

}}  // namespace conv2d_backward
}}  // namespace cutlass_ops
"""


def emit_sm90_backward_instance(key: InstanceKey, tile: Sm90Tile, origin: str) -> tuple[Instance, str]:
    kind = conv_kind(key)
    if kind not in ("dgrad", "wgrad") or key.alignment != 8 or key.dtype not in _CUTLASS_ELEMENT:
        raise ValueError(f"family-90 backward kernels are dgrad/wgrad fp16/bf16 alignment 8 only, not {key}")
    if tile.schedule:
        raise ValueError(f"family-90 dgrad/wgrad have the stock kernel only, not schedule {tile.schedule!r}")
    strided_dgrad = False if kind == "dgrad" else None  # unity stride only
    name = kernel_name(key, tile, strided_dgrad)
    m, n, k = tile.threadblock
    text = _SM90_BACKWARD_INSTANCE_TEMPLATE.format(
        doc=OP_FAMILY[key.op].doc, origin=origin, name=name, element=_CUTLASS_ELEMENT[key.dtype],
        conv_op="kDgrad" if kind == "dgrad" else "kWgrad", m=m, n=n, k=k, cluster_m=tile.cluster[0],
        cluster_n=tile.cluster[1], stages=tile.stages)
    return Instance(key, tile, name, f"{name}.cu", origin, strided_dgrad), text


def emit_sm90_instance(key: InstanceKey, tile: Sm90Tile, origin: str) -> tuple[Instance, str]:
    if conv_kind(key) in ("dgrad", "wgrad"):
        return emit_sm90_backward_instance(key, tile, origin)
    if conv_kind(key) != "fprop" or key.alignment != 8 or key.dtype not in _CUTLASS_ELEMENT:
        raise ValueError(f"family 90 has conv2d_fused fp16/bf16 alignment 8 only, not {key}")
    name = kernel_name(key, tile)
    m, n, k = tile.threadblock
    template = _SM90_PERSISTENT_INSTANCE_TEMPLATE if tile.schedule else _SM90_INSTANCE_TEMPLATE
    text = template.format(
        doc=OP_FAMILY[key.op].doc, origin=origin, name=name, element=_CUTLASS_ELEMENT[key.dtype],
        m=m, n=n, k=k, cluster_m=tile.cluster[0], cluster_n=tile.cluster[1], stages=tile.stages,
        schedule=tile.schedule, kernel_schedule=SM90_SCHEDULES.get(tile.schedule, ""))
    return Instance(key, tile, name, f"{name}.cu", origin), text


def emit_instance(key: InstanceKey, tile: Tile | Sm90Tile, origin: str,
                  strided_dgrad: bool | None = None) -> tuple[Instance, str]:
    if key.family == 90:
        return emit_sm90_instance(key, tile, origin)
    op = conv2d_operation(key, tile, strided_dgrad)
    name = kernel_name(key, tile, strided_dgrad)
    kind = conv_kind(key)
    emitted = _emitter(kind).emit(op).replace(op.procedural_name(), name)
    template = _INSTANCE_TEMPLATE if kind == "fprop" else _BACKWARD_INSTANCE_TEMPLATE
    text = template.format(doc=OP_FAMILY[key.op].doc, origin=origin, emitted=emitted, name=name)
    return Instance(key, tile, name, f"{name}.cu", origin, strided_dgrad), text


def _by_gpu(rules: list) -> tuple[list, list[tuple[str, int, int]]]:
    """(key, rule) pairs grouped by the GPU that measured them (sorted by its name, each
    GPU's rules in their order), and per GPU (name, first, count) into that list."""
    ordered = sorted(rules, key=lambda kr: kr[1].gpu)  # stable: a GPU's rules keep their order
    gpus: list[tuple[str, int, int]] = []
    for n, (_, rule) in enumerate(ordered):
        if gpus and gpus[-1][0] == rule.gpu:
            gpus[-1] = (rule.gpu, gpus[-1][1], gpus[-1][2] + 1)
        else:
            gpus.append((rule.gpu, n, 1))
    return ordered, gpus


def _table_file(comment: str, family: str, decls: str, rows: list[str], num_kernels: int,
                rule_rows: list[str], num_rules: int, gpus: list[tuple[str, int, int]]) -> str:
    """A generated dispatch table source: kernel declarations, kKernels, kProfileRules (grouped
    by GPU) and kProfileGpus (each GPU's slice of kProfileRules)."""
    gpu_rows = [f'  {{"{gpu}", {first}, {count}}},' for gpu, first, count in gpus] or ['  {"", 0, 0},']
    return f"""\
{comment}
#include "{family}/{family}_dispatch.h"

namespace cutlass_ops {{
namespace {family} {{

{decls}

const KernelEntry kKernels[] = {{
{chr(10).join(rows)}
}};
const int kNumKernels = {num_kernels};

const ProfileRule kProfileRules[] = {{
{chr(10).join(rule_rows)}
}};
const int kNumProfileRules = {num_rules};

// Per GPU (its profiles/<gpu>/ folder name, gpu_slug of the device name): its rules are
// kProfileRules[first, first + count).  A GPU not listed has no rules: the default choice.
const ProfileGpu kProfileGpus[] = {{
{chr(10).join(gpu_rows)}
}};
const int kNumProfileGpus = {len(gpus)};

}}  // namespace {family}
}}  // namespace cutlass_ops
"""


def _gpu_comment(gpus: list[tuple[str, int, int]], n: int) -> list[str]:
    """A comment line opening GPU group n's rules, if one opens at rule n."""
    return [f"  // {gpu}: {count} rules" for gpu, first, count in gpus if first == n]


def emit_backward_dispatch_table(instances: list[Instance], rules: list = ()) -> str:
    """The C++ table of the dgrad/wgrad kernels and their profile rules (problem -> kernel
    index, or -1 where cuDNN measured faster), grouped by the GPU that measured them (Rule.gpu;
    kProfileGpus); conv2d_backward_dispatch.cpp chooses with the running GPU's rules only."""
    decls = "\n".join(f"cutlass::Status {i.name}(Conv2dBackwardArgs const&, cudaStream_t, bool);"
                      for i in instances)
    rows = []
    for i in instances:
        m, n, k = i.tile.threadblock
        kind = "ConvKind::kDgrad" if i.conv_kind == "dgrad" else "ConvKind::kWgrad"
        rows.append(f'  {{"{i.name}", {kind}, {i.key.family}, {_DTYPE_ENUM[i.key.dtype]}, {i.key.alignment}, '
                    f"{'true' if i.strided_dgrad else 'false'}, {m}, {n}, {k}, {i.tile.stages}, &{i.name}}},")
    if not rows:
        rows.append('  {"", ConvKind::kDgrad, 0, DType::kF16, 0, false, 0, 0, 0, 0, nullptr},')
    index = {(i.key, i.tile, i.strided_dgrad): n for n, i in enumerate(instances)}
    rules, gpus = _by_gpu(list(rules))
    rule_rows = []
    for n_rule, (key, rule) in enumerate(rules):
        rule_rows += _gpu_comment(gpus, n_rule)
        p = rule.problem
        kind = "ConvKind::kDgrad" if OP_FAMILY[key.op].conv_kind == "dgrad" else "ConvKind::kWgrad"
        # family 90's dgrad kernels are the unity-stride ones (their rows' names say _unity)
        strided = rule.strided_dgrad if key.family != 90 or rule.strided_dgrad is None else False
        kernel = -1 if rule.tile is None else index[(key, rule.tile, strided)]
        winner = "cuDNN" if rule.tile is None else "ours"
        # the family: the rule's profile file (sm80.csv rows, cuDNN's included, are family 80's)
        rule_rows.append(f"  {{{kind}, {_DTYPE_ENUM[key.dtype]}, {p.c}, {p.k}, {p.r}, {p.s}, {p.stride}, "
                         f"{p.gemm_m}LL, {kernel}, {rule.split_k}, {key.family}, {rule.runtime_ms!r}}},"
                         f"  // {winner}")
    if not rule_rows:
        rule_rows.append("  {ConvKind::kDgrad, DType::kF16, 0, 0, 0, 0, 0, 0, -2, 1, 0, 0.0},")
    return _table_file("// Generated by cutlass_ops_gen; do not edit.  conv2d_backward_dispatch.cpp picks from it.",
                       "conv2d_backward", decls, rows, len(instances), rule_rows, len(rules), gpus)


def emit_dispatch_table(instances: list[Instance], rules: list = ()) -> str:
    """The C++ kernel table and the profile rules (problem -> kernel index), grouped by the GPU
    that measured them (Rule.gpu; kProfileGpus)."""
    decls = "\n".join(
        f"cutlass::Status {i.name}(Conv2dFusedArgs const&, cudaStream_t);" for i in instances)
    rows = []
    for i in instances:
        m, n, k = i.tile.threadblock
        # family 90 adds its cluster (the entry's last fields; 1x1 by default)
        cluster = f", {i.tile.cluster[0]}, {i.tile.cluster[1]}" if isinstance(i.tile, Sm90Tile) else ""
        rows.append(f'  {{"{i.name}", {i.key.family}, {_DTYPE_ENUM[i.key.dtype]}, {i.key.alignment}, '
                    f"{m}, {n}, {k}, {i.tile.stages}, &{i.name}{cluster}}},")
    if not rows:  # keep the array well-formed in a build without instances
        rows.append('  {"", 0, DType::kF16, 0, 0, 0, 0, 0, nullptr},')
    index = {(i.key, i.tile): n for n, i in enumerate(instances)}
    rules, gpus = _by_gpu(list(rules))
    rule_rows = []
    for n_rule, (key, rule) in enumerate(rules):
        rule_rows += _gpu_comment(gpus, n_rule)
        p = rule.problem
        rule_rows.append(f"  {{{key.family}, {_DTYPE_ENUM[key.dtype]}, {key.alignment}, {p.c}, {p.k}, "
                         f"{p.r}, {p.s}, {p.stride}, {p.gemm_m}LL, {index[(key, rule.tile)]}, {rule.split_k}, "
                         f"{rule.runtime_ms!r}}},")
    if not rule_rows:
        rule_rows.append("  {0, DType::kF16, 0, 0, 0, 0, 0, 0, 0, -1, 1, 0.0},")
    return _table_file("""\
// Generated by cutlass_ops_gen; do not edit.  The dispatcher follows the rules of the GPU it
// runs on only (kProfileGpus): for a problem, the kernel (and split-K) of that GPU's rule with
// the same (family, dtype, alignment, C, K, R, S, stride) and the nearest GEMM M first, then
// the others by occupancy; on sm90 the two families' rules of that GPU compete by their
// measured ms (conv2d_fused_dispatch.cpp).""", "conv2d_fused", decls, rows, len(instances), rule_rows,
                       len(rules), gpus)
