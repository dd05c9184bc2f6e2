"""The whole layout space of llama2-70b on 2048 H100s, searched on one core (target: < 2 s); and
the MoE space of deepseek-v3 on 2048 H100s (EP and expert TP searched too; target: < 2 s).

Run: `OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/search_speed.py`.
"""

from __future__ import annotations

import time

from scalelab.config import load_cluster, load_model
from scalelab.search import search


def main() -> None:
    cluster = load_cluster("h100-ib")
    for name, gpus, batch in (
        ("llama2-70b", 2048, 2048),
        ("llama2-7b", 2048, 2048),
        ("llama2-13b", 64, 512),
        ("deepseek-v3", 2048, 4096),  # MoE: EP and expert TP too, two-stage (issue 16: < 2 s)
    ):
        model = load_model(name)
        times = []
        for _ in range(3):
            start = time.perf_counter()
            result = search(model, cluster, gpus=gpus, global_batch=batch, seq_len=4096)
            times.append(time.perf_counter() - start)
        print(
            f"{name} on {gpus} GPUs, global batch {batch}: {result.considered:,} layouts considered, "
            f"{result.invalid:,} invalid, {result.not_fitting:,} do not fit, {result.ranked:,} ranked; "
            f"best of 3: {min(times):.2f} s ({result.considered / min(times):,.0f} layouts/s)"
        )


if __name__ == "__main__":
    main()
