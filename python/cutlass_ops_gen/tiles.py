"""Tile shapes per instance key, and the profile rules the dispatcher follows.

Defaults (for the ResNet-style convs this project targets, GEMM N = 64..512; without a
profile the dispatcher picks among them by occupancy, see conv2d_fused_dispatch.cpp):
  family 80, alignment >= 2 : 128x128x32 3-stage, 128x64x32 4-stage, 64x64x64 4-stage
  family 80, alignment 1    : 64x64x32 2-stage analytic iterators (cp.async cannot copy
                              2-byte elements, so these use the register-staged pipeline)
  family 70                 : 128x128x32 and 128x64x32, 2-stage, mma 8x8x4
  family 90 (sm_90a)        : SM90_TILES below (CUTLASS 3.x TMA + wgmma; one table to edit):
                              stock and persistent (cooperative / ping-pong) kernels
The ``sweep`` kernel set adds sweep_tiles() (fp16, alignment 8) for the profiler; the ``ci``
set takes one tile per key, two for family 90 (ci_tiles()).
Backward (family 80, alignment 8):
  conv2d_dgrad : the fprop defaults, each as a unity-stride and a strided kernel
  conv2d_wgrad : 128x128x32 3-stage and 64x128x32 4-stage (GEMM M = K = 64..512 output
                 channels; parallel split-K over N*P*Q supplies the threadblocks)
Backward (family 90, alignment 8; built only with --sm90-backward): SM90_DGRAD_TILES and
SM90_WGRAD_TILES below (stock CUTLASS 3.x kernels; dgrad unity stride only, wgrad split over
batch slices).

A profile is a CSV in the CUTLASS profiler's conv2d column layout (profiles/README.md):
ours (``python -m cutlass_ops profile``) or a real ``cutlass_profiler`` conv2d output.
For each instance key the rows of its conv kind (same dtype and alignment; rows of the
other 16-bit dtype when a dtype has none) are grouped by problem (c, k, r, s, stride,
M = n*p*q); the fastest (tile, split-K slices) per problem wins.  fprop keeps serial
split-K rows only (the fused epilogue runs serial split-K), wgrad parallel ones.  In a
backward profile cuDNN's rows (``Operation`` cudnn) compete too: where cuDNN wins, the
rule sends the problem to the ATen (cuDNN) path.  The generator instantiates the
defaults plus every winner, and emits one rule per problem: the dispatcher runs the
rule's tile and split for a problem with the same (c, k, r, s, stride) and the nearest M
(log scale).  Rules are per GPU: each profiles/<gpu>/ folder (named by
cutlass_ops/tools/profiler.py's gpu_slug of the device name) yields its own rules, keyed by that
name, and the dispatcher follows only the rules of the GPU it runs on (a GPU without a profile
gets the default choice, never another GPU's rules; profiles/README.md).  The tiles built are the
union over all GPUs (one wheel serves every GPU).  Family-90 profiles (profiles/<gpu>/sm90.csv)
are read the same way; their rows
need no warps columns, take the cluster from cluster_m/cluster_n (1 when absent), the kernel
schedule (persistent coop / pp) from a ``schedule`` column or the Operation name, and never
split K (the 3.x conv kernel has no split-K) except family-90 wgrad rows, whose parallel
"split-K slices" are batch slices (one launch per slice, concurrently).
"""
from __future__ import annotations

import csv
import re
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from .manifest import OP_FAMILY, InstanceKey


@dataclass(frozen=True)
class Tile:
    threadblock: tuple[int, int, int]
    warps: tuple[int, int, int]
    stages: int
    iterator: str = "optimized"  # or "analytic"

    @property
    def name(self) -> str:
        """e.g. 128x64x32_4s_2x2w_o: threadblock, stages, warps (M x N), iterator."""
        m, n, k = self.threadblock
        return f"{m}x{n}x{k}_{self.stages}s_{self.warps[0]}x{self.warps[1]}w_{self.iterator[0]}"


@dataclass(frozen=True)
class Sm90Tile:
    """A family-90 (Hopper, CUTLASS 3.x) kernel configuration: CTA tile (M x N x K), thread
    block cluster (M, N, 1), mainloop stages (0: the CUTLASS builder's automatic count, as
    many as fit in shared memory beside the epilogue)."""
    threadblock: tuple[int, int, int]
    cluster: tuple[int, int, int] = (1, 1, 1)
    stages: int = 0
    schedule: str = ""  # "": the stock kernel; SM90_SCHEDULES: the persistent ones

    def __post_init__(self):
        if self.schedule and self.schedule not in SM90_SCHEDULES:
            raise ValueError(f"Sm90Tile schedule {self.schedule!r}: '' or one of {tuple(SM90_SCHEDULES)}")

    @property
    def name(self) -> str:
        """e.g. 128x64x64_4s_1x1c, 128x128x64_autos_2x1c, 128x128x64_6s_1x1c_coop: tile,
        stages, cluster (M x N), schedule (none for the stock kernel)."""
        m, n, k = self.threadblock
        stages = f"{self.stages}s" if self.stages else "autos"
        schedule = f"_{self.schedule}" if self.schedule else ""
        return f"{m}x{n}x{k}_{stages}_{self.cluster[0]}x{self.cluster[1]}c{schedule}"


# Family-90 kernel schedules beside the stock one (CUTLASS 4.2's non-persistent conv kernel, one
# consumer warp group): the persistent GEMM kernels running the conv mainloop
# (kernels/conv2d_fused/conv2d_fused_sm90_persistent.hpp), two consumer warp groups each.
SM90_SCHEDULES = {
    "coop": "cutlass_ops::sm90_persistent::ConvCooperative",  # both share a tile (TileM >= 128)
    "pp": "cutlass_ops::sm90_persistent::ConvPingpong",       # they alternate tiles
}


# Family 90 (sm_90a: TMA im2col + wgmma, warp-specialized; fp16/bf16, alignment 8), one row
# per kernel instance: CTA tile, cluster, stages (0 = automatic), schedule.  Without a profile
# the dispatcher picks among all of them by occupancy; profiles/<gpu>/sm90.csv picks per problem.
#
# Stock kernels (CUTLASS 4.2's non-persistent conv kernel, one consumer warp group): the five
# fastest of docs/experiments/sm90_conv3x_fprop's 24 configurations on FusedResNet's shapes
# (H100, geometric mean over 16 problems against cuDNN: 128x128 4-stage 0.90x, 64x128 4-stage
# 0.92x, 128x64 cluster 1x2 0.96x, 128x128 cluster 2x1 0.98x, 128x64 1.03x).  Fixed 4 stages:
# the automatic count fills shared memory and leaves 1 CTA/SM.  (128x256 does not fit: one
# consumer warp group, 256 fp32 accumulators a thread.)
SM90_STOCK_TILES = [
    Sm90Tile((128, 64, 64), (1, 1, 1), 4),
    Sm90Tile((128, 128, 64), (1, 1, 1), 4),
    Sm90Tile((64, 128, 64), (1, 1, 1), 4),
    Sm90Tile((128, 64, 64), (1, 2, 1), 4),
    Sm90Tile((128, 128, 64), (2, 1, 1), 4),
]
# Persistent kernels (cooperative / ping-pong, the same fused EVT epilogue): the configurations
# that won FusedResNet's N=2048 problems in the experiment's persistent sweep (coop 128x128
# 6-stage, coop 256x128 and 128x256 4-stage for the large-K 3x3 convs, ping-pong 128x64
# 6-stage for 16x16 64->64).  In profiles/h100-80gb-hbm3/sm90.csv they win 23 of 60 problems,
# every N=2048 conv but the stem's, by 11-27% over the best stock kernel.
SM90_PERSISTENT_TILES = [
    Sm90Tile((128, 128, 64), (1, 1, 1), 6, "coop"),
    Sm90Tile((256, 128, 64), (1, 1, 1), 4, "coop"),
    Sm90Tile((128, 256, 64), (1, 1, 1), 4, "coop"),
    Sm90Tile((128, 64, 64), (1, 1, 1), 6, "pp"),
]
SM90_TILES = SM90_STOCK_TILES + SM90_PERSISTENT_TILES
# The ``ci`` kernel set's family-90 instances (fp16 only): one stock, one persistent, so that
# CI compiles both templates (~70 s each on one core).
SM90_CI_TILES = [SM90_STOCK_TILES[0], SM90_PERSISTENT_TILES[0]]


# Family-90 backward (built only with --sm90-backward, which CMake passes by default; tested and
# profiled on an H100).
# CUTLASS 4.2's unit tests run its sm90 dgrad and wgrad at 64x64x64 and 128x64x64 (clusters
# 1x1, 1x2, 2x1, 2x2; automatic stages); its library generator adds 64x128 / 128x128 / 128x256.
# Ours, for FusedResNet's C, K = 64..512, fixed 4 stages (the automatic count fills shared
# memory: one CTA per SM), cluster 1x1:
#   dgrad (GEMM M = N*H*W, N = C, K = K*R*S; like fprop, whose stock winners were 128x64 and
#   128x128): 128x64 (C = 64), 128x128 (C >= 128), 64x64 (small maps, few CTAs).
#   wgrad (GEMM M = K, N = C*R*S, K = N*P*Q): 128x64 and 64x64 (the unit tests' tiles; 64x64 for
#   K = 64) and 128x128 (K >= 128).  Batch slices, not the tile, supply most of the CTAs.
SM90_DGRAD_TILES = [
    Sm90Tile((128, 64, 64), (1, 1, 1), 4),
    Sm90Tile((128, 128, 64), (1, 1, 1), 4),
    Sm90Tile((64, 64, 64), (1, 1, 1), 4),
]
SM90_WGRAD_TILES = [
    Sm90Tile((128, 64, 64), (1, 1, 1), 4),
    Sm90Tile((64, 64, 64), (1, 1, 1), 4),
    Sm90Tile((128, 128, 64), (1, 1, 1), 4),
]


@dataclass(frozen=True)
class Problem:
    """A conv problem class as profiles and rules see it."""
    c: int
    k: int
    r: int
    s: int
    stride: int
    gemm_m: int


@dataclass(frozen=True)
class Rule:
    problem: Problem
    tile: Tile | Sm90Tile | None  # None: cuDNN (a ``--backward`` profile's Provider cudnn row) won
    runtime_ms: float
    split_k: int = 1      # split-K slices the winner ran with (serial; wgrad: parallel)
    strided_dgrad: bool | None = None  # dgrad: the winner was the strided kernel
    gpu: str = ""         # the GPU that measured it: its profiles/<gpu>/ folder name


def default_tiles(key: InstanceKey) -> list[Tile | Sm90Tile]:
    """The tiles built without a profile."""
    kind = OP_FAMILY[key.op].conv_kind
    if key.family == 90:
        return list({"fprop": SM90_TILES, "dgrad": SM90_DGRAD_TILES, "wgrad": SM90_WGRAD_TILES}[kind])
    if kind == "wgrad":
        return [Tile((128, 128, 32), (2, 2, 1), 3), Tile((64, 128, 32), (2, 2, 1), 4)]
    if key.family == 70:
        return [Tile((128, 64, 32), (2, 2, 1), 2), Tile((128, 128, 32), (2, 2, 1), 2)]
    if key.alignment == 1:
        return [Tile((64, 64, 32), (2, 2, 1), 2, iterator="analytic")]
    return [Tile((128, 128, 32), (2, 2, 1), 3), Tile((128, 64, 32), (2, 2, 1), 4),
            Tile((64, 64, 64), (2, 2, 1), 4)]


# Candidates the profiler sweeps (from CUTLASS's Sm80 16x8x16 generator lists, sized for
# GEMM N = 64..512), in addition to the defaults.
SWEEP_TILES = [
    Tile((256, 64, 32), (4, 1, 1), 4), Tile((64, 256, 32), (1, 4, 1), 4),
    Tile((128, 128, 64), (2, 2, 1), 3), Tile((128, 64, 64), (2, 2, 1), 3),
    Tile((64, 128, 32), (2, 2, 1), 4), Tile((64, 64, 32), (2, 2, 1), 6),
    Tile((64, 32, 64), (2, 1, 1), 4), Tile((32, 64, 64), (1, 2, 1), 4),
]


def ci_tiles(key: InstanceKey) -> list[Tile | Sm90Tile]:
    """The ``ci`` kernel set's tiles, whatever the profiles say: one per key (family 90: one
    stock, one persistent; family-90 dgrad/wgrad: the first default tile)."""
    if key.family == 90:
        return list(SM90_CI_TILES) if OP_FAMILY[key.op].conv_kind == "fprop" else default_tiles(key)[:1]
    return default_tiles(key)[-1:]


def sweep_tiles(key: InstanceKey) -> list[Tile]:
    """The profiler's candidates for a key beyond its defaults (fp16, alignment 8 only)."""
    if key.family != 80 or key.dtype != "f16" or key.alignment != 8:
        return []
    extra = [Tile((64, 64, 64), (2, 2, 1), 4)] if OP_FAMILY[key.op].conv_kind == "wgrad" else []
    return [t for t in SWEEP_TILES + extra if t not in default_tiles(key)]


class ProfileError(ValueError):
    pass


_REQUIRED = ("Operation", "n", "c", "k", "r", "s", "p", "q", "stride_h", "cta_m", "cta_n",
             "cta_k", "stages", "warps_m", "warps_n", "warps_k", "Runtime")
_WARPS = ("warps_m", "warps_n", "warps_k")


def _required(family: int) -> tuple[str, ...]:
    """Columns a profile row must have: family-90 kernels have no warp shape (a cluster,
    optional, instead)."""
    return tuple(c for c in _REQUIRED if c not in _WARPS) if family == 90 else _REQUIRED


def read_profile_rows(path: Path, conv_kind: str = "fprop", family: int = 80) -> list[dict]:
    with open(path, newline="") as f:
        lines = [line for line in f if not line.startswith("#")]  # header comments allowed
    reader = csv.DictReader(lines)
    required = _required(family)
    missing = [c for c in required if c not in (reader.fieldnames or [])]
    if missing:
        raise ProfileError(f"{path}: missing columns {missing}")
    rows = []
    for i, row in enumerate(reader, start=2):
        if row.get("Disposition", "passed") not in ("passed", ""):
            continue
        if row.get("conv_kind", "fprop") != conv_kind:
            continue
        try:
            for col in required[1:]:
                float(row[col])
        except (TypeError, ValueError) as e:
            raise ProfileError(f"{path}:{i}: bad number in a Runtime/shape/tile column ({e})") from None
        rows.append(row)
    return rows


def _dtype_and_alignment(row: dict) -> tuple[str, int] | None:
    """Ours: cutlass_ops_<op>_<dtype>_sm<family>_<tile>_align<A>.  CUTLASS profiler rows:
    dtype from the Activation column (e.g. f16:nhwc), alignment from the name's suffix."""
    name = row["Operation"]
    if name == "cudnn":  # cuDNN's rows (backward profiles) compete for the alignment-8 keys
        return {"f16": "f16", "bf16": "bf16"}.get(row.get("Activation", "").split(":")[0]), 8
    if "_align" not in name:
        return None
    try:
        alignment = int(name.rsplit("_align", 1)[1].split("_")[0])
    except ValueError:
        return None
    if name.startswith("cutlass_ops_"):
        return name.split("_")[4], alignment  # cutlass_ops_conv2d_fused_<dtype>_...
    activation = row.get("Activation", "").split(":")[0]
    return ({"f16": "f16", "bf16": "bf16"}.get(activation), alignment) if activation else None


# (family-90 dgrad names end in _unity_align8: a stride variant, not a schedule)
_SM90_SCHEDULE_SUFFIX = re.compile(r"_\d+x\d+c_(?!unity_)(?P<schedule>[a-z]+)_(?:unity_)?align\d+")


def _row_schedule(row: dict) -> str:
    """A family-90 row's kernel schedule: the ``schedule`` column when present, else the
    suffix after the cluster in our kernel names (..._1x1c_coop_align8); "" (stock) otherwise."""
    if row.get("schedule"):
        return row["schedule"]
    m = _SM90_SCHEDULE_SUFFIX.search(row["Operation"])
    return m["schedule"] if m else ""


def _row_tile(row: dict, key: InstanceKey) -> Tile | Sm90Tile:
    if key.family == 90:
        cluster = tuple(int(float(row.get(f"cluster_{d}") or 1)) for d in "mn")
        return Sm90Tile((int(row["cta_m"]), int(row["cta_n"]), int(row["cta_k"])),
                        (*cluster, 1), int(row["stages"]), _row_schedule(row))
    iterator = row.get("iterator_algorithm") or ("analytic" if key.alignment == 1 else "optimized")
    return Tile((int(row["cta_m"]), int(row["cta_n"]), int(row["cta_k"])),
                (int(row["warps_m"]), int(row["warps_n"]), int(row["warps_k"])),
                int(row["stages"]), iterator=iterator)


def _split_k(row: dict, conv_kind: str = "fprop") -> int | None:
    """Split-K slices of a row (1 when the column is absent); None for a split these
    kernels cannot reproduce (fprop runs serial split-K only, wgrad parallel only)."""
    try:
        slices = int(row.get("split_k_slices") or 1)
    except ValueError:
        return None
    mode = {"fprop": "serial", "wgrad": "parallel"}.get(conv_kind)
    if slices > 1 and row.get("split_k_mode", "serial") != mode:
        return None
    return max(slices, 1)


def rules_from_profiles(rows: list[dict], key: InstanceKey) -> list[Rule]:
    def rows_for(dtype):
        return [r for r in rows if _dtype_and_alignment(r) == (dtype, key.alignment)
                and (not r["Operation"].startswith("cutlass_ops_")
                     or r["Operation"].startswith(f"cutlass_ops_{key.op}_") and f"_sm{key.family}_" in r["Operation"])]

    mine = rows_for(key.dtype)
    if not mine:  # fp16 and bf16 share instruction shape and bytes: borrow the other's winners
        other = {"f16": "bf16", "bf16": "f16"}.get(key.dtype)
        mine = rows_for(other) if other else []
    kind = OP_FAMILY[key.op].conv_kind
    best: dict[Problem, Rule] = {}
    for row in mine:
        split_k = _split_k(row, kind)
        # family 90: no split-K, but wgrad splits the batch into slices (same parallel layout)
        if split_k is None or (key.family == 90 and split_k > 1 and kind != "wgrad"):
            continue
        problem = Problem(int(row["c"]), int(row["k"]), int(row["r"]), int(row["s"]),
                          int(row["stride_h"]), int(row["n"]) * int(row["p"]) * int(row["q"]))
        name = row["Operation"]
        tile = None if name == "cudnn" else _row_tile(row, key)
        strided = ("_strided_" in name) if kind == "dgrad" and tile is not None else None
        rule = Rule(problem, tile, float(row["Runtime"]), split_k, strided)
        if problem not in best or rule.runtime_ms < best[problem].runtime_ms:
            best[problem] = rule
    return [best[p] for p in sorted(best, key=lambda p: (p.c, p.k, p.r, p.s, p.stride, p.gemm_m))]


def profile_files(profiles_dir: Path, family: int) -> list[Path]:
    """Profiles for kernels of one family, every GPU's: profiles/<gpu>/sm<family>.csv (sorted by
    GPU).  Each file's rules belong to its GPU alone (select_tiles)."""
    if not profiles_dir.is_dir():
        return []
    return sorted(profiles_dir.glob(f"*/sm{family}.csv"))


def profile_gpus(profiles_dir: Path | None) -> list[str]:
    """The GPUs with a profile folder (profiles/<gpu>/ holding an sm<family>.csv), sorted."""
    if profiles_dir is None or not profiles_dir.is_dir():
        return []
    return sorted({p.parent.name for p in profiles_dir.glob("*/sm*.csv")})


def select_tiles(key: InstanceKey, profiles_dir: Path | None) -> tuple[list[Tile | Sm90Tile], list[Rule], str]:
    """Tiles to instantiate for one key, the dispatch rules, and where they came from.

    Each GPU's profile gives its own rules (Rule.gpu: its folder name); the rows of two GPUs
    never compete.  The tiles are the defaults plus every GPU's winners."""
    tiles = default_tiles(key)
    if profiles_dir is None:
        return tiles, [], "default"
    rules: list[Rule] = []
    sources = []
    for path in profile_files(profiles_dir, key.family):
        gpu = path.parent.name
        try:
            rows = read_profile_rows(path, OP_FAMILY[key.op].conv_kind, key.family)
        except (ProfileError, OSError, csv.Error) as e:
            warnings.warn(f"cutlass_ops_gen: ignoring profile: {e}; using default tiles")
            continue
        gpu_rules = [replace(rule, gpu=gpu) for rule in rules_from_profiles(rows, key)]
        if gpu_rules:
            rules += gpu_rules
            sources.append(gpu)
    if not rules:
        return tiles, [], "default"
    for rule in rules:
        if rule.tile is not None and rule.tile not in tiles:
            tiles.append(rule.tile)
    return tiles, rules, "default + profile " + "+".join(sources)
