"""FusedMLP kernels ahead of time (cutlass_ops_gen.mlp_aot): the manifest -> one folder per
(model, dtype, arch) under the key the runtime computes, and the nvcc commands CMake runs.
CPU only (no compile here; the build compiles them: tests/python/test_fused_mlp.py checks what
a build installed)."""
import json
import re
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

from cutlass_ops_gen.mlp_spec import trace_mlp  # noqa: E402
from cutlass_ops_gen.mlp_aot import build_model, main, write  # noqa: E402
from cutlass_ops_gen.mlp_emit import SMEM_LIMIT, aot_key, emit  # noqa: E402


def _manifest(tmp_path, models):
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": models}))
    return path


def test_chain_and_factory(tmp_path, monkeypatch):
    (tmp_path / "aot_factory_mod.py").write_text(textwrap.dedent("""
        import torch, torch.nn as nn
        class Sin30(nn.Module):
            def forward(self, x):
                return torch.sin(30 * x)
        def siren():
            return nn.Sequential(nn.Linear(3, 48), Sin30(), nn.Linear(48, 1))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("aot_factory_mod", None)
    chain = {"name": "chain", "widths": [32, 64, 64, 16], "activation": "gelu", "last": "sigmoid",
             "dtypes": ["float16", "bfloat16"]}
    siren = {"name": "siren", "factory": "aot_factory_mod:siren"}
    out = tmp_path / "out"
    entries = write(_manifest(tmp_path, [chain, siren]), ["70", "80", "90"], out)
    # sm_70 has no FusedMLP kernel; 2 dtypes + 1 (default float16) per arch
    assert sorted((e["name"], e["dtype"], e["arch"]) for e in entries) == sorted(
        [("chain", d, a) for d in ("float16", "bfloat16") for a in ("80", "90")] + [("siren", "float16", a) for a in ("80", "90")])
    for e in entries:
        # the key is what the runtime computes from the source it would compile on that arch
        spec = trace_mlp(build_model(e["model"]), None)
        source, _ = emit(spec, e["dtype"], SMEM_LIMIT[e["arch"]])
        assert e["key"] == aot_key(source, e["arch"])
        assert (out / e["key"] / "fused_mlp.cu").read_text() == source
        assert json.loads((out / e["key"] / "meta.json").read_text())["key"] == e["key"]
    assert json.loads((out / "index.json").read_text())["kernels"] == entries
    cmake = (out / "mlp_aot.cmake").read_text()
    assert len(re.findall(r"add_custom_command\(OUTPUT", cmake)) == len(entries)
    for e in entries:
        assert f'"-gencode=arch=compute_{e["arch"]},code=sm_{e["arch"]}"' in cmake and e["key"] in cmake


def test_key_follows_source_and_arch():
    spec = trace_mlp(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), None)
    a = emit(spec, "float16", SMEM_LIMIT["90"])[0]
    b = emit(spec, "bfloat16", SMEM_LIMIT["90"])[0]
    assert aot_key(a, "90") != aot_key(b, "90") and aot_key(a, "90") != aot_key(a, "80")
    assert aot_key(a, "90") == aot_key(a, "90")


@pytest.mark.parametrize("entry, message", [
    ({"name": "m", "widths": [4]}, "needs 'widths'"),
    ({"name": "m", "widths": [4, 4, 4], "activation": "swish2"}, "unknown activation 'swish2'"),
    ({"name": "m", "factory": "no_such_module_xyz:f"}, "cannot import factory"),
])
def test_manifest_errors(entry, message):
    with pytest.raises(ValueError, match=message):
        build_model(entry)


def test_cli_reports_errors(tmp_path, capsys):
    bad = _manifest(tmp_path, [{"name": "m", "widths": [4, 4], "dtypes": ["float32"]}])
    assert main(["--manifest", str(bad), "--archs", "80", "--out", str(tmp_path / "o")]) == 1
    assert "dtype 'float32'" in capsys.readouterr().err
