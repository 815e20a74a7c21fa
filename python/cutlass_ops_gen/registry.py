"""The registry of generated kernel families: one entry per family, one interface for all.

Modeled on CUTLASS's ``cutlass_library/manifest.py``, whose map from operation kind to emitter
lets its generator loop over every kind the same way.  Here each family of kernels/<name>/
whose instances are generated at build time is one ``GeneratedFamily``:

  ``select(options)``          the instances a build compiles (and, for the conv families, the
                               measured profile rules), in dispatch-table order;
  ``emit_instance(inst)``      the CUDA source of one instance (``inst.source`` names its file);
  ``emit_dispatch_table(sel)`` the C++ table of the selection (``<name>_dispatch_table.cpp``);
  ``arch_family(inst)``        the arch family (70, 80 or 90) whose compile flags the instance
                               takes: the CMake list it joins.

``python -m cutlass_ops_gen`` (``__main__.py``) loops over ``FAMILIES`` and writes, per family,
the instance sources, the dispatch table and the CMake lists ``CUTLASS_OPS_GENERATED_<NAME>_SM70``,
``_SM80``, ``_SM90`` and ``_DISPATCH`` (instances.cmake), which CMakeLists.txt reads beside the
family's hand-written sources (kernels/<name>/sources.cmake: entry points, dispatch code, extra
include folders such as conv2d_b2b's CUTLASS example headers).

The families: conv2d_fused (conv fprop with the fused epilogue) and conv2d_backward (dgrad and
wgrad) from the op manifest (manifest.py) through cutlass_library's emitter (emitter.py), with
their tiles from the profiles (tiles.py); conv2d_b2b (b2b.py) and linear_silu (linear_silu.py)
from this generator's own templates.  FusedMLP's ahead-of-time kernels are not a family here:
they are whole shared libraries per user model (a JSON list of models, traced with torch), built
by their own nvcc commands (mlp_aot.py, cmake/MlpAot.cmake), not objects of the op library.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .b2b import b2b_instances, emit_b2b_dispatch_table, emit_b2b_instance
from .linear_silu import emit_linear_silu_dispatch_table, emit_linear_silu_instance, linear_silu_instances
from .manifest import instance_keys
from .tiles import ci_tiles, select_tiles, sweep_tiles

# The arch families an instance can be compiled for (CMakeLists.txt: one set of flags each).
ARCH_FAMILIES = (70, 80, 90)


@dataclass(frozen=True)
class BuildOptions:
    """What a build asks the generator for (the command line of ``python -m cutlass_ops_gen``)."""
    archs: tuple[int, ...]
    kernel_set: str = "all"          # manifest.KERNEL_SETS
    sm90_backward: bool = False      # family-90 conv2d_dgrad/conv2d_wgrad (with 90 in archs)
    profiles: Path | None = None     # profiles/ folder (None: default tiles)


@dataclass
class Selection:
    """A family's part of a build: its instances in dispatch-table order, and the profile rules
    its table carries ((InstanceKey, Rule) pairs; conv families only)."""
    instances: list = field(default_factory=list)
    rules: list = field(default_factory=list)


@dataclass(frozen=True)
class GeneratedFamily:
    """One generated family (see the module docstring).  Its instances are the family's own
    objects; each has ``name`` (the C++ symbol) and ``source`` (its file name)."""
    name: str                                        # kernels/<name>/, <name>_dispatch_table.cpp
    select: Callable[[BuildOptions], Selection]
    emit_instance: Callable[[Any], str]
    emit_dispatch_table: Callable[[Selection], str]
    arch_family: Callable[[Any], int]
    describe: Callable[[Any], str]                   # the tag printed beside an instance's name

    @property
    def dispatch_table(self) -> str:
        return f"{self.name}_dispatch_table.cpp"

    @property
    def cmake_name(self) -> str:
        """The family's part of its CMake variable names: CUTLASS_OPS_GENERATED_<cmake_name>_*."""
        return self.name.upper()


# ---- conv2d_fused, conv2d_backward: the op manifest through cutlass_library --------------------

def _conv_select(ops: tuple[str, ...]) -> Callable[[BuildOptions], Selection]:
    """The instances of the manifest keys whose op is in ``ops``: the profiled (or default)
    tiles of each key, one per tile (dgrad: per stride variant too), and the keys' rules."""
    def select(options: BuildOptions) -> Selection:
        from .emitter import Instance, dgrad_variants, kernel_name  # needs cutlass_library
        sel = Selection()
        for key in instance_keys(list(options.archs), options.kernel_set, options.sm90_backward):
            if key.op not in ops:
                continue
            tiles, key_rules, origin = select_tiles(key, options.profiles)
            if options.kernel_set == "ci":  # one default tile per key, whatever the profiles say
                tiles, key_rules, origin = ci_tiles(key), [], "default"
            if options.kernel_set == "sweep":
                tiles += [t for t in sweep_tiles(key) if t not in tiles]
            for tile in tiles:
                for strided_dgrad in dgrad_variants(key):
                    name = kernel_name(key, tile, strided_dgrad)
                    sel.instances.append(Instance(key, tile, name, f"{name}.cu", origin, strided_dgrad))
            sel.rules += [(key, rule) for rule in key_rules]
        return sel
    return select


def _emit_conv_instance(inst) -> str:
    from .emitter import emit_instance
    emitted, text = emit_instance(inst.key, inst.tile, inst.tile_origin, inst.strided_dgrad)
    assert emitted == inst, (emitted, inst)
    return text


def _emit_fprop_table(sel: Selection) -> str:
    from .emitter import emit_dispatch_table
    return emit_dispatch_table(sel.instances, sel.rules)


def _emit_backward_table(sel: Selection) -> str:
    from .emitter import emit_backward_dispatch_table
    return emit_backward_dispatch_table(sel.instances, sel.rules)


CONV2D_FUSED = GeneratedFamily(
    name="conv2d_fused", select=_conv_select(("conv2d_fused",)), emit_instance=_emit_conv_instance,
    emit_dispatch_table=_emit_fprop_table, arch_family=lambda i: i.key.family, describe=lambda i: i.tile_origin)

CONV2D_BACKWARD = GeneratedFamily(
    name="conv2d_backward", select=_conv_select(("conv2d_dgrad", "conv2d_wgrad")),
    emit_instance=_emit_conv_instance, emit_dispatch_table=_emit_backward_table,
    arch_family=lambda i: i.key.family, describe=lambda i: i.tile_origin)

# ---- conv2d_b2b, linear_silu: this generator's own templates ----------------------------------

CONV2D_B2B = GeneratedFamily(
    name="conv2d_b2b", select=lambda o: Selection(b2b_instances(list(o.archs), o.kernel_set)),
    emit_instance=emit_b2b_instance, emit_dispatch_table=lambda sel: emit_b2b_dispatch_table(sel.instances),
    arch_family=lambda i: 80, describe=lambda i: "B2B")

LINEAR_SILU = GeneratedFamily(
    name="linear_silu", select=lambda o: Selection(linear_silu_instances(list(o.archs), o.kernel_set)),
    emit_instance=emit_linear_silu_instance,
    emit_dispatch_table=lambda sel: emit_linear_silu_dispatch_table(sel.instances),
    arch_family=lambda i: 90, describe=lambda i: "linear_silu")

FAMILIES = (CONV2D_FUSED, CONV2D_BACKWARD, CONV2D_B2B, LINEAR_SILU)
FAMILY = {f.name: f for f in FAMILIES}
