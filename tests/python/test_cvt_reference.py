"""cutlass_ops.models.cvt (our plain-PyTorch CvT-13) against the ORIGINAL microsoft/CvT code
(tests/python/cvt_original/cls_cvt.py, executed unchanged by _cvt_original with stand-ins for
its timm/einops imports): config, module tree, state_dict names/shapes, initialisation,
outputs and gradients.  The original cannot run in float64 (its LayerNorm casts the input to
float32 and then meets float64 weights), so the comparisons run in float32, where the two
compute the same ops."""
import copy

import pytest
import torch

import _cvt_original as original
from _cvt_testing import cvt, randomize
from _helpers import errors, seeded


def test_cvt_spec_is_the_config():
    assert cvt.CVT13_SPEC == original.config_spec()
    spec = cvt.CVT13_SPEC
    assert spec["DIM_EMBED"] == [64, 192, 384] and spec["NUM_HEADS"] == [1, 3, 6] and spec["DEPTH"] == [1, 2, 10]
    assert spec["CLS_TOKEN"] == [False, False, True] and spec["STRIDE_KV"] == [2, 2, 2]


def test_cvt_state_dict_module_tree_and_init_match_original():
    with seeded(1234):
        ours = cvt.cvt13()
    with seeded(1234):
        theirs = original.cvt13_original()
    a, b = ours.state_dict(), theirs.state_dict()
    assert list(a) == list(b)  # same names, same order
    for k in a:
        assert a[k].shape == b[k].shape and a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), f"{k}: init differs (RNG order or init rule)"
    assert [n for n, _ in ours.named_modules()] == [n for n, _ in theirs.named_modules()]
    assert sum(p.numel() for p in ours.parameters()) == 19_997_480  # CvT-13: 20.0M parameters
    # the details the task names: attention scale over the whole dim, QuickGELU, eps
    attn = ours.stage2.blocks[0].attn
    assert attn.scale == 384 ** -0.5 and attn.num_heads == 6
    assert attn.conv_proj_q.conv.stride == (1, 1) and attn.conv_proj_k.conv.stride == (2, 2)
    assert attn.conv_proj_v.conv.groups == 384 and attn.conv_proj_v.conv.bias is None
    assert isinstance(ours.stage0.blocks[0].mlp.act, cvt.QuickGELU) and ours.norm.eps == 1e-5
    assert ours.stage0.cls_token is None and ours.stage2.cls_token.shape == (1, 1, 384)
    assert ours.stage2.blocks[0].drop_path.__class__.__name__ == "Identity"
    assert ours.stage2.blocks[9].drop_path.drop_prob == pytest.approx(0.1)


def _pair(seed=0):
    with seeded(seed):
        ours = randomize(cvt.cvt13(), seed)
        theirs = original.cvt13_original()
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


@pytest.mark.parametrize("n,h,w", [(3, 96, 112), (1, 224, 224)])
def test_cvt_eval_output_matches_original(n, h, w):
    ours, theirs = _pair()
    ours.eval()
    theirs.eval()
    x = torch.randn(n, 3, h, w, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        a, b = ours(x), theirs(x)
    assert a.shape == (n, 1000)
    # the original's torch.squeeze drops the batch dim of a single image: (1000,)
    assert b.shape == ((1000,) if n == 1 else (n, 1000))
    rel, mx = errors(a, b.reshape(n, 1000))
    assert rel < 1e-5 and mx < 1e-5, (rel, mx)
    assert a.std() > 0.1  # not a degenerate output


def test_cvt_train_step_matches_original():
    """Train mode: BatchNorm on batch statistics (running statistics updated), drop path 0.1
    in stage 3 drawn from the same seed; outputs, every parameter's gradient and the input's."""
    ours, theirs = _pair(seed=3)
    ours.train()
    theirs.train()
    x = torch.randn(3, 3, 48, 64, generator=torch.Generator().manual_seed(6))
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    with seeded(99):  # the same drop-path draws in both
        ya = ours(xa)
    with seeded(99):
        yb = theirs(xb)
    rel, _ = errors(ya, yb)
    assert rel < 1e-5, rel
    g = torch.randn(ya.shape, generator=torch.Generator().manual_seed(7))
    ya.backward(g)
    yb.backward(g)
    pb = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        assert p.grad is not None and pb[name].grad is not None, name
        rel, _ = errors(p.grad, pb[name].grad)
        assert rel < 1e-4, (name, rel)
    assert errors(xa.grad, xb.grad)[0] < 1e-4
    sb = theirs.state_dict()
    for k, v in ours.state_dict().items():
        if "running" in k or "num_batches" in k:
            assert errors(v, sb[k])[0] < 1e-5, k


def test_cvt_drop_path_is_active_in_training():
    """The drop path draws differ between seeds in train mode (so the test above compares a
    random path, not an identity), and vanish in eval mode."""
    ours = randomize(cvt.cvt13(), 0)
    x = torch.randn(2, 3, 32, 32)
    ours.train()
    with torch.no_grad():
        outs = []
        for seed in (1, 2, 3, 4):
            with seeded(seed):
                outs.append(ours(x))
    assert any(not torch.allclose(outs[0], o) for o in outs[1:])
    ours.eval()
    with torch.no_grad():
        with seeded(1):
            a = ours(x)
        with seeded(2):
            assert torch.equal(a, ours(x))


def test_cvt_half_model_layer_norm_runs_in_float32():
    """A .half() model (the original cannot run one on the CPU: float32 input, float16
    LayerNorm weight) normalises in float32, as the original does under autocast."""
    ln = cvt.LayerNorm(8, eps=1e-5)
    with torch.no_grad():
        ln.weight.copy_(torch.randn(8))
        ln.bias.copy_(torch.randn(8))
    x = torch.randn(4, 8) * 100 + 1000
    half = copy.deepcopy(ln).half()
    ref = torch.nn.functional.layer_norm(x.half().double(), (8,), half.weight.double(), half.bias.double(), 1e-5)
    out = half(x.half())
    assert out.dtype == torch.float16
    assert errors(out, ref)[0] < 2e-3


def test_cvt13_flops_match_the_paper():
    """Wu et al. 2021, Table 2: CvT-13 at 224x224 is 4.5 G multiply-adds (their "FLOPs")."""
    macs = cvt.cvt_flops(cvt.CVT13_SPEC, 224, 224) / 2
    assert 4.45e9 < macs < 4.65e9, macs
