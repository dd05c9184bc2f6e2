"""Layouts evaluated per second by the predictor on one core, and llm-analysis for comparison.

Run: `OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/predict_speed.py [--distinct] [--llm-analysis-python PATH]`.
It prints wall-clock layouts/s and layouts per CPU-second (process time): on a loaded machine the
second is the one that measures the predictor rather than the other processes.
llm-analysis (PyPI, 0.2.2) is timed in its own interpreter, on a comparable configuration
(Llama-2 7B, H100 SXM 80 GB, 128 GPUs, FSDP-like ZeRO-3), when `--llm-analysis-python` points at a
Python that has it installed; it is never a dependency of scalelab.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import time

import numpy as np

from scalelab.config import Layout, LayoutTable, load_cluster, load_model
from scalelab.perf import predict

LLM_ANALYSIS_SNIPPET = """
import logging, time, io, contextlib
logging.disable(logging.CRITICAL)
from llm_analysis.analysis import train
kw = dict(model_name="NousResearch_Llama-2-7b-hf", gpu_name="h100-sxm-80gb", dtype_name="w16a16e16",
          log_level="CRITICAL", batch_size_per_gpu=1, seq_len=4096, total_num_gpus=128, ds_zero=3,
          flash_attn=True, mlp_gated_linear_units=True, flops_efficiency=0.55, hbm_memory_efficiency=0.8,
          total_num_tokens=128 * 4096)
with contextlib.redirect_stdout(io.StringIO()):
    train(**kw)
    n = 200
    start = time.perf_counter()
    for _ in range(n):
        train(**kw)
    elapsed = time.perf_counter() - start
print(n / elapsed)
"""


def layouts(n: int) -> LayoutTable:
    pool = [
        Layout(
            gpus=2048,
            global_batch=4096,
            seq_len=4096,
            tp=t,
            pp=p,
            micro_batch=mb,
            sharding=s,
            recompute=r,
        )
        for t in (1, 2, 4, 8)
        for p in (1, 2, 4, 8)
        for mb in (1, 2)
        for s in ("fsdp", "hsdp", "ddp", "zero1")
        for r in ("none", "selective", "full")
    ]
    table = LayoutTable.from_layouts(pool)
    return table.take(np.arange(n) % len(pool))


def distinct_layouts(n: int, seed: int = 1) -> LayoutTable:
    """`n` layouts that are (almost) all different: random GPU counts, global batches, degrees,
    micro-batches, shardings, recompute policies and sequence lengths. The predictor groups
    layouts by the few columns each cost reads, so the default pool of 384 layouts repeated
    flatters it; this table is the fairer figure (not every layout is valid; the predictor
    does not check)."""
    rng = np.random.default_rng(seed)
    base = LayoutTable.from_layouts([Layout(gpus=64, global_batch=64, seq_len=4096)])
    table = base.take(np.zeros(n, dtype=np.int64))
    return dataclasses.replace(
        table,
        gpus=rng.choice([128, 256, 512, 1024, 2048, 4096], n) * rng.integers(1, 4, n),
        global_batch=rng.integers(256, 8192, n),
        tp=rng.choice([1, 2, 4, 8], n),
        pp=rng.choice([1, 2, 4, 8], n),
        micro_batch=rng.choice([1, 2, 4], n),
        sharding=rng.integers(0, 5, n),
        recompute=rng.integers(0, 3, n),
        seq_len=rng.choice([2048, 4096, 8192], n),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layouts", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--distinct",
        action="store_true",
        help="time a table of (almost) all-different layouts instead of the repeated pool",
    )
    parser.add_argument("--llm-analysis-python", default=os.environ.get("LLM_ANALYSIS_PYTHON"))
    args = parser.parse_args()

    model, cluster = load_model("llama2-70b"), load_cluster("h100-ib")
    table = distinct_layouts(args.layouts) if args.distinct else layouts(args.layouts)
    predict(model, cluster, table.take(np.arange(100)))
    best = best_cpu = float("inf")
    for _ in range(args.repeats):
        fresh = table.take(np.arange(len(table)))  # no cached derived columns from the last call
        start, start_cpu = time.perf_counter(), time.process_time()
        predict(model, cluster, fresh)
        best = min(best, time.perf_counter() - start)
        best_cpu = min(best_cpu, time.process_time() - start_cpu)
    batch_rate = args.layouts / best
    cpu_rate = args.layouts / best_cpu
    single = [Layout(gpus=128, global_batch=128, seq_len=4096)]
    one = LayoutTable.from_layouts(single)
    start = time.perf_counter()
    for _ in range(200):
        predict(load_model("llama2-7b"), cluster, one)
    single_rate = 200 / (time.perf_counter() - start)
    print(
        f"scalelab predictor: {batch_rate:,.0f} layouts/s in batches of {args.layouts:,}"
        f"{' all-distinct' if args.distinct else ''} (best of {args.repeats}; "
        f"{cpu_rate:,.0f} per CPU-second, the figure to trust on a shared machine), "
        f"{single_rate:,.0f} single predictions/s; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
    )
    if args.llm_analysis_python:
        out = subprocess.run(
            [args.llm_analysis_python, "-c", LLM_ANALYSIS_SNIPPET],
            capture_output=True,
            text=True,
            check=True,
        )
        llm_rate = float(out.stdout.strip().splitlines()[-1])
        print(
            f"llm-analysis 0.2.2 train(): {llm_rate:,.0f} configurations/s (Llama-2 7B, H100, 128 GPUs, ZeRO-3)"
        )
        print(
            f"ratio: scalelab batched / llm-analysis = {batch_rate / llm_rate:,.0f}x; "
            f"scalelab single / llm-analysis = {single_rate / llm_rate:,.1f}x"
        )
    else:
        print(
            "llm-analysis: skipped (pass --llm-analysis-python PATH to a Python with llm-analysis installed)"
        )


if __name__ == "__main__":
    main()
