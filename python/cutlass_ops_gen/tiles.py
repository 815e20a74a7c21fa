"""Tile shapes per instance key: measured winners from profiles/, else documented defaults.

Defaults (for the ResNet-style convs this project targets, GEMM N = 64..512; the
dispatcher picks among them by occupancy, see conv2d_fused_dispatch.cpp):
  family 80, alignment >= 2 : 128x128x32 3-stage, 128x64x32 4-stage, 64x64x64 4-stage
  family 80, alignment 1    : 64x64x32 2-stage analytic iterators (cp.async cannot copy
                              2-byte elements, so these use the register-staged pipeline)
  family 70                 : 128x128x32 and 128x64x32, 2-stage, mma 8x8x4

A profile is a CSV in the CUTLASS profiler's conv2d column layout (profiles/README.md).
For each instance key the rows of that op, dtype and alignment are grouped by output
channel count k; the fastest tile per k wins, and each winner is used for k up to its
own k (the largest k's winner for everything above).
"""
from __future__ import annotations

import csv
import warnings
from dataclasses import dataclass
from pathlib import Path

from .manifest import InstanceKey


@dataclass(frozen=True)
class Tile:
    threadblock: tuple[int, int, int]
    warps: tuple[int, int, int]
    stages: int
    iterator: str = "optimized"  # or "analytic"
    max_out_channels: int = 0    # dispatch rule: use for K <= this; 0 = any K

    @property
    def name(self) -> str:
        m, n, k = self.threadblock
        return f"{m}x{n}x{k}_{self.stages}s_{self.iterator[0]}"


def default_tiles(key: InstanceKey) -> list[Tile]:
    if key.family == 70:
        return [Tile((128, 64, 32), (2, 2, 1), 2, max_out_channels=64),
                Tile((128, 128, 32), (2, 2, 1), 2)]
    if key.alignment == 1:
        return [Tile((64, 64, 32), (2, 2, 1), 2, iterator="analytic")]
    return [Tile((128, 128, 32), (2, 2, 1), 3), Tile((128, 64, 32), (2, 2, 1), 4),
            Tile((64, 64, 64), (2, 2, 1), 4)]


class ProfileError(ValueError):
    pass


_REQUIRED = ("Operation", "k", "cta_m", "cta_n", "cta_k", "stages",
             "warps_m", "warps_n", "warps_k", "Runtime")


def read_profile_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        lines = [line for line in f if not line.startswith("#")]  # header comments allowed
    reader = csv.DictReader(lines)
    missing = [c for c in _REQUIRED if c not in (reader.fieldnames or [])]
    if missing:
        raise ProfileError(f"{path}: missing columns {missing}")
    rows = []
    for i, row in enumerate(reader, start=2):
        if row.get("Disposition", "passed") not in ("passed", ""):
            continue
        try:
            float(row["Runtime"])
            int(row["k"])
        except (TypeError, ValueError) as e:
            raise ProfileError(f"{path}:{i}: bad Runtime/k value ({e})") from None
        rows.append(row)
    return rows


def _matches(row: dict, key: InstanceKey) -> bool:
    """Our kernels are named cutlass_ops_<op>_<dtype>_..._align<A>; see emitter.kernel_name."""
    name = row["Operation"]
    return (name.startswith(f"cutlass_ops_{key.op}_{key.dtype}_sm{key.family}_")
            and name.endswith(f"_align{key.alignment}"))


def tiles_from_profiles(rows: list[dict], key: InstanceKey) -> list[Tile]:
    best: dict[int, tuple[float, Tile]] = {}
    for row in rows:
        if not _matches(row, key):
            continue
        k = int(row["k"])
        tile = Tile((int(row["cta_m"]), int(row["cta_n"]), int(row["cta_k"])),
                    (int(row["warps_m"]), int(row["warps_n"]), int(row["warps_k"])),
                    int(row["stages"]),
                    iterator=row.get("iterator_algorithm") or ("analytic" if key.alignment == 1 else "optimized"))
        runtime = float(row["Runtime"])
        if k not in best or runtime < best[k][0]:
            best[k] = (runtime, tile)
    if not best:
        return []
    ks = sorted(best)
    chosen: list[Tile] = []
    for i, k in enumerate(ks):
        tile = best[k][1]
        limit = 0 if i == len(ks) - 1 else k
        # Merge neighbouring buckets won by the same tile.
        if chosen and _same_shape(chosen[-1], tile):
            chosen[-1] = _with_limit(chosen[-1], limit)
        else:
            chosen.append(_with_limit(tile, limit))
    return chosen


def _same_shape(a: Tile, b: Tile) -> bool:
    return (a.threadblock, a.warps, a.stages, a.iterator) == (b.threadblock, b.warps, b.stages, b.iterator)


def _with_limit(t: Tile, limit: int) -> Tile:
    return Tile(t.threadblock, t.warps, t.stages, t.iterator, limit)


def profile_files(profiles_dir: Path, family: int) -> list[Path]:
    """Profiles for kernels of one family: profiles/<gpu>/sm<family>.csv."""
    if not profiles_dir.is_dir():
        return []
    return sorted(profiles_dir.glob(f"*/sm{family}.csv"))


def select_tiles(key: InstanceKey, profiles_dir: Path | None) -> tuple[list[Tile], str]:
    """The tiles to instantiate for one key, and where they came from (for the build log)."""
    if profiles_dir is not None:
        rows: list[dict] = []
        sources = []
        for path in profile_files(profiles_dir, key.family):
            try:
                rows += read_profile_rows(path)
                sources.append(path.parent.name)
            except (ProfileError, OSError, csv.Error) as e:
                warnings.warn(f"cutlass_ops_gen: ignoring profile: {e}; using default tiles")
        tiles = tiles_from_profiles(rows, key)
        if tiles:
            return tiles, "profile " + "+".join(sources)
    return default_tiles(key), "default"
