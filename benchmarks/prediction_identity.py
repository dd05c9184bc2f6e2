"""Predictions before and after a refactor are identical: save a baseline, then compare to it.

Draws random *valid* layouts (fixed seed) for every cluster in the catalog and several models,
evaluates the array predictor on them and saves every numeric output; `compare` re-evaluates the
same layouts (read back from the baseline, so the inputs are exactly the same) and reports the
largest relative difference per output. Exit 1 if any exceeds the tolerance (1e-12) or an output
disappeared.

Run: `python benchmarks/prediction_identity.py save /tmp/pred_baseline.npz` on the old code, then
`python benchmarks/prediction_identity.py compare /tmp/pred_baseline.npz` after each change.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from scalelab.config import Layout, LayoutTable, load_cluster, load_model
from scalelab.config.catalog import cluster_names
from scalelab.config.layout import violation_masks
from scalelab.perf import predict

MODELS = ("llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "gpt3-175b", "llama-tiny")
PER_PAIR = 120
SEED = 20261203
TOLERANCE = 1e-12
# Outputs renamed since the baseline format was first written: old name -> new name.
RENAMED = {"tokens_per_joule": "tokens_per_j"}

_CHOICES = {
    "sharding": ("ddp", "zero1", "zero2", "fsdp", "hsdp"),
    "pp_schedule": ("gpipe", "1f1b", "interleaved", "zbv"),
    "recompute": ("none", "selective", "full"),
    "precision": ("bf16", "fp8"),
    "attention": ("flash", "math", "flash1", "fused"),
}


def _candidate(rng: np.random.Generator, max_gpus: int) -> dict[str, object]:
    exp = int(rng.integers(0, int(np.log2(max_gpus)) + 1))
    gpus = 2**exp
    tp = int(rng.choice([1, 1, 2, 4, 8]))
    pp = int(rng.choice([1, 1, 2, 4, 8]))
    cp = int(rng.choice([1, 1, 1, 2, 4]))
    mb = int(rng.choice([1, 1, 2, 4]))
    dp = max(1, gpus // (tp * pp * cp))
    m = int(rng.choice([1, 2, 4, 8, 16]))
    sharding = str(rng.choice(_CHOICES["sharding"]))
    schedule = str(rng.choice(_CHOICES["pp_schedule"]))
    v = {"interleaved": int(rng.choice([1, 2, 4])), "zbv": 2}.get(schedule, 1)
    hsdp = None
    if sharding == "hsdp" and rng.random() < 0.5:
        hsdp = int(rng.choice([2, 4, 8, 16]))
    return {
        "gpus": gpus,
        "global_batch": dp * mb * m,
        "seq_len": int(rng.choice([1024, 2048, 4096, 8192, 32768])),
        "sharding": sharding,
        "hsdp_shard_size": hsdp,
        "reshard_after_forward": bool(rng.random() < 0.7),
        "tp": tp,
        "sequence_parallel": bool(rng.random() < 0.7),
        "pp": pp,
        "pp_schedule": schedule,
        "virtual_stages": v,
        "cp": cp,
        "micro_batch": mb,
        "recompute": str(rng.choice(_CHOICES["recompute"])),
        "precision": str(rng.choice(_CHOICES["precision"])),
        "attention": str(rng.choice(_CHOICES["attention"])),
    }


def draw() -> list[tuple[str, str, list[dict[str, object]]]]:
    """(cluster, model, layouts) groups of valid layouts, the same on every run."""
    rng = np.random.default_rng(SEED)
    groups = []
    for cluster_name in cluster_names():
        cluster = load_cluster(cluster_name)
        for model_name in MODELS:
            model = load_model(model_name)
            kept: list[dict[str, object]] = []
            for _ in range(40):
                cands = [_candidate(rng, min(cluster.max_gpus, 4096)) for _ in range(400)]
                table = LayoutTable.from_layouts([Layout(**c) for c in cands])  # type: ignore[arg-type]
                bad = np.zeros(len(cands), dtype=bool)
                for mask in violation_masks(table, model, cluster).values():
                    bad |= mask
                kept.extend(c for c, b in zip(cands, bad, strict=True) if not b)
                if len(kept) >= PER_PAIR:
                    break
            groups.append((cluster_name, model_name, kept[:PER_PAIR]))
    return groups


def evaluate(groups: list[tuple[str, str, list[dict[str, object]]]]) -> dict[str, np.ndarray]:
    out: dict[str, list[np.ndarray]] = {}
    for cluster_name, model_name, layouts in groups:
        if not layouts:
            continue
        table = LayoutTable.from_layouts([Layout(**c) for c in layouts])  # type: ignore[arg-type]
        pred = predict(load_model(model_name), load_cluster(cluster_name), table)
        names = (
            pred.values.keys() if isinstance(getattr(pred, "values", None), dict) else pred.keys()
        )
        for key in list(names):
            arr = np.asarray(pred[key])
            if arr.dtype.kind in "biuf":
                out.setdefault(key, []).append(arr.astype(float))
    return {k: np.concatenate(v) for k, v in out.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=("save", "compare"))
    parser.add_argument("path")
    args = parser.parse_args()
    start = time.perf_counter()
    if args.mode == "save":
        groups = draw()
        values = evaluate(groups)
        n = sum(len(g[2]) for g in groups)
        np.savez(args.path, __layouts__=np.array(json.dumps(groups)), **values)
        print(
            f"saved {n} valid layouts, {len(groups)} (cluster, model) pairs, {len(values)} outputs"
        )
        return 0
    base = np.load(args.path)
    groups = [tuple(g) for g in json.loads(str(base["__layouts__"]))]
    values = evaluate(groups)  # type: ignore[arg-type]
    n = sum(len(g[2]) for g in groups)
    worst = 0.0
    failed = []
    for key in base.files:
        if key == "__layouts__":
            continue
        new_key = key if key in values else RENAMED.get(key, key)
        if new_key not in values:
            failed.append(f"{key}: missing")
            continue
        old, new = base[key], values[new_key]
        denom = np.maximum(np.abs(old), 1e-300)
        rel = np.where(old == new, 0.0, np.abs(new - old) / denom)
        m = float(np.max(rel)) if rel.size else 0.0
        worst = max(worst, m)
        if not m <= TOLERANCE:
            failed.append(f"{key}: max rel diff {m:.3g}")
    print(
        f"compared {n} layouts x {len(base.files) - 1} outputs: max rel diff {worst:.3g} "
        f"({time.perf_counter() - start:.1f} s)"
    )
    for line in failed:
        print("  DIFFERS", line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
