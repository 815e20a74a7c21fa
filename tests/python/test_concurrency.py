"""Concurrency: ops called from two threads and on two streams at once give the
right answers; the thread-local kernel choices (conv2d_backward_force_kernel,
conv2d_fused_force_kernel, the last-kernel names) do not leak between threads; a CUDA graph
captured on a side stream replays correctly while another stream runs eager ops."""
import threading

import pytest
import torch
import torch.nn.functional as F
from torch.nn.grad import conv2d_input

import cutlass_ops
from cutlass_ops import ops
from _helpers import DEVICES, HAS_CUDA, errors, run_in_threads

H = torch.float16
CL = torch.channels_last


def _conv_inputs(device, seed, dtype=H, n=4, c=32, hw=12):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, hw, hw, generator=g).to(device=device, dtype=dtype).contiguous(memory_format=CL)
    w = (torch.randn(c, c, 3, 3, generator=g) * (9 * c) ** -0.5).to(device=device, dtype=dtype)
    bias = torch.randn(c, generator=g).to(device)
    return x, w.contiguous(memory_format=CL), bias


def _want(x, w, bias):
    return F.conv2d(x.double().cpu(), w.double().cpu(), bias.double().cpu(), 1, 1).relu()


@pytest.mark.parametrize("device", DEVICES)
def test_two_threads_run_ops_at_once(device):
    dtype = H if device == "cuda" else torch.float32
    inputs = [_conv_inputs(device, seed, dtype) for seed in (1, 2)]
    wants = [_want(*a) for a in inputs]
    box = [torch.rand(500, 4, device=device) for _ in range(2)]
    box = [torch.cat([b[:, :2], b[:, :2] + b[:, 2:] + 0.1], 1) for b in box]
    want_giou = cutlass_ops.giou_loss(box[0].double(), box[1].double(), "sum")

    def work(i):
        stream = torch.cuda.Stream() if device == "cuda" else None
        ctx = torch.cuda.stream(stream) if stream is not None else torch.no_grad()
        with ctx:
            for _ in range(20):
                out = cutlass_ops.conv2d_fused(*inputs[i][:2], inputs[i][2], None, 1, 1, None, None, True)
                loss = cutlass_ops.giou_loss(box[0], box[1], "sum")
            if stream is not None:
                stream.synchronize()
        assert errors(out, wants[i])[0] < 2e-3, i
        assert abs(loss.item() - want_giou.item()) < 1e-4 * abs(want_giou.item())
    run_in_threads(work, 2)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)")
def test_two_streams_at_once():
    """Independent work on two streams, issued interleaved, each with its own inputs."""
    a, b = _conv_inputs("cuda", 3, n=64), _conv_inputs("cuda", 4, n=64)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    s1.wait_stream(torch.cuda.current_stream())
    s2.wait_stream(torch.cuda.current_stream())
    outs = [[], []]
    for _ in range(10):
        with torch.cuda.stream(s1):
            outs[0].append(cutlass_ops.conv2d_fused(a[0], a[1], a[2], None, 1, 1, None, None, True))
            grad_z, sums = ops.relu_backward(outs[0][-1], outs[0][-1])
        with torch.cuda.stream(s2):
            outs[1].append(cutlass_ops.conv2d_fused(b[0], b[1], b[2], None, 1, 1, None, None, True))
            dx = cutlass_ops.conv2d_dgrad(outs[1][-1], b[1], b[0].shape, 1, 1)
    torch.cuda.synchronize()
    for o in outs[0]:
        assert errors(o, _want(*a))[0] < 2e-3
    for o in outs[1]:
        assert errors(o, _want(*b))[0] < 2e-3
    want_dx = conv2d_input(b[0].shape, b[1].double().cpu(), outs[1][-1].double().cpu(), 1, 1)
    assert errors(dx, want_dx)[0] < 2e-3
    assert abs(sums[0].item() - outs[0][-1].double().sum().item()) < 1e-3 * outs[0][-1].double().abs().sum().item()


@pytest.mark.parametrize("device", DEVICES)
def test_forced_kernel_state_is_thread_local(device):
    """One thread forces kernels (the profiler's switch); another thread, running at the same
    time, sees none of it: its calls take the normal choice and report their own kernels."""
    forced_set = threading.Event()
    checked = threading.Event()
    seen = {}

    def forcer(_):
        torch.ops.cutlass_ops.conv2d_backward_force_kernel("cudnn", 0)
        torch.ops.cutlass_ops.conv2d_fused_force_kernel("no_such_kernel", 3)
        try:
            forced_set.set()
            checked.wait(30)
            if device == "cuda":  # still forced here: the name cannot run anything
                x, w, _ = _conv_inputs(device, 5)
                with pytest.raises(ValueError, match="no_such_kernel"):
                    cutlass_ops.conv2d_fused(x, w)
                dy = torch.randn_like(x)
                cutlass_ops.conv2d_dgrad(dy, w, x.shape, 1, 1)
                seen["forcer_backward"] = ops.conv2d_backward_last_kernel()
        finally:
            torch.ops.cutlass_ops.conv2d_backward_force_kernel("", 0)
            torch.ops.cutlass_ops.conv2d_fused_force_kernel("", 0)

    def other(_):
        forced_set.wait(30)
        try:
            x, w, bias = _conv_inputs(device, 6, H if device == "cuda" else torch.float32)
            out = cutlass_ops.conv2d_fused(x, w, bias, None, 1, 1, None, None, True)  # not "no_such_kernel"
            seen["other_fused"] = cutlass_ops.conv2d_fused_last_kernel()
            assert errors(out, _want(x, w, bias))[0] < 2e-3
            cutlass_ops.conv2d_dgrad(torch.randn_like(x), w, x.shape, 1, 1)
            seen["other_backward"] = ops.conv2d_backward_last_kernel()
        finally:
            checked.set()

    def body(i):
        (forcer if i == 0 else other)(i)
    run_in_threads(body, 2)
    assert "no_such_kernel" not in seen["other_fused"]
    assert "forced" not in seen["other_backward"], seen
    if device == "cuda":
        assert seen["forcer_backward"] == "aten (cuDNN: forced)", seen
    # and this (main) thread never had anything forced
    x, w, bias = _conv_inputs(device, 7, H if device == "cuda" else torch.float32)
    cutlass_ops.conv2d_fused(x, w, bias, None, 1, 1)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)")
def test_graph_captured_on_side_stream_replays_beside_eager_work():
    """A training-free FusedResNet forward captured (graph=True captures on its own stream)
    and an explicit graph of conv2d_fused captured on a side stream: replayed on the side
    stream while the default stream runs eager ops on other tensors; both stay right."""
    x, w, bias = _conv_inputs("cuda", 8, n=32)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            cutlass_ops.conv2d_fused(x, w, bias, None, 1, 1, None, None, True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            static_out = cutlass_ops.conv2d_fused(x, w, bias, None, 1, 1, None, None, True)
    torch.cuda.current_stream().wait_stream(side)
    e_x, e_w, e_bias = _conv_inputs("cuda", 9, n=64)
    g = torch.Generator().manual_seed(10)
    for step in range(5):
        new_x = torch.randn(x.shape, generator=g).to(x)
        side.wait_stream(torch.cuda.current_stream())  # new_x is ready
        with torch.cuda.stream(side):
            x.copy_(new_x)
            graph.replay()
            snapshot = static_out.clone()
        eager = [cutlass_ops.conv2d_fused(e_x, e_w, e_bias, None, 1, 1, None, None, True) for _ in range(3)]
        se = cutlass_ops.se_gate(eager[-1], eager[-2], *[torch.randn(s, device="cuda") * 0.1 for s in
                                                        ((2, 32), (2,), (32, 2), (32,))])
        torch.cuda.current_stream().wait_stream(side)
        assert errors(snapshot, _want(new_x, w, bias))[0] < 2e-3, step
        assert errors(eager[-1], _want(e_x, e_w, e_bias))[0] < 2e-3, step
        assert torch.isfinite(se).all()
