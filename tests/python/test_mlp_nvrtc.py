"""FusedMLP's NVRTC path (cutlass_ops/mlp_nvrtc.py, mlp_build.py): a model's kernel compiled
without nvcc, by libnvrtc, into a CUBIN launched through the CUDA driver API.

CPU tests (no GPU needed, nvcc hidden): NVRTC builds a model's device code for sm_80 and sm_90a,
the CUBIN is a CUDA ELF holding the four kernels under the names NVRTC lowered, a fresh process
finds it in the cache without compiling, and the error without nvcc and NVRTC names both.  They
skip where libnvrtc is not found.  GPU tests (sm_80+): the NVRTC kernel of a random model
against the nvcc kernel of the same source (forward, backward, CUDA graph), and the cache in a
second process.
"""
import contextlib
import ctypes
import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn

from _helpers import HAS_CUDA
from _mlp_models import random_mlp
from cutlass_ops import MlpOptions, mlp_build, mlp_nvrtc
from cutlass_ops_gen.mlp_emit import SMEM_LIMIT
from cutlass_ops_gen.mlp_spec import trace_mlp

HAS_GPU = HAS_CUDA and torch.cuda.get_device_capability()[0] >= 8
gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU of sm_80 or newer")


def _nvrtc_or_skip():
    nvrtc = mlp_nvrtc.find_nvrtc()
    if nvrtc is None:
        pytest.skip("libnvrtc not found (neither NVIDIA's pip wheels nor a CUDA toolkit have it here)")
    return nvrtc


def _env_without_nvcc(nowhere: str) -> dict:
    """This process's environment for a child that finds no nvcc (CUDA_HOME: ``nowhere``) and
    picks the compiler by itself."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDACXX", "CUTLASS_OPS_NVCC", "CUTLASS_OPS_MLP_COMPILER")}
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep)
                                  if d and not os.path.isfile(os.path.join(d, "nvcc")))
    env["CUDA_HOME"] = nowhere
    return env


def _hide_nvcc(monkeypatch, tmp_path):
    """No nvcc anywhere FusedMLP looks: PATH without it, no CUDACXX, CUDA_HOME and
    MlpOptions.nvcc pointing at nothing."""
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not os.path.isfile(os.path.join(d, "nvcc"))]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    monkeypatch.delenv("CUDACXX", raising=False)
    monkeypatch.delenv("CUTLASS_OPS_NVCC", raising=False)
    monkeypatch.delenv("CUTLASS_OPS_MLP_COMPILER", raising=False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    options = MlpOptions(cache_dir=str(tmp_path / "cache"), nvcc=str(tmp_path / "no-nvcc"))
    with pytest.raises(RuntimeError, match="nvcc"):
        mlp_build.find_nvcc(options)
    return options


# A fixed small model (its weights play no part: only its structure is compiled): bias and no
# bias, two activations, the fused weight-gradient kernel.  Source text: a child process runs it too.
MODEL = textwrap.dedent("""
    def model():
        return nn.Sequential(nn.Linear(7, 40), nn.SiLU(), nn.Linear(40, 24, bias=False), nn.Tanh(),
                             nn.Linear(24, 5))
""")
_scope = {"nn": nn}
exec(MODEL, _scope)
_model = _scope["model"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The model built by NVRTC for sm_80 and sm_90a with nvcc hidden: {arch: Build}."""
    _nvrtc_or_skip()
    mp = pytest.MonkeyPatch()
    try:
        options = _hide_nvcc(mp, tmp_path_factory.mktemp("nvrtc"))
        spec = trace_mlp(_model(), None)
        builds = {arch: mlp_build.build(spec, "float16", SMEM_LIMIT[arch.rstrip("a")], arch, False, options)
                  for arch in ("80", "90a")}
    finally:
        mp.undo()
    return builds, options


@pytest.mark.parametrize("arch", ["80", "90a"])
def test_nvrtc_builds_a_cubin_without_nvcc(built, arch):
    b = built[0][arch]
    assert b.compiler == "nvrtc" and not b.cache_hit and b.compile_seconds > 0, b
    assert b.compiler_version.startswith("nvrtc ")
    cubin = b.path.read_bytes()
    assert b.path.name == "fused_mlp.cubin" and cubin[:4] == b"\x7fELF"
    assert int.from_bytes(cubin[18:20], "little") == 190  # e_machine: EM_CUDA
    lowered = json.loads((b.dir / "kernels.json").read_text())
    assert b.config.dw_warps > 0  # the model has the fused weight-gradient kernel: all four
    assert set(lowered) == set(mlp_nvrtc.KERNELS.values())
    for name, mangled in lowered.items():
        assert mangled.startswith("_ZN10fmlp_model") and mangled.encode() in cubin, (name, mangled)
    meta = json.loads((b.dir / "meta.json").read_text())
    assert meta["arch"] == arch and meta["compiler"] == "nvrtc" and meta["nvrtc"] == b.compiler_version
    assert f"--gpu-architecture=sm_{arch}" in meta["flags"]


def test_nvrtc_cache_hit_in_a_fresh_process(built):
    """A second process with the same cache loads the CUBIN's entry and compiles nothing
    (NVRTC's compile is replaced by a failure there)."""
    first, options = built[0]["80"], built[1]
    script = textwrap.dedent("""
        import json, torch.nn as nn
        from cutlass_ops import MlpOptions, mlp_build, mlp_nvrtc
        from cutlass_ops_gen.mlp_emit import SMEM_LIMIT
        from cutlass_ops_gen.mlp_spec import trace_mlp

        def no_compile(*a, **k):
            raise AssertionError("compiled again")
        mlp_nvrtc.Nvrtc.compile = no_compile
    """) + MODEL + textwrap.dedent(f"""
        options = MlpOptions(cache_dir={options.cache_dir!r}, nvcc={options.nvcc!r})
        b = mlp_build.build(trace_mlp(model(), None), "float16", SMEM_LIMIT["80"], "80", False, options)
        print(json.dumps({{"compiler": b.compiler, "cache_hit": b.cache_hit, "path": str(b.path),
                          "compile_seconds": b.compile_seconds}}))
    """)
    env = _env_without_nvcc(options.nvcc)
    # -P: the working directory (a source checkout's root, under tests/dev_overlay.sh) stays off
    # sys.path, so the child imports the same cutlass_ops as this process
    r = subprocess.run([sys.executable, "-P", "-c", script], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    second = json.loads(r.stdout.strip().splitlines()[-1])
    assert second == {"compiler": "nvrtc", "cache_hit": True, "path": str(first.path), "compile_seconds": None}


def test_no_compiler_error_names_both(monkeypatch, tmp_path):
    """Without nvcc and without libnvrtc: one RuntimeError that names both and where to get
    them; compiler='nvrtc' or 'nvcc' name the one asked for."""
    options = _hide_nvcc(monkeypatch, tmp_path)
    monkeypatch.setattr(mlp_nvrtc, "library_candidates", lambda: [])
    monkeypatch.setattr(mlp_nvrtc, "_FOUND", {})
    spec = trace_mlp(_model(), None)
    with pytest.raises(RuntimeError) as e:
        mlp_build.build(spec, "float16", SMEM_LIMIT["80"], "80", False, options)
    msg = str(e.value)
    assert "nvcc" in msg and "NVRTC" in msg and "CUDA_HOME" in msg and "pip install" in msg, msg
    with pytest.raises(RuntimeError, match="compiler='nvrtc'.*no libnvrtc.*pip install"):
        mlp_build.build(spec, "float16", SMEM_LIMIT["80"], "80", False,
                        dataclasses.replace(options, compiler="nvrtc"))
    with pytest.raises(RuntimeError, match="compiler='nvcc'.*found none.*PATH"):
        mlp_build.build(spec, "float16", SMEM_LIMIT["80"], "80", False, dataclasses.replace(options, compiler="nvcc"))
    assert not (tmp_path / "cache").exists()  # nothing half-written


def test_compiler_option(monkeypatch):
    monkeypatch.setenv("CUTLASS_OPS_MLP_COMPILER", "nvrtc")
    assert MlpOptions().compiler == "nvrtc"
    monkeypatch.delenv("CUTLASS_OPS_MLP_COMPILER")
    assert MlpOptions().compiler == "auto"
    with pytest.raises(ValueError, match="auto, nvcc or nvrtc"):
        MlpOptions(compiler="clang")


def test_param_structs_mirror_the_kernels():
    """FwdParams, BwdParams, BwdDwParams (mlp_emit.emit): pointers, per-layer pointer arrays of
    length L, then long long M, each 8 bytes with no padding."""
    L = 3
    s = mlp_nvrtc._structs(L)
    for kind, fields in (("Fwd", ["x", "y", "w", "b", "z", "a"]), ("Bwd", ["dy", "dx", "z", "w", "dz", "db"]),
                         ("BwdDw", ["dy", "dx", "x", "z", "a", "w", "dw", "db"])):
        struct = s[kind]
        assert [f for f, _ in struct._fields_] == fields + ["M"]
        n = sum(1 if f in ("x", "y", "dy", "dx") else L for f in fields)
        assert struct.M.offset == 8 * n and ctypes.sizeof(struct) == 8 * (n + 1)


class FakeDriver:
    """libcuda's calls that mlp_nvrtc.Module makes, recorded (no GPU): a device of ``sms``
    multiprocessors on which ``per_sm`` CTAs of any kernel fit."""

    def __init__(self, sms, per_sm):
        self.sms, self.per_sm, self.current, self.ctx_sets = sms, per_sm, None, 0
        self.names, self.attrs, self.launches = {}, {}, []

    def cuInit(self, flags):
        return 0

    def cuDeviceGet(self, dev, ordinal):
        dev._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxRetain(self, ctx, dev):
        ctx._obj.value = 0x1000 + dev.value
        return 0

    def cuCtxGetCurrent(self, ctx):
        ctx._obj.value = self.current
        return 0

    def cuCtxSetCurrent(self, ctx):
        self.current, self.ctx_sets = ctx.value, self.ctx_sets + 1
        return 0

    def cuDeviceGetAttribute(self, out, attr, dev):
        assert attr == 16  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
        out._obj.value = self.sms
        return 0

    def cuModuleLoadData(self, module, image):
        assert image[:4] == b"\x7fELF"
        module._obj.value = 0x2000
        return 0

    def cuModuleGetFunction(self, f, module, name):
        f._obj.value = 0x3000 + len(self.names)
        self.names[f._obj.value] = name.decode()
        return 0

    def cuFuncSetAttribute(self, f, attr, value):
        assert attr == 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        self.attrs[self.names[f.value]] = value
        return 0

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, n, f, threads, smem):
        n._obj.value = self.per_sm
        return 0

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, args, extra):
        name = self.names[f.value]
        struct = self.structs["BwdDw" if "bwd_dw" in name else "Bwd" if "bwd" in name else "Fwd"]
        # the parameters are copied at the launch, as the driver does
        params = struct.from_buffer_copy(ctypes.string_at(args[0], ctypes.sizeof(struct)))
        self.launches.append((name, gx, bx, smem, stream, params))
        return 0


@pytest.mark.parametrize("shape", ["resident", "streamed"])
def test_driver_launches(built, monkeypatch, shape):
    """mlp_nvrtc.Module against a recording stand-in for libcuda: each launch goes to the right
    kernel with mlp_emit's grid (grid_size, dw_grid), block, shared memory and stream, with the
    parameter struct filled as its PARAMS helpers fill it; none for M = 0; the device's
    primary context made current only where it is not."""
    b = built[0]["90a"]
    lowered = json.loads((b.dir / "kernels.json").read_text())
    cfg = b.config if shape == "resident" else dataclasses.replace(b.config, resident_warps=0)
    drv = FakeDriver(sms=132, per_sm=2)
    monkeypatch.setattr(mlp_nvrtc, "_driver", lambda: drv)
    L = 3
    module = mlp_nvrtc.Module(b.dir, cfg, 0, L)
    drv.structs = module.structs
    assert drv.ctx_sets == 1 and set(drv.names.values()) == set(lowered.values())
    smem = {"fwd": cfg.smem_fwd, "fwd_save": cfg.smem_fwd, "bwd": cfg.smem_bwd, "bwd_dw": cfg.smem_dw}
    assert drv.attrs == {lowered[mlp_nvrtc.KERNELS[role]]: v for role, v in smem.items()}
    threads = cfg.resident_warps * 32 if cfg.resident_warps else 128

    def grid(M):
        tiles = -(-M // cfg.bm)
        return min(-(-tiles // cfg.resident_warps), 132 * 2) if cfg.resident_warps else tiles

    w, bias, z, a = [11, 12, 13], [21, 0, 23], [31, 0, 33], [41, 42, 0]
    for M in (1, 1000, 10 ** 7):
        module.fwd(0x100, 0x200, w, bias, z, a, M, False, 77)
        name, g, t, smem, stream, p = drv.launches[-1]
        assert (name, g, t, smem, stream) == (lowered["fmlp_model::fwd_kernel<false>"], grid(M), threads,
                                              cfg.smem_fwd, 77)
        assert (p.x, p.y, list(p.w), list(p.b), list(p.z), list(p.a), p.M) == (
            0x100, 0x200, w, [21, None, 23], [None] * L, [None] * L, M)
        module.fwd(0x100, 0x200, w, bias, z, a, M, True, 0)
        name, g, t, smem, stream, p = drv.launches[-1]
        assert (name, g, stream) == (lowered["fmlp_model::fwd_kernel<true>"], grid(M), None)
        assert (list(p.z), list(p.a)) == ([31, None, 33], [41, 42, None])
        module.bwd(0x300, 0, z, w, [51, 52, 53], [61, 0, 63], M, 77)
        name, g, t, smem, stream, p = drv.launches[-1]
        assert (name, g, t, smem) == (lowered["fmlp_model::bwd_kernel"], grid(M), threads, cfg.smem_bwd)
        assert (p.dy, p.dx, list(p.z), list(p.w), list(p.dz), list(p.db), p.M) == (
            0x300, None, [31, None, 33], w, [51, 52, 53], [61, None, 63], M)
        ctas = min(-(-M // (cfg.dw_warps * cfg.bm)), 132 * 2)
        assert module.bwd_dw_ctas(M) == ctas
        module.bwd_dw(0x300, 0x400, 0x500, z, a, w, [71, 72, 73], [61, 0, 63], M, 77)
        name, g, t, smem, stream, p = drv.launches[-1]
        assert (name, g, t, smem) == (lowered["fmlp_model::bwd_dw_kernel"], ctas, cfg.dw_warps * 32, cfg.smem_dw)
        assert (p.dy, p.dx, p.x, list(p.a), list(p.dw), p.M) == (0x300, 0x400, 0x500, [41, 42, None], [71, 72, 73], M)
    n = len(drv.launches)
    module.fwd(0x100, 0x200, w, bias, z, a, 0, True, 77)
    module.bwd(0x300, 0, z, w, z, bias, 0, 77)
    module.bwd_dw(0x300, 0, 0x500, z, a, w, z, bias, 0, 77)
    assert len(drv.launches) == n and module.bwd_dw_ctas(0) == 0
    assert drv.ctx_sets == 1  # the context stayed current
    drv.current = 0xdead  # another context current on this thread (another device's)
    module.fwd(0x100, 0x200, w, bias, z, a, 5, False, 77)
    assert drv.ctx_sets == 2 and drv.current == module.ctx.value


def test_kernel_glue_with_fake_driver(built, monkeypatch, tmp_path):
    """mlp_jit's launches (launch_forward, launch_backward with fused dW) through a Kernel
    backed by the NVRTC build, on CPU tensors against the recording stand-in for libcuda (torch's
    device queries stand in for an sm_80 GPU): the kernel loads from the cache, kernel_info says
    nvrtc, and each parameter struct holds the tensors' addresses."""
    import types
    from cutlass_ops import mlp_jit
    from cutlass_ops_gen.mlp_emit import partial_layout
    b, options = built[0]["80"], built[1]
    _hide_nvcc(monkeypatch, tmp_path)
    drv = FakeDriver(sms=108, per_sm=1)
    monkeypatch.setattr(mlp_nvrtc, "_driver", lambda: drv)
    monkeypatch.setattr(mlp_jit, "_KERNELS", {})
    monkeypatch.setattr(mlp_jit, "_CONFIGS", {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i=None: types.SimpleNamespace(shared_memory_per_block_optin=SMEM_LIMIT["80"]))
    monkeypatch.setattr(torch.cuda, "device", lambda i: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: types.SimpleNamespace(cuda_stream=77))
    model = _model().half()
    spec = trace_mlp(model, None)
    key = mlp_jit.register_spec(spec, options)
    lins = [m for m in model if isinstance(m, nn.Linear)]
    weights = [m.weight.detach() for m in lins]
    biases = [None if m.bias is None else m.bias.detach() for m in lins]
    M = 1000
    x = torch.zeros(M, spec.in_features, dtype=torch.half)
    kern = mlp_jit.kernel(key, torch.half, x.device, forward=True)
    drv.structs = kern.launcher.structs
    info = mlp_jit.kernel_info(key)[0]
    assert (info["compiler"], info["cache_hit"], info["path"], info["compile_seconds"]) == (
        "nvrtc", True, str(b.path), None)
    y, saved = mlp_jit.launch_forward(key, x, weights, biases, save=True)
    name, grid, threads, smem, stream, p = drv.launches[-1]
    assert name == json.loads((b.dir / "kernels.json").read_text())["fmlp_model::fwd_kernel<true>"] and stream == 77
    assert (p.x, p.y, p.M) == (x.data_ptr(), y.data_ptr(), M)
    assert list(p.w) == [w.data_ptr() for w in weights]
    assert list(p.b) == [None if t is None else t.data_ptr() for t in biases]
    L = len(lins)
    zs, acts = saved[:L], saved[L:]
    assert list(p.z) == [t.data_ptr() if t.numel() else None for t in zs]
    assert list(p.a) == [t.data_ptr() for t in acts] + [None]
    g = torch.zeros_like(y)
    dx, dzs, db, dw = mlp_jit.launch_backward(key, g, x, weights, saved, need_dx=True, fused_dw=True)
    name, grid, threads, smem, stream, p = drv.launches[-1]
    assert "bwd_dw_kernel" in name and grid == min(-(-M // (kern.config.dw_warps * kern.config.bm)), 108)
    assert (p.dy, p.dx, p.x, p.M) == (g.data_ptr(), dx.data_ptr(), x.data_ptr(), M)
    db_offsets, _, dw_offsets, dw_stride = partial_layout(spec)
    assert [q - p.dw[0] for q in p.dw] == [4 * o for o in dw_offsets] and dw.shape == (dw_stride,)
    assert [q is None for q in p.db] == [o is None for o in db_offsets]


# ---------------------------------------------------------------------------------------------
# GPU (sm_80+): the NVRTC kernel against the nvcc kernel of the same source
# ---------------------------------------------------------------------------------------------

def _close(a, b, dtype):
    """(within 2 units in the last place of dtype, relative to the larger tensor's largest
    value; bitwise equal).  The kernels are the same source, and with nvcc and NVRTC of one
    CUDA release their PTX holds the same floating-point operations in the same order (only
    the integer address arithmetic differs), so bitwise equality is expected and printed; the
    bound allows for an nvcc of another release than torch's NVRTC wheel, whose compiler may
    contract or schedule the float32 math differently."""
    a, b = a.float(), b.float()
    eps = torch.finfo(dtype).eps
    tol = 2 * eps * max(a.abs().max().item(), b.abs().max().item(), 1e-30)
    return (a - b).abs().max().item() <= tol, bool(torch.equal(a, b))


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_nvrtc_matches_nvcc(dtype, rng, rng_seed, monkeypatch, tmp_path):
    from cutlass_ops.fused_mlp import FusedMLP
    _nvrtc_or_skip()
    try:
        mlp_build.find_nvcc(MlpOptions())
    except RuntimeError:
        pytest.skip("the comparison needs nvcc too")
    name, model = random_mlp(rng_seed)
    model = model.to(dtype)
    base = MlpOptions(wide_kernel=True, cache_dir=str(tmp_path))
    ref = FusedMLP.from_module(model, options=dataclasses.replace(base, compiler="nvcc")).cuda()
    assert ref.compile_kernel()["compiler"] == "nvcc"  # compiled (forward and backward) while nvcc is in reach
    options = _hide_nvcc(monkeypatch, tmp_path)  # auto, with nvcc out of reach: NVRTC
    fused = FusedMLP.from_module(model, options=dataclasses.replace(base, compiler="auto", nvcc=options.nvcc)).cuda()
    info = fused.compile_kernel()
    assert info["compiler"] == "nvrtc" and info["path"].endswith("fused_mlp.cubin"), info
    assert info["load_seconds"] > 0 and info["compile_seconds"] > 0
    x = torch.randn(5003, fused.spec.in_features, generator=rng).to(dtype).cuda()
    outs = {}
    for tag, f in (("nvcc", ref), ("nvrtc", fused)):
        with torch.no_grad():
            y0 = f(x)
        xg = x.clone().requires_grad_(True)
        y = f(xg)
        y.float().square().sum().backward()
        graph_x = x.clone()
        with torch.no_grad():
            f(graph_x)  # warm up outside the capture
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                gy = f(graph_x)
            graph_x.copy_(x.flip(0))
            g.replay()
        outs[tag] = [y0, y, xg.grad, gy] + [p.grad for p in f.parameters()]
    torch.cuda.synchronize()
    bitwise = True
    for i, (a, b) in enumerate(zip(outs["nvcc"], outs["nvrtc"])):
        ok, same = _close(a, b, dtype)
        bitwise &= same
        assert ok, (name, dtype, i, (a.float() - b.float()).abs().max().item())
    print(f"\n{name} {dtype}: NVRTC {'bitwise equal to' if bitwise else 'within 2 ulp of'} nvcc")
    # the fused-dW grid (dw_grid in the nvcc library, bwd_dw_ctas in Python) agrees
    from cutlass_ops.mlp_jit import kernel
    kn, kr = kernel(ref.key, dtype, x.device), kernel(fused.key, dtype, x.device)
    if kn.config.dw_warps:
        for M in (0, 1, 4097, 10 ** 6, 10 ** 8):
            assert kn.bwd_dw_ctas(M) == kr.bwd_dw_ctas(M), M


@gpu
def test_gpu_nvrtc_second_process_hits_cache(tmp_path, rng_seed):
    """With nvcc out of reach, a first process compiles with NVRTC and a second loads the
    CUBIN from the cache; both get the same output."""
    _nvrtc_or_skip()
    script = textwrap.dedent(f"""
        import json, torch, torch.nn as nn
        from cutlass_ops.fused_mlp import FusedMLP
        g = torch.Generator().manual_seed({rng_seed})  # the test's seed (the same in both processes)
        m = nn.Sequential(nn.Linear(9, 48), nn.GELU(), nn.Linear(48, 3)).half().cuda()
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        f = FusedMLP.from_module(m)
        with torch.no_grad():
            y = f(torch.randn(1000, 9, generator=g).half().cuda())
        info = f.kernel_info()[0]
        info["y_sum"] = y.double().sum().item()
        print(json.dumps(info))
    """)
    env = dict(_env_without_nvcc(str(tmp_path / "no-cuda")), CUTLASS_OPS_CACHE=str(tmp_path / "cache"))
    runs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-P", "-c", script], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["compiler"] == second["compiler"] == "nvrtc"
    assert first["cache_hit"] is False and first["compile_seconds"] > 0
    assert second["cache_hit"] is True and second["compile_seconds"] is None and second["path"] == first["path"]
    assert first["y_sum"] == second["y_sum"]
