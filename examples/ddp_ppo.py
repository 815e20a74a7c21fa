#!/usr/bin/env python
"""DD-PPO-shaped training of FusedResNet under torch DistributedDataParallel.

One process per GPU (bps-nav's DD-PPO): synthetic observations, the SE-ResNet9-FixUp encoder
(FusedResNet, or the PyTorch reference module in channels_last for comparison), a small
policy/value head and a PPO clipped-surrogate loss; DDP all-reduces the gradients.

    torchrun --nproc-per-node 2 examples/ddp_ppo.py --batch 2048 --steps 20 --out r2.json
    torchrun --nproc-per-node 1 examples/ddp_ppo.py --batch 4096 --steps 20 --out r1.json
    torchrun --nproc-per-node 2 examples/ddp_ppo.py --check-grads --batch 256
    torchrun --nproc-per-node 2 examples/ddp_ppo.py --device cpu --dtype float64 --batch 2 --check-grads

Device "auto": CUDA with NCCL when a GPU is visible, else the CPU with gloo.  More ranks than
GPUs on a node share the GPUs with gloo (NCCL refuses two ranks on one GPU): the "two
processes on one GPU" test.  Data: each step's global batch is cut into chunks of
--data-chunk samples, chunk i drawn from its own seeded generator, and rank r takes the
chunks of samples [r*N, (r+1)*N): so 2 ranks at N and 1 rank at 2N see the same samples.

--check-grads: one DDP step's gradients (after all-reduce) against a single process on the
concatenated batch, computed in the same run on rank 0, per parameter (and, to show the
all-reduce did something, the local gradients of the ranks, which differ).
The all-reduce's cost: every bucket's all-reduce is timed through a DDP comm hook (CUDA
events / host clocks: when the bucket was ready, when its all-reduce finished, against the
end of the backward's compute), and --measure-allreduce times fwd+bwd with and without
gradient sync (ddp.no_sync()).  Nothing here is CUTLASS-specific except the encoder.
Needs cutlass_ops installed (`pip install --no-build-isolation .`).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from cutlass_ops.distributed import flatten_parameters, named_gradients

ACTIONS = 4
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64}


# ---- model ---------------------------------------------------------------------------------------

class Agent(nn.Module):
    """Encoder (N, C, H, W) -> (N, 512, H/32, W/32), then a policy/value head."""

    def __init__(self, encoder: nn.Module, features: int, hidden: int = 512):
        super().__init__()
        self.encoder = encoder
        self.fc = nn.Linear(features, hidden)
        self.policy = nn.Linear(hidden, ACTIONS)
        self.value = nn.Linear(hidden, 1)

    def forward(self, obs):
        h = F.relu(self.fc(self.encoder(obs).flatten(1)))
        return self.policy(h), self.value(h).squeeze(1)


def make_agent(model: str, in_channels: int, base_planes: int, image: int, device, dtype) -> Agent:
    """dtype: the parameters' dtype (float32 master weights under autocast)."""
    from cutlass_ops import FusedResNet
    from cutlass_ops.models import SEResNet9FixUp
    if model == "fused":
        encoder = FusedResNet(in_channels, base_planes)
    else:
        encoder = SEResNet9FixUp(in_channels, base_planes)
    features = base_planes * 8 * (image // 32) ** 2
    agent = Agent(encoder, features).to(device=device, dtype=dtype)
    if model == "reference":
        agent = agent.to(memory_format=torch.channels_last)  # the eager reference as its users run it
    return agent


def randomize(agent: nn.Module, seed: int) -> None:
    """Random non-zero values for every parameter (the FixUp init's zero biases, unit scales and
    zero conv2 weights would hide bugs in their gradients)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in agent.named_parameters():
            if p.dim() >= 2:
                fan_in = p[0].numel()
                v = torch.randn(p.shape, generator=g, dtype=torch.float64) * (1.0 / fan_in) ** 0.5
            elif "fixup_scale" in name:
                v = 0.5 + torch.rand(p.shape, generator=g, dtype=torch.float64)
            else:
                v = 0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64)
            p.copy_(v)


# ---- data and loss -------------------------------------------------------------------------------

def batch_for(step: int, first: int, n: int, chunk: int, in_channels: int, image: int, seed: int, device):
    """Samples [first, first + n) of step `step`'s global batch: observations (float32) and the
    PPO rollout fields.  The target action brightens one quadrant of channel 0."""
    parts = []
    for c0 in range(first // chunk, (first + n) // chunk):
        gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + step * 10_007 + c0)
        obs = torch.rand(chunk, in_channels, image, image, generator=gen, device=device)
        target = torch.randint(0, ACTIONS, (chunk,), generator=gen, device=device)
        action = torch.randint(0, ACTIONS, (chunk,), generator=gen, device=device)
        noise = torch.randn(chunk, 2, generator=gen, device=device)
        half = image // 2
        rows = (target // 2)[:, None] * half + torch.arange(half, device=device)[None]
        cols = (target % 2)[:, None] * half + torch.arange(half, device=device)[None]
        quad = torch.zeros(chunk, image, image, device=device)
        quad[torch.arange(chunk, device=device)[:, None, None], rows[:, :, None], cols[:, None, :]] = 0.5
        obs[:, 0] += quad
        advantage = (action == target).float() * 2 - 1 + 0.1 * noise[:, 0]
        returns = (target.float() / ACTIONS) + 0.1 * noise[:, 1]
        old_logp = torch.full((chunk,), math.log(1.0 / ACTIONS), device=device)
        parts.append((obs, action, advantage, returns, old_logp))
    return [torch.cat(t) for t in zip(*parts)]


def ppo_loss(agent, obs, action, advantage, returns, old_logp, clip=0.2, value_coef=0.5, entropy_coef=0.01):
    """PPO's clipped surrogate + value loss - entropy bonus, mean over the batch (float32 math, float64
    for a float64 model)."""
    logits, value = agent(obs)
    acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
    logits, value = logits.to(acc), value.to(acc)
    logp_all = F.log_softmax(logits, dim=1)
    logp = logp_all.gather(1, action[:, None]).squeeze(1)
    ratio = torch.exp(logp - old_logp)
    surrogate = torch.min(ratio * advantage, ratio.clamp(1 - clip, 1 + clip) * advantage)
    value_loss = 0.5 * (value - returns).square()
    entropy = -(logp_all.exp() * logp_all).sum(1)
    return (-surrogate + value_coef * value_loss - entropy_coef * entropy).mean()


# ---- all-reduce timing ---------------------------------------------------------------------------

class AllreduceTimer:
    """A DDP comm hook (the default all-reduce: divide by the world size, sum) that records
    per bucket when it was ready (in the backward's stream order) and when its all-reduce
    finished: CUDA events on GPUs, host clocks on the CPU (gloo completes on its threads)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.records: list = []   # (ready, done, bucket bytes) of the current step
        self.active = True

    def __call__(self, state, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        if not self.active:
            return allreduce_hook(state, bucket)
        rec = [self._now(), None, bucket.buffer().numel() * bucket.buffer().element_size()]
        self.records.append(rec)
        fut = allreduce_hook(state, bucket)

        def done(f):
            rec[1] = self._now()
            return f.value()
        return fut.then(done)

    def _now(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def mark(self):
        return self._now()

    def summary(self, start, backward_end) -> dict:
        """ms since `start` per bucket.  The backward's compute ends when the last bucket is
        ready (its last gradient was stored); what the all-reduces add after that is exposed,
        the rest of their time overlapped the backward.  `backward_end`: backward() returned
        (DDP waits there for the all-reduces)."""
        def ms(a, b):
            return a.elapsed_time(b) if self.cuda else (b - a) * 1e3
        if self.cuda:
            torch.cuda.synchronize()
        buckets = [{"ready_ms": ms(start, r), "done_ms": ms(start, d), "bytes": n} for r, d, n in self.records
                   if d is not None]
        if not buckets:
            return {"buckets": []}
        compute_end = max(b["ready_ms"] for b in buckets)
        last = max(b["done_ms"] for b in buckets)
        return {"buckets": buckets, "backward_compute_end_ms": compute_end,
                "backward_returned_ms": ms(start, backward_end),
                "allreduce_exposed_ms": max(0.0, last - compute_end),
                "allreduce_busy_ms_sum": sum(b["done_ms"] - b["ready_ms"] for b in buckets),
                "allreduce_overlapped_ms_sum": sum(max(0.0, min(b["done_ms"], compute_end) - b["ready_ms"])
                                                   for b in buckets),
                "buckets_done_before_compute_end": sum(b["done_ms"] <= compute_end for b in buckets)}


# ---- setup ---------------------------------------------------------------------------------------

def setup(args):
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device_kind = args.device
    if device_kind == "auto":
        device_kind = "cuda" if torch.cuda.is_available() else "cpu"
    if device_kind == "cuda":
        count = torch.cuda.device_count()
        device = torch.device("cuda", local_rank % count)
        torch.cuda.set_device(device)
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        shared = local_world > count
    else:
        device, shared = torch.device("cpu"), False
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" and not shared else "gloo"
    if args.graph:
        # DDP under whole-step capture (torch.cuda docs, "Usage with DistributedDataParallel").
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    if "MASTER_ADDR" not in os.environ:  # a plain `python examples/ddp_ppo.py`: one process
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port or 29517))
    options = None
    if backend == "nccl" and args.nccl_max_ctas:
        # NCCL's kernels take an SM per channel; beside the backward's convs (buckets smaller
        # than the gradients) fewer of them may cost the convs less than they cost the all-reduce.
        options = dist.ProcessGroupNCCL.Options()
        options.config.max_ctas = args.nccl_max_ctas
        options.config.min_ctas = 1
    dist.init_process_group(backend, rank=rank, world_size=world,
                            device_id=device if backend == "nccl" else None, pg_options=options)
    return rank, world, device, backend, shared


def autocast_for(args, device):
    dtype = DTYPES[args.dtype]
    if dtype in (torch.float16, torch.bfloat16):
        return torch.autocast(device.type, dtype=dtype), torch.float32
    return nullcontext(), dtype


def param_dtype(args):
    dtype = DTYPES[args.dtype]
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def wrap(agent, args, device):
    if args.ignore_param:  # a negative control for the tests: DDP leaves these gradients local
        DDP._set_params_and_buffers_to_ignore_for_model(agent, args.ignore_param)
    kwargs = dict(static_graph=args.static_graph, bucket_cap_mb=args.bucket_cap_mb,
                  gradient_as_bucket_view=args.grad_as_bucket_view)
    if device.type == "cuda":
        kwargs["device_ids"] = [device]
    return DDP(agent, **kwargs)


def flat_grads(agent) -> torch.Tensor:
    """Every parameter's gradient (NaN where none), as named before any flatten_parameters, in one vector."""
    return torch.cat([(g if g is not None else torch.full_like(p, float("nan"))).detach().double().reshape(-1)
                      for _, p, g in named_gradients(agent)])


def stage_of(name: str) -> int:
    """The encoder stage a parameter belongs to (the stem with stage 0, the head with the last)."""
    parts = name.split(".")
    if parts[0] != "encoder":
        return 3
    return int(parts[2]) if parts[1] == "layers" else 0


def prepare(agent: nn.Module, args) -> nn.Module:
    """--flat-params: cutlass_ops.flatten_parameters on the whole agent (after randomize): one flat
    parameter, or one per encoder stage."""
    if args.flat_params is None:
        return agent
    return flatten_parameters(agent, group=stage_of if args.flat_params == "stages" else None)


# ---- --check-grads ---------------------------------------------------------------------------

def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def check_grads(args, rank, world, device) -> dict:
    """DDP gradients vs one process on the concatenated batch (rank 0), per parameter, for
    --check-steps steps (DDP rebuilds its buckets after the first, in the order the
    gradients arrived), and the ranks' local (unsynchronized) gradients."""
    autocast, pdtype = autocast_for(args, device)
    n, chunk = args.batch, args.data_chunk
    agent = make_agent(args.model, args.in_channels, args.base_planes, args.image, device, pdtype)
    randomize(agent, args.seed)
    state = {k: v.clone() for k, v in agent.state_dict().items()}
    agent = prepare(agent, args)
    ddp = wrap(agent, args, device)
    names = [name for name, _, _ in named_gradients(agent)]
    model = torch.compile(ddp, backend=args.compile_backend) if args.compile else ddp
    single = ref64 = None
    if rank == 0:
        single = make_agent(args.model, args.in_channels, args.base_planes, args.image, device, pdtype)
        single.load_state_dict(state)
        if DTYPES[args.dtype] != torch.float64:  # the noise floor: float64
            ref64 = make_agent(args.model, args.in_channels, args.base_planes, args.image, device, torch.float64)
            ref64.load_state_dict(state)
    steps = []
    for step in range(args.check_steps):
        data = batch_for(step, rank * n, n, chunk, args.in_channels, args.image, args.seed, device)
        agent.zero_grad(set_to_none=True)
        with autocast:
            loss = ppo_loss(model, data[0].to(pdtype), *data[1:])
        loss.backward()
        synced = flat_grads(agent)
        if step == 0:
            first_synced = synced
        gathered = [torch.empty_like(synced) for _ in range(world)]
        dist.all_gather(gathered, synced)
        record = {"step": step, "loss": loss.item(),
                  "grads_missing": sum(g is None for _, _, g in named_gradients(agent))}
        if rank == 0:
            record["cross_rank_max_abs_diff"] = max((g - gathered[0]).abs().max().item() for g in gathered)
            full = batch_for(step, 0, n * world, chunk, args.in_channels, args.image, args.seed, device)
            single.zero_grad(set_to_none=True)
            with autocast:
                ppo_loss(single, full[0].to(pdtype), *full[1:]).backward()
            ref = {name: p.grad.detach().double() for name, p in single.named_parameters()}
            exact = ref
            if ref64 is not None:
                ref64.zero_grad(set_to_none=True)
                ppo_loss(ref64, full[0].double(), *full[1:]).backward()
                exact = {name: p.grad.detach().double() for name, p in ref64.named_parameters()}
            per_param, offset = {}, 0
            for name, p, _ in named_gradients(agent):
                ddp_g = synced[offset:offset + p.numel()].reshape(p.shape)
                offset += p.numel()
                row = {"numel": p.numel(), "dtype": str(p.dtype)[6:], "max_abs_err": (ddp_g - ref[name]).abs().max().item(),
                       "rel_err": rel_err(ddp_g, ref[name]), "ref_norm": ref[name].norm().item()}
                if ref64 is not None:
                    row["ddp_rel_err_vs_float64"] = rel_err(ddp_g, exact[name])
                    row["single_rel_err_vs_float64"] = rel_err(ref[name], exact[name])
                per_param[name] = row
            record["params"] = per_param
            record["max_rel_err"] = max(r["rel_err"] for r in per_param.values())
            record["max_abs_err"] = max(r["max_abs_err"] for r in per_param.values())
        steps.append(record)
    # The local gradients (no all-reduce), to show that the synchronized ones differ from them;
    # through the same (compiled) module as the synchronized ones, so that they are the same
    # computation but for the all-reduce (compiled and eager fp16 gradients differ by ~2e-4).
    data = batch_for(0, rank * n, n, chunk, args.in_channels, args.image, args.seed, device)
    agent.zero_grad(set_to_none=True)
    with ddp.no_sync(), autocast:
        loss = ppo_loss(model, data[0].to(pdtype), *data[1:])
    loss.backward()
    local = flat_grads(agent)
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local)
    result = {"check_steps": steps, "params": names}
    if rank == 0:
        result["local_cross_rank_max_abs_diff"] = max((g - gathered[0]).abs().max().item() for g in gathered)
        # The all-reduce must give the mean of the ranks' local gradients (step 0's data and weights),
        # per parameter dtype (float32 FixUp scalars and SE weights round at 1e-7).
        mean_local, offset, worst = torch.stack(gathered).mean(0), 0, {}
        for _, p, _ in named_gradients(agent):
            a, b = first_synced[offset:offset + p.numel()], mean_local[offset:offset + p.numel()]
            offset += p.numel()
            key = str(p.dtype)[6:]
            err = 0.0 if (a - b).abs().max().item() <= (0 if key == "float64" else 1e-7) else rel_err(a, b)
            worst[key] = max(worst.get(key, 0.0), err)
        result["synced_vs_mean_of_local_rel_err"] = worst
    return result


# ---- training --------------------------------------------------------------------------------

def build_step(args, rank, device, use_ddp: bool) -> SimpleNamespace:
    """One training setup: the agent (random non-zero weights from --seed), DDP around it where
    use_ddp, Adam, GradScaler (float16), forward + backward captured in a CUDA graph with --graph;
    ``step(data)`` runs one training step (forward, backward, the optimizer)."""
    autocast, pdtype = autocast_for(args, device)
    n, chunk, cuda = args.batch, args.data_chunk, device.type == "cuda"
    agent = make_agent(args.model, args.in_channels, args.base_planes, args.image, device, pdtype)
    randomize(agent, args.seed)
    if use_ddp:  # (the one-process baseline as one GPU runs best: unflattened)
        agent = prepare(agent, args)
    side = torch.cuda.Stream(device) if args.graph else None
    with torch.cuda.stream(side) if side is not None else nullcontext():
        model = ddp = wrap(agent, args, device) if use_ddp else agent
    timer = None
    if use_ddp and not args.graph:
        timer = AllreduceTimer(cuda)
        def timed_allreduce(state, bucket):
            return timer(state, bucket)
        ddp.register_comm_hook(None, timed_allreduce)
    if args.compile:
        model = torch.compile(ddp, backend=args.compile_backend)
    opt = torch.optim.Adam(agent.parameters(), lr=args.lr, eps=1e-5)
    use_scaler = DTYPES[args.dtype] == torch.float16
    scaler = torch.amp.GradScaler(device.type, enabled=use_scaler)

    def load(step):
        return batch_for(step, rank * n, n, chunk, args.in_channels, args.image, args.seed, device)

    def fwd_bwd(data):
        with autocast:
            loss = ppo_loss(model, data[0].to(pdtype), *data[1:])
        scaler.scale(loss).backward()
        return loss.detach()

    replay = None
    if args.graph:
        if not cuda:
            raise SystemExit("--graph needs CUDA")
        static = load(0)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(args.graph_warmup):  # DDP wants >= 11 eager iterations before capture
                agent.zero_grad(set_to_none=True)
                fwd_bwd(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        agent.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            static_loss = fwd_bwd(static)

        def replay(data):
            for s, d in zip(static, data):
                s.copy_(d)
            graph.replay()
            return static_loss.clone()

    def optimizer_step():
        scaler.step(opt)
        scaler.update()

    def fwd_bwd_step(data):
        if replay is not None:
            return replay(data)
        agent.zero_grad(set_to_none=True)
        return fwd_bwd(data)

    return SimpleNamespace(agent=agent, model=model, ddp=ddp, timer=timer, load=load, fwd_bwd=fwd_bwd,
                           fwd_bwd_step=fwd_bwd_step, optimizer_step=optimizer_step,
                           step=lambda data: (fwd_bwd_step(data), optimizer_step()))


def train(args, rank, world, device) -> dict:
    n, cuda = args.batch, device.type == "cuda"
    t = build_step(args, rank, device, use_ddp=not args.no_ddp)
    agent, model, ddp, timer, load, fwd_bwd = t.agent, t.model, t.ddp, t.timer, t.load, t.fwd_bwd
    fwd_bwd_step, optimizer_step = t.fwd_bwd_step, t.optimizer_step
    losses, times, comm = [], [], []
    for step in range(args.steps):
        data = load(step)
        if cuda:
            torch.cuda.synchronize()
        if timer is not None:
            timer.records = []
        t0 = timer.mark() if timer is not None else None
        start = time.perf_counter()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if cuda else None
        if cuda:
            ev[0].record()
        loss = fwd_bwd_step(data)
        bwd_end = timer.mark() if timer is not None else None
        optimizer_step()
        if cuda:
            ev[1].record()
            torch.cuda.synchronize()
            times.append(ev[0].elapsed_time(ev[1]))
        else:
            times.append((time.perf_counter() - start) * 1e3)
        if timer is not None and timer.records:
            comm.append(timer.summary(t0, bwd_end))
        losses.append(loss)
    losses = torch.stack(losses).float()
    dist.all_reduce(losses)  # each rank's loss is its local mean: the global one is their mean
    losses = (losses / world).tolist()
    result = {"losses": losses, "step_ms": times}
    timed = times[args.warmup:] or times
    result["median_step_ms"] = statistics.median(timed)
    result["samples_per_s"] = n * world / (result["median_step_ms"] / 1e3)
    if comm:
        later = comm[args.warmup:] or comm
        result["allreduce_exposed_ms_median"] = statistics.median(c["allreduce_exposed_ms"] for c in later)
        result["allreduce_busy_ms_median"] = statistics.median(c["allreduce_busy_ms_sum"] for c in later)
        result["allreduce_overlapped_ms_median"] = statistics.median(c["allreduce_overlapped_ms_sum"] for c in later)
        result["buckets_per_step"] = len(later[-1]["buckets"])
        result["bucket_bytes"] = [b["bytes"] for b in later[-1]["buckets"]]
        result["comm_last_step"] = later[-1]
    if args.measure_allreduce and not args.no_ddp and not args.graph:
        result["allreduce_added"] = measure_sync_cost(args, ddp, model, agent, fwd_bwd, load, cuda, timer)
    if args.throughput_steps:
        if timer is not None:
            timer.active = False
        batches = [load(args.steps + i) for i in range(min(args.throughput_steps, 4))]
        result.update(measure_throughput(t.step, batches, args.throughput_steps, args.throughput_windows, n * world,
                                         cuda, device))
        if args.paired_baseline and world > 1:
            result.update(measure_paired(args, rank, world, device, t.step, batches))
    if args.profile_steps and cuda:
        if timer is not None:
            timer.active = False
        batches = [load(args.steps + i) for i in range(min(args.profile_steps, 4))]
        result["gpu_timeline"] = gpu_timeline(lambda d: (fwd_bwd_step(d), optimizer_step()), batches,
                                              args.profile_steps)
    return result


def union_ms(intervals) -> float:
    """Total length of the union of (start, end) intervals, in ms (intervals in us)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total / 1e3


def gpu_timeline(step, batches, steps) -> dict:
    """Where a step's GPU time goes, from the profiler's kernel records (CUPTI sees the kernels
    inside CUDA graphs): `steps` steps back to back after a barrier, then per step: the span from
    the first kernel's start to the last one's end, compute (the union of all non-NCCL kernels,
    copies and sets), NCCL (the union of NCCL kernels: it includes waiting for the other ranks),
    NCCL exposed (NCCL time with no compute beside it) and idle (no kernel at all: the host's
    gaps, e.g. GradScaler's found-inf read).  Every rank's; the comparison of 1 and 2 GPUs says
    whether the lost scaling is the all-reduce, a wait, or the host.  ``kernel_table``: per
    kernel name (cut to 100 characters), its count and its time a step, the 40 longest: what DDP
    adds (ddp_ppo_report.py's kernel_diff sets it beside the 1-GPU run's)."""
    from torch.profiler import ProfilerActivity, profile
    dist.barrier()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            step(batches[i % len(batches)])
        torch.cuda.synchronize()
    comm, other, by_name = [], [], {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA or e.time_range.end <= e.time_range.start:
            continue
        (comm if "nccl" in e.name.lower() else other).append((e.time_range.start, e.time_range.end))
        entry = by_name.setdefault(e.name[:100], [0, 0.0])
        entry[0] += 1
        entry[1] += e.time_range.end - e.time_range.start
    everything = comm + other
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:40]
    mine = {"steps": steps, "kernels": len(everything), "nccl_kernels": len(comm), "distinct_kernels": len(by_name),
            "kernel_table": [{"name": k, "per_step": c / steps, "us_per_step": us / steps} for k, (c, us) in top]}
    if everything:
        span = (max(b for _, b in everything) - min(a for a, _ in everything)) / 1e3
        busy, compute, nccl = union_ms(everything), union_ms(other), union_ms(comm)
        mine.update(span_ms=span / steps, compute_ms=compute / steps, nccl_ms=nccl / steps,
                    nccl_exposed_ms=(busy - compute) / steps, idle_ms=(span - busy) / steps)
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    return {"per_rank": ranks}


def measure_throughput(step, batches, steps, windows, global_batch, cuda, device) -> dict:
    """Training steps back to back, `windows` windows of `steps` each, every window between two
    CUDA events (the host clock on the CPU), every rank starting it together after a barrier, the
    data already made (cycling through `batches`); per window the slowest rank's time, and the
    median window is the metric.  The per-step medians above synchronize the host before each step
    and time from the step's start on rank 0, so on several ranks they also count the wait for a
    rank that started later; this is the rate a training loop sustains.  Several windows: the
    median shrugs off one disturbed window, and their spread shows the noise within a launch
    (between launches of one run an H200 moved by 15%: tests/gpu_ddp.sh compares launches in
    rounds, and --paired-baseline times one process within the same launch)."""
    per_window = []
    for _ in range(windows):
        dist.barrier()
        ms = _window_ms(step, batches, steps, cuda)
        slowest = torch.tensor([ms], dtype=torch.float64, device=device if cuda else "cpu")
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        per_window.append(slowest.item())
    ms = statistics.median(per_window)
    return {"throughput_steps": steps, "throughput_windows_ms": per_window, "throughput_step_ms": ms,
            "throughput_samples_per_s": global_batch / (ms / 1e3)}


def _window_ms(step, batches, steps, cuda) -> float:
    """ms a step over `steps` steps back to back (CUDA events; the host clock on the CPU)."""
    if cuda:
        torch.cuda.synchronize()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        ev[0].record()
    start = time.perf_counter()
    for i in range(steps):
        step(batches[i % len(batches)])
    if cuda:
        ev[1].record()
        torch.cuda.synchronize()
        return ev[0].elapsed_time(ev[1]) / steps
    return (time.perf_counter() - start) * 1e3 / steps


def measure_paired(args, rank, world, device, ddp_step, batches) -> dict:
    """The scaling measured within one launch (--paired-baseline): rank 0 also builds the
    one-process setup (the same agent, optimizer and CUDA graph, no DDP), and windows alternate:
    every rank's DDP steps (the slowest rank's time), then rank 0's one-process steps alone (the
    other ranks wait at a barrier).  Each pair's scaling is world x (1-GPU ms) / (DDP ms), same N
    per GPU; the median pair is the metric.  Launches minutes apart differed by up to 15% on an
    H200: pairs of adjacent windows see the machine in the same state."""
    cuda = device.type == "cuda"
    base = build_step(args, rank, device, use_ddp=False) if rank == 0 else None
    if base is not None:  # warm the one-process setup up (its graph is captured in build_step)
        _window_ms(base.step, batches, 3, cuda)
    pairs = []
    for _ in range(args.throughput_windows):
        dist.barrier()
        ddp_ms = torch.tensor([_window_ms(ddp_step, batches, args.throughput_steps, cuda)], dtype=torch.float64,
                              device=device if cuda else "cpu")
        dist.all_reduce(ddp_ms, op=dist.ReduceOp.MAX)
        one_ms = torch.zeros(1, dtype=torch.float64, device=ddp_ms.device)
        if base is not None:
            one_ms.fill_(_window_ms(base.step, batches, args.throughput_steps, cuda))
        dist.broadcast(one_ms, 0)
        pairs.append({"ddp_ms": ddp_ms.item(), "one_gpu_ms": one_ms.item(),
                      "speedup": world * one_ms.item() / ddp_ms.item()})
    return {"paired_windows": pairs, "paired_speedup_median": statistics.median(p["speedup"] for p in pairs),
            "paired_one_gpu_ms_median": statistics.median(p["one_gpu_ms"] for p in pairs),
            "paired_ddp_ms_median": statistics.median(p["ddp_ms"] for p in pairs)}


def measure_sync_cost(args, ddp, model, agent, fwd_bwd, load, cuda, timer) -> dict:
    """Median fwd+bwd time with gradient sync and without (ddp.no_sync()), alternating, same data."""
    if timer is not None:
        timer.active = False
    data = load(0)
    times = {"sync": [], "no_sync": []}
    for i in range(2 * args.measure_allreduce + 2):
        kind = "sync" if i % 2 == 0 else "no_sync"
        agent.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with ddp.no_sync() if kind == "no_sync" else nullcontext():
            fwd_bwd(data)
        if cuda:
            torch.cuda.synchronize()
        if i >= 2:
            times[kind].append((time.perf_counter() - start) * 1e3)
    agent.zero_grad(set_to_none=True)
    sync, no_sync = statistics.median(times["sync"]), statistics.median(times["no_sync"])
    return {"fwd_bwd_ms_sync": sync, "fwd_bwd_ms_no_sync": no_sync, "added_ms": sync - no_sync,
            "reps": args.measure_allreduce}


def environment(device, backend, world, shared) -> dict:
    env = {"torch": torch.__version__, "device": str(device), "backend": backend, "world_size": world,
           "ranks_share_a_gpu": shared, "python": sys.version.split()[0]}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if backend == "nccl" else None
    try:
        import cutlass_ops
        env["cutlass_ops"] = cutlass_ops.__file__
        env["cutlass_ops_cuda_kernels"] = cutlass_ops.cuda_kernels_built()
    except ImportError:
        pass
    return env


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="DD-PPO-shaped training of FusedResNet + a policy/value head under torch "
                    "DistributedDataParallel. Launch with torchrun, one process per GPU, e.g. "
                    "`torchrun --nproc-per-node 2 examples/ddp_ppo.py --batch 2048 --steps 20 --out r.json`. "
                    "Device auto: CUDA + NCCL when a GPU is visible, else CPU + gloo; more ranks than GPUs "
                    "share them through gloo.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", choices=["fused", "reference"], default="fused",
                   help="encoder: FusedResNet, or the PyTorch SEResNet9FixUp in channels_last (eager)")
    p.add_argument("--batch", type=int, default=None,
                   help="samples per rank (N); the global batch is N x world size (default 2048 on CUDA, 4 on CPU)")
    p.add_argument("--steps", type=int, default=20, help="training steps (Adam, lr --lr)")
    p.add_argument("--warmup", type=int, default=3,
                   help="first steps left out of the timing medians (they still train)")
    p.add_argument("--dtype", choices=list(DTYPES), default=None,
                   help="float16/bfloat16: float32 weights + torch.autocast (+ GradScaler for float16); "
                        "float32/float64: the weights' dtype (default float16 on CUDA, float32 on CPU)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                   help="auto: nccl on CUDA (one GPU per rank), else gloo")
    p.add_argument("--graph", action="store_true",
                   help="CUDA + NCCL: capture forward + backward (+ DDP's all-reduces) in one CUDA graph "
                        "after --graph-warmup eager iterations on a side stream; the optimizer step stays eager")
    p.add_argument("--graph-warmup", type=int, default=11, help="eager iterations before the capture")
    p.add_argument("--compile", action="store_true", help="torch.compile the DDP model (DDPOptimizer splits "
                                                          "the graph at bucket boundaries)")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend (aot_eager: no codegen)")
    p.add_argument("--static-graph", action="store_true", help="DDP(static_graph=True)")
    p.add_argument("--grad-as-bucket-view", action="store_true", help="DDP(gradient_as_bucket_view=True)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket size")
    p.add_argument("--nccl-max-ctas", type=int, default=None, metavar="K",
                   help="NCCL: at most K CTAs (channels, one SM each) per collective (ncclConfig_t.maxCTAs; "
                        "default: NCCL's choice)")
    p.add_argument("--no-ddp", action="store_true", help="no DDP wrapper (the 1-process baseline; world size 1)")
    p.add_argument("--check-grads", action="store_true",
                   help="compare one DDP step's gradients with a single process on the concatenated batch "
                        "(on rank 0), per parameter; exit 1 if they differ beyond --tolerance")
    p.add_argument("--check-steps", type=int, default=2,
                   help="--check-grads: steps compared (DDP rebuilds its buckets after the first)")
    p.add_argument("--tolerance", type=float, default=None,
                   help="--check-grads: max relative error per parameter (default: 1e-10 for float64 parameters, "
                        "1e-4 for float32 ones; 16-bit runs: DDP's error vs float64 <= 2x the single process's "
                        "+ 1e-3, tensors only)")
    p.add_argument("--throughput-steps", type=int, default=None, metavar="K",
                   help="after the logged steps, time K more back to back (barrier first, data made "
                        "beforehand; the slowest rank's time): the throughput metric (default 50 on CUDA, 0 on the CPU)")
    p.add_argument("--throughput-windows", type=int, default=5, metavar="W",
                   help="time W such windows of K steps; the median window is the metric")
    p.add_argument("--flat-params", choices=["one", "stages"], default=None,
                   help="cutlass_ops.flatten_parameters on the agent: one flat parameter (DDP copies one gradient "
                        "a step instead of 54; its all-reduce starts after the backward), or one per encoder stage "
                        "(4: the last stages' all-reduces overlap the first stages' backward)")
    p.add_argument("--paired-baseline", action="store_true",
                   help="on 2+ ranks, also time the one-process run (no DDP) on rank 0 within this launch, in "
                        "windows alternating with the DDP ones: each pair's scaling, and their median "
                        "(paired_speedup_median)")
    p.add_argument("--profile-steps", type=int, default=0, metavar="K",
                   help="CUDA: profile K more steps back to back and split each step's GPU time into compute, "
                        "NCCL (exposed or beside compute) and idle, per rank")
    p.add_argument("--measure-allreduce", type=int, default=0, metavar="REPS",
                   help="also time REPS fwd+bwd with gradient sync and REPS without (ddp.no_sync()), alternating")
    p.add_argument("--ignore-param", action="append", default=[], metavar="NAME",
                   help="negative control: DDP does not synchronize this parameter (--check-grads must then fail)")
    p.add_argument("--in-channels", type=int, default=3)
    p.add_argument("--base-planes", type=int, default=64, help="encoder width (64: bps-nav's; smaller for tests)")
    p.add_argument("--image", type=int, default=64, help="observation height = width (a multiple of 32)")
    p.add_argument("--data-chunk", type=int, default=256,
                   help="samples per data generator (runs compared step by step need the same value; "
                        "reduced to gcd(N, chunk))")
    p.add_argument("--lr", type=float, default=2.5e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=None, help="MASTER_PORT when not launched by torchrun")
    p.add_argument("--out", default=None, help="JSON: per-step loss and step times, all-reduce timing, "
                                               "or the --check-grads report (written by rank 0)")
    args = p.parse_args(argv)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    rank, world, device, backend, shared = setup(args)
    if args.batch is None:
        args.batch = 2048 if device.type == "cuda" else 4
    if args.dtype is None:
        args.dtype = "float16" if device.type == "cuda" else "float32"
    if args.check_grads and args.graph:
        raise SystemExit("--check-grads compares steps run outside a CUDA graph; --graph is checked by training: "
                         "its loss curve against eager's (tests/python/test_ddp.py, tests/gpu_ddp.sh)")
    if args.throughput_steps is None:
        args.throughput_steps = 50 if device.type == "cuda" else 0
    if args.throughput_windows < 1:
        raise SystemExit(f"--throughput-windows {args.throughput_windows}: at least 1")
    args.data_chunk = math.gcd(args.batch, args.data_chunk)
    if args.no_ddp and world != 1:
        raise SystemExit("--no-ddp is the one-process baseline: world size 1")
    if args.no_ddp and args.flat_params is not None:
        raise SystemExit("--flat-params is for DDP (one gradient to copy into its bucket); the one-process "
                         "baseline runs unflattened")
    torch.manual_seed(args.seed)
    result = {"args": vars(args), "environment": environment(device, backend, world, shared)}
    ok = True
    try:
        if args.check_grads:
            report = check_grads(args, rank, world, device)
            result.update(report)
            if rank == 0:
                ok = verdict(args, result)
        else:
            result.update(train(args, rank, world, device))
    finally:
        flag = torch.tensor([int(ok)], device=device if backend == "nccl" else "cpu")
        dist.broadcast(flag, 0)
        ok = bool(flag.item())
        dist.destroy_process_group()
    if rank == 0:
        summarize(args, result)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(result, indent=1))
            print(f"wrote {args.out}")
    return 0 if ok else 1


def verdict(args, result) -> bool:
    """Whether the --check-grads report passes; sets result['passed'] and ['failures'].

    float32/float64 runs: each parameter's gradient within a relative --tolerance of the single
    process's (by default 1e-10 for float64 parameters, 1e-4 for float32 ones: FusedResNet keeps
    its FixUp scalars and SE weights in float32 in a float64 model, and the two runs sum their
    gradients in different orders; or within 1e-7 absolute for a gradient that small; or, in a
    float32 run, no farther from float64 than 2x the single process's + the tolerance: on a GPU
    float32 convs run in TF32, cuDNN's default, and an H100 had a FixUp scale's gradient 1.3e-4
    apart between the batch of 64 and two of 32, each as far from float64).  16-bit
    runs: each tensor's DDP gradient no farther from float64 than 2x the single process's + 1e-3
    (the FixUp scalars' 16-bit gradients are noise, README).  Always: every parameter has a
    gradient, the ranks' gradients are identical, and they are the mean of the local ones."""
    dtype = DTYPES[args.dtype]
    sixteen = dtype in (torch.float16, torch.bfloat16)
    failures = []
    for rec in result["check_steps"]:
        if rec["grads_missing"]:
            failures.append(f"step {rec['step']}: {rec['grads_missing']} parameters without a gradient")
        if rec["cross_rank_max_abs_diff"] != 0:
            failures.append(f"step {rec['step']}: ranks' gradients differ by {rec['cross_rank_max_abs_diff']:.3g}")
        for name, row in rec["params"].items():
            if sixteen:
                if row["numel"] > 1 and row["ddp_rel_err_vs_float64"] > 2 * row["single_rel_err_vs_float64"] + 1e-3:
                    failures.append(f"step {rec['step']} {name}: DDP {row['ddp_rel_err_vs_float64']:.3g} vs "
                                    f"single {row['single_rel_err_vs_float64']:.3g} from float64")
                continue
            tol = args.tolerance if args.tolerance is not None else (1e-10 if row["dtype"] == "float64" else 1e-4)
            small = row["dtype"] != "float64" and row["max_abs_err"] <= 1e-7
            as_exact = ("ddp_rel_err_vs_float64" in row
                        and row["ddp_rel_err_vs_float64"] <= 2 * row["single_rel_err_vs_float64"] + tol)
            if not (row["rel_err"] <= tol or small or as_exact):
                failures.append(f"step {rec['step']} {name} ({row['dtype']}): rel. error {row['rel_err']:.3g} > {tol:g}")
    for key, err in result["synced_vs_mean_of_local_rel_err"].items():
        if not err <= (1e-12 if key == "float64" else 1e-5):
            failures.append(f"synchronized {key} gradients are not the mean of the ranks' local ones: "
                            f"rel. error {err:.3g}")
    if result["local_cross_rank_max_abs_diff"] == 0 and int(result["environment"]["world_size"]) > 1:
        failures.append("the ranks' local gradients are identical: the check cannot tell an all-reduce happened")
    result["passed"], result["failures"] = not failures, failures
    return not failures


def summarize(args, result) -> None:
    env = result["environment"]
    print(f"{env['world_size']} rank(s), {env['device']} ({env['backend']}), model {args.model}, N={args.batch} "
          f"per rank, {args.dtype}, graph={args.graph}, compile={args.compile}, static_graph={args.static_graph}")
    if args.check_grads:
        for rec in result["check_steps"]:
            print(f"step {rec['step']}: loss {rec['loss']:.6f}; DDP vs single process on the concatenated "
                  f"batch: max rel. error {rec['max_rel_err']:.3g}, max abs. error {rec['max_abs_err']:.3g} over "
                  f"{len(rec['params'])} parameters; ranks differ by {rec['cross_rank_max_abs_diff']:.3g}")
        print(f"local (unsynchronized) gradients differ across ranks by {result['local_cross_rank_max_abs_diff']:.3g}; "
              f"the synchronized ones are their mean within "
              + ", ".join(f"{v:.3g} ({k})" for k, v in result["synced_vs_mean_of_local_rel_err"].items()))
        print("PASSED" if result["passed"] else "FAILED:\n  " + "\n  ".join(result["failures"][:20]))
        return
    losses = result["losses"]
    print(f"loss: step 0 {losses[0]:.5f}, step {len(losses) - 1} {losses[-1]:.5f}")
    print(f"step: median {result['median_step_ms']:.3f} ms ({result['samples_per_s']:.0f} samples/s global)")
    if "throughput_step_ms" in result:
        windows = result["throughput_windows_ms"]
        print(f"throughput: {result['throughput_steps']} steps back to back, {result['throughput_step_ms']:.3f} ms "
              f"a step ({result['throughput_samples_per_s']:.0f} samples/s global; median of {len(windows)} windows, "
              f"{min(windows):.3f}-{max(windows):.3f} ms)")
    if "paired_speedup_median" in result:
        pairs = result["paired_windows"]
        print(f"paired with one process on GPU 0 in alternating windows: median scaling "
              f"{result['paired_speedup_median']:.3f}x (throughput; DDP {result['paired_ddp_ms_median']:.3f} ms, "
              f"1 GPU {result['paired_one_gpu_ms_median']:.3f} ms a step; pairs "
              + ", ".join(f"{p['speedup']:.3f}" for p in pairs) + ")")
    for rank, t in enumerate(result.get("gpu_timeline", {}).get("per_rank", [])):
        if "span_ms" not in t:
            print(f"GPU timeline rank {rank}: the profiler saw no kernels")
            continue
        print(f"GPU timeline rank {rank} (ms a step, {t['steps']} steps profiled): span {t['span_ms']:.3f} = "
              f"compute {t['compute_ms']:.3f} + NCCL exposed {t['nccl_exposed_ms']:.3f} + idle {t['idle_ms']:.3f}; "
              f"NCCL {t['nccl_ms']:.3f} in all ({t['nccl_kernels'] / t['steps']:.0f} kernels a step)")
    if "allreduce_exposed_ms_median" in result:
        print(f"all-reduce: {result['buckets_per_step']} bucket(s) per step "
              f"({', '.join(f'{b / 2**20:.1f}' for b in result['bucket_bytes'])} MiB); medians: "
              f"{result['allreduce_busy_ms_median']:.3f} ms of all-reduce, {result['allreduce_overlapped_ms_median']:.3f} "
              f"ms of it beside the backward's compute, {result['allreduce_exposed_ms_median']:.3f} ms after it")
    if "allreduce_added" in result:
        a = result["allreduce_added"]
        print(f"fwd+bwd with sync {a['fwd_bwd_ms_sync']:.3f} ms, without {a['fwd_bwd_ms_no_sync']:.3f} ms: "
              f"all-reduce adds {a['added_ms']:.3f} ms")


if __name__ == "__main__":
    sys.exit(main())
