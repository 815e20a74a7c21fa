"""Bad input everywhere: every public op and module, given a wrong dtype, a tensor
on the wrong device (a CPU tensor among CUDA ones and the reverse; on a machine without CUDA
a meta tensor among CPU ones, which runs the fake impls' checks), a wrong rank, or a
complex tensor that requires grad, raises ValueError/TypeError naming the argument, before
any kernel launch: afterwards the CUDA context still works.

Table-driven: each op has a factory of valid arguments (by name) and a call; each mutation
changes one named tensor argument and expects its name in the message."""
from __future__ import annotations

import re

import pytest
import torch

import cutlass_ops
from cutlass_ops import ops
from _helpers import DEVICES, HAS_CUDA

F16 = torch.float16


def _other_device(device: str) -> str:
    """A device other than `device` to mix in: CUDA/CPU where there is a GPU, else meta."""
    if device == "cuda":
        return "cpu"
    return "cuda" if HAS_CUDA else "meta"


def _t(*shape, device, dtype=torch.float32, cl=False):
    t = torch.randn(shape, dtype=torch.float64).to(device=device, dtype=dtype)
    return t.contiguous(memory_format=torch.channels_last) if cl else t


# ---- valid arguments per op (name -> value), and how to call the op -------------------------

def _conv2d_fused_args(device, dtype):
    return dict(input=_t(2, 8, 6, 6, device=device, dtype=dtype, cl=True),
                weight=_t(8, 8, 3, 3, device=device, dtype=dtype, cl=True),
                bias=_t(8, device=device), residual=_t(2, 8, 6, 6, device=device, dtype=dtype, cl=True),
                scale=_t(device=device), post_bias=_t(device=device))


def _conv2d_fused_call(a):
    return cutlass_ops.conv2d_fused(a["input"], a["weight"], a["bias"], a["residual"], 1, 1, a["scale"],
                                    a["post_bias"], True)


def _dgrad_args(device, dtype):
    return dict(grad_output=_t(2, 8, 6, 6, device=device, dtype=dtype, cl=True),
                weight=_t(8, 8, 3, 3, device=device, dtype=dtype, cl=True), scale=_t(device=device))


def _dgrad_call(a):
    return cutlass_ops.conv2d_dgrad(a["grad_output"], a["weight"], (2, 8, 6, 6), 1, 1, a["scale"])


def _wgrad_args(device, dtype):
    return dict(grad_output=_t(2, 8, 6, 6, device=device, dtype=dtype, cl=True),
                input=_t(2, 8, 6, 6, device=device, dtype=dtype, cl=True),
                weight=_t(8, 8, 3, 3, device=device, dtype=dtype, cl=True), scale=_t(device=device))


def _wgrad_call(a):
    return cutlass_ops.conv2d_wgrad(a["grad_output"], a["input"], a["weight"], 1, 1, a["scale"])


def _se_params(device):
    return dict(fc1_weight=_t(4, 16, device=device), fc1_bias=_t(4, device=device),
                fc2_weight=_t(16, 4, device=device), fc2_bias=_t(16, device=device))


def _se_gate_args(device, dtype):
    return dict(h=_t(2, 16, 4, 4, device=device, dtype=dtype, cl=True),
                identity=_t(2, 16, 4, 4, device=device, dtype=dtype, cl=True), **_se_params(device),
                identity_bias=_t(device=device), post_bias=_t(device=device), h_bias=_t(device=device))


def _se_gate_call(a):
    return cutlass_ops.se_gate(a["h"], a["identity"], a["fc1_weight"], a["fc1_bias"], a["fc2_weight"],
                               a["fc2_bias"], a["identity_bias"], a["post_bias"], avgpool=True, h_bias=a["h_bias"])


def _se_gate_backward_args(device, dtype):
    return dict(grad_out=_t(2, 16, 4, 4, device=device, dtype=dtype, cl=True),
                grad_pooled=_t(2, 16, 2, 2, device=device, dtype=dtype, cl=True),
                h=_t(2, 16, 4, 4, device=device, dtype=dtype, cl=True),
                out=_t(2, 16, 4, 4, device=device, dtype=dtype, cl=True), **_se_params(device),
                post_bias=_t(device=device), h_bias=_t(device=device))


def _se_gate_backward_call(a):
    return ops.se_gate_backward(a["grad_out"], a["grad_pooled"], a["h"], a["out"], a["fc1_weight"], a["fc1_bias"],
                                a["fc2_weight"], a["fc2_bias"], a["post_bias"], a["h_bias"])


def _relu_backward_args(device, dtype):
    return dict(grad=_t(2, 8, 4, 4, device=device, dtype=dtype, cl=True),
                out=_t(2, 8, 4, 4, device=device, dtype=dtype, cl=True), post_bias=_t(device=device))


def _relu_backward_call(a):
    return ops.relu_backward(a["grad"], a["out"], a["post_bias"])


def _s2d_args(device, dtype):
    return dict(input=_t(2, 3, 8, 8, device=device, dtype=dtype), weight=_t(32, 48, 1, 1, device=device, dtype=dtype),
                post_bias=_t(device=device))


def _s2d_call(a):
    return cutlass_ops.space_to_depth_conv(a["input"], a["weight"], a["post_bias"], relu=True)


def _s2d_wgrad_args(device, dtype):
    return dict(grad=_t(2, 32, 2, 2, device=device, dtype=dtype, cl=True), input=_t(2, 3, 8, 8, device=device, dtype=dtype),
                out=_t(2, 32, 2, 2, device=device, dtype=dtype, cl=True), post_bias=_t(device=device))


def _s2d_wgrad_call(a):
    return ops.space_to_depth_conv_weight_grad(a["grad"], a["input"], a["out"], a["post_bias"])


def _giou_args(device, dtype):
    return {"boxes1 (pred)": _t(3, 5, 4, device=device, dtype=dtype), "boxes2 (target)": _t(3, 5, 4, device=device, dtype=dtype),
            "counts": torch.tensor([5, 0, 2], device=device)}


def _giou_call(a):
    return cutlass_ops.giou_loss_padded(a["boxes1 (pred)"], a["boxes2 (target)"], counts=a["counts"], reduction="mean")


def _giou_mask_args(device, dtype):
    a = _giou_args(device, dtype)
    del a["counts"]
    a["mask"] = torch.rand(3, 5, device=device) > 0.5 if device != "meta" else torch.ones(3, 5, dtype=torch.bool)
    return a


def _giou_mask_call(a):
    return cutlass_ops.giou_loss_padded(a["boxes1 (pred)"], a["boxes2 (target)"], mask=a["mask"], reduction="sum")


def _giou_ragged_args(device, dtype):
    return {"boxes1 (pred)": _t(6, 4, device=device, dtype=dtype), "boxes2 (target)": _t(6, 4, device=device, dtype=dtype),
            "offsets": torch.tensor([0, 2, 5], device=device)}


def _giou_ragged_call(a):
    return cutlass_ops.giou_loss_ragged(a["boxes1 (pred)"], a["boxes2 (target)"], a["offsets"], reduction="none")


def _b2b_args(device, dtype):
    return dict(input=_t(2, 8, 6, 6, device=device, dtype=dtype, cl=True),
                w0=_t(16, 8, 3, 3, device=device, dtype=dtype, cl=True), bias0=_t(16, device=device, dtype=dtype),
                w1=_t(8, 16, 1, 1, device=device, dtype=dtype, cl=True), bias1=_t(8, device=device, dtype=dtype))


def _b2b_call(a):
    return cutlass_ops.conv2d_b2b(a["input"], a["w0"], a["bias0"], a["w1"], a["bias1"], 1, 1)


OPS = {
    "conv2d_fused": (_conv2d_fused_args, _conv2d_fused_call),
    "conv2d_b2b": (_b2b_args, _b2b_call),
    "conv2d_dgrad": (_dgrad_args, _dgrad_call),
    "conv2d_wgrad": (_wgrad_args, _wgrad_call),
    "se_gate": (_se_gate_args, _se_gate_call),
    "se_gate_backward": (_se_gate_backward_args, _se_gate_backward_call),
    "relu_backward": (_relu_backward_args, _relu_backward_call),
    "space_to_depth_conv": (_s2d_args, _s2d_call),
    "space_to_depth_conv_weight_grad": (_s2d_wgrad_args, _s2d_wgrad_call),
    "giou_loss_padded": (_giou_args, _giou_call),
    "giou_loss_padded_mask": (_giou_mask_args, _giou_mask_call),
    "giou_loss_ragged": (_giou_ragged_args, _giou_ragged_call),
}

# Arguments whose dtype is not the data dtype: the wrong dtype to give each.
WRONG_DTYPE = {"counts": torch.int32, "offsets": torch.int32, "mask": torch.float32}


def _wrong_dtype(name, t):
    if name in WRONG_DTYPE:
        return t.to(WRONG_DTYPE[name])
    if name.startswith("boxes"):  # integer boxes are upcast as torchvision does: a dtype mismatch instead
        return t.to(torch.float64 if t.dtype != torch.float64 else torch.float32)
    return t.to(torch.int32)


def _wrong_rank(name, t):
    if t.dim() == 0:
        return t.reshape(1, 1).expand(2, 2).contiguous()  # a scalar argument given as a matrix
    if t.dim() == 1:
        return t.unsqueeze(0)
    return t[0]


def _complex_requiring_grad(name, t):
    return t.to(torch.complex64).requires_grad_()


MUTATIONS = {"dtype": _wrong_dtype, "rank": _wrong_rank, "complex_requires_grad": _complex_requiring_grad}


def _names_argument(message: str, name: str) -> bool:
    return re.search(r"(?<![\w])" + re.escape(name) + r"(?![\w])", message) is not None


def _cases():
    for op, (make, _) in OPS.items():
        for name in make("cpu", torch.float32):
            for kind in (*MUTATIONS, "device"):
                if kind == "complex_requires_grad" and name in WRONG_DTYPE:
                    continue  # index/mask arguments: no gradient
                yield op, name, kind


CASES = list(_cases())


def _context_still_works(device):
    if device == "cuda":
        torch.cuda.synchronize()
        x = torch.ones(4, device="cuda")
        assert (x + 1).sum().item() == 8  # no sticky CUDA error


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op, name, kind", CASES, ids=[f"{o}-{n.split()[0]}-{k}" for o, n, k in CASES])
@pytest.mark.fallback  # an input no kernel takes may reach the fallback before the error
def test_bad_argument_raises_naming_it(device, op, name, kind):
    make, call = OPS[op]
    dtype = F16 if device == "cuda" else torch.float32
    args = make(device, dtype)
    call(args)  # the valid arguments run
    t = args[name]
    if kind == "device":
        other = _other_device(device)
        args[name] = t.to(other)
    else:
        args[name] = MUTATIONS[kind](name, t)
    with pytest.raises((ValueError, TypeError)) as info:
        call(args)
    message = str(info.value)
    # "boxes1 (pred)": either name will do
    assert any(_names_argument(message, n) for n in re.findall(r"\w+", name)), (op, name, kind, message)
    _context_still_works(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.fallback  # an input no kernel takes may reach the fallback before the error
def test_cpu_and_cuda_data_mixed_both_ways(device):
    """The data tensor on one device and everything else on the other (the op then runs as
    the other device's op): the data tensor is named."""
    other = _other_device(device)
    for op, (make, call) in OPS.items():
        args = make(device, F16 if device == "cuda" else torch.float32)
        first = next(iter(args))
        moved = {k: (v.to(other) if k != first else v) for k, v in args.items()}
        with pytest.raises(ValueError) as info:
            call(moved)
        assert " is on " in str(info.value), (op, str(info.value))
    _context_still_works(device)


@pytest.mark.parametrize("device", DEVICES)
def test_non_tensor_and_bad_scalars(device):
    x = _t(2, 8, 6, 6, device=device)
    w = _t(8, 8, 3, 3, device=device)
    with pytest.raises(TypeError, match="stride must be an int or two ints"):
        cutlass_ops.conv2d_fused(x, w, stride=1.5)
    with pytest.raises(TypeError, match="padding must be an int or two ints"):
        cutlass_ops.conv2d_fused(x, w, padding="same")
    with pytest.raises(ValueError, match="stride must be an int or two ints"):
        cutlass_ops.conv2d_fused(x, w, stride=(1, 2, 3))
    with pytest.raises(ValueError, match="stride must be >= 1"):
        cutlass_ops.conv2d_fused(x, w, stride=0)
    with pytest.raises(ValueError, match="padding must be >= 0"):
        cutlass_ops.conv2d_fused(x, w, padding=-1)
    with pytest.raises(ValueError, match="input_size must be"):
        cutlass_ops.conv2d_dgrad(_t(2, 8, 4, 4, device=device), w, (8, 6, 6))
    with pytest.raises(ValueError, match="must be real"):
        cutlass_ops.giou_loss(torch.ones(3, 4, dtype=torch.complex64, device=device),
                              torch.ones(3, 4, dtype=torch.complex64, device=device))
    with pytest.raises(TypeError, match="boxes1 .pred. must be a tensor"):
        cutlass_ops.giou_loss([[0.0, 0.0, 1.0, 1.0]], torch.ones(1, 4, device=device))
    _context_still_works(device)


# ---- modules ---------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_fused_conv2d_module_bad_input(device):
    dtype = F16 if device == "cuda" else torch.float32
    m = cutlass_ops.FusedConv2d(8, 8, 3, padding=1, scale=True, post_bias=True).to(device=device, dtype=dtype)
    x = _t(2, 8, 6, 6, device=device, dtype=dtype, cl=True)
    m(x)
    with pytest.raises(ValueError, match="input must be a floating tensor"):
        m(x.to(torch.int32))
    with pytest.raises(ValueError, match="weight dtype"):
        m(x.to(torch.float64 if dtype != torch.float64 else torch.float32))
    with pytest.raises(ValueError, match="input must be 4-D"):
        m(x[0])
    with pytest.raises(ValueError, match=r"input has 4 channels but weight expects 8"):
        m(x[:, :4])
    with pytest.raises(ValueError, match="weight is on .* but input is on"):
        m(x.to(_other_device(device)))
    with pytest.raises(ValueError, match="residual"):
        m(x, residual=x[:, :, :3])
    with pytest.raises(ValueError, match="input must be a floating tensor, got ComplexFloat"):
        m(x.to(torch.complex64).requires_grad_())
    _context_still_works(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.fallback  # an input no kernel takes may reach the fallback before the error
def test_fused_conv_pair_module_bad_input(device):
    dtype = F16 if device == "cuda" else torch.float32
    m = cutlass_ops.FusedConvPair(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.Conv2d(16, 8, 1)).to(device, dtype)
    x = _t(2, 8, 6, 6, device=device, dtype=dtype, cl=True)
    m(x)
    with pytest.raises(ValueError, match="input must be a floating tensor"):
        m(x.to(torch.int32))
    with pytest.raises(ValueError, match="w0 dtype"):
        m(x.to(torch.float64 if dtype != torch.float64 else torch.float32))
    with pytest.raises(ValueError, match="input must be 4-D"):
        m(x[0])
    with pytest.raises(ValueError, match=r"input has 4 channels but w0 expects 8"):
        m(x[:, :4])
    with pytest.raises(ValueError, match="w0 is on .* but input is on"):
        m(x.to(_other_device(device)))
    with pytest.raises(ValueError, match="input must be a floating tensor, got ComplexFloat"):
        m(x.to(torch.complex64).requires_grad_())
    _context_still_works(device)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_resnet_module_bad_input(device):
    dtype = F16 if device == "cuda" else torch.float32
    m = cutlass_ops.FusedResNet(3).to(device=device, dtype=dtype)
    x = _t(2, 3, 32, 32, device=device, dtype=dtype)
    with pytest.raises(ValueError, match=r"expected input \(N, 3, H, W\)"):
        m(x[0])
    with pytest.raises(ValueError, match=r"expected input \(N, 3, H, W\)"):
        m(x[:, :2])
    with pytest.raises(ValueError, match="multiples of 4"):
        m(x[:, :, :30])
    with pytest.raises(ValueError, match="input is torch.int32"):
        m(x.to(torch.int32))
    with pytest.raises(ValueError, match="input is .* on " + _other_device(device)):
        m(x.to(_other_device(device)))
    with pytest.raises(ValueError, match="input is torch.complex64"):
        m(x.to(torch.complex64).requires_grad_())
    _context_still_works(device)
