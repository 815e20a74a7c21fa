"""Measuring a set of systems (ours and the peers) in three metrics, their ratios, the printed
table and the bar plot: what bench resnet, train, cvt, b2b and se-excite share."""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

from .timing import device_time, time_cuda, time_throughput


# Every system is timed the two ways users run a model, side by side:
#   throughput: K back-to-back calls between two CUDA events, no sync inside (a pipelined
#               user: host work overlaps the GPU's), per call; median of `reps` repeats;
#   latency:    one call between two events, synchronized after each (a user waiting for
#               each answer: host work before the launch counts); median of the calls;
# and the device time: the profiler's sum of the kernels one call launches (what the GPU
# itself spends; neither host work nor launch gaps).  The systems are timed in `rounds`
# interleaved rounds (A, B, ..., then again), so drift in clocks or in the machine affects
# all alike; each metric's result is the median of the rounds' medians.

METRICS = ("throughput_ms", "latency_ms", "device_ms")
METRIC_NAMES = {"throughput_ms": "throughput", "latency_ms": "latency", "device_ms": "device time"}


def measure_systems(setups: dict, rounds: int = 3, calls: int = 200, reps: int = 5,
                    latency_iters: int = 50, warmup: int = 3, progress=print, label: str = "",
                    interleave: bool = True) -> dict:
    """Set up each system (`setups`: name -> zero-argument function returning the callable
    to time; compile, autotune and capture happen there and in the first calls, timed as
    setup_s), then time them in the three metrics, `rounds` times.  interleave=True: all
    systems set up first, then timed in interleaved rounds.  interleave=False: each system
    set up, timed in its rounds and released before the next is set up (training: a
    torch.compile model's own CUDA graphs (cudagraph trees) left hand-captured graphs of
    another model hanging or crashing at their next replay on torch 2.11).  A system whose
    setup fails is reported with its error instead of stopping the others."""
    results = {}

    def set_up(name):
        progress(f"  {label}{name}: set up ...")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        try:
            fn = setups[name]()
            for _ in range(warmup):
                fn()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - reported in the results, the others still run
            results[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}
            progress(f"  {label}{name}: FAILED: {results[name]['error']}")
            return None
        results[name] = {"setup_s": time.perf_counter() - t0,
                         "peak_mem_mib": (torch.cuda.max_memory_allocated() - base) / 2**20}
        return fn

    def time_rounds(fns: dict):
        tp = {name: [] for name in fns}
        lat = {name: [] for name in fns}
        for r in range(rounds):
            for name, fn in fns.items():
                progress(f"  {label}{name}: round {r + 1}/{rounds} ...")
                tp[name].append(statistics.median(time_throughput(fn, calls, reps)))
                lat[name].append(time_cuda(fn, warmup=1, iters=latency_iters)["median_ms"])
        for name, fn in fns.items():
            results[name].update(throughput_ms=statistics.median(tp[name]), throughput_round_ms=tp[name],
                                 latency_ms=statistics.median(lat[name]), latency_round_ms=lat[name],
                                 calls=calls, reps=reps, latency_iters=latency_iters * rounds)
            results[name].update(device_time(fn))
        report_row(progress, label.rstrip(": "), {name: results[name] for name in fns})

    if interleave:
        fns = {name: fn for name in setups if (fn := set_up(name)) is not None}
        time_rounds(fns)
    else:
        for name in setups:
            fn = set_up(name)
            if fn is not None:
                time_rounds({name: fn})
            del fn
            torch._dynamo.reset()
            torch.cuda.empty_cache()
    return {name: results[name] for name in setups}


def is_ours(system: str) -> bool:
    return system.startswith("Fused")


def ratios(results: dict) -> dict:
    """Per metric: our best system against the best peer in that same metric."""
    out = {}
    for metric in METRICS:
        timed = {s: r[metric] for s, r in results.items() if metric in r}
        ours = {s: t for s, t in timed.items() if is_ours(s)}
        peers = {s: t for s, t in timed.items() if not is_ours(s)}
        if not ours or not peers:
            continue
        o, p = min(ours, key=ours.get), min(peers, key=peers.get)
        out[metric] = {"ours": o, "ours_ms": ours[o], "peer": p, "peer_ms": peers[p],
                       "ratio": ours[o] / peers[p]}
    return out


def report_row(progress, label: str, results: dict) -> None:
    """One finished row's times through `progress` as soon as they exist (the table is printed
    at the end: a run stopped before then keeps these lines)."""
    for name, r in results.items():
        times = (" / ".join(f"{r[m]:.4f}" for m in METRICS) + " ms (throughput / latency / device)"
                 if all(m in r for m in METRICS) else r.get("error", "not timed"))
        progress(f"  {label} done: {name}: {times}")


# What print_systems reads of each system (besides "error" for one that failed).
SYSTEM_COLUMNS = (*METRIC_NAMES, "kernels", "setup_s", "peak_mem_mib")


def not_a_systems_table(result) -> str:
    """Why `result` is not what bench resnet / bench train write (empty when it is): rows of
    {n, results: {system: SYSTEM_COLUMNS, or an error}}, with the dtype and C_in."""
    if not isinstance(result, dict) or not isinstance(result.get("rows"), list) or not result["rows"]:
        return "no rows"
    if "dtype" not in result or "in_channels" not in result:
        return "no dtype or in_channels"
    for row in result["rows"]:
        if not isinstance(row, dict) or "n" not in row or not isinstance(row.get("results"), dict):
            return "a row without n or results"
        for system, r in row["results"].items():
            if not isinstance(r, dict) or ("error" not in r and not all(c in r for c in SYSTEM_COLUMNS)):
                return f"{system!r} lacks the metrics {', '.join(SYSTEM_COLUMNS)} (an older bench?)"
    return ""


def print_systems(results: dict, indent: str = "  ") -> None:
    """One line per system (throughput, latency, device time, setup) and the ratios."""
    print(f"{indent}{'system':58s} {'throughput':>10s} {'latency':>9s} {'device':>8s} {'kernels':>7s} "
          f"{'setup s':>8s} {'peak MiB':>9s}")
    for name, r in results.items():
        if "error" in r:
            print(f"{indent}{name:58s} failed: {r['error']}")
            continue
        print(f"{indent}{name:58s} {r['throughput_ms']:10.4f} {r['latency_ms']:9.4f} {r['device_ms']:8.4f} "
              f"{r['kernels']:7d} {r['setup_s']:8.1f} {r['peak_mem_mib']:9.1f}")
    for metric, q in ratios(results).items():
        print(f"{indent}{METRIC_NAMES[metric]:>11s}: {q['ours']} {q['ours_ms']:.4f} ms / {q['peer']} "
              f"{q['peer_ms']:.4f} ms = {q['ratio']:.2f}x")


def _systems(rows) -> list:
    """Every system any row timed, in first-seen order (rows merged from several runs)."""
    return list(dict.fromkeys(s for row in rows for s in row["results"]))


def plot_systems(rows: list, title: str, path: Path) -> None:
    """Bars per batch size: throughput and latency (ms) of every system, ours in green."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    systems = _systems(rows)
    fig, axes = plt.subplots(1, len(rows), figsize=(3.6 * len(rows) + 1, 5), squeeze=False)
    width = 0.4
    for ax, row in zip(axes[0], rows):
        res = row["results"]
        xs = range(len(systems))
        for j, (metric, hatch) in enumerate((("throughput_ms", ""), ("latency_ms", "//"))):
            ms = [res.get(s, {}).get(metric, 0.0) for s in systems]
            colors = ["tab:green" if is_ours(s) else "tab:gray" for s in systems]
            ax.bar([i + (j - 0.5) * width for i in xs], ms, width, color=colors, hatch=hatch,
                   edgecolor="black", linewidth=0.3, label=METRIC_NAMES[metric])
        ax.set_xticks(list(xs), [s.replace("torch.compile ", "compile ").replace("channels_last", "CL")
                                 for s in systems], rotation=70, ha="right", fontsize=6)
        ax.set_title(f"N={row['n']}")
        ax.set_ylabel("ms per call")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}", file=sys.stderr)
