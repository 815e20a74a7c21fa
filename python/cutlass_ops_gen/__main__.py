"""python -m cutlass_ops_gen: write kernel instances and dispatch tables for a build."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .b2b import b2b_instances, emit_b2b_dispatch_table, emit_b2b_instance
from .linear_silu import emit_linear_silu_dispatch_table, emit_linear_silu_instance, linear_silu_instances
from .manifest import KERNEL_SETS, instance_keys
from .tiles import ci_tiles, select_tiles, sweep_tiles


def parse_archs(text: str) -> list[int]:
    archs = []
    for part in text.replace(",", ";").split(";"):
        part = part.strip().lower().removeprefix("sm_").removeprefix("sm").replace(".", "")
        if part:
            if not part.isdigit():
                raise argparse.ArgumentTypeError(f"bad arch {part!r}; use numbers like 80;86;90")
            archs.append(int(part))
    if not archs:
        raise argparse.ArgumentTypeError("no archs given")
    return archs


def write_if_changed(path: Path, text: str) -> None:
    """Leave unchanged files alone so that re-configuring does not recompile them."""
    if path.exists() and path.read_text() == text:
        return
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cutlass_ops_gen", description=__doc__)
    p.add_argument("--archs", type=parse_archs, required=True,
                   help="SM archs to build for, e.g. '80;86;90' (70 = Volta; 90 adds the sm_90a kernels)")
    p.add_argument("--kernels", choices=KERNEL_SETS, default="all",
                   help="kernel set: all (release), ci (small, for CI builds) or sweep (all + the profiler's candidate tiles)")
    p.add_argument("--sm90-backward", action="store_true",
                   help="with 90 in --archs, also emit the family-90 (sm_90a) conv2d_dgrad/conv2d_wgrad "
                        "kernels (CMake passes it unless CUTLASS_OPS_SM90_BACKWARD=OFF)")
    p.add_argument("--profiles", type=Path, default=None,
                   help="profiles/ folder with measured tile winners (default tiles without it)")
    p.add_argument("--out", type=Path, required=True, help="output folder (in the build tree)")
    p.add_argument("--list", action="store_true", help="print the instances, write nothing")
    args = p.parse_args(argv)

    # Imported here so that --help works without the nvidia-cutlass wheel.
    from .emitter import dgrad_variants, emit_backward_dispatch_table, emit_dispatch_table, emit_instance

    instances, texts, rules = [], {}, []
    for key in instance_keys(args.archs, args.kernels, args.sm90_backward):
        tiles, key_rules, origin = select_tiles(key, args.profiles)
        if args.kernels == "ci":  # one default tile per key, whatever the profiles say
            tiles, key_rules, origin = ci_tiles(key), [], "default"
        if args.kernels == "sweep":
            tiles += [t for t in sweep_tiles(key) if t not in tiles]
        for tile in tiles:
            for strided_dgrad in dgrad_variants(key):
                inst, text = emit_instance(key, tile, origin, strided_dgrad)
                instances.append(inst)
                texts[inst.source] = text
        rules += [(key, rule) for rule in key_rules]

    b2b = b2b_instances(args.archs, args.kernels)
    linear_silu = linear_silu_instances(args.archs, args.kernels)
    for inst in instances:
        print(f"  {inst.name}  [{inst.tile_origin}]", file=sys.stderr if args.list else sys.stdout)
    for inst in b2b:
        print(f"  {inst.name}  [B2B]", file=sys.stderr if args.list else sys.stdout)
    for inst in linear_silu:
        print(f"  {inst.name}  [linear_silu]", file=sys.stderr if args.list else sys.stdout)
    if args.list:
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        write_if_changed(args.out / name, text)
    fprop = [i for i in instances if i.conv_kind == "fprop"]
    backward = [i for i in instances if i.conv_kind != "fprop"]
    fprop_rules = [(k, r) for k, r in rules if k.op == "conv2d_fused"]
    backward_rules = [(k, r) for k, r in rules if k.op != "conv2d_fused"]
    write_if_changed(args.out / "conv2d_fused_dispatch_table.cpp", emit_dispatch_table(fprop, fprop_rules))
    write_if_changed(args.out / "conv2d_backward_dispatch_table.cpp",
                     emit_backward_dispatch_table(backward, backward_rules))
    for inst in b2b:
        write_if_changed(args.out / inst.source, emit_b2b_instance(inst))
    write_if_changed(args.out / "conv2d_b2b_dispatch_table.cpp", emit_b2b_dispatch_table(b2b))
    for inst in linear_silu:
        write_if_changed(args.out / inst.source, emit_linear_silu_instance(inst))
    write_if_changed(args.out / "linear_silu_dispatch_table.cpp", emit_linear_silu_dispatch_table(linear_silu))

    by_family: dict[int, list[str]] = {}
    for inst in instances:
        by_family.setdefault(inst.key.family, []).append(str(args.out / inst.source))
    for inst in linear_silu:  # family 90: compiled for sm_90a with the conv instances
        by_family.setdefault(90, []).append(str(args.out / inst.source))
    lines = ["# Generated by cutlass_ops_gen; included by CMakeLists.txt."]
    for family in (70, 80, 90):
        files = " ".join(f'"{f}"' for f in by_family.get(family, []))
        lines.append(f"set(CUTLASS_OPS_INSTANCES_SM{family} {files})")
    lines.append(f'set(CUTLASS_OPS_DISPATCH_TABLE "{args.out / "conv2d_fused_dispatch_table.cpp"}")')
    lines.append(f'set(CUTLASS_OPS_BACKWARD_DISPATCH_TABLE "{args.out / "conv2d_backward_dispatch_table.cpp"}")')
    # B2B instances: family 80, but with the CUTLASS example's include folder (CMakeLists.txt)
    lines.append("set(CUTLASS_OPS_INSTANCES_B2B " + " ".join(f'"{args.out / i.source}"' for i in b2b) + ")")
    lines.append(f'set(CUTLASS_OPS_B2B_DISPATCH_TABLE "{args.out / "conv2d_b2b_dispatch_table.cpp"}")')
    lines.append(f'set(CUTLASS_OPS_LINEAR_SILU_DISPATCH_TABLE "{args.out / "linear_silu_dispatch_table.cpp"}")')
    write_if_changed(args.out / "instances.cmake", "\n".join(lines) + "\n")
    print(f"cutlass_ops_gen: {len(instances)} conv kernel instances, {len(b2b)} B2B instances, "
          f"{len(linear_silu)} linear_silu instances, {len(rules)} profile rules in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
