"""FusedResNet (SE-ResNet9-FixUp) against the reference module run in float64."""
import pytest
import torch
import torch.nn.functional as F

import cutlass_ops
from cutlass_ops.small_map_conv import dense_conv_weight
from cutlass_ops.models import SEResNet9FixUp
from _helpers import HAS_CUDA, errors

# Issue bounds: relative L2 error vs float64, per dtype.
BOUND = {torch.float16: 1e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}


def randomize_(model: SEResNet9FixUp, g: torch.Generator) -> SEResNet9FixUp:
    """Random weights everywhere: FixUp's init (conv2 = 0, scalars 0/1) would hide bugs."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "fixup_scale" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif "fixup_bias" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            elif p.dim() == 4:  # convs: keep activations O(1)
                fan_in = p.shape[1] * p.shape[2] * p.shape[3]
                p.copy_(torch.randn(p.shape, generator=g) * (2.0 / fan_in) ** 0.5)
            else:  # SE Linear weights and biases
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 / p.shape[-1]) ** 0.5)
    return model


def make_pair(in_channels, dtype, device, g, graph=False, fuse_se_gate=False):
    ref = randomize_(SEResNet9FixUp(in_channels), g).to(device=device, dtype=dtype)
    fused = cutlass_ops.FusedResNet.from_reference(ref, graph=graph, fuse_se_gate=fuse_se_gate)
    return ref, fused


def reference_output(ref, x):
    """Float64 run of the reference module with the same (rounded) weights and input."""
    r64 = SEResNet9FixUp(ref.stem[1].weight.shape[1] // 16).to(device=x.device, dtype=torch.float64)
    r64.load_state_dict({k: v.double() for k, v in ref.state_dict().items()})
    with torch.no_grad():
        return r64(x.double())


CUDA_CASES = [(c, n, d) for d in (torch.float16, torch.bfloat16) for c in (3, 1, 11)
              for n in (1, 3, 128, 1000)]
CPU_CASES = [(c, n, d) for d in (torch.float16, torch.bfloat16, torch.float32) for c in (3, 1, 11)
             for n in (1, 3)]


def _check(in_channels, n, dtype, device, graph=False, fuse_se_gate=False):
    g = torch.Generator().manual_seed(1000 * in_channels + n)
    ref, fused = make_pair(in_channels, dtype, device, g, graph, fuse_se_gate)
    x = torch.randn(n, in_channels, 64, 64, generator=g).to(device=device, dtype=dtype)
    if device == "cuda":  # poison the allocator's free blocks: unwritten outputs show as NaN
        t = torch.full((n * 64 * 64 * 64 * 4,), float("nan"), dtype=dtype, device=device)
        del t
    with torch.no_grad():
        out = fused(x)
    expected = reference_output(ref, x)
    assert out.shape == (n, 512, 2, 2) and out.dtype == dtype
    rel, mx = errors(out, expected)
    print(f"FusedResNet C_in={in_channels} N={n} {dtype}: rel {rel:.2e} max {mx:.2e}")
    assert rel <= BOUND[dtype], f"rel {rel:.3e} > {BOUND[dtype]}"
    return fused, x, out


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("in_channels, n, dtype", CUDA_CASES,
                         ids=[f"c{c}-n{n}-{str(d)[6:]}" for c, n, d in CUDA_CASES])
def test_fused_resnet_cuda(in_channels, n, dtype):
    _check(in_channels, n, dtype, "cuda")


SE_GATE_CASES = [(3, n, d) for d in (torch.float16, torch.bfloat16) for n in (1, 133, 1000)]


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("in_channels, n, dtype", SE_GATE_CASES,
                         ids=[f"c{c}-n{n}-{str(d)[6:]}" for c, n, d in SE_GATE_CASES])
def test_fused_resnet_cuda_fuse_se_gate(in_channels, n, dtype):
    """fuse_se_gate=True: block 0's conv2 and gate as one kernel on sm90 (the two ops elsewhere)."""
    _check(in_channels, n, dtype, "cuda", fuse_se_gate=True)


@pytest.mark.parametrize("in_channels, n, dtype", CPU_CASES,
                         ids=[f"c{c}-n{n}-{str(d)[6:]}" for c, n, d in CPU_CASES])
def test_fused_resnet_cpu(in_channels, n, dtype):
    _check(in_channels, n, dtype, "cpu")


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_graph_mode_matches_and_follows_weight_updates():
    fused, x, out = _check(3, 16, torch.float16, "cuda", graph=True)
    with torch.no_grad():  # the graph's path
        eager = fused._fused_forward(x)
        torch.testing.assert_close(out, eager, rtol=0, atol=0)
        # An in-place update must not replay a stale graph (nor a stale dense weight).
        fused.layers[1][0].downsample[1].weight.mul_(2)
        fused.layers[2][0].fixup_scale.add_(0.25)
        fused.layers[3][0].conv2.weight.mul_(-1)
        torch.testing.assert_close(fused(x).clone(), fused._fused_forward(x), rtol=0, atol=0)


def test_state_dict_names_are_the_originals():
    ref = SEResNet9FixUp(3)
    fused = cutlass_ops.FusedResNet(3)
    assert list(fused.state_dict().keys()) == list(ref.state_dict().keys())
    fused.load_state_dict(ref.state_dict())  # strict
    assert "layers.1.0.downsample.1.weight" in ref.state_dict()
    assert "layers.3.0.se.excite.2.bias" in ref.state_dict()


def test_bad_input_raises():
    fused = cutlass_ops.FusedResNet(3)
    with pytest.raises(ValueError, match=r"expected input \(N, 3"):
        fused(torch.randn(2, 1, 64, 64))
    with pytest.raises(ValueError, match="multiples of 4"):
        fused(torch.randn(2, 3, 62, 62))
    with pytest.raises(ValueError, match="convert one of them"):
        fused(torch.randn(2, 3, 64, 64, dtype=torch.float16))


def test_torch_compile_traces_fused_resnet():
    g = torch.Generator().manual_seed(0)
    ref, fused = make_pair(1, torch.float32, "cpu", g)
    x = torch.randn(2, 1, 64, 64, generator=g)
    compiled = torch.compile(fused._fused_forward, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), fused(x))


def test_kernel_report_names_every_conv():
    fused = cutlass_ops.FusedResNet(3)
    report = fused.kernel_report(torch.randn(2, 3, 64, 64))
    assert [r[0] for r in report] == ["stem", "layers.0.conv1", "layers.0.conv2"] + [
        f"layers.{i}.{c}" for i in (1, 2, 3) for c in ("conv1", "conv2", "downsample")]
    assert report[-1][1] == (2, 512, 2, 2) and all(r[2].startswith("aten") for r in report)  # CPU
    assert [r[0] for r in report if "dense" in r[2]] == ["layers.3.conv2"]  # its map is 2x2


@pytest.mark.parametrize("height,width", [(2, 2), (1, 1), (2, 3), (1, 2), (3, 3)])
def test_dense_conv_weight_is_the_conv(height, width):
    g = torch.Generator().manual_seed(height * 10 + width)
    w = torch.randn(7, 5, 3, 3, generator=g, dtype=torch.float64)
    x = torch.randn(3, 5, height, width, generator=g, dtype=torch.float64)
    dense = dense_conv_weight(w, height, width, padding=1)
    assert dense.shape == (height * width * 7, height * width * 5, 1, 1)
    flat = x.permute(0, 2, 3, 1).reshape(3, -1) @ dense.reshape(dense.shape[0], -1).T
    got = flat.reshape(3, height, width, 7).permute(0, 3, 1, 2)
    torch.testing.assert_close(got, F.conv2d(x, w, padding=1), rtol=1e-12, atol=1e-12)


def test_small_input_takes_dense_conv2_paths():
    # 32x32 input: block 2's map is 2x2 and block 3's 1x1, both run as dense layers.
    g = torch.Generator().manual_seed(5)
    ref, fused = make_pair(3, torch.float64, "cpu", g)
    x = torch.randn(3, 3, 32, 32, generator=g, dtype=torch.float64)
    report = fused.kernel_report(x)
    assert [r[0] for r in report if "dense" in r[2]] == ["layers.2.conv2", "layers.3.conv2"]
    with torch.no_grad():
        torch.testing.assert_close(fused(x), ref(x), rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_kernel_report_on_cuda_names_generated_kernels():
    fused = cutlass_ops.FusedResNet(3).cuda().half()
    report = fused.kernel_report(torch.randn(4, 3, 64, 64, device="cuda", dtype=torch.half))
    assert report[0] == ("stem", (4, 64, 16, 16), "space_to_depth_conv kernel"), report
    assert all(r[2].startswith("cutlass_ops_conv2d_fused_f16_") for r in report[1:]), report
