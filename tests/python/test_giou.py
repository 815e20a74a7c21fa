"""cutlass_ops.giou_loss / giou_loss_padded / giou_loss_ragged: forward and gradients against
torchvision's formula in float64 (restated here, so these run without torchvision), against
torchvision itself where installed, errors, and the op registration."""
import pytest
import torch

import cutlass_ops
from _helpers import DEVICES, HAS_CUDA, TOLERANCE, errors

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
REDUCTIONS = ["none", "mean", "sum"]


def reference_loss(boxes1, boxes2, eps=1e-7):
    """torchvision.ops.generalized_box_iou_loss(reduction="none"), restated op for op."""
    x1, y1, x2, y2 = boxes1.unbind(-1)
    x1g, y1g, x2g, y2g = boxes2.unbind(-1)
    xkis1, ykis1 = torch.max(x1, x1g), torch.max(y1, y1g)
    xkis2, ykis2 = torch.min(x2, x2g), torch.min(y2, y2g)
    inter = torch.zeros_like(x1)
    m = (ykis2 > ykis1) & (xkis2 > xkis1)
    inter[m] = (xkis2[m] - xkis1[m]) * (ykis2[m] - ykis1[m])
    union = (x2 - x1) * (y2 - y1) + (x2g - x1g) * (y2g - y1g) - inter
    iou = inter / (union + eps)
    area_c = (torch.max(x2, x2g) - torch.min(x1, x1g)) * (torch.max(y2, y2g) - torch.min(y1, y1g))
    return 1 - (iou - (area_c - union) / (area_c + eps))


def reduce(per_box, num_valid, reduction):
    if reduction == "none":
        return per_box
    return per_box.sum() / max(num_valid, 1) if reduction == "mean" else per_box.sum()


def random_boxes(n, g, scale=12.0):
    xy = torch.rand(n, 2, generator=g, dtype=torch.float64) * scale
    wh = torch.rand(n, 2, generator=g, dtype=torch.float64) * scale / 2
    return torch.cat([xy, xy + wh], -1)


def box_pairs(n, g):
    """n float64 box pairs: random ones, half of them on a 1/8 grid (exact in every dtype:
    shared edges, equal corners, so ties), and every 8th row of each degenerate kind."""
    b1, b2 = random_boxes(n, g), random_boxes(n, g)
    half = n // 2
    b1[:half], b2[:half] = (b1[:half] * 8).round() / 8, (b2[:half] * 8).round() / 8
    kind = torch.arange(n) % 8
    b1[kind == 1, 2] = b1[kind == 1, 0]                     # zero width
    b2[kind == 2, 3] = b2[kind == 2, 1]                     # zero height
    b1[kind == 3] = b1[kind == 3][:, [2, 1, 0, 3]]          # x2 < x1
    b2[kind == 4] = b1[kind == 4]                           # identical boxes
    b1[kind == 5, 2:] = b1[kind == 5, :2]                   # a point
    b2[kind == 6, 0] = b1[kind == 6, 2]                     # touching edges
    b2[kind == 7] = b1[kind == 7] + torch.tensor([0.5, 0.0, 0.5, 0.0], dtype=torch.float64)  # shifted
    return b1, b2


def upstream_grad(shape, reduction, g):
    """A random upstream gradient (per box for "none"): a constant one would hide mix-ups."""
    return torch.rand(shape if reduction == "none" else (), generator=g, dtype=torch.float64) + 0.5


def loss_and_grads(fn, b1, b2, grad):
    """fn(b1, b2) and the gradients of <fn(b1, b2), grad> with respect to b1 and b2."""
    p, t = b1.detach().clone().requires_grad_(), b2.detach().clone().requires_grad_()
    loss = fn(p, t)
    if not loss.requires_grad:  # the reference of a batch without valid boxes is a constant
        return loss, torch.zeros_like(p), torch.zeros_like(t)
    gp, gt = torch.autograd.grad(loss, [p, t], grad.to(loss.dtype).to(loss.device))
    return loss, gp, gt


def loop_reference(b1, b2, images, slot_shape, reduction, grad, eps=1e-7):
    """The per-image loop in float64 on the CPU: images lists each image's slot indices into
    the flattened boxes; all other slots are invalid (loss 0, no gradient)."""
    def fn(p, t):
        p, t = p.reshape(-1, 4), t.reshape(-1, 4)
        per_box = torch.zeros(p.shape[0], dtype=torch.float64)
        for idx in images:
            per_box = per_box.index_put((idx,), reference_loss(p[idx], t[idx], eps))
        return reduce(per_box.reshape(slot_shape), sum(len(i) for i in images), reduction)
    return loss_and_grads(fn, b1.detach().double().cpu(), b2.detach().double().cpu(), grad.double())


# Gradients near degenerate boxes are ill-conditioned (divisions by enclose + eps): float32
# math gives up to ~1e-4 relative error there (worst over 400 random batches: 1.0e-4), so
# float32 gradients get a looser bound than float32 losses (worst 1.7e-7).
GRAD_TOLERANCE = {**TOLERANCE, torch.float32: (5e-4, 5e-4)}


def check(out, ref, dtype, what, tolerance=TOLERANCE):
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    # Identical zero-width boxes have enclose + eps = eps: float16 gradients overflow to inf,
    # torchvision's too.  Those must be the same infinities; the rest is compared.
    out, ref = out.detach().cpu(), ref.detach().cpu()
    overflow = ~torch.isfinite(ref.to(dtype))
    # the same infinities, and NaN where the reference has NaN (torch.equal calls NaN unequal:
    # a drawn pair whose formula gives NaN with eps = 0.5 failed CI once on that alone)
    assert torch.equal(out[overflow].isnan(), ref.to(dtype)[overflow].isnan()), f"{what}: overflow differs"
    assert torch.equal(out[overflow].nan_to_num(0.0, posinf=1.0, neginf=-1.0),
                       ref.to(dtype)[overflow].nan_to_num(0.0, posinf=1.0, neginf=-1.0)), f"{what}: overflow differs"
    out, ref = out[~overflow], ref[~overflow]
    rel, mx = errors(out, ref)
    rel_tol, max_tol = tolerance[dtype]
    assert rel <= rel_tol and mx <= max_tol, f"{what}: rel {rel:.3e} max {mx:.3e}"


def check_all(ours, ref, dtype):
    """Loss in float32 (float64 for float64 boxes) as torchvision's; gradients in the boxes' dtype."""
    loss_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    assert ours[0].dtype == loss_dtype and ours[1].dtype == dtype and ours[2].dtype == dtype
    check(ours[0], ref[0], loss_dtype, "loss")
    check(ours[1], ref[1], dtype, "grad boxes1", GRAD_TOLERANCE)
    check(ours[2], ref[2], dtype, "grad boxes2", GRAD_TOLERANCE)


# ---- the flat (torchvision) form --------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(200, 4), (3, 5, 4), (4,), (0, 4)])
def test_flat_matches_torchvision_formula(device, dtype, reduction, shape, rng):
    n = torch.Size(shape[:-1]).numel()
    b1, b2 = (b.reshape(shape).to(dtype) for b in box_pairs(n, rng))
    grad = upstream_grad(shape[:-1], reduction, rng)
    ours = loss_and_grads(lambda p, t: cutlass_ops.giou_loss(p, t, reduction), b1.to(device), b2.to(device), grad)
    ref = loss_and_grads(lambda p, t: reduce(reference_loss(p, t), n, reduction), b1.double(), b2.double(), grad)
    check_all(ours, ref, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_flat_matches_torchvision(device, dtype, reduction, rng):
    torchvision = pytest.importorskip("torchvision")
    b1, b2 = (b.to(dtype).to(device) for b in box_pairs(256, rng))
    grad = upstream_grad((256,), reduction, rng)
    ours = loss_and_grads(lambda p, t: cutlass_ops.giou_loss(p, t, reduction), b1, b2, grad)
    theirs = loss_and_grads(lambda p, t: torchvision.ops.generalized_box_iou_loss(p, t, reduction), b1, b2, grad)
    assert ours[0].dtype == theirs[0].dtype
    check_all(ours, theirs, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_eps_is_used(device, rng):
    b1, b2 = (b.to(device) for b in box_pairs(64, rng))
    for eps in (1e-7, 0.5):
        ref = reference_loss(b1.double().cpu(), b2.double().cpu(), eps)
        check(cutlass_ops.giou_loss(b1.double(), b2.double(), eps=eps), ref, torch.float64, f"eps={eps}")


@pytest.mark.parametrize("device", DEVICES)
def test_integer_boxes_are_upcast_like_torchvision(device):
    b1 = torch.tensor([[0, 0, 4, 4], [1, 1, 2, 3]], device=device)
    b2 = torch.tensor([[2, 2, 6, 6], [1, 1, 2, 3]], device=device)
    out = cutlass_ops.giou_loss(b1, b2, "sum")
    assert out.dtype == torch.float32
    check(out, reference_loss(b1.double().cpu(), b2.double().cpu()).sum(), torch.float32, "loss")


# ---- padded and ragged batches ----------------------------------------------------------------

def padded_case(b_images, m, dtype, device, g, validity):
    """(B, M, 4) boxes with NaN padding (so reading it or mixing it in would show), the
    validity operand and each image's valid slot indices into the flattened boxes."""
    b1, b2 = (b.reshape(b_images, m, 4) for b in box_pairs(b_images * m, g))
    if validity == "counts":
        counts = torch.tensor([0, 3, m, m + 2, -1, 1][:b_images], dtype=torch.int64)
        valid = torch.arange(m)[None, :] < counts[:, None]
        operand = {"counts": counts.to(device)}
    elif validity == "mask":
        valid = torch.rand(b_images, m, generator=g) < 0.6
        operand = {"mask": valid.to(device)}
    else:
        valid = torch.ones(b_images, m, dtype=torch.bool)
        operand = {}
    b1[~valid], b2[~valid] = float("nan"), float("nan")
    images = [torch.nonzero(valid[i]).flatten() + i * m for i in range(b_images)]
    return b1.to(dtype).to(device), b2.to(dtype).to(device), operand, images


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("validity", ["counts", "mask", "all"])
@pytest.mark.parametrize("b_images, m", [(6, 7), (0, 5), (3, 0)])
def test_padded_matches_per_image_loop(device, dtype, reduction, validity, b_images, m, rng):
    b1, b2, operand, images = padded_case(b_images, m, dtype, device, rng, validity)
    grad = upstream_grad((b_images, m), reduction, rng)
    ours = loss_and_grads(lambda p, t: cutlass_ops.giou_loss_padded(p, t, reduction=reduction, **operand),
                          b1, b2, grad)
    ref = loop_reference(b1, b2, images, (b_images, m), reduction, grad)
    check_all(ours, ref, dtype)
    invalid = torch.ones(b_images * m, dtype=torch.bool)
    invalid[torch.cat(images + [torch.zeros(0, dtype=torch.int64)])] = False
    if reduction == "none":  # exactly 0, not NaN, at padding
        assert (ours[0].reshape(-1)[invalid.to(device)] == 0).all()
    assert (ours[1].reshape(-1, 4)[invalid.to(device)] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("offsets", [[2, 2, 9, 15, 15, 26], [0, 30], [0], [5, 5], [0, 0]])
def test_ragged_matches_per_image_loop(device, dtype, reduction, offsets, rng):
    total = 30 if offsets != [0, 0] else 0
    b1, b2 = box_pairs(total, rng)
    images = [torch.arange(offsets[i], offsets[i + 1]) for i in range(len(offsets) - 1)]
    valid = torch.zeros(total, dtype=torch.bool)
    valid[offsets[0]:offsets[-1]] = True
    b1[~valid], b2[~valid] = float("nan"), float("nan")  # outside the range: never read
    b1, b2 = b1.to(dtype).to(device), b2.to(dtype).to(device)
    grad = upstream_grad((total,), reduction, rng)
    off = torch.tensor(offsets, dtype=torch.int64, device=device)
    ours = loss_and_grads(lambda p, t: cutlass_ops.giou_loss_ragged(p, t, off, reduction), b1, b2, grad)
    ref = loop_reference(b1, b2, images, (total,), reduction, grad)
    check_all(ours, ref, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_mean_is_over_all_valid_boxes_of_the_batch(device, rng):
    b1, b2, operand, images = padded_case(6, 7, torch.float64, device, rng, "counts")
    per_box = cutlass_ops.giou_loss_padded(b1, b2, reduction="none", **operand)
    mean = cutlass_ops.giou_loss_padded(b1, b2, reduction="mean", **operand)
    total = cutlass_ops.giou_loss_padded(b1, b2, reduction="sum", **operand)
    num_valid = sum(len(i) for i in images)
    torch.testing.assert_close(mean, per_box.sum() / num_valid)
    torch.testing.assert_close(total, per_box.sum())
    _, counted = torch.ops.cutlass_ops.giou_loss(b1, b2, None, operand["counts"], None, "mean", 1e-7)
    assert counted.item() == num_valid


# ---- registration: opcheck, gradcheck, torch.compile -----------------------------------------

def op_cases(device, dtype, g):
    """(name, boxes1, boxes2, mask, counts, offsets) for every form."""
    b1, b2 = box_pairs(24, g)
    b1, b2 = b1.to(dtype).to(device), b2.to(dtype).to(device)
    mask = (torch.rand(4, 6, generator=g) < 0.5).to(device)
    counts = torch.tensor([0, 2, 6, 9], device=device)
    offsets = torch.tensor([1, 4, 4, 20], device=device)
    p3, t3 = b1.reshape(4, 6, 4), b2.reshape(4, 6, 4)
    return [("flat", b1, b2, None, None, None), ("mask", p3, t3, mask, None, None),
            ("counts", p3, t3, None, counts, None), ("ragged", b1, b2, None, None, offsets)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_opcheck(device, dtype, reduction, rng):
    for name, b1, b2, mask, counts, offsets in op_cases(device, dtype, rng):
        b1, b2 = b1.clone().requires_grad_(), b2.clone().requires_grad_()
        args = (b1, b2, mask, counts, offsets, reduction, 1e-7)
        torch.library.opcheck(torch.ops.cutlass_ops.giou_loss.default, args)
        loss, num_valid = torch.ops.cutlass_ops.giou_loss(*args)
        grad = torch.rand_like(loss) + 0.5
        torch.library.opcheck(torch.ops.cutlass_ops.giou_loss_backward.default,
                              (grad, b1.detach(), b2.detach(), mask, counts, offsets, num_valid,
                               reduction, 1e-7))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gradcheck_float64(device, reduction):
    # continuous random boxes: finite differences need a margin from ties and overlap edges
    g = torch.Generator().manual_seed(7)
    b1, b2 = (random_boxes(24, g).to(device) for _ in range(2))
    for name, _, _, mask, counts, offsets in op_cases(device, torch.float64, g):
        shape = (24, 4) if mask is None and counts is None else (4, 6, 4)
        p = b1.reshape(shape).clone().requires_grad_()
        t = b2.reshape(shape).clone().requires_grad_()
        fn = lambda p, t: torch.ops.cutlass_ops.giou_loss(p, t, mask, counts, offsets, reduction, 1e-7)[0]
        assert torch.autograd.gradcheck(fn, (p, t)), name


def test_torch_compile_fullgraph_with_backward(rng):
    b1, b2 = box_pairs(32, rng)
    counts = torch.tensor([1, 8, 3, 0])

    def loss_fn(p, t):
        return (cutlass_ops.giou_loss_padded(p.view(4, 8, 4), t.view(4, 8, 4), counts, reduction="mean")
                + cutlass_ops.giou_loss(p, t, "sum"))

    compiled = torch.compile(loss_fn, backend="aot_eager", fullgraph=True)
    ours = loss_and_grads(compiled, b1, b2, torch.tensor(1.0))
    ref = loss_and_grads(loss_fn, b1, b2, torch.tensor(1.0))
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b)


# ---- bad input: clear errors ------------------------------------------------------------------

def _boxes(device, *shape, dtype=torch.float32):
    return torch.rand(*shape, 4, device=device, dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call, message", [
    (lambda d: cutlass_ops.giou_loss(torch.rand(5, 3, device=d), torch.rand(5, 3, device=d)), r"shape \[\.\.\., 4\]"),
    (lambda d: cutlass_ops.giou_loss(_boxes(d, 5), _boxes(d, 6)), "boxes2 .target. shape"),
    (lambda d: cutlass_ops.giou_loss(_boxes(d, 5), _boxes(d, 5, dtype=torch.float16)), "boxes2 .target. dtype"),
    (lambda d: torch.ops.cutlass_ops.giou_loss(_boxes(d, 5).int(), _boxes(d, 5).int()), "must be float32"),
    (lambda d: cutlass_ops.giou_loss(_boxes(d, 5), _boxes(d, 5), "avg"), "reduction must be"),
    (lambda d: cutlass_ops.giou_loss_padded(_boxes(d, 5), _boxes(d, 5)), r"pred must be \(B, M, 4\)"),
    (lambda d: cutlass_ops.giou_loss_padded(_boxes(d, 2, 3), _boxes(d, 2, 3),
                                            counts=torch.ones(3, dtype=torch.int64, device=d)), "counts must have shape"),
    (lambda d: cutlass_ops.giou_loss_padded(_boxes(d, 2, 3), _boxes(d, 2, 3),
                                            counts=torch.ones(2, dtype=torch.int32, device=d)), "counts must be int64"),
    (lambda d: cutlass_ops.giou_loss_padded(_boxes(d, 2, 3), _boxes(d, 2, 3),
                                            mask=torch.ones(2, 4, dtype=torch.bool, device=d)), "mask must have shape"),
    (lambda d: cutlass_ops.giou_loss_padded(_boxes(d, 2, 3), _boxes(d, 2, 3),
                                            mask=torch.ones(2, 3, device=d)), "mask must be bool"),
    (lambda d: cutlass_ops.giou_loss_padded(_boxes(d, 2, 3), _boxes(d, 2, 3),
                                            counts=torch.ones(2, dtype=torch.int64, device=d),
                                            mask=torch.ones(2, 3, dtype=torch.bool, device=d)), "at most one of"),
    (lambda d: cutlass_ops.giou_loss_ragged(_boxes(d, 6), _boxes(d, 6),
                                            torch.zeros(2, 2, dtype=torch.int64, device=d)), "offsets must have shape"),
    (lambda d: cutlass_ops.giou_loss_ragged(_boxes(d, 6), _boxes(d, 6),
                                            torch.zeros(0, dtype=torch.int64, device=d)), "offsets must have shape"),
    (lambda d: cutlass_ops.giou_loss_ragged(_boxes(d, 6), _boxes(d, 6),
                                            torch.tensor([0, 6], dtype=torch.int32, device=d)), "offsets must be int64"),
    (lambda d: cutlass_ops.giou_loss_ragged(_boxes(d, 2, 3), _boxes(d, 2, 3),
                                            torch.tensor([0, 6], device=d)), r"must be ragged \(T, 4\)"),
])
def test_bad_input_raises(device, call, message):
    with pytest.raises(ValueError, match=message):
        call(device)


def test_mixed_devices_raise_on_cpu():
    # a meta tensor among CPU ones dispatches to the fake impl, which checks devices too
    b = _boxes("cpu", 2, 3)
    with pytest.raises(ValueError, match="boxes2 .target. is on meta"):
        cutlass_ops.giou_loss(b, b.to("meta"))
    with pytest.raises(ValueError, match="offsets is on meta"):
        cutlass_ops.giou_loss_ragged(b[0], b[0], torch.tensor([0, 3], device="meta"))


def test_double_backward_raises():
    b1, b2 = box_pairs(8, torch.Generator().manual_seed(0))
    p = b1.requires_grad_()
    (g,) = torch.autograd.grad(cutlass_ops.giou_loss(p, b2, "sum"), p, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        g.sum().backward()


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_mixed_devices_raise():
    b = _boxes("cuda", 2, 3)
    with pytest.raises(ValueError, match="boxes2 .target. is on cpu"):
        cutlass_ops.giou_loss(b, b.cpu())
    with pytest.raises(ValueError, match="counts is on cpu"):
        cutlass_ops.giou_loss_padded(b, b, counts=torch.ones(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="mask is on cpu"):
        cutlass_ops.giou_loss_padded(b, b, mask=torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="offsets is on cpu"):
        cutlass_ops.giou_loss_ragged(b[0], b[0], torch.tensor([0, 3]))


# ---- CUDA: no host sync, deterministic, many blocks --------------------------------------------

@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cuda_has_no_host_sync(reduction, rng):
    cases = op_cases("cuda", torch.float16, rng)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for name, b1, b2, mask, counts, offsets in cases:
            p = b1.clone().requires_grad_()
            loss = torch.ops.cutlass_ops.giou_loss(p, b2, mask, counts, offsets, reduction, 1e-7)[0]
            loss.backward(torch.ones_like(loss))
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cuda_many_blocks_deterministic(rng):
    # more slots than one grid pass (1024 blocks x 256 threads) covers
    n = 600_000
    b1, b2 = box_pairs(n, rng)
    p, t = b1.float().cuda(), b2.float().cuda()
    mask = (torch.rand(n, generator=rng) < 0.7).cuda()
    runs = [loss_and_grads(lambda p, t: torch.ops.cutlass_ops.giou_loss(p, t, mask, None, None, "mean", 1e-7)[0],
                           p, t, torch.tensor(1.0)) for _ in range(2)]
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    valid = mask.cpu()
    ref = reference_loss(b1.float().double()[valid], b2.float().double()[valid]).mean()
    check(runs[0][0], ref, torch.float32, "loss")


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cuda_runs_on_the_current_stream(rng):
    b1, b2 = (b.float().cuda() for b in box_pairs(4096, rng))
    expected = cutlass_ops.giou_loss(b1, b2)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(10_000_000)  # keep the side stream busy: a default-stream launch would race
        out = cutlass_ops.giou_loss(b1, b2)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
