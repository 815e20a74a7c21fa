"""FusedResNet: SE-ResNet9-FixUp from fused kernels (the backward: the ops' autograd, cutlass_ops/ops/).

Same parameters and state_dict names as the reference ``models.SEResNet9FixUp``; only
the forward differs.  Per forward (16 kernels):

  stem      space_to_depth_conv:        SpaceToDepth(4) + 1x1 conv + ReLU read from the NCHW
                                        input (a tensor-core kernel), + block 0's fixup_bias1a
  per block conv1  conv2d_fused 3x3:    relu(acc + b1b) + b2a     (= conv2's padded input)
            downsample (blocks 1-3):    conv2d_fused 1x1 on the pooled map the previous
                                        block's se_gate wrote (AvgPool2d(3, 2, 1) fused there);
                                        with graph=True beside conv1/conv2 (a graph branch)
            conv2  conv2d_fused 3x3:    acc * scale; on maps smaller than 3x3 (block 3's
                                        2x2) as a 1x1 conv over the flattened map with a
                                        dense weight (4/9 of the implicit GEMM's work; in
                                        training too: small_map_conv.py)
            se_gate (one CTA/image):    h + b2b, squeeze, excite MLP, h*g + identity, ReLU,
                                        + the next block's fixup_bias1a, + its avgpool
            conv2 + se_gate as one kernel (conv2d_fused_se_gate) with fuse_se_gate=True, in
                                        inference on an H100/H200 for block 0 at 64x64 inputs:
                                        h never reaches HBM (15 kernels then)

Small-M convs (late blocks, small batches) split K serially across threadblocks.  On sm90
every kernel launches as a programmatic dependent of the one before (its launch overlaps
that one's tail; kernels/common/programmatic_launch.cuh).
Not fused yet (see README): the squeeze re-reads conv2's output instead of being summed in its
epilogue (except with fuse_se_gate=True, block 0 in inference on sm90).  The excite MLP is a
plain loop in se_gate: as a B2B GEMM (FusedMLP) between se_squeeze and se_gate_apply it measured
1.2-2.9x slower on an H100 (bench se-excite).
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from .streams import weights_used_once
from .models import SEFixupBasicBlock, SEResNet9FixUp
from .ops import (conv2d_fused, conv2d_fused_last_kernel, conv2d_fused_se_gate, conv2d_fused_se_gate_last_kernel,
                  conv2d_fused_se_gate_why_not, se_gate, space_to_depth_conv)
from .small_map_conv import dense_conv_weight, runs_dense, small_map_conv


class FusedResNet(SEResNet9FixUp):
    """Drop-in for ``SEResNet9FixUp``.

    ``graph=True`` replays a CUDA graph per input shape/dtype under ``torch.no_grad()`` (the
    output tensor is then reused by the next call of that shape: clone it to keep it).
    ``fuse_se_gate=True`` runs block 0's conv2 and SE gate as one kernel in inference on sm90
    (conv2d_fused_se_gate); off by default because on an H100 it is no faster than the two
    kernels it replaces (docs/fused_resnet.md has the measurements).
    Training works (cutlass_ops/ops/: CUTLASS or, where the profile measured it
    faster, cuDNN dgrad/wgrad, and our kernels for the epilogues' and the SE gate's backward).
    FixUp scalars and SE weights stay float32 whatever the model dtype: they are tiny and
    the kernels use them in float32.
    """

    def __init__(self, in_channels: int = 3, base_planes: int = 64, graph: bool = False,
                 fuse_se_gate: bool = False):
        super().__init__(in_channels, base_planes)
        self.in_channels = in_channels
        self.graph = graph
        self.fuse_se_gate = fuse_se_gate
        self._derived: dict = {}
        self._graphs: dict = {}
        self._param_list: list = []
        self._side_streams: dict = {}
        self._to_kernel_layouts()

    @classmethod
    def from_reference(cls, model: SEResNet9FixUp, graph: bool = False,
                       fuse_se_gate: bool = False) -> "FusedResNet":
        in_channels = model.stem[1].weight.shape[1] // 16
        base = model.stem[1].weight.shape[0]
        p = next(model.parameters())
        fused = cls(in_channels, base, graph=graph, fuse_se_gate=fuse_se_gate).to(device=p.device, dtype=p.dtype)
        fused.load_state_dict(model.state_dict())
        return fused

    # -- parameter layouts -----------------------------------------------------------------
    def _float32_params(self):
        for blk in self._blocks():
            yield from (blk.fixup_bias1a, blk.fixup_bias1b, blk.fixup_bias2a, blk.fixup_scale,
                        blk.fixup_bias2b)
            yield from blk.se.parameters()

    def _to_kernel_layouts(self) -> None:
        self._param_list = list(self.parameters())  # walked per graph replay: cache it
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last)
        for p in self._float32_params():
            if p.is_floating_point() and p.dtype != torch.float32:
                p.data = p.data.float()

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self._to_kernel_layouts()
        self._derived.clear()
        self._graphs.clear()
        return out

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self._to_kernel_layouts()
        self._derived.clear()
        self._graphs.clear()
        return result

    def _blocks(self) -> list[SEFixupBasicBlock]:
        return [layer[0] for layer in self.layers]

    def _cached(self, name: str, source: torch.Tensor, make):
        """A tensor derived from a parameter, rebuilt when the parameter changes."""
        key = (source.data_ptr(), source._version, source.dtype)
        hit = self._derived.get(name)
        if hit is None or hit[0] != key:
            with torch.no_grad():
                hit = (key, make(source))
            self._derived[name] = hit
        return hit[1]

    # -- forward ---------------------------------------------------------------------------
    def _check_input(self, x: torch.Tensor, autocast_dtype) -> None:
        w = self.stem[1].weight
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"FusedResNet: expected input (N, {self.in_channels}, H, W), got {tuple(x.shape)}")
        if x.shape[2] % 4 or x.shape[3] % 4:
            raise ValueError(f"FusedResNet: input height and width must be multiples of 4, got "
                             f"{x.shape[2]}x{x.shape[3]}")
        if x.device != w.device or (autocast_dtype is None and x.dtype != w.dtype):
            raise ValueError(f"FusedResNet: input is {x.dtype} on {x.device} but the model is "
                             f"{w.dtype} on {w.device}; convert one of them")
        if autocast_dtype is not None and not x.is_floating_point():
            raise ValueError(f"FusedResNet: input must be floating, got {x.dtype}")

    @staticmethod
    def _autocast_dtype(x: torch.Tensor):
        """The dtype torch.autocast asks for on x's device, or None outside autocast."""
        # (Only the devices the model runs on: torch.amp.is_autocast_available is not
        # traceable by torch.compile in torch 2.11, is_autocast_enabled is.)
        device = x.device.type
        if device in ("cuda", "cpu") and torch.is_autocast_enabled(device):
            return torch.get_autocast_dtype(device)
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Fast path: an input of a shape/dtype/device already captured was checked then.
        # (Host time before the replay delays the GPU at small batches: every microsecond
        # shows in the latency.)
        if self.graph and not torch.is_grad_enabled():
            key = (x.shape, x.dtype, x.device)
            if key in self._graphs and not torch.is_autocast_enabled("cuda") \
                    and not torch.cuda.is_current_stream_capturing():
                return self._graphed(x, key)
        autocast_dtype = self._autocast_dtype(x)
        self._check_input(x, autocast_dtype)
        if self.graph and x.is_cuda and not torch.is_grad_enabled() and autocast_dtype is None \
                and not torch.cuda.is_current_stream_capturing():
            return self._graphed(x, (x.shape, x.dtype, x.device))
        return self._fused_forward(x, autocast_dtype=autocast_dtype)

    def kernel_report(self, x: torch.Tensor) -> list[tuple[str, tuple, str]]:
        """(layer, output shape, kernel) for each conv of one forward on x: which generated
        kernel (tile, alignment, split-K) the dispatcher picked per layer, or "aten"."""
        report: list = []
        with torch.no_grad():
            self._fused_forward(x, report)
        return report

    def _fused_forward(self, x: torch.Tensor, report: list | None = None, autocast_dtype=None) -> torch.Tensor:
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            # Each conv weight and FixUp scale goes to one op: in a captured backward their
            # wgrads may finish at the end of the pass (streams.weights_used_once; declared
            # only here, the one place it is used, so torch.compile need not trace it).
            with weights_used_once():
                return self._fused_ops(x, report, autocast_dtype)
        return self._fused_ops(x, report, autocast_dtype)

    def _fused_ops(self, x: torch.Tensor, report: list | None, autocast_dtype) -> torch.Tensor:
        # Under torch.autocast the input and the conv weights are cast to its dtype, as
        # autocast does for F.conv2d (differentiably: float32 master weights get float32
        # gradients, which GradScaler needs).  FixUp scalars and SE weights stay float32.
        def cast(t):
            return t if autocast_dtype is None or t.dtype == autocast_dtype else t.to(autocast_dtype)

        def conv(name, x, weight, *args, **kwargs):
            y = conv2d_fused(x, cast(weight), *args, **kwargs)
            if report is not None:
                report.append((name, tuple(y.shape), torch.ops.cutlass_ops.conv2d_fused_last_kernel()))
            return y

        blocks = self._blocks()
        b1a0 = blocks[0].fixup_bias1a
        # The stem's epilogue adds block 0's b1a: xa = relu(stem) + b1a.  Block 0's identity
        # is the stem output itself, recovered in se_gate as xa + (-b1a).
        x = cast(x)
        xa = space_to_depth_conv(x, cast(self.stem[1].weight), b1a0, relu=True)
        if report is not None:
            half = x.is_cuda and x.dtype in (torch.float16, torch.bfloat16)
            report.append(("stem", tuple(xa.shape), "space_to_depth_conv kernel" if half else "aten"))
        # Cached for inference; recomputed (one tiny kernel) when b1a needs a gradient.
        neg_b1a0 = -b1a0 if torch.is_grad_enabled() and b1a0.requires_grad else \
            self._cached("neg_b1a0", b1a0, lambda t: -t)
        # While a CUDA graph is captured (graph=True), each downsample conv goes on a side
        # stream: it needs only the pooled map, so in the graph it runs beside conv1 and conv2
        # (which leave SMs idle at small batches) instead of after them.  Eager calls stay
        # on one stream: there a fork costs more host time than it saves.
        side = self._side_stream(x.device) if x.is_cuda and torch.cuda.is_current_stream_capturing() else None
        # The dense conv2 weights (blocks whose map is smaller than 3x3) depend on the weights
        # alone: while a graph is captured, the ones not cached are built on the side stream
        # here, beside the stem and the early blocks, instead of on the path to their conv.
        dense = {}
        if side is not None:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.no_grad():  # a constant to small_map_conv
                for i, blk, height, width in self._dense_conv2_maps(x):
                    if not self._dense_weight_cached(blk, cast):
                        dense[i] = dense_conv_weight(cast(blk.conv2.weight), height, width, padding=1)
            for t in dense.values():
                t.record_stream(torch.cuda.current_stream())  # used by this stream's convs
        pooled = None
        for i, blk in enumerate(blocks):
            fork = side is not None and blk.downsample is not None
            if fork:  # after the previous se_gate wrote the pooled map, before conv1
                side.wait_stream(torch.cuda.current_stream())
            stride = blk.conv1.stride[0]
            h = conv(f"layers.{i}.conv1", xa, blk.conv1.weight, blk.fixup_bias1b.view(()), None,
                     stride, 1, None, blk.fixup_bias2a, relu=True)
            nxt = blocks[i + 1] if i + 1 < len(blocks) else None
            fc1, fc2 = blk.se.excite[0], blk.se.excite[2]
            pool_next = nxt is not None and nxt.downsample is not None
            next_b1a = nxt.fixup_bias1a if nxt is not None else None
            if self.fuse_se_gate and blk.downsample is None and not self._block_trains(blk, h) and \
                    conv2d_fused_se_gate_why_not(h, blk.conv2.weight, xa, fc1.weight) is None:
                # Inference, block 0's shape on sm90: conv2 with the gate as its epilogue.
                result = conv2d_fused_se_gate(h, cast(blk.conv2.weight), blk.fixup_scale, xa, fc1.weight, fc1.bias,
                                              fc2.weight, fc2.bias, neg_b1a0, next_b1a,
                                              avgpool=pool_next, h_bias=blk.fixup_bias2b.view(()))
                if report is not None:
                    report.append((f"layers.{i}.conv2+se_gate", tuple(h.shape), conv2d_fused_se_gate_last_kernel()))
                xa, pooled = result if pool_next else (result, None)
                continue
            if runs_dense(h.shape[2], h.shape[3], *blk.conv2.kernel_size):
                if i in dense:
                    torch.cuda.current_stream().wait_stream(side)
                h = self._dense_conv2(i, blk, h, cast, report, dense.get(i))
            else:
                h = conv(f"layers.{i}.conv2", h, blk.conv2.weight, None, None, 1, 1, blk.fixup_scale, None,
                         relu=False)
            if blk.downsample is None:
                identity, identity_bias = xa, neg_b1a0
            else:
                # AvgPool2d(3, 2, 1) of xa came from the previous se_gate; here the 1x1 conv.
                # (Cross-stream tensors stay referenced until after the join, so the
                # allocator cannot hand their memory to a kernel that could still race.)
                with torch.cuda.stream(side) if fork else contextlib.nullcontext():
                    identity = conv(f"layers.{i}.downsample", pooled, blk.downsample[1].weight)
                if fork:
                    torch.cuda.current_stream().wait_stream(side)
                identity_bias = None
            # conv2's FixUp bias b2b is added in se_gate (h + b2b): its gradient, sum(grad_h),
            # then comes out of se_gate's backward pass instead of a pass of its own.
            result = se_gate(h, identity, fc1.weight, fc1.bias, fc2.weight, fc2.bias, identity_bias,
                             next_b1a, avgpool=pool_next,
                             h_bias=blk.fixup_bias2b.view(()))
            xa, pooled = result if pool_next else (result, None)
        return xa

    @staticmethod
    def _block_trains(blk: SEFixupBasicBlock, h: torch.Tensor) -> bool:
        """Whether autograd wants gradients through the block's conv2 and gate: then they run
        as conv2d_fused and se_gate, whose backward needs no recomputation."""
        return torch.is_grad_enabled() and (h.requires_grad or any(p.requires_grad for p in blk.parameters()))

    def _dense_conv2_maps(self, x: torch.Tensor):
        """(block index, block, H, W) of each conv2 that runs as a dense layer on input x."""
        height, width = x.shape[2] // 4, x.shape[3] // 4
        for i, blk in enumerate(self._blocks()):
            stride = blk.conv1.stride[0]
            height, width = (height - 1) // stride + 1, (width - 1) // stride + 1  # 3x3, padding 1
            if runs_dense(height, width, *blk.conv2.kernel_size):
                yield i, blk, height, width

    @staticmethod
    def _dense_weight_cached(blk: SEFixupBasicBlock, cast) -> bool:
        """Inference caches the dense weight; training (the weight trains) and autocast (a
        new cast weight per call) rebuild it."""
        weight = blk.conv2.weight
        return cast(weight) is weight and not (torch.is_grad_enabled() and weight.requires_grad)

    def _dense_conv2(self, i: int, blk: SEFixupBasicBlock, h: torch.Tensor, cast, report,
                     dense: torch.Tensor | None) -> torch.Tensor:
        """conv2 on a map smaller than its kernel footprint, as a dense layer (small_map_conv),
        with `dense` its weight when built already."""
        weight, height, width = cast(blk.conv2.weight), h.shape[2], h.shape[3]
        if dense is None and self._dense_weight_cached(blk, cast):
            dense = self._cached(f"layers.{i}.conv2.dense{height}x{width}", weight,
                                 lambda w: dense_conv_weight(w, height, width, padding=1))
        y = small_map_conv(h, weight, blk.fixup_scale, 1, dense)
        if report is not None:
            dense_in, dense_out = height * width * h.shape[1], y.shape[1] * y.shape[2] * y.shape[3]
            report.append((f"layers.{i}.conv2", tuple(y.shape),
                           f"{conv2d_fused_last_kernel()} (as dense 1x1 conv, {dense_in}->{dense_out})"))
        return y

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        stream = self._side_streams.get(device)
        if stream is None:
            stream = self._side_streams[device] = torch.cuda.Stream(device)
        return stream

    def _graphed(self, x: torch.Tensor, key: tuple) -> torch.Tensor:
        # Host time here is on the critical path of small batches (the GPU waits for the
        # replay): keep it to a dict lookup, one version scan, one copy and the launch.
        versions = [p._version for p in self._param_list]  # in-place updates re-capture
        entry = self._graphs.get(key)
        if entry is None or entry["versions"] != versions:
            static_x = x.clone()
            side = torch.cuda.Stream(x.device)
            side.wait_stream(torch.cuda.current_stream(x.device))
            with torch.cuda.stream(side):
                for _ in range(2):  # warm-up: builds derived weights, loads kernels
                    self._fused_forward(static_x)
            torch.cuda.current_stream(x.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = self._fused_forward(static_x)
            entry = {"graph": graph, "x": static_x, "out": static_out, "versions": versions}
            self._graphs[key] = entry
        entry["x"].copy_(x)
        entry["graph"].replay()
        return entry["out"]
