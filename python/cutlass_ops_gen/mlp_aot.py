"""FusedMLP kernels built ahead of time: the build's MLP manifest -> sources.

FusedMLP compiles a model's kernel at first use.  A wheel can carry some models' kernels
instead: the build reads a manifest (JSON, named by CUTLASS_OPS_MLP_MODELS) such as

    {"models": [
      {"name": "relu_32_64x4_16", "widths": [32, 64, 64, 64, 64, 16], "activation": "relu",
       "last": null, "bias": true, "dtypes": ["float16", "bfloat16"]},
      {"name": "siren", "factory": "my_package.models:siren", "dtypes": ["float16"]}
    ]}

A model is either a chain (``widths``; ``activation`` between layers and ``last`` after the
last, each a name of ACTIVATIONS or null; ``bias``, default true) or a ``factory``
("module:function", importable at build time, returning the ``nn.Module``).  Each is traced
(``trace_mlp``) and emitted (``mlp_emit.emit``) for each dtype and each arch of the build
(80/86/87/89/90; others have no FusedMLP kernel) at that arch's shared-memory limit, with the
weights resident where they fit, as the runtime emits it by default.  ``write`` puts each
kernel in a folder named ``mlp_emit.aot_key(source, arch)`` (fused_mlp.cu, meta.json) with an
index.json of all, and a CMake file that compiles each with nvcc into fused_mlp.so (the same
command as the runtime's).  The package finds a kernel there before compiling
(``cutlass_ops.mlp_build``), so those models need no compiler (nvcc or NVRTC) on the user's
machine.

    python -m cutlass_ops_gen.mlp_aot --manifest models.json --archs 80,90 --out build/mlp_aot
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from .mlp_spec import trace_mlp
from .mlp_emit import CTYPES, SMEM_LIMIT, aot_key, emit, nvcc_command


def _activations():
    import torch.nn as nn
    return {"relu": nn.ReLU, "leaky_relu": nn.LeakyReLU, "gelu": nn.GELU,
            "gelu_tanh": lambda: nn.GELU(approximate="tanh"), "silu": nn.SiLU, "sigmoid": nn.Sigmoid,
            "tanh": nn.Tanh, "softplus": nn.Softplus}


ACTIVATIONS = ("relu", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "softplus")


def build_model(entry: dict):
    """The nn.Module a manifest entry describes (see the module docstring)."""
    import torch.nn as nn
    name = entry.get("name", "?")
    if "factory" in entry:
        module_name, _, fn = entry["factory"].partition(":")
        try:
            return getattr(importlib.import_module(module_name), fn)()
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"MLP manifest model {name!r}: cannot import factory {entry['factory']!r}: {exc}") from None
    widths = entry.get("widths")
    if not isinstance(widths, list) or len(widths) < 2:
        raise ValueError(f"MLP manifest model {name!r}: needs 'widths' (a list of >= 2 ints) or 'factory'")
    acts = _activations()

    def act(key):
        if key is None:
            return None
        if key not in acts:
            raise ValueError(f"MLP manifest model {name!r}: unknown activation {key!r}; known: "
                             f"{', '.join(ACTIVATIONS)} (or give a 'factory')")
        return acts[key]()
    mods = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        mods.append(nn.Linear(a, b, bias=entry.get("bias", True)))
        f = act(entry.get("activation", "relu")) if i < len(widths) - 2 else act(entry.get("last"))
        if f is not None:
            mods.append(f)
    return nn.Sequential(*mods)


def write(manifest: Path, archs: list[str], out: Path, nvcc: str = "nvcc") -> list[dict]:
    """Emits every (model, dtype, arch) of ``manifest`` under ``out`` (one folder per kernel,
    index.json, mlp_aot.cmake); returns the index entries."""
    models = json.loads(Path(manifest).read_text()).get("models", [])
    out.mkdir(parents=True, exist_ok=True)
    entries, rules = [], []
    for arch in archs:
        if arch not in SMEM_LIMIT:
            print(f"mlp_aot: no FusedMLP kernels for sm_{arch} (needs 80, 86, 87, 89 or 90): skipped")
            continue
        for m in models:
            spec = trace_mlp(build_model(m), None)
            for dtype in m.get("dtypes", ["float16"]):
                if dtype not in CTYPES:
                    raise ValueError(f"MLP manifest model {m.get('name')!r}: dtype {dtype!r}, not one of {list(CTYPES)}")
                source, cfg = emit(spec, dtype, SMEM_LIMIT[arch])
                key = aot_key(source, arch)
                folder = out / key
                folder.mkdir(exist_ok=True)
                (folder / "fused_mlp.cu").write_text(source)
                entry = {"name": m.get("name"), "dtype": dtype, "arch": arch, "key": key,
                         "structure": spec.structure_key(), "resident_warps": cfg.resident_warps, "model": m}
                (folder / "meta.json").write_text(json.dumps(entry, indent=1))
                entries.append(entry)
                cmd = nvcc_command(nvcc, str(folder / "fused_mlp.cu"), str(folder / "fused_mlp.so"), arch)
                rules.append((str(folder / "fused_mlp.so"), str(folder / "fused_mlp.cu"), cmd[1:]))
    (out / "index.json").write_text(json.dumps({"kernels": entries}, indent=1))
    lines = ["# generated by cutlass_ops_gen.mlp_aot: one nvcc command per ahead-of-time FusedMLP kernel",
             "set(CUTLASS_OPS_MLP_AOT_LIBRARIES)"]
    for so, cu, args in rules:
        quoted = " ".join(f'"{a}"' for a in args)
        lines += [f'add_custom_command(OUTPUT "{so}" COMMAND "${{CMAKE_CUDA_COMPILER}}" {quoted}',
                  f'  DEPENDS "{cu}" COMMENT "FusedMLP ahead of time: {Path(so).parent.name}" VERBATIM)',
                  f'list(APPEND CUTLASS_OPS_MLP_AOT_LIBRARIES "{so}")']
    (out / "mlp_aot.cmake").write_text("\n".join(lines) + "\n")
    return entries


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m cutlass_ops_gen.mlp_aot", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--manifest", required=True, help="the JSON list of models (see above)")
    p.add_argument("--archs", required=True, help="comma-separated SM archs, e.g. 80,90")
    p.add_argument("--out", required=True, help="output folder")
    args = p.parse_args(argv)
    try:
        entries = write(Path(args.manifest), [a.strip() for a in args.archs.split(",") if a.strip()], Path(args.out))
    except (ValueError, OSError) as exc:
        print(f"mlp_aot: {exc}", file=sys.stderr)
        return 1
    for e in entries:
        print(f"mlp_aot: {e['name']} {e['dtype']} sm_{e['arch']} -> {e['key']} (resident warps {e['resident_warps']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
