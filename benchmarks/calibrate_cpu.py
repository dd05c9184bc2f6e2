"""Calibration on this machine: measure, fit a cpu-gloo cluster on part, predict the rest.

1. `scalelab comm --nproc-per-node 2` and `scalelab bench` runs of two tiny Llama models on CPU
   (gloo, 1-2 processes) with several layouts — real PyTorch distributed training;
2. `scalelab calibrate` on the training half (cpu-gloo as the base);
3. predict the held-out runs (other layouts and model sizes) with the base and with the fitted
   cluster, and print the error of step time against the measurement.

Run: `python benchmarks/calibrate_cpu.py [--out DIR]` (about 5 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

WIDE = """n_layers: 4
d_model: 128
n_heads: 4
n_kv_heads: 2
d_ff: 256
vocab_size: 256
ffn: swiglu
tied_embeddings: false
seq_len: 64
"""

TRAIN = [
    ("llama-tiny", 1, ["--sharding", "fsdp", "--global-batch", "8"]),
    ("llama-tiny", 2, ["--sharding", "fsdp", "--global-batch", "8"]),
    ("llama-tiny", 2, ["--sharding", "ddp", "--global-batch", "16"]),
    ("WIDE", 1, ["--sharding", "fsdp", "--global-batch", "8"]),
    ("WIDE", 2, ["--sharding", "fsdp", "--global-batch", "16"]),
]
HELD_OUT = [
    ("llama-tiny", 2, ["--sharding", "fsdp", "--global-batch", "16", "--micro-batch", "2"]),
    ("llama-tiny", 2, ["--tp", "2", "--global-batch", "8"]),
    ("WIDE", 2, ["--sharding", "ddp", "--global-batch", "8"]),
    ("WIDE", 2, ["--pp", "2", "--global-batch", "8", "--pp-schedule", "1f1b"]),
    ("WIDE", 1, ["--sharding", "fsdp", "--global-batch", "16", "--seq-len", "128"]),
]


def scalelab(*args: str) -> dict:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONWARNINGS": "ignore",
    }
    out = subprocess.run(
        [sys.executable, "-m", "scalelab", *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if out.returncode != 0:
        raise SystemExit(f"scalelab {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=Path(tempfile.mkdtemp(prefix="scalelab-calib-"))
    )
    args = parser.parse_args()
    wide = args.out / "tiny-wide.yaml"
    args.out.mkdir(parents=True, exist_ok=True)
    wide.write_text(WIDE)
    train_dir, test_dir = args.out / "train", args.out / "held-out"
    steps = ["--steps", "8", "--warmup", "3", "--repeats", "2"]
    print("comm: 2-process gloo sweep", flush=True)
    scalelab(
        "comm",
        "--nproc-per-node",
        "2",
        "--sizes",
        "4K:4M:4",
        "--iters",
        "10",
        "--out",
        str(train_dir),
    )
    measured = []
    for folder, runs in ((train_dir, TRAIN), (test_dir, HELD_OUT)):
        for model, nproc, flags in runs:
            name = str(wide) if model == "WIDE" else model
            print(f"bench {model} x{nproc} {' '.join(flags)}", flush=True)
            rec = scalelab(
                "bench", name, "--nproc-per-node", str(nproc), *flags, *steps, "--out", str(folder)
            )
            measured.append((folder, model, nproc, flags, rec))
    fitted_yaml = args.out / "cpu-fitted.yaml"
    fit = scalelab("calibrate", str(train_dir), "--base", "cpu-gloo", "--out", str(fitted_yaml))
    print(
        f"fitted {sorted(fit['fitted'])}; undetermined {fit['undetermined']}; "
        f"training error {fit['error_before'] * 100:.0f} % -> {fit['error_after'] * 100:.0f} %"
    )
    print("| set | run | measured step (ms) | base cpu-gloo | calibrated |")
    print("|---|---|---:|---:|---:|")
    errors: dict[str, list[float]] = {"base": [], "fit": []}
    for folder, model, nproc, flags, rec in measured:
        layout = rec["layout"]
        lay = [
            "--gpus",
            str(layout["gpus"]),
            "--global-batch",
            str(layout["global_batch"]),
            "--seq-len",
            str(layout["seq_len"]),
            "--sharding",
            layout["sharding"],
            "--tp",
            str(layout["tp"]),
            "--pp",
            str(layout["pp"]),
            "--micro-batch",
            str(layout["micro_batch"]),
            "--pp-schedule",
            layout["pp_schedule"],
        ]
        name = str(wide) if model == "WIDE" else model
        step = rec["summary"]["step_time_s"]["mean"]
        base = scalelab("predict", name, "--cluster", "cpu-gloo", *lay)["step_time_s"]
        mine = scalelab("predict", name, "--cluster", str(fitted_yaml), *lay)["step_time_s"]
        held = folder == test_dir
        if held:
            errors["base"].append(abs(base / step - 1))
            errors["fit"].append(abs(mine / step - 1))
        print(
            f"| {'held out' if held else 'train'} | {model} x{nproc} {' '.join(flags)} | {step * 1e3:.1f} | "
            f"{(base / step - 1) * 100:+.0f} % | {(mine / step - 1) * 100:+.0f} % |"
        )
    print(
        f"held-out mean |error| of step time: base {100 * sum(errors['base']) / len(errors['base']):.0f} %, "
        f"calibrated {100 * sum(errors['fit']) / len(errors['fit']):.0f} %; records and cluster file in {args.out}"
    )


if __name__ == "__main__":
    main()
