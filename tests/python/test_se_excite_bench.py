"""bench se-excite's systems compute the same gate (CPU: the ops' ATen paths, FusedMLP's torch
layers), within their dtypes' error of the float64 gate; no timing here."""
import pytest
import torch

from cutlass_ops.fused_mlp import FusedMLP
from cutlass_ops.tools import se_excite_bench as seb


@pytest.mark.parametrize("c,hw,_w,avgpool,has_post", seb.SE_SHAPES[:1] + seb.SE_SHAPES[-1:])
def test_every_system_computes_the_gate(c, hw, _w, avgpool, has_post):
    n = 3
    t = seb.se_inputs(n, c, hw, torch.bfloat16, device="cpu", seed=1)
    pb = t["pb"] if has_post else None
    fused = None
    if c <= seb.MAX_FUSED_MLP_WIDTH:  # block 3's excite (512 wide) is too wide for FusedMLP
        fused = FusedMLP.from_module(seb.excite_module(t, torch.bfloat16), torch.zeros(1, c, dtype=torch.bfloat16))
    paths = seb.se_paths(t, avgpool, pb, fused)
    assert set(paths) == set(seb.SYSTEMS) - ({seb.SYSTEMS[1]} if fused is None else set())
    with torch.no_grad():
        errors = seb.errors_vs_float64(t, avgpool, pb, paths)
    for name, rel in errors.items():
        assert 0 < rel < 1e-2, f"{name}: rel {rel:.2e}"  # bf16: ~4e-3; 0 would mean no rounding at all
