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
    AttentionOpt,
    CpOpt,
    GlobalBatchOpt,
    HsdpGroupOpt,
    JsonOpt,
    MicroBatchOpt,
    ModelArg,
    PpOpt,
    PrecisionOpt,
    RecomputeOpt,
    ReshardOpt,
    ScheduleOpt,
    SeqLenOpt,
    ShardingOpt,
    SpOpt,
    TpOpt,
    VstagesOpt,
    build_layout,
    console,
    err_console,
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
        help="catalog cluster or YAML (GPU peak for MFU, and --predict); default: from the GPU name, h100-ib to predict on CPU",
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


def _resolve_cluster(name: str | None, gpu: str | None) -> tuple[ClusterSpec | None, str | None]:
    from scalelab.config.catalog import load_cluster
    from scalelab.measure.config import default_cluster_for_gpu

    if name is not None:
        return load_cluster(name), name
    if gpu is not None:
        detected = default_cluster_for_gpu(gpu)
        if detected is not None:
            return load_cluster(detected), detected
    return None, None


def bench(
    model: ModelArg,
    seq_len: SeqLenOpt = None,
    global_batch: GlobalBatchOpt = None,
    sharding: ShardingOpt = "fsdp",
    hsdp_shard_size: HsdpGroupOpt = None,
    reshard_after_forward: ReshardOpt = True,
    tp: TpOpt = 1,
    sp: SpOpt = True,
    pp: PpOpt = 1,
    pp_schedule: ScheduleOpt = "1f1b",
    virtual_stages: VstagesOpt = 1,
    cp: CpOpt = 1,
    micro_batch: MicroBatchOpt = 1,
    recompute: RecomputeOpt = "none",
    precision: PrecisionOpt = "bf16",
    attention: AttentionOpt = "flash",
    nproc_per_node: NprocOpt = 1,
    steps: StepsOpt = 50,
    warmup: WarmupOpt = 10,
    repeats: RepeatsOpt = 3,
    seed: SeedOpt = 0,
    lr: LrOpt = 3e-4,
    grad_clip: ClipOpt = 1.0,
    compile: CompileOpt = False,
    compute_dtype: DtypeOpt = "auto",
    data: DataOpt = None,
    profile: ProfileOpt = False,
    profile_steps: ProfileStepsOpt = 3,
    timeout_s: TimeoutOpt = 600.0,
    cluster: BenchClusterOpt = None,
    predict: PredictOpt = False,
    out: OutOpt = Path("runs"),
    json_out: JsonOpt = False,
) -> None:
    """Train MODEL under a layout on this machine (or as one process of a torchrun job) and write
    one JSON record: tokens/s, MFU/HFU, memory, GPU energy, losses, over repeats."""
    from pydantic import ValidationError

    from scalelab.cli.common import choice, positive
    from scalelab.config.catalog import load_cluster, load_model
    from scalelab.config.layout import check
    from scalelab.measure.config import (
        BenchOptions,
        check_layout,
        check_model,
        check_options,
        check_tokens,
        under_torchrun,
    )

    spec = load_model(model)
    check_model(spec)
    for name, value in (("steps", steps), ("repeats", repeats), ("profile-steps", profile_steps)):
        positive(name, value)
    if warmup < 0:
        raise InputError("warmup", f"must be 0 or more, not {warmup}")
    choice("compute-dtype", compute_dtype, ("auto", "fp32", "bf16"))
    try:
        options = BenchOptions(
            steps=steps, warmup=warmup, repeats=repeats, seed=seed, lr=lr, grad_clip=grad_clip,
            compile=compile, compute_dtype=compute_dtype, data=data, profile=profile,  # type: ignore[arg-type]
            profile_steps=profile_steps, timeout_s=timeout_s, cluster=cluster, predict=predict,
            out_dir=str(out),
        )  # fmt: skip
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InputError(str(err["loc"][0]).replace("_", "-"), err["msg"]) from None
    check_options(options)
    worker = under_torchrun()
    if worker:
        gpus = int(os.environ["WORLD_SIZE"])
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(gpus)))
    else:
        positive("nproc-per-node", nproc_per_node)
        gpus = per_node = nproc_per_node
    layout = build_layout(
        gpus=gpus, seq_len=seq_len or spec.seq_len, global_batch=global_batch, sharding=sharding,
        hsdp_shard_size=hsdp_shard_size, reshard_after_forward=reshard_after_forward, tp=tp, sp=sp,
        pp=pp, pp_schedule=pp_schedule, virtual_stages=virtual_stages, cp=cp, micro_batch=micro_batch,
        recompute=recompute, precision=precision, attention=attention,
    )  # fmt: skip
    gpu = _detected_gpu()
    if gpu is not None and not worker:
        import torch

        if nproc_per_node > torch.cuda.device_count():
            raise InputError(
                "nproc-per-node",
                f"{nproc_per_node} processes but {torch.cuda.device_count()} GPUs here",
            )
    cluster_spec, cluster_name = _resolve_cluster(cluster, gpu)
    if gpu is None:
        cluster_spec = None  # a CPU run: the cluster name is recorded as given, its peak unused
    reference = cluster_spec or load_cluster("h100-ib")
    local = reference.model_copy(update={"gpus_per_node": per_node, "nvlink_domain": per_node})
    check(layout, spec, local)
    check_layout(layout, spec)
    if data is not None:
        check_tokens(data, spec.vocab_size, layout.seq_len)
    predict_cluster = None
    if predict:
        try:
            from scalelab.perf.predict import predict_layout  # noqa: F401
        except ImportError:
            raise InputError(
                "predict", "the predictor (scalelab.perf.predict) is not available in this install"
            ) from None
        predict_cluster = cluster_spec or load_cluster(cluster or "h100-ib")

    from scalelab.measure.launch import RunIdentity, base_record, launch, run_worker

    if worker or nproc_per_node == 1:
        rc, path = run_worker(spec, layout, options, cluster_spec, cluster_name, predict_cluster)
        if worker and (
            int(os.environ.get("RANK", "0")) != 0 or os.environ.get("SCALELAB_QUIET_WORKER")
        ):
            _exit(rc)
            return
    else:
        # A caller that runs many benchmarks (scalelab sweep) may fix the run's identity.
        identity = RunIdentity.from_env() or RunIdentity.new(spec, layout)
        failed = base_record(identity, spec, layout, options, cluster_name, "failed")
        argv = _worker_argv(
            model, layout, options, cluster, seq_len or spec.seq_len, json_out=False
        )
        rc, path = launch(argv, nproc_per_node, identity, out, failed)
    _report(path, json_out)
    _exit(rc)


def _exit(rc: int) -> None:
    """A failed run exits 1 (SystemExit passes through click and `main` unchanged)."""
    if rc != 0:
        raise SystemExit(1)


def _worker_argv(
    model: str, layout: Any, options: Any, cluster: str | None, seq_len: int, json_out: bool
) -> list[str]:
    """The same benchmark as explicit flags, for the processes torchrun starts."""
    args = [
        "bench", model,
        "--seq-len", str(seq_len), "--global-batch", str(layout.global_batch),
        "--sharding", layout.sharding,
        "--reshard-after-forward" if layout.reshard_after_forward else "--no-reshard-after-forward",
        "--tp", str(layout.tp), "--sp" if layout.sequence_parallel else "--no-sp",
        "--pp", str(layout.pp), "--pp-schedule", layout.pp_schedule,
        "--virtual-stages", str(layout.virtual_stages), "--cp", str(layout.cp),
        "--micro-batch", str(layout.micro_batch), "--recompute", layout.recompute,
        "--precision", layout.precision, "--attention", layout.attention,
        "--steps", str(options.steps), "--warmup", str(options.warmup),
        "--repeats", str(options.repeats), "--seed", str(options.seed), "--lr", repr(options.lr),
        "--grad-clip", repr(options.grad_clip), "--compile" if options.compile else "--no-compile",
        "--compute-dtype", options.compute_dtype, "--profile-steps", str(options.profile_steps),
        "--timeout-s", repr(options.timeout_s), "--out", options.out_dir,
    ]  # fmt: skip
    if layout.hsdp_shard_size is not None:
        args += ["--hsdp-shard-size", str(layout.hsdp_shard_size)]
    if options.data is not None:
        args += ["--data", options.data]
    if options.profile:
        args.append("--profile")
    if cluster is not None:
        args += ["--cluster", cluster]
    if options.predict:
        args.append("--predict")
    if json_out:
        args.append("--json")
    return args


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
    table = Table(title=f"{w['model']} · {path.name}")
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
        ("peak CUDA allocated (GiB)", "peak_memory_allocated_bytes", 2**-30, 2, False),
        ("peak RSS (GiB)", "peak_rss_bytes", 2**-30, 2, False),
        ("GPU power (W)", "avg_power_w", 1.0, 0, False),
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
        console.print(f"[dim]{field}: {reason}[/]")
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
