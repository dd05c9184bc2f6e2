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
    FromOpt,
    JsonOpt,
    OptionalModelArg,
    build_layout,
    console,
    err_console,
    layout_options,
    print_json,
    read_from,
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
    str | None,
    typer.Option(
        "--fp8-recipe",
        help="with --precision fp8: torchao float8 scaling, tensorwise (default) | rowwise",
    ),
]
OversubscribeOpt = Annotated[
    bool,
    typer.Option(
        "--oversubscribe",
        help="on CPU, allow more ranks than cores (up to 8 per core; tests run 4 ranks on 2)",
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
DryRunOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="validate the job and print what would run (ranks, mesh, stages and their "
        "layers) without importing torch or launching anything",
    ),
]
NnodesOpt = Annotated[
    int,
    typer.Option(
        "--nnodes",
        help="nodes of the job, for --dry-run (a multi-node run is launched by torchrun "
        "... -m scalelab bench, which sets the world size)",
    ),
]
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
    model: OptionalModelArg = None,
    nproc_per_node: NprocOpt = 1,
    nnodes: NnodesOpt = 1,
    steps: StepsOpt = 50,
    warmup: WarmupOpt = 10,
    repeats: RepeatsOpt = 3,
    seed: SeedOpt = 0,
    lr: LrOpt = 3e-4,
    grad_clip: ClipOpt = 1.0,
    compile: CompileOpt = False,
    compute_dtype: DtypeOpt = "auto",
    grad_sync: GradSyncOpt = "step",
    fp8_recipe: Fp8RecipeOpt = None,
    fp8_all_gather: Fp8AllGatherOpt = False,
    data: DataOpt = None,
    profile: ProfileOpt = False,
    profile_steps: ProfileStepsOpt = 3,
    timeout_s: TimeoutOpt = 600.0,
    oversubscribe: OversubscribeOpt = False,
    cluster: BenchClusterOpt = None,
    predict: PredictOpt = False,
    out: OutOpt = Path("runs"),
    from_file: FromOpt = None,
    dry_run: DryRunOpt = False,
    json_out: JsonOpt = False,
    **layout: Any,
) -> None:
    """Train MODEL under a layout on this machine (or as one process of a torchrun job) and write
    one JSON record: tokens/s, MFU/HFU, memory, GPU energy, losses, over repeats.

    The layout flags are generated from `scalelab.config.Layout`'s fields (as for predict)."""
    from pydantic import ValidationError

    from scalelab.cli.common import (
        MAX_COUNT,
        at_most,
        choice,
        only_with,
        positive,
        writable_folder,
    )
    from scalelab.config.catalog import load_cluster, load_model
    from scalelab.config.layout import check
    from scalelab.measure.config import (
        BenchOptions,
        check_layout,
        check_layout_options,
        check_model,
        check_nproc,
        check_options,
        check_timeout,
        check_tokens,
        under_torchrun,
        visible_gpus,
    )

    ingested = None
    if from_file is not None:
        # The file's layout, model and GPU count (torchrun's) stand for the flags.
        ingested = read_from(from_file, model=model)
        spec = ingested.model
    elif model is None:
        raise InputError("model", "name a model (see `scalelab models`) or give --from FILE")
    else:
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
    if fp8_recipe is not None:
        choice("fp8-recipe", fp8_recipe, ("tensorwise", "rowwise"))
    check_timeout("timeout-s", timeout_s)
    if not 0 <= seed < 2**63:
        raise InputError("seed", f"must be from 0 to 2**63 - 1, not {seed}")
    only_with("--profile-steps", profile_steps != 3, "--profile", profile)
    try:
        options = BenchOptions(
            steps=steps, warmup=warmup, repeats=repeats, seed=seed, lr=lr, grad_clip=grad_clip,
            compile=compile, compute_dtype=compute_dtype, data=data, profile=profile,  # type: ignore[arg-type]
            grad_sync=grad_sync,  # type: ignore[arg-type]
            fp8_recipe=fp8_recipe or "tensorwise", fp8_all_gather=fp8_all_gather,  # type: ignore[arg-type]
            profile_steps=profile_steps, timeout_s=timeout_s, predict=predict,
            out_dir=str(out),
        )  # fmt: skip
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InputError(str(err["loc"][0]).replace("_", "-"), err["msg"]) from None
    check_options(options)
    if not dry_run:
        writable_folder("out", out)
    worker = under_torchrun()
    positive("nnodes", nnodes)
    if worker:
        gpus = int(os.environ["WORLD_SIZE"])
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(gpus)))
    else:
        positive("nproc-per-node", nproc_per_node)
        gpus, per_node = nnodes * nproc_per_node, nproc_per_node
    if ingested is not None:
        built = ingested.layout
        if not worker and built.gpus != gpus:
            gpus = built.gpus
            per_node = nproc_per_node = min(gpus, ingested.gpus_per_node or gpus)
    else:
        seq_len = layout.pop("seq_len", None)
        seq_len = spec.seq_len if seq_len is None else seq_len
        built = build_layout(gpus=gpus, seq_len=seq_len, **layout)
    if fp8_recipe is not None and built.precision != "fp8":
        raise InputError("fp8-recipe", "--fp8-recipe needs --precision fp8")
    # The checks that need no cluster run before torch's import (~3 s), so bad input fails at once.
    check_layout(built, spec, per_node)
    check_layout_options(options, built, spec)
    if data is not None:
        check_tokens(data, spec.vocab_size, built.seq_len)
    if dry_run:
        from scalelab.config.catalog import load_cluster as _load_cluster

        reference = _load_cluster(cluster or "h100-ib")
        local = reference.model_copy(update={"gpus_per_node": per_node, "nvlink_domain": per_node})
        check(built, spec, local)
        plan = dry_run_plan(built, spec, per_node)
        if ingested is not None:
            plan["from"] = {"file": str(from_file), "framework": ingested.framework}
            plan["from"]["defaults"] = ingested.defaults
        if json_out:
            print_json(plan)
        else:
            render_plan(plan)
        return
    if not worker:  # before torch's import (not for --dry-run: it plans for other machines)
        check_nproc(nproc_per_node, visible_gpus(), oversubscribe)
    if gpus > per_node and not worker:
        raise InputError(
            "nnodes",
            f"{gpus} ranks over {gpus // per_node} nodes: launch them with torchrun on each node "
            "(torchrun --nnodes N --nproc_per_node G -m scalelab bench ...); here only --dry-run",
        )
    gpu = _detected_gpu()
    if gpu is not None and not worker:
        import torch

        check_nproc(nproc_per_node, torch.cuda.device_count(), oversubscribe)
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
            fp8.check_gloo(options.fp8_recipe, built.tp, built.sequence_parallel)
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


def dry_run_plan(layout: Any, spec: Any, gpus_per_node: int) -> dict[str, Any]:
    """What `scalelab bench` would run for `layout` (torch-free): ranks, the mesh (and the
    expert mesh), and each pipeline rank's stages with their layers."""
    from scalelab.config.pipeline import layout_stages, rank_stage_ids
    from scalelab.config.stack_rules import data_parallel_degrees

    replicate, shard = data_parallel_degrees(layout, gpus_per_node)
    mesh = {"pp": layout.pp, "dp_replicate": replicate, "dp_shard": shard}
    mesh |= {"cp": layout.cp, "tp": layout.tp}
    split = layout_stages(spec, layout)
    stages: list[dict[str, Any]] = []
    for pp_rank in range(layout.pp):
        for stage in rank_stage_ids(layout, pp_rank):
            chunk = split[stage]
            stages.append(
                {
                    "stage": stage,
                    "pp_rank": pp_rank,
                    "layers": [chunk.first_layer, chunk.end_layer - 1] if chunk.n_layers else [],
                    "n_layers": chunk.n_layers,
                    "embedding": chunk.embedding,
                    "norm_and_output": chunk.head,
                }
            )
    placed = sum(s["n_layers"] for s in stages)
    plan: dict[str, Any] = {
        "dry_run": True,
        "model": spec.name,
        "layout": layout.model_dump(),
        "label": layout.label,
        "ranks": layout.gpus,
        "nodes": max(1, layout.gpus // gpus_per_node),
        "ranks_per_node": min(layout.gpus, gpus_per_node),
        "mesh": mesh,
        "mesh_order": "pp, dp_replicate, dp_shard, cp, tp (tp innermost: consecutive ranks)",
        "micro_batches_per_step": layout.n_microbatches,
        "stages": stages,
        "layers_placed": placed,
    }
    if layout.ep > 1:
        inner = layout.cp * (layout.tp if layout.expert_tp == 1 else 1)
        plan["expert_mesh"] = {
            "ep": layout.ep,
            "expert_tp": layout.expert_tp,
            "dp_shard_in_ep": max(1, layout.ep // inner),
            "dp_shard_mod_ep": shard // max(1, layout.ep // inner),
        }
    return plan


def render_plan(plan: dict[str, Any]) -> None:
    """The dry run as text."""
    console.print(
        f"[bold]dry run[/]: {escape(plan['model'])}, {escape(plan['label'])}: "
        f"{plan['ranks']} ranks on {plan['nodes']} node(s) of {plan['ranks_per_node']}, "
        f"{plan['micro_batches_per_step']} micro-batch(es) per step; nothing launched"
    )
    for key, text in plan.get("from", {}).get("defaults", {}).items():
        console.print(
            f"  [dim]unstated, the framework's default: {escape(key)} = {escape(text)}[/]"
        )
    mesh = " x ".join(f"{k} {v}" for k, v in plan["mesh"].items())
    console.print(f"mesh: {mesh} ({plan['mesh_order']})")
    if "expert_mesh" in plan:
        console.print(
            "expert mesh: " + ", ".join(f"{k} {v}" for k, v in plan["expert_mesh"].items())
        )
    table = Table(title="pipeline stages")
    for col in ("pp rank", "stage", "layers", "embedding", "norm + output"):
        table.add_column(col, justify="right")
    for s in plan["stages"]:
        layers = f"{s['layers'][0]}-{s['layers'][1]} ({s['n_layers']})" if s["layers"] else "none"
        table.add_row(
            str(s["pp_rank"]), str(s["stage"]), layers,
            "yes" if s["embedding"] else "", "yes" if s["norm_and_output"] else "",
        )  # fmt: skip
    console.print(table)
    if "warning" in plan:
        console.print(f"[yellow]{escape(plan['warning'])}[/]")


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
