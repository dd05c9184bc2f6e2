"""What every study shares: the one set of assumptions, evaluation helpers, plots and output."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.config.catalog import load_cluster, load_model, load_stack
from scalelab.config.hardware import ClusterSpec
from scalelab.config.layout import Layout
from scalelab.config.model import ModelSpec
from scalelab.config.stack import StackSpec
from scalelab.io import atomic_write_text
from scalelab.perf.predict import predict_layout
from scalelab.search import Constraints, describe, search


@dataclass(frozen=True)
class Assumptions:
    """What the study does not state, chosen once for every experiment and finding."""

    model: str = "llama2-7b"
    cluster: str = "h100-ib"
    seq_len: int = 4096
    sequences_per_gpu: int = 1
    precision: str = "bf16"
    hardware_scale_gpus: int = 64
    strong_scaling_global_batch: int = 32
    mp_grid_gpus: int = 256
    mp_grid_global_batch: int = 512
    # Cluster fields moved within their stated uncertainty (the parameter sensitivity table):
    # ("host_cpu", "amd") or ("params.nccl_channels", 16); empty for the catalog's values.
    cluster_overrides: tuple[tuple[str, Any], ...] = ()

    def lines(self) -> list[str]:
        return [
            f"model {self.model}, sequence length {self.seq_len} (Llama-2's context), "
            f"{self.sequences_per_gpu} sequence per GPU per step in weak scaling (global batch = GPUs x "
            f"{self.sequences_per_gpu}), {self.precision}, causal flash attention",
            f"cluster {self.cluster} (DGX H100-like: 8 GPUs per node on NVSwitch, 8 x 400 Gb/s NICs); "
            "its parameters are the catalog's, the same `predict` and `validate` use",
            "pure FSDP = PyTorch 2.3.1's FSDP (FSDP1) FULL_SHARD over every GPU: one AllGather and one "
            "ReduceScatter per transformer block's FlatParameter, implicit forward prefetch, "
            "BACKWARD_PRE, limit_all_gathers (its defaults; the predictor's schedule is this one), "
            "reshard after forward, no model parallelism, no activation recomputation unless the "
            "layout would not fit; F3 and F6 search it over SHARD_GRAD_OP (no reshard) and "
            "micro-batch like the TP/PP arm",
            f"hardware comparison at {self.hardware_scale_gpus} GPUs; strong scaling at global batch "
            f"{self.strong_scaling_global_batch}; TP x PP grid at {self.mp_grid_gpus} GPUs, global batch "
            f"{self.mp_grid_global_batch}",
            "power is GPU board power (as NVML reports it), not CPU, memory or network",
            f"software stack {STUDY_STACK.name}: {STUDY_STACK.description.strip()}; its layouts "
            "only (schedules, shardings, TP and PP up to 16)",
        ]


DEFAULT = Assumptions()
WEAK_SCALING_GPUS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048)

# The predictor's output keys the studies read by name (metrics.py names).
TOKENS_PER_J = "tokens_per_j"

# The study's software stack (config/catalog/stacks.yaml `study-pytorch-2.3`): PyTorch 2.3.1 has
# no pipeline schedules in core (torch.distributed.pipelining arrived in 2.4 from PiPPy, which
# offered GPipe, 1F1B and interleaved 1F1B); ZBV was added in December 2024
# (pytorch/pytorch#142084). Every series that stands for the study's arms is searched and predicted
# with this stack: only what it offers, as it runs it.
STUDY_STACK = load_stack("study-pytorch-2.3")
STUDY_SCHEDULES = [str(s) for s in STUDY_STACK.schedules]
STUDY_SCHEDULES_NOTE = (
    "PyTorch 2.3.1's pipeline schedules (GPipe, 1F1B, interleaved 1F1B); ZBV, added to PyTorch in "
    "December 2024 (pytorch/pytorch#142084), is excluded"
)


def family(layout: dict[str, Any]) -> str:
    """The layout family a reader can check a label against: FSDP / HSDP with + TP, + PP, + CP."""
    parts = [str(layout["sharding"]).upper()]
    for key in ("tp", "pp", "cp"):
        if int(layout[key]) > 1:
            parts.append(key.upper())
    return " + ".join(parts)


def families_label(rows: list[dict[str, Any]]) -> str:
    """'HSDP' when every row is one family, else 'FSDP + TP at 16-32 GPUs, ...' in GPU order."""
    seen: dict[str, list[int]] = {}
    for r in sorted(rows, key=lambda r: r["gpus"]):
        seen.setdefault(r["family"], []).append(r["gpus"])
    if len(seen) == 1:
        return next(iter(seen))
    return ", ".join(
        f"{fam} at {g[0]}" + (f"-{g[-1]}" if len(g) > 1 else "") + " GPUs"
        for fam, g in seen.items()
    )


def is_assumed(source: str) -> bool:
    """A catalog entry whose source says its values are assumed rather than measured or fitted."""
    return "ASSUM" in source


@dataclass
class StudyOutput:
    """What a study wrote: figures, tables, and its section of the report."""

    name: str
    title: str
    figures: list[Path] = field(default_factory=list)
    tables: list[Path] = field(default_factory=list)
    markdown: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)


def pure_fsdp(gpus: int, a: Assumptions = DEFAULT, recompute: str = "none", **kw: Any) -> Layout:
    per_gpu = kw.pop("sequences_per_gpu", a.sequences_per_gpu)
    return Layout(
        gpus=gpus,
        global_batch=kw.pop("global_batch", Layout.default_global_batch(gpus, micro_batch=per_gpu)),
        seq_len=kw.pop("seq_len", a.seq_len),
        micro_batch=kw.pop("micro_batch", per_gpu),
        sharding=kw.pop("sharding", "fsdp"),
        recompute=recompute,  # type: ignore[arg-type]
        precision=a.precision,  # type: ignore[arg-type]
        **kw,
    )


def fsdp_at(gpus: int, a: Assumptions = DEFAULT, **kw: Any) -> Callable[[str], Layout]:
    """A maker of the pure-FSDP layout at `gpus` for a given recompute choice."""

    def make(recompute: str) -> Layout:
        return pure_fsdp(gpus, a, recompute=recompute, **kw)

    return make


def predict_fitting(
    model: ModelSpec,
    cluster: ClusterSpec,
    make: Callable[[str], Layout],
    stack: StackSpec = STUDY_STACK,
) -> dict[str, Any]:
    """Predict the layout with the least recomputation that fits (the last one if none fits)."""
    result: dict[str, Any] = {}
    for recompute in ("none", "selective", "full"):
        result = predict_layout(model, cluster, make(recompute), stack)
        if result["fits"]:
            return result
    return result


def best_layout(
    model: ModelSpec,
    cluster: ClusterSpec,
    gpus: int,
    global_batch: int,
    seq_len: int,
    constraints: Constraints | None = None,
    stack: StackSpec = STUDY_STACK,
) -> dict[str, Any] | None:
    result = search(
        model,
        cluster,
        gpus=gpus,
        global_batch=global_batch,
        seq_len=seq_len,
        constraints=constraints,
        top_k=1,
        stack=stack,
    )
    return result.top[0] if result.top else None


def with_overrides(cluster: ClusterSpec, overrides: tuple[tuple[str, Any], ...]) -> ClusterSpec:
    """The cluster with `overrides` applied (`params.NAME` for a predictor parameter)."""
    for name, value in overrides:
        if name.startswith("params."):
            params = cluster.params.model_copy(update={name.split(".", 1)[1]: value})
            cluster = cluster.model_copy(update={"params": params})
        else:
            cluster = cluster.model_copy(update={name: value})
    return cluster


def load(a: Assumptions = DEFAULT) -> tuple[ModelSpec, ClusterSpec]:
    model = load_model(a.model)
    return model, with_overrides(load_cluster(a.cluster), a.cluster_overrides)


def write_report(out: Path, title: str, sections: list[str]) -> Path:
    return atomic_write_text(out / "report.md", f"# {title}\n\n" + "\n\n".join(sections) + "\n")


__all__ = ["DEFAULT", "WEAK_SCALING_GPUS", "Assumptions", "StudyOutput", "describe"]
