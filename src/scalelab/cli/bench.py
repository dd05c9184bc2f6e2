"""`scalelab bench`: measure a layout with the real harness (PyTorch distributed)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from scalelab.cli.common import (
    JsonOpt,
    ModelArg,
    build_layout,
    console,
    err_console,
    layout_options,
    record_for_display,
)
from scalelab.config.hardware import ClusterSpec
from scalelab.errors import InputError

NprocOpt = Annotated[
    int,
    typer.Option(
        "--nproc-per-node", help="processes to launch here with torchrun (GPUs, or CPU ranks)"
    ),
]
StepsOpt = Annotated[int, typer.Option("--steps", help="measured steps per repeat")]
WarmupOpt = Annotated[int, typer.Option("--warmup", help="warm-up steps per repeat (not measured)")]
RepeatsOpt = Annotated[int, typer.Option("--repeats", help="repeats (for mean, std and 95 % CI)")]
SeedOpt = Annotated[
    int, typer.Option("--seed", help="seed of the parameters and the synthetic data")
]
LrOpt = Annotated[float, typer.Option("--lr", help="AdamW learning rate")]
ClipOpt = Annotated[float, typer.Option("--grad-clip", help="max gradient norm (0: no clipping)")]
CompileOpt = Annotated[
    bool, typer.Option("--compile/--no-compile", help="torch.compile each block")
]
DtypeOpt = Annotated[
    str, typer.Option("--compute-dtype", help="auto (bf16 on GPU, fp32 on CPU) | bf16 | fp32")
]
GradSyncOpt = Annotated[
    str,
    typer.Option(
        "--grad-sync",
        help="step: reduce gradients once per step (no_sync on earlier micro-batches) | microbatch",
    ),
]
Fp8RecipeOpt = Annotated[
    str,
    typer.Option(
        "--fp8-recipe",
        help="with --precision fp8: torchao float8 scaling, tensorwise | rowwise",
    ),
]
Fp8AllGatherOpt = Annotated[
    bool,
    typer.Option(
        "--fp8-all-gather/--no-fp8-all-gather",
        help="with --precision fp8, tensorwise and FSDP: gather weights in fp8 (torchao)",
    ),
]
DataOpt = Annotated[
    str | None, typer.Option("--data", help="token file (.npy, or uint16 .bin); default synthetic")
]
ProfileOpt = Annotated[bool, typer.Option("--profile", help="write one Kineto trace per rank")]
ProfileStepsOpt = Annotated[
    int, typer.Option("--profile-steps", help="profiled steps (after the measured ones)")
]
TimeoutOpt = Annotated[
    float, typer.Option("--timeout-s", help="collective timeout: a stuck job fails after it")
]
PredictOpt = Annotated[
    bool, typer.Option("--predict", help="add the predictor's numbers for this layout")
]
OutOpt = Annotated[Path, typer.Option("--out", help="folder for the record (and traces/)")]
BenchClusterOpt = Annotated[
    str | None,
    typer.Option(
        "--cluster", "-c",
        help="catalog cluster or YAML (GPU peak for MFU, and --predict); default: from the GPU name; on CPU, --predict needs it",
    ),
]  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)


def _detected_gpu() -> str | None:
    """The local CUDA device's name, or None (checked without importing torch when possible)."""
    try:
        import torch
    except ImportError:
        raise InputError(
            "bench", "the harness needs PyTorch: pip install 'scalelab[measure]'"
        ) from None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


@layout_options()
def bench(
    model: ModelArg,
    nproc_per_node: NprocOpt = 1,
    steps: StepsOpt = 50,
    warmup: WarmupOpt = 10,
    repeats: RepeatsOpt = 3,
    seed: SeedOpt = 0,
    lr: LrOpt = 3e-4,
    grad_clip: ClipOpt = 1.0,
    compile: CompileOpt = False,
    compute_dtype: DtypeOpt = "auto",
    grad_sync: GradSyncOpt = "step",
    fp8_recipe: Fp8RecipeOpt = "tensorwise",
    fp8_all_gather: Fp8AllGatherOpt = False,
    data: DataOpt = None,
    profile: ProfileOpt = False,
    profile_steps: ProfileStepsOpt = 3,
    timeout_s: TimeoutOpt = 600.0,
    cluster: BenchClusterOpt = None,
    predict: PredictOpt = False,
    out: OutOpt = Path("runs"),
    json_out: JsonOpt = False,
    **layout: Any,
) -> None:
    """Train MODEL under a layout on this machine (or as one process of a torchrun job) and write
    one JSON record: tokens/s, MFU/HFU, memory, GPU energy, losses, over repeats.

    The layout flags are generated from `scalelab.config.Layout`'s fields (as for predict)."""
    from pydantic import ValidationError

    from scalelab.cli.common import MAX_COUNT, at_most, choice, positive, writable_folder
    from scalelab.config.catalog import load_cluster, load_model
    from scalelab.config.layout import check
    from scalelab.measure.config import (
        BenchOptions,
        check_layout,
        check_layout_options,
        check_model,
        check_options,
        check_tokens,
        under_torchrun,
    )

    spec = load_model(model)
    check_model(spec)
    for name, value in (("steps", steps), ("repeats", repeats), ("profile-steps", profile_steps)):
        positive(name, value)
        at_most(name, value, MAX_COUNT)
    if warmup < 0:
        raise InputError("warmup", f"must be 0 or more, not {warmup}")
    at_most("warmup", warmup, MAX_COUNT)
    choice("compute-dtype", compute_dtype, ("auto", "fp32", "bf16"))
    choice("grad-sync", grad_sync, ("step", "microbatch"))
    choice("fp8-recipe", fp8_recipe, ("tensorwise", "rowwise"))
    try:
        options = BenchOptions(
            steps=steps, warmup=warmup, repeats=repeats, seed=seed, lr=lr, grad_clip=grad_clip,
            compile=compile, compute_dtype=compute_dtype, data=data, profile=profile,  # type: ignore[arg-type]
            grad_sync=grad_sync,  # type: ignore[arg-type]
            fp8_recipe=fp8_recipe, fp8_all_gather=fp8_all_gather,  # type: ignore[arg-type]
            profile_steps=profile_steps, timeout_s=timeout_s, predict=predict,
            out_dir=str(out),
        )  # fmt: skip
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InputError(str(err["loc"][0]).replace("_", "-"), err["msg"]) from None
    check_options(options)
    writable_folder("out", out)
    worker = under_torchrun()
    if worker:
        gpus = int(os.environ["WORLD_SIZE"])
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(gpus)))
    else:
        positive("nproc-per-node", nproc_per_node)
        gpus = per_node = nproc_per_node
    seq_len = layout.pop("seq_len", None)
    seq_len = spec.seq_len if seq_len is None else seq_len
    built = build_layout(gpus=gpus, seq_len=seq_len, **layout)
    # The checks that need no cluster run before torch's import (~3 s), so bad input fails at once.
    check_layout(built, spec, per_node)
    check_layout_options(options, built, spec)
    if data is not None:
        check_tokens(data, spec.vocab_size, built.seq_len)
    gpu = _detected_gpu()
    if gpu is not None and not worker:
        import torch

        if nproc_per_node > torch.cuda.device_count():
            raise InputError(
                "nproc-per-node",
                f"{nproc_per_node} processes but {torch.cuda.device_count()} GPUs here",
            )
    from scalelab.measure.config import resolve_cluster

    cluster_spec, _ = resolve_cluster(cluster, gpu)
    if gpu is None:
        cluster_spec = None  # a CPU run: the cluster name is recorded as given, its peak unused
    reference = cluster_spec or load_cluster("h100-ib")
    local = reference.model_copy(update={"gpus_per_node": per_node, "nvlink_domain": per_node})
    check(built, spec, local)
    if built.precision == "fp8":
        from scalelab.measure import fp8

        if gpu is not None:
            fp8.check_local_device()
        else:
            fp8.check_gloo(fp8_recipe, built.tp, built.sequence_parallel)
    predict_cluster = None
    if predict:
        from scalelab.predicted import require_predictor

        require_predictor()
        if cluster_spec is None and cluster is None:
            raise InputError(
                "cluster",
                "--predict on a machine without a GPU needs --cluster: the cluster to predict"
                " for (cpu-gloo for this machine's CPU ranks, or a GPU cluster)",
            )
        predict_cluster = cluster_spec or load_cluster(cluster or "")

    from scalelab.measure.job import BenchJob
    from scalelab.measure.launch import launch_job
    from scalelab.measure.worker import run_worker

    job = BenchJob(
        model=spec, layout=built, options=options, cluster=cluster, nproc_per_node=per_node
    )
    if worker or nproc_per_node == 1:
        rc, path = run_worker(job)
        if worker and int(os.environ.get("RANK", "0")) != 0:
            _exit(rc)
            return
    else:
        rc, path = launch_job(job, out)
    if predict_cluster is not None and rc == 0 and path is not None:
        _attach_prediction(path, predict_cluster)
    _report(path, json_out)
    _exit(rc)


def _attach_prediction(path: Path, cluster: ClusterSpec) -> None:
    """Put the predictor's numbers for the same layout beside the measurement (atomically)."""
    from scalelab.predicted import attach_prediction
    from scalelab.results import load_record, write_record

    record = load_record(path)
    if record.status == "ok":
        write_record(attach_prediction(record, cluster), path.parent)


def _exit(rc: int) -> None:
    """A failed run exits 1 (SystemExit passes through click and `main` unchanged)."""
    if rc != 0:
        raise SystemExit(1)


def _fmt(value: Any, scale: float = 1.0, digits: int = 1, pct: bool = False) -> str:
    if value is None:
        return "n/a"
    v = value * scale
    return f"{v:.{digits}f}%" if pct else f"{v:,.{digits}f}"


def _report(path: Path | None, json_out: bool) -> None:
    record = record_for_display(path, json_out, "bench")
    if record is None or path is None:
        return
    if record.status != "ok":
        err_console.print(f"[bold red]{record.status}[/]: {escape(record.error or '')}")
        err_console.print(f"record: {path}")
        return
    s = record.summary
    w = record.workload
    table = Table(title=escape(f"{w['model']} · {path.name}"))
    table.add_column("metric")
    table.add_column("mean", justify="right")
    table.add_column("std", justify="right")
    table.add_column("95 % CI", justify="right")
    rows = (
        ("step time (ms)", "step_time_s", 1e3, 2, False),
        ("tokens/s", "tokens_per_s", 1.0, 0, False),
        ("tokens/s per GPU", "tokens_per_s_per_gpu", 1.0, 0, False),
        ("MFU", "mfu", 100.0, 1, True),
        ("HFU", "hfu", 100.0, 1, True),
        ("model TFLOP/s per GPU (6N + attention)", "model_tflops_per_gpu", 1.0, 2, False),
        ("peak CUDA allocated (GiB)", "memory_peak_allocated_bytes", 2**-30, 2, False),
        ("peak RSS (GiB)", "memory_peak_rss_bytes", 2**-30, 2, False),
        ("GPU power per GPU (W)", "power_w_per_gpu", 1.0, 0, False),
        ("GPU energy, whole job (J)", "energy_j", 1.0, 0, False),
        ("GPU energy per token (mJ)", "energy_per_token_j", 1e3, 3, False),
        ("loss at end of repeat", "final_loss", 1.0, 4, False),
    )
    for label, key, scale, digits, pct in rows:
        st = s.get(key, {})
        ci = (
            f"{_fmt(st.get('ci95_low'), scale, digits, pct)} – {_fmt(st.get('ci95_high'), scale, digits, pct)}"
            if st.get("ci95_low") is not None
            else "n/a"
        )
        table.add_row(
            label,
            _fmt(st.get("mean"), scale, digits, pct),
            _fmt(st.get("std"), scale, digits, pct),
            ci,
        )
    console.print(table)
    for field, reason in record.notes.items():
        console.print(f"[dim]{escape(f'{field}: {reason}')}[/]")
    if record.prediction:
        console.print(
            "predicted: "
            + json.dumps(
                {
                    k: record.prediction.get(k)
                    for k in ("tokens_per_s", "mfu", "step_time_s")
                    if k in record.prediction
                }
            )
        )
    console.print(f"record: {path}")
