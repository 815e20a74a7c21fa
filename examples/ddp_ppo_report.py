#!/usr/bin/env python
"""Summarizes examples/ddp_ppo.py runs (tests/gpu_ddp.sh writes them): throughput of 2 GPUs
against 1 GPU at the same per-GPU batch, per model and mode (`speedup`: by the throughput
metric, steps back to back, where both runs have it; else by the per-step medians), the all-reduce's cost, and the
loss curves of 2 GPUs vs 1 GPU on the same global batch overlaid in a PNG.

    python examples/ddp_ppo_report.py RESULTS_DIR      # reads RESULTS_DIR/*.json, writes summary.json + PNG

Run names (file stems): <model>_<mode>_<gpus>gpu[_samebatch], e.g. fused_eager_2gpu,
fused_eager_1gpu (N per GPU: the throughput baseline) and fused_eager_1gpu_samebatch (2N on
one GPU: the loss-curve baseline).  Runs launched in rounds carry _round<k> before _<gpus>gpu:
each is compared with its own round's 1-GPU run, and a row per configuration gives the speedup of
every round and their median (`speedup_median`, the figure to quote).  Where the folder has
gpu_clocks.csv and launches.txt (tests/gpu_ddp.sh samples them), each run's row gets its GPUs'
median SM clock, peak temperature, median power and clock-event reasons while it ran.
"""
import json
import re
import statistics
import sys
from pathlib import Path


def _when(text: str) -> float:
    """Seconds since the epoch of nvidia-smi's / gpu_ddp.sh's "YYYY/MM/DD HH:MM:SS[.fff]"."""
    from datetime import datetime, timezone
    text = text.strip()
    fmt = "%Y/%m/%d %H:%M:%S.%f" if "." in text else "%Y/%m/%d %H:%M:%S"
    return datetime.strptime(text, fmt).replace(tzinfo=timezone.utc).timestamp()


def launch_clocks(folder: Path) -> dict:
    """run name -> {gpu index: {sm_mhz_median, temp_c_max, power_w_median, event_reasons}} over the
    samples between the run's start and the next run's (launches.txt, gpu_clocks.csv)."""
    launches, clocks = folder / "launches.txt", folder / "gpu_clocks.csv"
    if not (launches.exists() and clocks.exists()):
        return {}
    starts = []
    for line in launches.read_text().splitlines():
        m = re.fullmatch(r"(\S+ \S+) start (\S+)", line.strip())
        if m:
            starts.append((_when(m.group(1)), m.group(2)))
    samples = []  # (time, gpu, sm MHz, temperature, power W, reasons)
    for line in clocks.read_text().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 6 or not cells[1].isdigit():
            continue  # a header (repeated when appended) or a broken line
        try:
            number = lambda c: float(c.split()[0])  # noqa: E731  "1980 MHz", "650.12 W"
            samples.append((_when(cells[0]), int(cells[1]), number(cells[2]), number(cells[4]), number(cells[5]),
                            cells[6] if len(cells) > 6 else None))
        except ValueError:
            continue  # "[N/A]" and the like
    out = {}
    for i, (start, name) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else float("inf")
        per_gpu = {}
        for t, gpu, sm, temp, power, reasons in samples:
            if start <= t < end:
                per_gpu.setdefault(gpu, []).append((sm, temp, power, reasons))
        if per_gpu:
            out[name] = {gpu: {"sm_mhz_median": statistics.median(v[0] for v in vals),
                               "temp_c_max": max(v[1] for v in vals),
                               "power_w_median": statistics.median(v[2] for v in vals),
                               "event_reasons": sorted({v[3] for v in vals if v[3]})}
                         for gpu, vals in sorted(per_gpu.items())}
    return out


def rounds_summary(rows: list) -> list:
    """One row per configuration run in rounds: each round's speedup (against that round's 1-GPU
    run) and their median."""
    groups = {}
    for row in rows:
        m = re.fullmatch(r"(.*)_round([0-9]+)", row["run"])
        if m and "speedup" in row:
            groups.setdefault(m.group(1), []).append((int(m.group(2)), row))
    out = []
    for stem, members in sorted(groups.items()):
        members.sort(key=lambda t: t[0])
        speedups = [r["speedup"] for _, r in members]
        median = statistics.median(speedups)
        out.append({"run": stem, "rounds": [k for k, _ in members], "speedup_rounds": speedups,
                    "speedup_median": median, "meets_1.9x": median >= 1.9,
                    "paired_speedup_rounds": [r.get("paired_speedup_median") for _, r in members],
                    "throughput_step_ms_2gpu_rounds": [r.get("throughput_step_ms_2gpu") for _, r in members],
                    "throughput_step_ms_1gpu_rounds": [r.get("throughput_step_ms_1gpu") for _, r in members]})
    return out


def _plain(stem: str) -> str:
    """A run's name without its DDP-only settings (bucket size, NCCL CTAs, bucket views, flat
    parameters): the name of its 1-GPU baseline's stem."""
    return re.sub(r"_bucket[0-9.]+mb|_ctas[0-9]+|_view|_flat|_stages", "", stem)


def kernel_diff(two: dict, one: dict, top: int = 15) -> list:
    """What a step on 2 GPUs runs beyond a step on 1: per kernel name in either profile's table
    (gpu_timeline's kernel_table, one rank's), the change in its count and its time a step, the
    ``top`` largest changes of time first."""
    a = {k["name"]: k for k in one.get("kernel_table", [])}
    b = {k["name"]: k for k in two.get("kernel_table", [])}
    rows = []
    for name in set(a) | set(b):
        ka, kb = a.get(name, {}), b.get(name, {})
        rows.append({"name": name, "per_step_1gpu": ka.get("per_step", 0.0), "per_step_2gpu": kb.get("per_step", 0.0),
                     "us_per_step_added": kb.get("us_per_step", 0.0) - ka.get("us_per_step", 0.0)})
    rows.sort(key=lambda r: -abs(r["us_per_step_added"]))
    return rows[:top]


def main(folder: str) -> int:
    root = Path(folder)
    runs = {p.stem: json.loads(p.read_text()) for p in sorted(root.glob("*.json"))
            if p.stem != "summary" and "losses" in json.loads(p.read_text())}
    rows, clocks = [], launch_clocks(root)
    for name, two in runs.items():
        if not name.endswith("_2gpu"):
            continue
        stem = name[: -len("_2gpu")]
        # the 1-GPU baseline: the same run's, else the same model, mode and N without the DDP-only
        # settings in the name (bucket size, NCCL CTAs, bucket views, flat parameters)
        base = stem + "_1gpu" if stem + "_1gpu" in runs else _plain(stem) + "_1gpu"
        one = runs.get(base)
        row = {"run": stem, "step_ms_2gpu": two["median_step_ms"], "samples_per_s_2gpu": two["samples_per_s"]}
        if one:
            row["baseline_1gpu"] = base
            row.update(step_ms_1gpu=one["median_step_ms"], samples_per_s_1gpu=one["samples_per_s"],
                       speedup_per_step_median=two["samples_per_s"] / one["samples_per_s"])
        # the throughput metric (steps back to back after a barrier), where both runs have it
        if "throughput_step_ms" in two:
            row.update(throughput_step_ms_2gpu=two["throughput_step_ms"],
                       throughput_samples_per_s_2gpu=two["throughput_samples_per_s"])
        if one and "throughput_step_ms" in two and "throughput_step_ms" in one:
            row.update(throughput_step_ms_1gpu=one["throughput_step_ms"],
                       throughput_samples_per_s_1gpu=one["throughput_samples_per_s"],
                       speedup=two["throughput_samples_per_s"] / one["throughput_samples_per_s"])
        elif one:
            row["speedup"] = row["speedup_per_step_median"]
        if one:
            row["meets_1.9x"] = row["speedup"] >= 1.9
        if "paired_speedup_median" in two:  # the 1-GPU run timed within the same launch (--paired-baseline)
            row.update(paired_speedup_median=two["paired_speedup_median"],
                       paired_ddp_ms_median=two["paired_ddp_ms_median"],
                       paired_one_gpu_ms_median=two["paired_one_gpu_ms_median"])
        for key in ("allreduce_exposed_ms_median", "allreduce_overlapped_ms_median", "allreduce_busy_ms_median",
                    "buckets_per_step"):
            if key in two:
                row[key] = two[key]
        for gpus, run in (("2gpu", two), ("1gpu", one)):
            if run and "gpu_timeline" in run:  # ms a step per rank: span = compute + NCCL exposed + idle
                row[f"gpu_timeline_{gpus}"] = run["gpu_timeline"]["per_rank"]
        for gpus, run_name in (("2gpu", name), ("1gpu", base if one else None)):
            if run_name in clocks:  # the GPUs' clocks, heat and power while the run ran
                row[f"clocks_{gpus}"] = clocks[run_name]
        if one and "gpu_timeline" in one and "gpu_timeline" in two:  # rank 0's kernels against the 1-GPU run's
            row["kernel_diff_rank0"] = kernel_diff(two["gpu_timeline"]["per_rank"][0], one["gpu_timeline"]["per_rank"][0])
        if "allreduce_added" in two:
            row["allreduce_added_ms"] = two["allreduce_added"]["added_ms"]
        same = runs.get(stem + "_1gpu_samebatch") or runs.get(_plain(stem) + "_1gpu_samebatch")
        if same:
            row["max_rel_loss_diff_vs_1gpu_same_global_batch"] = max(
                abs(a - b) / max(abs(b), 1e-12) for a, b in zip(two["losses"], same["losses"]))
        rows.append(row)
    rows += rounds_summary(rows)
    for row in rows:
        print(json.dumps(row))
    (root / "summary.json").write_text(json.dumps(rows, indent=1))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no PNG")
        return 0
    curves = [(r["run"], runs[r["run"] + "_2gpu"], runs.get(r["run"] + "_1gpu_samebatch")
               or runs.get(_plain(r["run"]) + "_1gpu_samebatch")) for r in rows if r["run"] + "_2gpu" in runs]
    curves = [c for c in curves if c[2]]
    if curves:
        fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.8), squeeze=False)
        for ax, (name, two, one) in zip(axes[0], curves):
            ax.plot(one["losses"], "-", label=f"1 GPU, N={one['args']['batch']}")
            ax.plot(two["losses"], "--", label=f"2 GPUs, N={two['args']['batch']} each")
            ax.set_title(name, fontsize=9)
            ax.set_xlabel("step")
            ax.set_ylabel("PPO loss")
            ax.legend()
        fig.suptitle(f"same global batch; {two['environment'].get('gpu', '')}", fontsize=9)
        fig.tight_layout()
        fig.savefig(root / "loss_curves_1_vs_2_gpus.png", dpi=110)
        print(f"wrote {root / 'loss_curves_1_vs_2_gpus.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "gpu_results/ddp"))
