"""Train llama-tiny under several layouts in one process group and print each one's losses.

Run by tests/measure/test_parity.py, under torchrun (the parallel layouts) or as one plain
process (the single-process reference). Each case builds its own meshes, model and optimizer with
the harness's `Trainer` and runs its timed loop (`run_repeat`), so the losses compared are exactly
the ones `scalelab bench` records. Rank 0 prints one line, `PARITY {case: {...}}`, with each case's
losses, the sequence length a rank saw (to prove CP split it) and rank 0's local parameter count
(to prove the parameters were sharded or split), its gradient norms and, for a mixture-of-experts
model (a case's `model`: a catalog name or YAML file; llama-tiny by default), the measured load
imbalance. A case may set `compute_dtype`, `grad_sync` and `n_layers` (llama-tiny at another
depth); a case with `count_collectives` also profiles one more step and reports rank 0's
collectives of that step by kind (`collectives`), without the gradient norm's all-reduce.
"""

from __future__ import annotations

import json
import sys
import time
import warnings

import torch
import torch.distributed as dist

from scalelab.cli.common import build_layout
from scalelab.config.catalog import load_model
from scalelab.config.model import ModelSpec
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
    "ep": 1,
    "expert_tp": 1,
}


def _local_numel(param: torch.Tensor) -> int:
    from torch.distributed.tensor import DTensor

    return (param.to_local() if isinstance(param, DTensor) else param).numel()


COLLECTIVE_OPS = {
    "c10d::allreduce_": "all_reduce",
    "c10d::_allgather_base_": "all_gather",
    "c10d::allgather_": "all_gather",
    "c10d::allgather_into_tensor_coalesced_": "all_gather",
    "c10d::_reduce_scatter_base_": "reduce_scatter",
    "c10d::reduce_scatter_": "reduce_scatter",
    "c10d::reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "c10d::broadcast_": "broadcast",
}
CLIP = "scalelab::clip_grad_norm"


def _count_collectives(trainer: Trainer, step: int) -> dict[str, int]:
    """Rank 0's collectives (c10d ops, as the process group runs them) in one profiled optimizer
    step, by kind, without the gradient norm's (inside the step's `scalelab::clip_grad_norm`)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.step(step)
    events = list(prof.events())
    clip = [(e.time_range.start, e.time_range.end) for e in events if e.name == CLIP]
    counts: dict[str, int] = {}
    for event in events:
        kind = COLLECTIVE_OPS.get(event.name)
        start = event.time_range.start
        if kind is None or any(a <= start <= b for a, b in clip):
            continue
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def main() -> None:
    warnings.filterwarnings("ignore")
    cases = json.loads(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    info = init_distributed(timeout_s=60)
    results: dict[str, dict[str, object]] = {}
    for case in cases:
        start = time.perf_counter()
        name = case.pop("name")
        spec = load_model(case.pop("model", "llama-tiny"))
        if "n_layers" in case:  # the same model with another depth (uneven pipeline splits)
            n_layers = case.pop("n_layers")
            spec = ModelSpec.model_validate(
                spec.model_dump() | {"n_layers": n_layers, "name": f"{spec.name}-{n_layers}l"}
            )
        dtype = case.pop("compute_dtype", "fp32")
        grad_sync = case.pop("grad_sync", "step")
        count = case.pop("count_collectives", False)
        fp8 = {k: case.pop(k) for k in ("fp8_recipe", "fp8_all_gather") if k in case}
        options = BenchOptions(
            steps=steps,
            warmup=0,
            repeats=1,
            lr=3e-3,
            compute_dtype=dtype,
            grad_sync=grad_sync,
            **fp8,
        )
        layout = build_layout(gpus=info.world_size, **(DEFAULTS | case))
        trainer = Trainer(spec, layout, options, info)
        built = time.perf_counter()
        repeat = run_repeat(trainer, EnergyMeter(None), 0)
        results[name] = {
            "loss": repeat.loss,
            "grad_norm": repeat.grad_norm,
            "expert_load_imbalance": repeat.extra.get("expert_load_imbalance"),
            "ep_load_imbalance": repeat.extra.get("ep_load_imbalance"),
            "local_seq_len": trainer.local_seq_len,
            "local_numel": sum(_local_numel(p) for p in trainer.params),
            "fp8_modules": sum(
                type(m).__name__ == "Float8Linear" for s in trainer.modules for m in s.modules()
            ),
        }
        if trainer.moe_modules:  # experts this rank holds (n_experts / ep) and their hidden width
            w1 = trainer.moe_modules[0][1].experts.w1
            results[name]["local_experts"] = list(w1.shape[:2])
            if info.world_size == 1:  # the routed slots per (step, layer, expert): all of them
                results[name]["expert_counts"] = [c.tolist() for c in trainer.expert_counts]
        if count:
            results[name]["collectives"] = _count_collectives(trainer, steps)
        del trainer
        # Rank 0's wall seconds building the case and running its steps (where a launch's time
        # goes; not asserted on).
        results[name]["seconds"] = [round(built - start, 2), round(time.perf_counter() - built, 2)]
    if info.rank == 0:
        print("PARITY " + json.dumps(results), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
