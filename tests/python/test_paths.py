"""cutlass_ops.paths: which path each op's CUDA call took, fallbacks counted and warned once per
(op, reason), strict mode.  The mechanism and the wrappers' reasons on the CPU; on a GPU, for
each op, one input its kernel runs (strict mode passes, last_path is "kernel") and one it
falls back on (strict mode raises; otherwise a warning)."""
import re
import threading
import warnings

import pytest
import torch

import cutlass_ops
from _helpers import HAS_CUDA
from cutlass_ops import ops, paths
from cutlass_ops.ops._common import _dtype_reason, _gemm_why_not

# The tests set strict mode themselves (the fixture below, strict(True) where they mean it): the
# process's default (CUTLASS_OPS_STRICT) stays out of them.
pytestmark = pytest.mark.fallback

gpu = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)")
F16 = torch.float16


@pytest.fixture(autouse=True)
def fresh_paths():
    """Counts and the warned-once set cleared around each test; strict mode off unless a test
    turns it on (whatever CUTLASS_OPS_STRICT says)."""
    paths.reset()
    with paths.strict(False):
        yield
    paths.reset()


# ---- the mechanism ------------------------------------------------------------------------------

def test_record_and_last_path():
    assert paths.last_path("op_a") is None
    paths.record("op_a")
    assert paths.last_path("op_a") == "kernel"
    paths.record("op_a", paths.EMPTY)
    assert paths.last_path("op_a") == "empty"
    with pytest.warns(UserWarning, match="op_a: some reason"):
        paths.fallback("op_a", "some reason")
    assert paths.last_path("op_a") == "fallback: some reason"
    assert paths.last_path("op_b") is None


def test_last_path_is_per_thread():
    paths.record("op_t")
    seen = {}

    def other():
        seen["before"] = paths.last_path("op_t")
        paths.fallback("op_t", "in the other thread")
        seen["after"] = paths.last_path("op_t")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen == {"before": None, "after": "fallback: in the other thread"}
    assert paths.last_path("op_t") == "kernel"
    # any_thread: the last record on any thread (a CUDA backward's op runs on autograd's thread)
    assert paths.last_path("op_t", any_thread=True) == "fallback: in the other thread"
    # the counts are the process's, all threads
    assert paths.fallback_counts() == {("op_t", "in the other thread"): 1}


def test_warns_once_per_distinct_reason_and_counts_every_call():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            paths.fallback("op_w", "reason one", "x (2, 3) float32")
        paths.fallback("op_w", "reason two")
        paths.fallback("op_v", "reason one")
    messages = [str(w.message) for w in caught]
    assert len(messages) == 3, messages
    assert "cutlass_ops.op_w: reason one" in messages[0] and "x (2, 3) float32" in messages[0]
    assert "reason two" in messages[1] and "cutlass_ops.op_v" in messages[2]
    assert paths.fallback_counts() == {("op_w", "reason one"): 3, ("op_w", "reason two"): 1,
                                       ("op_v", "reason one"): 1}
    paths.reset()
    assert paths.fallback_counts() == {}
    with pytest.warns(UserWarning, match="reason one"):
        paths.fallback("op_w", "reason one")


def test_strict_raises_naming_op_reason_and_input():
    x = torch.zeros(2, 3, 4, dtype=torch.float32).transpose(1, 2)
    with paths.strict():
        with pytest.raises(cutlass_ops.FallbackError) as e:
            paths.fallback("op_s", "float32 input (the kernel takes float16/bfloat16)", paths.describe(x=x, k=5))
    msg = str(e.value)
    assert "cutlass_ops.op_s" in msg and "float32 input" in msg
    assert "x (2, 4, 3) float32 strides (12, 1, 4) cpu" in msg and "k=5" in msg
    assert paths.fallback_counts() == {("op_s", "float32 input (the kernel takes float16/bfloat16)"): 1}
    assert paths.last_path("op_s").startswith("fallback: float32 input")


def test_a_strict_error_does_not_use_up_the_warning():
    """The first fallback outside strict mode warns, even after the same (op, reason) raised in
    strict mode (the error is not the warning)."""
    with paths.strict(), pytest.raises(cutlass_ops.FallbackError):
        paths.fallback("op_sw", "a reason")
    with pytest.warns(UserWarning, match="cutlass_ops.op_sw: a reason"):
        paths.fallback("op_sw", "a reason")
    assert paths.fallback_counts() == {("op_sw", "a reason"): 2}


def test_strict_nests_and_restores():
    assert not paths.is_strict()
    with paths.strict():
        assert paths.is_strict()
        with paths.strict(False):
            assert not paths.is_strict()
            with paths.strict():
                assert paths.is_strict()
            assert not paths.is_strict()
        assert paths.is_strict()
        with pytest.raises(KeyError):
            with paths.strict(False):
                raise KeyError("restored on the way out")
        assert paths.is_strict()
    assert not paths.is_strict()


def test_strict_is_per_thread():
    seen = []
    default = paths._default[0]  # the threads' default here (the module's fallback marker turns it off)
    with paths.strict():
        t = threading.Thread(target=lambda: seen.append(paths.is_strict()))
        t.start()
        t.join()
    assert seen == [default]
    with paths.strict(not default, all_threads=True):
        t = threading.Thread(target=lambda: seen.append(paths.is_strict()))
        t.start()
        t.join()
        assert not paths.is_strict()  # this thread's own strict(False) (the fixture's) still rules here
    assert seen[1] is (not default) and paths._default[0] is default


@pytest.mark.parametrize("value, expected", [(None, False), ("", False), ("0", False), ("off", False),
                                             ("1", True), ("true", True), (" YES ", True), ("on", True)])
def test_env_default_parsed(value, expected, monkeypatch):
    assert paths.parse_flag(value) is expected
    if value is None:
        monkeypatch.delenv("CUTLASS_OPS_STRICT", raising=False)
    else:
        monkeypatch.setenv("CUTLASS_OPS_STRICT", value)
    assert paths._strict_from_env() is expected


def test_env_default_typo_warns_and_stays_off(monkeypatch):
    with pytest.raises(ValueError, match="CUTLASS_OPS_STRICT"):
        paths.parse_flag("2")
    monkeypatch.setenv("CUTLASS_OPS_STRICT", "strict")
    with pytest.warns(UserWarning, match="strict mode stays off"):
        assert paths._strict_from_env() is False


def test_cpu_and_fake_tensors_are_not_recorded():
    x = torch.randn(4, 16)
    assert not paths.recording(x) and not paths.recording(None, None)
    assert not paths.recording(torch.empty(2, device="meta"))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        assert not paths.recording(torch.empty(2))
    # a CPU call is the CPU path, not a fallback: nothing recorded, even in strict mode
    with paths.strict():
        cutlass_ops.ops.scale_samples(x, torch.ones(4))
        cutlass_ops.ops.layer_norm_rows(x, None, None, 1e-5)
    assert paths.last_path("scale_samples") is None and paths.last_path("layer_norm_rows") is None
    assert paths.fallback_counts() == {}


def test_compiled_calls_trace():
    """torch.compile traces a wrapper (nothing recorded while tracing) and still gives the op's
    numbers."""
    x = torch.randn(3, 5, dtype=torch.float64)
    scale = torch.rand(3, dtype=torch.float64)
    compiled = torch.compile(lambda a, b: cutlass_ops.ops.scale_samples(a, b), backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, scale), x * scale[:, None])


# ---- the wrappers' reasons (pure functions of the tensors' metadata) ---------------------------

def test_reasons_from_metadata():
    from cutlass_ops.ops.dw_conv3x3_tokens import _dw_why_not
    from cutlass_ops.ops.layer_norm_rows import _rows_why_not
    from cutlass_ops.ops.se_gate import _se_why_not
    assert _dtype_reason(torch.empty(2, dtype=F16)) is None
    assert _dtype_reason(torch.empty(2)) == "float32 input (the kernel takes float16/bfloat16)"
    assert _gemm_why_not(torch.empty(4, 64, dtype=F16), torch.empty(32, 64, dtype=F16)) is None
    assert "multiples of 8" in _gemm_why_not(torch.empty(4, 12, dtype=F16), torch.empty(32, 12, dtype=F16))
    assert _gemm_why_not(torch.empty(0, 64, dtype=F16), torch.empty(32, 64, dtype=F16)) == paths.EMPTY
    h = torch.empty(2, 64, 4, 4, dtype=F16).contiguous(memory_format=torch.channels_last)
    assert _se_why_not(h, (h,), 4096) is None
    assert "C = 12" in _se_why_not(torch.empty(2, 12, 4, 4, dtype=F16), (), 4096)
    assert "over the kernel's 2048" in _se_why_not(torch.empty(1, 4096, 1, 1, dtype=F16), (), 2048)
    assert _rows_why_not(torch.empty(4, 2048, dtype=F16), (None,), 2048) is None
    assert "over the kernel's 2048" in _rows_why_not(torch.empty(4, 2056, dtype=F16), (None,), 2048)
    assert "over the kernel's 512" in _rows_why_not(torch.empty(4, 1001, dtype=F16), (None,), 2048)
    assert _rows_why_not(torch.empty(4, 1001, dtype=F16)[:, 1:], (None,), 2048) is None  # 1000 columns, copied
    assert _dw_why_not(torch.empty(2, 16, 8)) == "float32 input (the kernel takes float16/bfloat16)"


# ---- each op on a GPU: the kernel in strict mode, and a fallback --------------------------------

def _cuda(*shape, dtype=F16, cl=False):
    t = torch.randn(*shape, device="cuda").to(dtype)
    return t.contiguous(memory_format=torch.channels_last) if cl else t


def _b2b_case(dtype):
    built = [n for n in ops.conv2d_b2b_kernels() if "_f16_" in n]
    if not built:
        pytest.skip("no float16 conv2d_b2b kernel in this build")
    k0, k1 = map(int, re.search(r"_k(\d+)_k(\d+)_", built[0]).groups())
    return (_cuda(2, 32, 8, 8, dtype=dtype, cl=True), _cuda(k0, 32, 3, 3, dtype=dtype), None,
            _cuda(k1, k0, 1, 1, dtype=dtype)), {"padding": 1}


def _se_args(c, dtype):
    h, identity = _cuda(2, c, 8, 8, dtype=dtype, cl=True), _cuda(2, c, 8, 8, dtype=dtype, cl=True)
    r = max(c // 4, 1)
    return h, identity, _cuda(r, c, dtype=torch.float32), _cuda(r, dtype=torch.float32), \
        _cuda(c, r, dtype=torch.float32), _cuda(c, dtype=torch.float32)


def _se_backward_args(c, dtype):
    h, identity, w1, b1, w2, b2 = _se_args(c, dtype)
    return (torch.randn_like(h), None, h, torch.relu(h), w1, b1, w2, b2), {}


def _dw_args(dtype):
    return (_cuda(2, 16, 32, dtype=dtype), 4, 4, _cuda(3, 32, 1, 3, 3, dtype=torch.float32),
            _cuda(3, 32, dtype=torch.float32), [1, 2, 2]), {}


def _linear_silu_case(k):
    if k == 256 and (torch.cuda.get_device_capability() != (9, 0) or not ops.linear_silu_kernels()):
        pytest.skip("linear_silu's kernel runs on sm90 builds with its kernels only")
    return (_cuda(64, k), _cuda(128, k), None), {}


# op name -> (its wrapper, a case its kernel runs, a case that falls back); a case is a function
# returning (args, kwargs) on the GPU.
CASES = {
    "conv2d_fused": (cutlass_ops.conv2d_fused,
                     lambda: ((_cuda(2, 64, 8, 8, cl=True), _cuda(64, 64, 3, 3)), {"padding": 1}),
                     lambda: ((_cuda(2, 64, 8, 8, dtype=torch.float32), _cuda(64, 64, 3, 3, dtype=torch.float32)),
                              {"padding": 1})),
    "conv2d_dgrad": (cutlass_ops.conv2d_dgrad,
                     lambda: ((_cuda(2, 64, 8, 8, cl=True), _cuda(64, 64, 3, 3, cl=True), (2, 64, 8, 8)),
                              {"padding": 1}),
                     lambda: ((_cuda(2, 64, 8, 8, dtype=torch.float32), _cuda(64, 64, 3, 3, dtype=torch.float32),
                               (2, 64, 8, 8)), {"padding": 1})),
    "conv2d_wgrad": (cutlass_ops.conv2d_wgrad,
                     lambda: ((_cuda(2, 64, 8, 8, cl=True), _cuda(2, 64, 8, 8, cl=True), _cuda(64, 64, 3, 3, cl=True)),
                              {"padding": 1}),
                     lambda: ((_cuda(2, 64, 8, 8, dtype=torch.float32), _cuda(2, 64, 8, 8, dtype=torch.float32),
                               _cuda(64, 64, 3, 3, dtype=torch.float32)), {"padding": 1})),
    "conv2d_b2b": (cutlass_ops.conv2d_b2b, lambda: _b2b_case(F16),
                   lambda: ((lambda a, kw: (a, {**kw, "relu1": False}))(*_b2b_case(F16)))),
    "se_gate": (cutlass_ops.se_gate, lambda: (_se_args(64, F16), {}), lambda: (_se_args(12, F16), {})),
    "se_squeeze": (ops.se_squeeze, lambda: ((_cuda(2, 64, 8, 8, cl=True),), {}),
                   lambda: ((_cuda(2, 12, 8, 8, cl=True),), {})),
    "se_gate_backward": (ops.se_gate_backward, lambda: _se_backward_args(64, F16),
                         lambda: _se_backward_args(64, torch.float32)),
    "relu_backward": (ops.relu_backward, lambda: ((_cuda(2, 8, 4, 4, cl=True), _cuda(2, 8, 4, 4, cl=True)), {}),
                      lambda: ((_cuda(2, 8, 4, 4, dtype=torch.float32), _cuda(2, 8, 4, 4, dtype=torch.float32)), {})),
    "scale_samples": (ops.scale_samples, lambda: ((_cuda(4, 3, 8), _cuda(4, dtype=torch.float32)), {}),
                      lambda: ((_cuda(4, 3, 8, dtype=torch.float32), _cuda(4, dtype=torch.float32)), {})),
    "space_to_depth_conv": (cutlass_ops.space_to_depth_conv,
                            lambda: ((_cuda(2, 3, 32, 32), _cuda(32, 48, 1, 1)), {"relu": True}),
                            lambda: ((_cuda(2, 3, 32, 32), _cuda(48, 48, 1, 1)), {"relu": True})),
    "layer_norm_rows": (ops.layer_norm_rows, lambda: ((_cuda(4, 64), None, None, 1e-5), {}),
                        lambda: ((_cuda(4, 1001), None, None, 1e-5), {})),
    "dw_conv3x3_tokens": (ops.dw_conv3x3_tokens, lambda: _dw_args(F16), lambda: _dw_args(torch.float32)),
    "conv_embed": (ops.conv_embed, lambda: ((_cuda(2, 3, 32, 32), _cuda(64, 3, 7, 7)), {"stride": 4, "padding": 2}),
                   lambda: ((_cuda(2, 3, 32, 32), _cuda(48, 3, 7, 7)), {"stride": 4, "padding": 2})),
    "linear_silu": (ops.linear_silu, lambda: _linear_silu_case(256), lambda: _linear_silu_case(12)),
    "linear_residual": (ops.linear_residual, lambda: ((_cuda(4, 64), _cuda(32, 64), None, _cuda(4, 32)), {}),
                        lambda: ((_cuda(4, 12), _cuda(32, 12), None, _cuda(4, 32)), {})),
}


@gpu
@pytest.mark.parametrize("op", sorted(CASES))
def test_gpu_kernel_in_strict_mode(op):
    fn, kernel_case, _ = CASES[op]
    args, kwargs = kernel_case()
    with paths.strict():
        fn(*args, **kwargs)
    torch.cuda.synchronize()
    assert paths.last_path(op) == "kernel", paths.last_path(op)
    assert paths.fallback_counts() == {}


@gpu
@pytest.mark.parametrize("op", sorted(CASES))
def test_gpu_fallback_raises_in_strict_mode_and_warns_otherwise(op):
    fn, _, fallback_case = CASES[op]
    args, kwargs = fallback_case()
    with paths.strict(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the C++ ops' own one-time warnings
        with pytest.raises(cutlass_ops.FallbackError, match=rf"cutlass_ops\.{op}: .*\(input: "):
            fn(*args, **kwargs)
    assert paths.last_path(op).startswith("fallback: ")
    with pytest.warns(UserWarning, match=rf"cutlass_ops\.{op}: "):
        fn(*args, **kwargs)
    torch.cuda.synchronize()
    ((key, count),) = paths.fallback_counts().items()
    assert key[0] == op and count == 2 and paths.last_path(op) == "fallback: " + key[1]


@gpu
def test_gpu_backward_is_strict_with_all_threads():
    """conv2d_fused's backward (on autograd's CUDA thread) goes through the conv2d_dgrad,
    conv2d_wgrad and relu_backward wrappers: strict(all_threads=True) covers them; a float32
    backward falls back there and raises."""
    x = _cuda(2, 64, 8, 8, cl=True).requires_grad_()
    w = _cuda(64, 64, 3, 3).requires_grad_()
    with paths.strict(), paths.strict(all_threads=True):
        cutlass_ops.conv2d_fused(x, w, padding=1, relu=True).sum().backward()
    torch.cuda.synchronize()
    assert paths.last_path("conv2d_fused") == "kernel" and paths.fallback_counts() == {}
    xf, wf = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = cutlass_ops.conv2d_fused(xf, wf, padding=1, relu=True)  # not strict: counted, then the backward
    with paths.strict(), paths.strict(all_threads=True), pytest.raises(cutlass_ops.FallbackError):
        y.sum().backward()
    assert {op for op, _ in paths.fallback_counts()} >= {"conv2d_fused", "relu_backward"}
