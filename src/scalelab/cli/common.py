"""Flags and helpers shared by the verbs: the one set of layout flags, JSON output, consoles."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.console import Console

from scalelab.config.layout import ATTENTIONS, PRECISIONS, RECOMPUTES, SCHEDULES, SHARDINGS, Layout
from scalelab.config.options import (
    AttentionKernel,
    PipelineSchedule,
    Precision,
    Recompute,
    Sharding,
)
from scalelab.errors import InputError

console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True)

ModelArg = Annotated[
    str, typer.Argument(help="catalog model name (see `scalelab models`) or a YAML file")
]
ClusterOpt = Annotated[
    str,
    typer.Option(
        "--cluster", "-c", help="catalog cluster (see `scalelab hardware`) or a YAML file"
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document and nothing else")]
SeqLenOpt = Annotated[
    int | None, typer.Option("--seq-len", help="sequence length (default: the model's)")
]

# Layout flags: the same names for predict, search (as constraints) and bench.
ShardingOpt = Annotated[str, typer.Option("--sharding", help="|".join(SHARDINGS))]
HsdpGroupOpt = Annotated[
    int | None, typer.Option("--hsdp-shard-size", help="HSDP shard group size (default: a node)")
]
ReshardOpt = Annotated[
    bool,
    typer.Option(
        "--reshard-after-forward/--no-reshard-after-forward", help="FSDP: free params after forward"
    ),
]
TpOpt = Annotated[int, typer.Option("--tp", help="tensor-parallel degree")]
SpOpt = Annotated[bool, typer.Option("--sp/--no-sp", help="sequence parallelism with TP")]
PpOpt = Annotated[int, typer.Option("--pp", help="pipeline-parallel degree")]
ScheduleOpt = Annotated[str, typer.Option("--pp-schedule", help="|".join(SCHEDULES))]
VstagesOpt = Annotated[int, typer.Option("--virtual-stages", help="pipeline stages per rank")]
CpOpt = Annotated[int, typer.Option("--cp", help="context-parallel degree")]
MicroBatchOpt = Annotated[
    int, typer.Option("--micro-batch", help="sequences per micro-batch per data-parallel rank")
]
GlobalBatchOpt = Annotated[
    int | None,
    typer.Option(
        "--global-batch",
        help="sequences per step (default: 1 per data-parallel rank x micro-batch)",
    ),
]
RecomputeOpt = Annotated[str, typer.Option("--recompute", help="|".join(RECOMPUTES))]
PrecisionOpt = Annotated[str, typer.Option("--precision", help="|".join(PRECISIONS))]
AttentionOpt = Annotated[str, typer.Option("--attention", help="|".join(ATTENTIONS))]


def choice(field: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise InputError(field, f"'{value}' is not one of {', '.join(allowed)}")
    return value


def positive(field: str, value: int) -> int:
    if value < 1:
        raise InputError(field, f"must be a positive integer, not {value}")
    return value


def build_layout(
    *,
    gpus: int,
    seq_len: int,
    global_batch: int | None,
    sharding: str,
    hsdp_shard_size: int | None,
    reshard_after_forward: bool,
    tp: int,
    sp: bool,
    pp: int,
    pp_schedule: str,
    virtual_stages: int,
    cp: int,
    micro_batch: int,
    recompute: str,
    precision: str,
    attention: str,
) -> Layout:
    """A `Layout` from CLI flags, each checked with a message naming its flag."""
    for name, value in (
        ("gpus", gpus),
        ("seq-len", seq_len),
        ("tp", tp),
        ("pp", pp),
        ("cp", cp),
        ("virtual-stages", virtual_stages),
        ("micro-batch", micro_batch),
    ):
        positive(name, value)
    if hsdp_shard_size is not None:
        positive("hsdp-shard-size", hsdp_shard_size)
    if global_batch is None:
        global_batch = Layout.default_global_batch(
            gpus, tp=tp, pp=pp, cp=cp, micro_batch=micro_batch
        )
    positive("global-batch", global_batch)
    return Layout(
        gpus=gpus,
        global_batch=global_batch,
        seq_len=seq_len,
        sharding=Sharding.parse("sharding", sharding),
        hsdp_shard_size=hsdp_shard_size,
        reshard_after_forward=reshard_after_forward,
        tp=tp,
        sequence_parallel=sp,
        pp=pp,
        pp_schedule=PipelineSchedule.parse("pp-schedule", pp_schedule),
        virtual_stages=virtual_stages,
        cp=cp,
        micro_batch=micro_batch,
        recompute=Recompute.parse("recompute", recompute),
        precision=Precision.parse("precision", precision),
        attention=AttentionKernel.parse("attention", attention),
    )


def print_json(document: Any) -> None:
    """One JSON document on stdout (NaN and infinity become null)."""
    sys.stdout.write(json.dumps(_clean(document), indent=2) + "\n")


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        return _clean(value.item())
    return value


def record_for_display(path: Any, json_out: bool, verb: str) -> Any:
    """Load a run's record; print it as JSON (and return None) with --json. Missing: say so on stderr."""
    from scalelab.results import load_record

    if path is None:
        err_console.print(f"scalelab {verb}: no record was written")
        return None
    record = load_record(path)
    if json_out:
        print_json(record.model_dump())
        return None
    return record
