"""Hugging Face transformers' CvT (CvtForImageClassification, CvtModel) loaded into the CvT
reference and FusedCvT (cutlass_ops.models.cvt_hf, FusedCvT.from_huggingface): outputs
against transformers' own forward, the key mapping, its errors, the CvT-21/W24 specs.

Random weights and random non-trivial BatchNorm running statistics and affine parameters
(_cvt_testing.randomize) in every model.  CPU: float64 to ~1e-10 relative; float32 within 2x
transformers' own float32 error against its float64 run.  CUDA (skipped without a GPU): fp16
within 2x transformers' own fp16 error.  Tests that need transformers skip without it; the
state_dict ones (dict config) and the error tests run without it."""
import pytest
import torch
from torch import nn

import cutlass_ops
from _cvt_testing import cvt, fused_cvt, randomize
from _helpers import HAS_CUDA, errors, seeded
from cutlass_ops.models import cvt_hf

FusedCvT = fused_cvt.FusedCvT
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)")

# small enough for the CPU; transformers' CvtStage indexes its drop path rates by the stage,
# so stage i needs depth > i
SMALL = {"embed_dim": [16, 32, 48], "num_heads": [1, 2, 3], "depth": [1, 2, 3], "num_labels": 7}
CVT13 = {"num_labels": 1000}  # CvtConfig's defaults are CvT-13's


def _seed(rng: torch.Generator) -> int:
    return int(torch.randint(0, 2 ** 31 - 1, (1,), generator=rng))


def _hf(rng, fields, kind="CvtForImageClassification", dtype=torch.float64):
    transformers = pytest.importorskip("transformers")
    seed = _seed(rng)
    with seeded(seed):
        model = getattr(transformers, kind)(transformers.CvtConfig(**fields))
    return randomize(model, seed).to(dtype).eval()


def _input(rng, n, size, dtype=torch.float64):
    return torch.randn(n, 3, size, size, generator=rng, dtype=torch.float64).to(dtype)


def _logits(model, x):
    with torch.no_grad():
        out = model(x)
    return out.logits if hasattr(out, "logits") else out


def _hf_names(state_dict):
    """Our state_dict with transformers' CvtForImageClassification names."""
    out = {}
    for k, v in state_dict.items():
        name = cvt_hf.cvt_key_to_hf(k)
        out[("cvt." if name.startswith("encoder.") else "") + name] = v
    return out


def _small_reference(rng, spec=None, num_classes=7, act=nn.GELU):
    from functools import partial
    seed = _seed(rng)
    spec = spec or cvt_hf.hf_spec(SMALL)
    with seeded(seed):
        ref = cvt.ConvolutionalVisionTransformer(num_classes=num_classes, act_layer=act,
                                                 norm_layer=partial(cvt.LayerNorm, eps=1e-5), spec=spec)
    return randomize(ref, seed).double().eval()


# ---- against transformers' forward ---------------------------------------------------------

# (CvT-13 itself: on CUDA below; building and running transformers' CvT-13 on two CPU cores
# takes tens of seconds)
@pytest.mark.parametrize("fields,n,size", [(SMALL, 3, 224), (SMALL, 1, 64)], ids=["small-224-n3", "small-64-n1"])
def test_hf_float64(rng, fields, n, size):
    hf = _hf(rng, fields)
    ref = cvt_hf.cvt_from_huggingface(hf)
    fused = FusedCvT.from_huggingface(hf)
    assert not ref.training and not fused.training
    assert isinstance(fused.stage0.blocks[0].mlp.act, nn.GELU) and fused.stage0.blocks[0].mlp.act.approximate == "none"
    x = _input(rng, n, size)
    expected = _logits(hf, x)
    for name, model in (("reference", ref), ("fused", fused)):
        out = _logits(model, x)
        assert out.shape == expected.shape == (n, hf.config.num_labels)
        rel, mx = errors(out, expected)
        assert rel < 1e-10 and mx < 1e-10, (name, rel, mx)


@pytest.mark.parametrize("size", [224, 384])
def test_hf_float32_within_transformers_own_error(rng, size):
    hf64 = _hf(rng, SMALL)
    hf32 = _hf(torch.Generator().manual_seed(0), SMALL)  # replaced next: the same weights in float32
    hf32.load_state_dict(hf64.state_dict())
    hf32.float()
    fused = FusedCvT.from_huggingface(hf32)
    assert fused.stage0.patch_embed.proj.weight.dtype == torch.float32
    x = _input(rng, 3, size)
    expected = _logits(hf64, x)
    theirs = errors(_logits(hf32, x.float()), expected)
    ours = errors(_logits(fused, x.float()), expected)
    print("float32 errors (rel, max): FusedCvT", ours, "transformers", theirs)
    assert ours[0] <= 2 * theirs[0] + 1e-7 and ours[1] <= 2 * theirs[1] + 1e-7, (ours, theirs)


def test_hf_cvt_model_without_head(rng):
    """A CvtModel (no final LayerNorm, no classifier): num_classes 0, the output the cls token
    normalised without an affine."""
    hf = _hf(rng, SMALL, kind="CvtModel")
    fused = FusedCvT.from_huggingface(hf)
    assert fused.num_classes == 0 and torch.equal(fused.norm.weight, torch.ones(48, dtype=torch.float64))
    x = _input(rng, 2, 64)
    with torch.no_grad():
        cls = hf(x).cls_token_value
        out = fused(x)
    expected = torch.nn.functional.layer_norm(cls, (48,), eps=1e-5).squeeze(1)
    rel, mx = errors(out, expected)
    assert rel < 1e-10 and mx < 1e-10, (rel, mx)


def test_hf_module_eps_and_momentum_are_copied(rng):
    """Given a module, each LayerNorm's and BatchNorm's eps (and BatchNorm momentum) come from
    it (transformers builds 1e-5 everywhere; a changed one must be followed, fused paths too)."""
    hf = _hf(rng, SMALL)
    for m in hf.modules():
        if isinstance(m, nn.LayerNorm):
            m.eps = 1e-2
        elif isinstance(m, nn.BatchNorm2d):
            m.eps, m.momentum = 1e-2, 0.3
    fused = FusedCvT.from_huggingface(hf)
    assert fused.norm.eps == fused.stage1.patch_embed.norm.eps == fused.stage2.blocks[2].norm2.eps == 1e-2
    bn = fused.stage2.blocks[1].attn.conv_proj_v.bn
    assert (bn.eps, bn.momentum) == (1e-2, 0.3)
    x = _input(rng, 2, 64)
    rel, mx = errors(_logits(fused, x), _logits(hf, x))
    assert rel < 1e-10 and mx < 1e-10, (rel, mx)


def test_hf_training_gradients_float64(rng):
    """Train mode (BatchNorm batch statistics; transformers' drop path quirks off: rate 0): every
    parameter's gradient, the input's and the BatchNorm running statistics of FusedCvT (its
    GELU path under autograd) equal transformers' in float64."""
    hf = _hf(rng, dict(SMALL, drop_path_rate=[0.0, 0.0, 0.0])).train()
    fused = FusedCvT.from_huggingface(hf)
    assert fused.training
    x = _input(rng, 3, 64)
    g = torch.randn(3, 7, generator=rng, dtype=torch.float64)
    grads = {}
    for name, model in (("hf", hf), ("fused", fused)):
        xi = x.clone().requires_grad_()
        out = model(xi)
        (out.logits if hasattr(out, "logits") else out).backward(g)
        grads[name] = xi.grad
    rel, _ = errors(grads["fused"], grads["hf"])
    assert rel < 1e-10, ("input", rel)
    theirs = dict(hf.named_parameters())
    buffers = dict(hf.named_buffers())
    # relative to each gradient, or to a thousandth of the largest where it is zero analytically
    # (a bias added to every key cancels in softmax: rounding noise in both)
    floor = 1e-3 * max(p.grad.norm() for p in hf.parameters())
    for name, p in fused.named_parameters():
        hf_name = cvt_hf.cvt_key_to_hf(name)
        other = theirs[("cvt." if hf_name.startswith("encoder.") else "") + hf_name].grad
        assert (p.grad - other).norm() <= 1e-9 * max(other.norm(), floor), name
    for name, b in fused.named_buffers():
        if name.endswith(("running_mean", "running_var")):
            hf_name = "cvt." + cvt_hf.cvt_key_to_hf(name)
            assert torch.allclose(b, buffers[hf_name], rtol=1e-12, atol=1e-14), name


def test_hf_rejects_another_activation(rng):
    hf = _hf(rng, SMALL)
    hf.cvt.encoder.stages[1].layers[0].intermediate.activation = nn.ReLU()
    with pytest.raises(ValueError, match=r"cvt\.encoder\.stages\.1\.layers\.0\.intermediate\.activation is ReLU"):
        FusedCvT.from_huggingface(hf)


def test_hf_state_dict_with_transformers_config(rng):
    """A state_dict and a transformers CvtConfig load like the module (eval mode)."""
    hf = _hf(rng, SMALL)
    fused = FusedCvT.from_huggingface(hf.state_dict(), hf.config)
    assert not fused.training
    x = _input(rng, 1, 64)
    rel, mx = errors(_logits(fused, x), _logits(hf, x))
    assert rel < 1e-10 and mx < 1e-10, (rel, mx)


def test_kernel_report_names_the_mlp_path(rng):
    ref = _small_reference(rng)
    report = FusedCvT.from_reference(ref).kernel_report(_input(rng, 1, 64), mlps=True)
    mlps = [r for r in report if r[0].endswith(".mlp")]
    assert [r[0] for r in mlps] == [f"stage{i}.blocks.{j}.mlp" for i, d in enumerate(SMALL["depth"])
                                    for j in range(d)]
    assert mlps[0][1] == (1, 256, 64) and mlps[-1][1] == (1, 17, 192)
    assert all(r[2].startswith("aten: F.gelu(approximate='none')") for r in mlps), mlps
    quick = _small_reference(rng, act=cvt.QuickGELU)
    report = FusedCvT.from_reference(quick).kernel_report(_input(rng, 1, 64), mlps=True)
    assert all(r[2].startswith("aten: QuickGELU as one SiLU") for r in report if r[0].endswith(".mlp"))
    assert len(FusedCvT.from_reference(quick).kernel_report(_input(rng, 1, 64))) == 3  # the embeddings only


# ---- without transformers: state_dicts with a dict config -----------------------------------

def test_state_dict_round_trip_with_dict_config(rng):
    ref = _small_reference(rng)
    sd = _hf_names(ref.state_dict())
    assert "cvt.encoder.stages.2.layers.1.attention.attention.convolution_projection_key.convolution_projection" \
           ".normalization.running_var" in sd and "classifier.weight" in sd and "layernorm.bias" in sd
    spec, ours = cvt_hf.hf_state_dict_to_cvt(sd, SMALL)
    assert spec == ref.spec and list(ours) == list(ref.state_dict())
    assert all(torch.equal(ours[k], v) for k, v in ref.state_dict().items())
    loaded = cvt_hf.cvt_from_huggingface(sd, dict(SMALL))
    fused = FusedCvT.from_huggingface(sd, dict(SMALL))
    x = _input(rng, 3, 96)
    expected = _logits(ref, x)
    assert torch.equal(_logits(loaded, x), expected)
    rel, mx = errors(_logits(fused, x), expected)
    assert rel < 1e-10 and mx < 1e-10, (rel, mx)
    # CvtModel's names (no "cvt." prefix, no final LayerNorm or classifier)
    bare = {k.removeprefix("cvt."): v for k, v in sd.items() if not k.startswith(("layernorm.", "classifier."))}
    model = cvt_hf.cvt_from_huggingface(bare, SMALL)
    assert model.num_classes == 0 and torch.equal(model.norm.bias, torch.zeros(48, dtype=torch.float64))


def test_specs_match_the_hub_configs():
    """CvtConfig's fields for CvT-13/21/W24 (microsoft/cvt-13, cvt-21, cvt-w24-384-22k) give
    microsoft/CvT's yaml specs; their parameter counts are the paper's (20M, 32M, 277M)."""
    assert cvt_hf.hf_spec({}) == cvt.CVT13_SPEC
    assert cvt_hf.hf_spec({"depth": [1, 4, 16]}) == cvt.CVT21_SPEC
    assert cvt_hf.hf_spec({"embed_dim": [192, 768, 1024], "num_heads": [3, 12, 16], "depth": [2, 2, 20],
                           "drop_path_rate": [0.0, 0.0, 0.3]}) == cvt.CVTW24_SPEC
    for make, millions in ((cvt.cvt13, 20), (cvt.cvt21, 32), (cvt.cvtw24, 277)):
        with torch.device("meta"):
            count = sum(p.numel() for p in make().parameters())
        assert round(count / 1e6) == millions, (make.__name__, count)


@pytest.mark.parametrize("spec,size", [(cvt.CVT21_SPEC, 384), (cvt.CVTW24_SPEC, 64)], ids=["cvt21-384", "cvtw24-64"])
def test_fused_specs_run(rng, spec, size):
    """FusedCvT of CvT-21 and CvT-W24 (a block per stage: the specs' widths and heads) equals
    the reference in float64 (CvT-21 at 384 px; W24 smaller, for the CPU's time)."""
    spec = dict(spec, DEPTH=[1, 1, 1])
    ref = _small_reference(rng, spec=spec, num_classes=10, act=cvt.QuickGELU)
    fused = FusedCvT.from_reference(ref)
    x = _input(rng, 1, size)
    rel, mx = errors(_logits(fused, x), _logits(ref, x))
    assert rel < 1e-10 and mx < 1e-10, (rel, mx)


def _sd_and_config(rng):
    return _hf_names(_small_reference(rng).state_dict()), dict(SMALL)


def test_error_unknown_key(rng):
    sd, config = _sd_and_config(rng)
    sd["cvt.encoder.stages.0.layers.0.attention.attention.extra.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"'encoder\.stages\.0\.layers\.0\.attention\.attention\.extra\.weight' "
                                         "has no counterpart"):
        FusedCvT.from_huggingface(sd, config)
    sd, config = _sd_and_config(rng)
    config["depth"] = [1, 2, 2]  # the checkpoint has stage 2's layer 2
    with pytest.raises(ValueError, match=r"encoder\.stages\.2\.layers\.2\..* has no counterpart.*depth \[1, 2, 2\]"):
        cvt_hf.hf_state_dict_to_cvt(sd, config)


def test_error_wrong_shape_and_missing_key(rng):
    sd, config = _sd_and_config(rng)
    key = "cvt.encoder.stages.1.layers.0.intermediate.dense.weight"
    sd[key] = sd[key][:100]
    with pytest.raises(ValueError, match=r"'encoder\.stages\.1\.layers\.0\.intermediate\.dense\.weight' has shape "
                                         r"\(100, 32\); the config gives \(128, 32\) \(stage1\.blocks\.0\.mlp\.fc1"):
        cvt_hf.hf_state_dict_to_cvt(sd, config)
    sd, config = _sd_and_config(rng)
    del sd["cvt.encoder.stages.2.cls_token"]
    with pytest.raises(ValueError, match=r"'encoder\.stages\.2\.cls_token' is missing"):
        cvt_hf.hf_state_dict_to_cvt(sd, config)
    sd, config = _sd_and_config(rng)
    config["num_labels"] = 5
    with pytest.raises(ValueError, match="num_labels = 5 but classifier.weight has 7 rows"):
        cvt_hf.hf_state_dict_to_cvt(sd, config)


def test_error_unsupported_config(rng):
    sd, config = _sd_and_config(rng)
    config["qkv_projection_method"] = ["dw_bn", "avg", "dw_bn"]
    with pytest.raises(ValueError, match=r"qkv_projection_method\[1\] = 'avg': only 'dw_bn'"):
        FusedCvT.from_huggingface(sd, config)
    config = dict(SMALL, stride_kv=[2, 2])
    with pytest.raises(ValueError, match=r"stride_kv = \[2, 2\] needs one value per stage \(3"):
        cvt_hf.hf_spec(config)
    with pytest.raises(ValueError, match="needs its config"):
        cvt_hf.cvt_from_huggingface(sd)
    with pytest.raises(TypeError, match="expected a transformers CvT module or a state_dict"):
        FusedCvT.from_huggingface([1, 2])


# ---- CUDA (H100/H200) ------------------------------------------------------------------------

@cuda_only
@pytest.mark.parametrize("fields,n,size", [(CVT13, 3, 224), (SMALL, 1, 384)], ids=["cvt13-224-n3", "small-384-n1"])
def test_hf_fp16_cuda(rng, fields, n, size):
    """fp16 FusedCvT of a transformers CvT on CUDA against transformers in float64: within 2x
    transformers' own fp16 error; the MLPs' exact GELU ran through PyTorch."""
    hf64 = _hf(rng, fields).cuda()
    hf16 = _hf(torch.Generator().manual_seed(0), fields)
    hf16.load_state_dict(hf64.state_dict())
    hf16 = hf16.half().cuda()
    fused = FusedCvT.from_huggingface(hf16)
    x = _input(rng, n, size).cuda()
    expected = _logits(hf64, x)
    theirs = errors(_logits(hf16, x.half()), expected)
    ours = errors(_logits(fused, x.half()), expected)
    assert cutlass_ops.last_path("fused_cvt.mlp").startswith("aten: F.gelu(approximate='none')")
    assert ours[0] <= 2 * theirs[0] + 1e-4 and ours[1] <= 2 * theirs[1] + 1e-4, (ours, theirs)


@cuda_only
def test_fused_cvtw24_384_fp16_cuda(rng):
    """CvT-W24 (random weights, QuickGELU, 384 px) fp16 against its reference in float64 within
    2x the reference's own fp16 error; its 192-channel stem goes to cuDNN, not conv_embed."""
    with seeded(_seed(rng)):
        ref = randomize(cvt.cvtw24(drop_path_rate=0.0), _seed(rng)).double().eval()
    ref16 = cvt.cvtw24(drop_path_rate=0.0).eval()
    ref16.load_state_dict(ref.state_dict())
    ref, ref16 = ref.cuda(), ref16.half().cuda()
    fused = FusedCvT.from_reference(ref16)
    x = _input(rng, 2, 384).cuda()
    expected = _logits(ref, x)
    theirs, ours = errors(_logits(ref16, x.half()), expected), errors(_logits(fused, x.half()), expected)
    assert ours[0] <= 2 * theirs[0] + 1e-4 and ours[1] <= 2 * theirs[1] + 1e-4, (ours, theirs)
    report = fused.kernel_report(x.half())
    assert report[0][1] == (2, 192, 96, 96) and report[0][2].startswith("aten"), report[0]
