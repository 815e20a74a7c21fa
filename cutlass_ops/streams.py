"""Stream and DistributedDataParallel policy of the ops' backward passes.

While a CUDA graph is captured, work that nothing waits for until an autograd node returns (a
conv's wgrad beside its dgrad) goes on a side stream (use_side_stream, fork_side_stream), and
joins the current stream before the node returns or, for gradients autograd stores as they are
(stored_as_is: weights declared used once with weights_used_once), at the end of the backward
pass (join_side_stream).  Under a DistributedDataParallel forward (ddp_forward_active) nothing
is deferred: DDP's reducer reads each gradient as soon as autograd stores it."""
from __future__ import annotations

import contextlib
import threading

import torch


_SIDE_STREAMS: dict = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    stream = _SIDE_STREAMS.get(device)
    if stream is None:
        stream = _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return stream


def use_side_stream(grad: torch.Tensor) -> bool:
    """Whether work that nothing waits for until the autograd node returns (a wgrad beside
    its dgrad: at small batches neither fills the GPU) should go on a side stream: while a
    CUDA graph is captured.  Eager calls stay on one stream: there the fork costs more host
    time than it saves."""
    return grad.is_cuda and torch.cuda.is_current_stream_capturing()


def fork_side_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream, after it has waited for everything issued so far on the current one
    (call it once the side's inputs are issued)."""
    side = _side_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    return side


_SINGLE_USE = threading.local()


@contextlib.contextmanager
def weights_used_once():
    """Declares that each conv weight and scale passed to the ops inside is passed to no
    other op in the graph (FusedResNet's forward), so that no gradient of one is added to
    another's: their wgrads may then finish at the end of the backward pass (stored_as_is)."""
    before = getattr(_SINGLE_USE, "on", False)
    _SINGLE_USE.on = True
    try:
        yield
    finally:
        _SINGLE_USE.on = before


def ddp_forward_active() -> bool:
    """Whether a torch DistributedDataParallel forward is running.  Its reducer reads each
    parameter's gradient as soon as autograd stores it (a post hook on the parameter's
    AccumulateGrad node copies it into an all-reduce bucket, and a full bucket's all-reduce
    starts then, ordered after the current stream only), a reader that stored_as_is cannot
    see: no tensor hook, no .grad yet.  (DDP's Python reducer, used under compiled autograd,
    registers post-accumulate-grad hooks, which stored_as_is does see.)"""
    ddp = getattr(torch.nn.parallel, "DistributedDataParallel", None)
    active = getattr(ddp, "_get_active_ddp_module", None)
    return active is not None and active() is not None


def single_use_declared() -> bool:
    """Whether the op being set up runs inside weights_used_once(), and not inside a
    DistributedDataParallel forward (ddp_forward_active): there a deferred wgrad would be
    read, copied into a bucket and all-reduced before the side stream finished it, so each
    wgrad joins before its node returns and DDP's buckets overlap the rest of the backward."""
    return getattr(_SINGLE_USE, "on", False) and not ddp_forward_active()


def stored_as_is(param, used_once: bool) -> bool:
    """Whether autograd will store param's gradient without launching anything that reads
    it before the backward pass ends: a leaf used by one op (weights_used_once) with no
    .grad yet and no hooks (AccumulateGrad then takes the tensor itself).  None (no such
    gradient) qualifies."""
    return param is None or (used_once and param.is_leaf and param.grad is None and not param._backward_hooks
                             and not getattr(param, "_post_accumulate_grad_hooks", None))


def join_side_stream(side, made_there=(), used_there=(), at_end_of_backward: bool = False) -> None:
    """The current stream waits for `side`: now, or with at_end_of_backward when the backward
    pass finishes (a callback on the caller's stream, before backward() returns), so that
    a wgrad overlaps the nodes after its own.  Deferring is only for gradients that nothing
    reads before then (stored_as_is); the inputs the side stream reads are then marked as
    used there (autograd may free them when the node returns).  The tensors made there are
    marked as used on the current stream (the allocator must not hand their memory to the
    side stream early)."""
    if side is None:
        return
    main = torch.cuda.current_stream(side.device)
    for t in made_there:
        if t is not None:
            t.record_stream(main)
    if at_end_of_backward:
        for t in used_there:
            if t is not None:
                t.record_stream(side)
        torch.autograd.Variable._execution_engine.queue_callback(
            lambda: torch.cuda.current_stream(side.device).wait_stream(side))
    else:
        main.wait_stream(side)
