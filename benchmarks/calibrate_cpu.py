"""Calibration on this machine: measure a grid of 2-rank CPU layouts, fit cpu-gloo on part of it,
predict the rest, and print the error of step time in-sample and held out.

1. Microbenchmarks (this process, one thread, fp32 as the CPU harness trains): matmul GFLOP/s
   (a square 512 matmul and one of the grid's size) and copy bandwidth. They set the "GPU"'s peak,
   its small-GEMM knee and its bandwidth, so gemm_efficiency is the achieved fraction of a
   measured matmul rate, and what the step times cannot separate (the knee, the bandwidth's
   efficiency, attention: calibrate.CPU_UNDETERMINED) is measured or kept instead of absorbing
   the host overheads.
2. `scalelab comm --nproc-per-node 2`: the gloo collectives fit the intra-node collective
   parameters (latency, per-step latency, bus efficiency, ramp) on their own.
3. One torchrun launch of 2 ranks trains every layout of the grid with the harness's `Trainer`
   and timed loop (`run_repeat`, exactly what `scalelab bench` runs): two models (llama-tiny, 4
   layers d_model 64, and an 8-layer d_model-128 model) x FSDP, no-reshard FSDP, ZeRO-2, DDP,
   ZeRO-1, HSDP, TP (with and without SP), PP (1F1B, GPipe, interleaved), selective recompute,
   several micro-batch counts. The step time of a layout is its fastest measured step (on shared
   cores other processes only slow a step down).
4. Fit what calibrate fits on CPU ranks (`free_parameters(cpu=True)`: gemm_efficiency and the host
   overheads per layer, per TP layer, per collective, per micro-batch and per step) on the
   training half, the collectives' parameters held: each layout is trained on one model and held
   out on the other, so every held-out layout is a mechanism seen at another size.
5. Print each layout's measured and predicted step time, and MAPE and Spearman's rank
   correlation in-sample and held out, with the load average.

Run: `python benchmarks/calibrate_cpu.py [--out DIR] [--steps 5]` (about 3-5 minutes on 2 idle
cores). `--worker` is the grid's torchrun entry point (internal).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SMALL = """name: llama-8l-d128
n_layers: 8
d_model: 128
n_heads: 4
n_kv_heads: 2
d_ff: 256
vocab_size: 256
ffn: swiglu
tied_embeddings: false
seq_len: 64
source: scalelab's calibration grid (benchmarks/calibrate_cpu.py), not a published model
"""

# 2-rank layouts (layout flags as `build_layout` takes them), each run on both models.
LAYOUTS: list[tuple[str, dict[str, Any]]] = [
    ("fsdp mb4", {"sharding": "fsdp", "global_batch": 8, "micro_batch": 4}),
    ("fsdp mb1 x4", {"sharding": "fsdp", "global_batch": 8, "micro_batch": 1}),
    (
        "fsdp no-reshard mb2 x2",
        {"sharding": "fsdp", "global_batch": 8, "micro_batch": 2, "reshard_after_forward": False},
    ),
    ("zero2 mb4", {"sharding": "zero2", "global_batch": 8, "micro_batch": 4}),
    ("ddp mb4", {"sharding": "ddp", "global_batch": 8, "micro_batch": 4}),
    ("ddp mb2 x4", {"sharding": "ddp", "global_batch": 16, "micro_batch": 2}),
    ("zero1 mb4", {"sharding": "zero1", "global_batch": 8, "micro_batch": 4}),
    (
        "hsdp 2x1 mb2 x2",
        {"sharding": "hsdp", "hsdp_shard_size": 1, "global_batch": 8, "micro_batch": 2},
    ),
    ("tp2 sp mb4", {"tp": 2, "sp": True, "global_batch": 4, "micro_batch": 4}),
    ("tp2 mb2 x2", {"tp": 2, "sp": False, "global_batch": 4, "micro_batch": 2}),
    ("pp2 1f1b mb2 x4", {"pp": 2, "pp_schedule": "1f1b", "global_batch": 8, "micro_batch": 2}),
    ("pp2 gpipe mb1 x8", {"pp": 2, "pp_schedule": "gpipe", "global_batch": 8, "micro_batch": 1}),
    (
        "pp2 interleaved mb2 x4",
        {
            "pp": 2,
            "pp_schedule": "interleaved",
            "virtual_stages": 2,
            "global_batch": 8,
            "micro_batch": 2,
        },
    ),
    (
        "fsdp selective-ac mb4",
        {"sharding": "fsdp", "global_batch": 8, "micro_batch": 4, "recompute": "selective"},
    ),
]
# Beyond calibrate's CPU_UNDETERMINED: what 2 CPU ranks of one machine cannot inform at all.
NOT_INFORMED = {
    "fp8_efficiency_ratio": "no fp8 run",
    "net_* collective parameters": "one node: no collective crosses a network",
    "compute_power_fraction": "no GPU energy counter",
}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONWARNINGS="ignore")
    return env


def scalelab(*args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "scalelab", *args, "--json"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=900,
    )
    if out.returncode != 0:
        raise SystemExit(f"scalelab {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout)
    return result


# 1. Microbenchmarks ------------------------------------------------------------------------------


def microbenchmarks() -> dict[str, float]:
    """One thread, fp32: matmul FLOP/s (n = 512, the best of several) and copy bandwidth."""
    import torch

    torch.set_num_threads(1)

    def best(fn: Any, reps: int, budget_s: float = 1.5) -> float:
        """The fastest of at least `reps` calls, repeated for `budget_s` (on shared cores the
        fastest call is the one that ran alone)."""
        fn()
        times: list[float] = []
        end = time.perf_counter() + budget_s
        while len(times) < reps or time.perf_counter() < end:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    n = 512
    a, b = torch.randn(n, n), torch.randn(n, n)
    flops = 2.0 * n**3 / best(lambda: torch.mm(a, b), 15)
    # A GEMM of the grid's size (256 tokens x 128 -> 256): its rate sets the small-GEMM knee.
    x, w = torch.randn(256, 128), torch.randn(128, 256)
    small_flop = 2.0 * 256 * 128 * 256
    small = small_flop / best(lambda: torch.mm(x, w), 200)
    src = torch.randn(2**20)  # 4 MiB: a small model's tensors live in the caches
    dst = torch.empty_like(src)
    copy_s = best(lambda: dst.copy_(src), 10)
    # efficiency(f) = f / (f + half): the small GEMM's rate relative to the large one's (a
    # small GEMM that fits in cache may run faster: then the peak is its rate and half is 0).
    half_gflop = max(0.0, small_flop / 1e9 * (flops / small - 1.0))
    flops = max(flops, small)
    return {
        "matmul_flops": flops,
        "small_matmul_flops": small,
        "gemm_half_gflop": half_gflop,
        "copy_bytes_per_s": 2.0 * src.numel() * 4 / copy_s,
    }


# 3. The grid, in one torchrun launch ---------------------------------------------------------------


def worker(grid_file: str, out_file: str, steps: int, warmup: int) -> None:
    """Under torchrun: train every layout of the grid in turn; rank 0 writes their step times."""
    import warnings

    import torch.distributed as dist

    from scalelab.cli.common import build_layout
    from scalelab.config.catalog import load_model
    from scalelab.measure.config import BenchOptions, check_layout
    from scalelab.measure.energy import EnergyMeter
    from scalelab.measure.train import Trainer, init_distributed, run_repeat

    warnings.filterwarnings("ignore")
    grid = json.loads(Path(grid_file).read_text())
    info = init_distributed(timeout_s=300)
    options = BenchOptions(steps=steps, warmup=warmup, repeats=1, lr=3e-3)
    times: dict[str, list[float]] = {item["label"]: [] for item in grid}
    # Two passes, the second in reverse order, so that each layout is measured at two moments
    # (a burst of another process on the shared cores rarely covers both).
    for order in (grid, grid[::-1]):
        for item in order:
            spec = load_model(item["model"])
            layout = build_layout(gpus=info.world_size, seq_len=spec.seq_len, **item["layout"])
            check_layout(layout, spec)
            trainer = Trainer(spec, layout, options, info)
            rep = run_repeat(trainer, EnergyMeter(None), 0)
            times[item["label"]] += rep.step_time_s
            if info.rank == 0:
                print(f"  {item['label']:<36} {1e3 * min(rep.step_time_s):8.1f} ms", flush=True)
            del trainer
    results = [item | {"step_time_s": times[item["label"]]} for item in grid]
    if info.rank == 0:
        Path(out_file).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def measure_grid(out: Path, small: Path, steps: int, warmup: int) -> list[dict[str, Any]]:
    grid = []
    for m_index, model in enumerate(("llama-tiny", str(small))):
        for index, (label, flags) in enumerate(LAYOUTS):
            name = "llama-tiny" if m_index == 0 else "llama-8l-d128"
            grid.append(
                {
                    "label": f"{name} {label}",
                    "model": model,
                    "layout": flags,
                    # Each layout trains on one model and is held out on the other.
                    "train": (index + m_index) % 2 == 0,
                }
            )
    grid_file, result_file = out / "grid.json", out / "grid-times.json"
    grid_file.write_text(json.dumps(grid))
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        __file__, "--worker", str(grid_file), str(result_file),
        "--steps", str(steps), "--warmup", str(warmup),
    ]  # fmt: skip
    done = subprocess.run(cmd, env=_env(), timeout=1800, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the grid failed:\n{done.stderr[-3000:]}")
    results: list[dict[str, Any]] = json.loads(result_file.read_text())
    return results


# 4-5. Fit and predict ------------------------------------------------------------------------------


def spearman(x: list[float], y: list[float]) -> float:
    import numpy as np
    from scipy.stats import spearmanr

    return float(spearmanr(np.array(x), np.array(y)).statistic)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=4, help="measured steps per layout and pass")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up steps per layout and pass")
    parser.add_argument(
        "--reuse", action="store_true", help="reuse the comm sweep and grid times found in --out"
    )
    parser.add_argument("--worker", nargs=2, metavar=("GRID", "RESULT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker, args.steps, args.warmup)
        return

    import numpy as np

    from scalelab.calibrate import (
        CPU_UNDETERMINED,
        CommPoint,
        StepPoint,
        fit,
        free_parameters,
        points_from_records,
    )
    from scalelab.config.catalog import load_cluster, load_model
    from scalelab.config.layout import LayoutTable
    from scalelab.perf.predict import predict
    from scalelab.results import load_record

    start = time.time()
    out = args.out or Path(tempfile.mkdtemp(prefix="scalelab-calib-"))
    out.mkdir(parents=True, exist_ok=True)
    small = out / "llama-8l-d128.yaml"
    small.write_text(SMALL)
    load_before = os.getloadavg()

    print("1. microbenchmarks (1 thread, fp32)", flush=True)
    saved_micro = out / "micro.json"
    if args.reuse and saved_micro.exists():
        micro = json.loads(saved_micro.read_text())
    else:
        micro = microbenchmarks()
        saved_micro.write_text(json.dumps(micro))
    print(
        f"   matmul {micro['matmul_flops'] / 1e9:.1f} GFLOP/s (512^3), "
        f"{micro['small_matmul_flops'] / 1e9:.1f} GFLOP/s (256x128x256: gemm_half_gflop "
        f"{micro['gemm_half_gflop']:.3g}), copy {micro['copy_bytes_per_s'] / 1e9:.1f} GB/s",
        flush=True,
    )
    base = load_cluster("cpu-gloo")
    peak_tflops = micro["matmul_flops"] / 1e12
    gpu = base.gpu.model_copy(
        update={
            "peak_tflops": {k: peak_tflops for k in base.gpu.peak_tflops},
            "hbm_gbs": micro["copy_bytes_per_s"] / 1e9,
        }
    )
    measured_base = base.model_copy(
        update={
            "gpu": gpu,
            "params": base.params.model_copy(
                update={
                    "gemm_efficiency": 1.0,
                    "gemm_half_gflop": micro["gemm_half_gflop"],
                    "hbm_efficiency": 1.0,
                    "overlap_slowdown": 1.0,
                }
            ),
        }
    )

    print("2. comm: 2-process gloo sweep", flush=True)
    comm_dir = out / "comm"
    if not (args.reuse and list(comm_dir.glob("*.json"))):
        scalelab(
            "comm", "--nproc-per-node", "2", "--sizes", "4K:4M:4", "--iters", "10",
            "--out", str(comm_dir), "--cluster", "cpu-gloo",
        )  # fmt: skip
    records = [load_record(path) for path in sorted(comm_dir.glob("*.json"))]
    comm_points: list[CommPoint] = points_from_records(records)[0]
    comm_fit = fit(measured_base, comm_points, [])
    comm_cluster = measured_base.model_copy(
        update={"params": measured_base.params.model_copy(update=comm_fit.fitted)}
    )
    print(
        "   fitted "
        + ", ".join(f"{k} {v:.3g}" for k, v in comm_fit.fitted.items())
        + f"; collective error {comm_fit.error_before * 100:.0f} % -> {comm_fit.error_after * 100:.0f} %",
        flush=True,
    )

    n_layouts = 2 * len(LAYOUTS)
    print(
        f"3. {n_layouts} layouts x 2 ranks, 2 passes of {args.warmup}+{args.steps} steps each "
        "(fastest step of each pass shown)",
        flush=True,
    )
    saved = out / "grid-times.json"
    if args.reuse and saved.exists():
        runs = json.loads(saved.read_text())
    else:
        runs = measure_grid(out, small, args.steps, args.warmup)
    points, train = [], []
    for run in runs:
        spec = load_model(run["model"])
        from scalelab.cli.common import build_layout

        layout = build_layout(gpus=2, seq_len=spec.seq_len, **run["layout"])
        # The fastest measured step: on shared cores, other processes only ever slow a step
        # down, so the fastest is the one they disturbed least.
        fastest = float(np.min(run["step_time_s"]))
        points.append(StepPoint(spec, layout, fastest, source=run["label"]))
        train.append(bool(run["train"]))

    print("4. fit on the training half", flush=True)
    train_pts = [p for p, t in zip(points, train, strict=True) if t]
    names = free_parameters([], train_pts, cpu=True)  # the host overheads and gemm_efficiency
    result = fit(comm_cluster, [], train_pts, names=names)
    fitted = comm_cluster.model_copy(
        update={"params": comm_cluster.params.model_copy(update=result.fitted)}
    )
    print("   " + ", ".join(f"{k} {v:.4g}" for k, v in result.fitted.items()))
    if result.undetermined:
        print(f"   undetermined by the steps (kept): {', '.join(result.undetermined)}")
    for group in result.collinear:
        print(f"   moved only together by these steps: {', '.join(group)}")

    def predicted(cluster: Any) -> list[float]:
        values = []
        for p in points:
            pred = predict(p.model, cluster, LayoutTable.from_layouts([p.layout]))
            values.append(float(pred["step_time_s"][0]))
        return values

    before, after = predicted(base), predicted(fitted)
    measured = [p.step_time_s for p in points]
    print()
    print("| set | layout (2 ranks) | measured (ms) | base cpu-gloo | calibrated |")
    print("|---|---|---:|---:|---:|")
    for p, t, b, a in zip(points, train, before, after, strict=True):
        print(
            f"| {'train' if t else 'held out'} | {p.source} | {p.step_time_s * 1e3:.1f} | "
            f"{(b / p.step_time_s - 1) * 100:+.0f} % | {(a / p.step_time_s - 1) * 100:+.0f} % |"
        )
    print()
    summary: dict[str, dict[str, float]] = {}
    for name, pick in (("in-sample", True), ("held out", False)):
        idx = [i for i, t in enumerate(train) if t == pick]
        m = [measured[i] for i in idx]
        row = {}
        for label, pred in (("base", before), ("calibrated", after)):
            pr = [pred[i] for i in idx]
            row[f"{label} MAPE"] = float(
                np.mean([abs(a / b - 1) for a, b in zip(pr, m, strict=True)])
            )
            row[f"{label} Spearman"] = spearman(pr, m)
        row["n"] = len(idx)
        summary[name] = row
        print(
            f"{name} ({len(idx)} layouts): MAPE {row['calibrated MAPE'] * 100:.1f} % "
            f"(base {row['base MAPE'] * 100:.0f} %), Spearman {row['calibrated Spearman']:.2f} "
            f"(base {row['base Spearman']:.2f})"
        )
    load_after = os.getloadavg()
    print(
        "\nparameters the CPU data cannot determine (kept or measured): "
        + "; ".join(f"{k}: {v}" for k, v in (CPU_UNDETERMINED | NOT_INFORMED).items())
    )
    print(
        f"\nmachine {platform.node()} ({os.cpu_count()} CPUs), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after, "
        f"wall {time.time() - start:.0f} s; records and grid in {out}"
    )
    (out / "summary.json").write_text(
        json.dumps(
            {
                "micro": micro,
                "comm_fit": comm_fit.fitted,
                "step_fit": result.fitted,
                "summary": summary,
                "load": [load_before, load_after],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
