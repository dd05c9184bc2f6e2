"""Train llama-tiny under several layouts in one process group and print each one's losses.

Run by tests/measure/test_parity.py, under torchrun (the parallel layouts) or as one plain
process (the single-process reference). Each case builds its own meshes, model and optimizer with
the harness's `Trainer` and runs its timed loop (`run_repeat`), so the losses compared are exactly
the ones `scalelab bench` records. Rank 0 prints one line, `PARITY {case: {...}}`, with each case's
losses, the sequence length a rank saw (to prove CP split it) and rank 0's local parameter count
(to prove the parameters were sharded or split). A case may set `compute_dtype`.
"""

from __future__ import annotations

import json
import sys
import warnings

import torch
import torch.distributed as dist

from scalelab.cli.common import build_layout
from scalelab.config.catalog import load_model
from scalelab.measure.config import BenchOptions
from scalelab.measure.energy import EnergyMeter
from scalelab.measure.train import Trainer, init_distributed, run_repeat

DEFAULTS = {
    "seq_len": 32,
    "global_batch": 8,
    "sharding": "fsdp",
    "hsdp_shard_size": None,
    "reshard_after_forward": True,
    "tp": 1,
    "sp": True,
    "pp": 1,
    "pp_schedule": "1f1b",
    "virtual_stages": 1,
    "cp": 1,
    "micro_batch": 1,
    "recompute": "none",
    "precision": "bf16",
    "attention": "flash",
}


def _local_numel(param: torch.Tensor) -> int:
    from torch.distributed.tensor import DTensor

    return (param.to_local() if isinstance(param, DTensor) else param).numel()


def main() -> None:
    warnings.filterwarnings("ignore")
    cases = json.loads(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    info = init_distributed(timeout_s=60)
    spec = load_model("llama-tiny")
    results: dict[str, dict[str, object]] = {}
    for case in cases:
        name = case.pop("name")
        dtype = case.pop("compute_dtype", "fp32")
        options = BenchOptions(steps=steps, warmup=0, repeats=1, lr=3e-3, compute_dtype=dtype)
        layout = build_layout(gpus=info.world_size, **(DEFAULTS | case))
        trainer = Trainer(spec, layout, options, info)
        losses = run_repeat(trainer, EnergyMeter(None), 0).loss
        results[name] = {
            "loss": losses,
            "local_seq_len": trainer.local_seq_len,
            "local_numel": sum(_local_numel(p) for p in trainer.params),
        }
        del trainer
    if info.rank == 0:
        print("PARITY " + json.dumps(results), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
