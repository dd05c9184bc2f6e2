"""The sweep file (YAML) and its expansion into points, each with a stable id.

A sweep is models × node counts × layouts × runs, plus the options every `scalelab bench` of it
gets. A layout is either written out (any `Layout` field but `gpus`, which the node count sets),
or `best: K`: the K best layouts that `scalelab search` finds at each scale (and that the harness
can run). A point is one `scalelab bench` job; its id is a hash of what determines the
measurement (the model's architecture, nodes, GPUs per node, layout, bench options, environment,
run index), so the same point always gets the same id and record name, and a sweep that is run
again finds what it already measured.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scalelab.config.hardware import ClusterSpec
from scalelab.config.layout import Layout
from scalelab.config.model import ModelSpec
from scalelab.errors import InputError

# Bench options that do not change what is measured stay out of a point's id.
_NOT_IN_ID = ("out_dir", "cluster", "predict", "timeout_s")
_SAFE_SLURM = re.compile(r"[\x00\n\r\\]")


class SlurmOptions(BaseModel):
    """How each point is submitted to SLURM (one job per point, one task per node)."""

    model_config = ConfigDict(extra="forbid")

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    time_min: int = Field(60, gt=0, description="time limit of each job, minutes")
    cpus_per_task: int | None = Field(None, gt=0, description="CPUs per node (one task per node)")
    mem_gb: float | None = Field(None, gt=0, description="memory per node, GB")
    exclusive: bool = True
    setup: list[str] = Field(
        default_factory=list,
        description="shell lines run in the job script before srun (module load, source a venv)",
    )
    additional: dict[str, str | int | bool] = Field(
        default_factory=dict, description="further #SBATCH flags, e.g. {gres: 'gpu:8'}"
    )
    port: int | None = Field(
        None, gt=0, lt=65536, description="rendezvous port (default: 29500 + job id mod 2000)"
    )
    python: str | None = Field(
        None, description="path of the Python on the nodes (default: this one); quoted in srun"
    )
    gpus: Literal["auto", "gpus-per-node", "gres", "none"] = Field(
        "auto",
        description=(
            "how each job asks for GPUs: auto = --gpus-per-node G when the sweep's cluster has GPUs"
            " and nothing otherwise (a CPU cluster, or no cluster named); gres = --gres=gpu:G"
            " (or gpu:TYPE:G with gres_type) for clusters that schedule GPUs as gres only"
        ),
    )
    poll_s: float = Field(
        10.0, gt=0, le=3600, description="seconds between checks of the jobs' states"
    )
    gres_type: str | None = Field(
        None, description="GPU type in --gres=gpu:TYPE:G (the cluster's name for it, e.g. h100)"
    )


class BestLayouts(BaseModel):
    """`best: K`: the K best layouts from `search` at each scale."""

    model_config = ConfigDict(extra="forbid")

    best: int = Field(gt=0)
    objective: str = "throughput"
    constraints: dict[str, Any] = Field(default_factory=dict)
    name: str | None = None


class ExplicitLayout(BaseModel):
    """A layout written out: every `Layout` field but `gpus` (global_batch optional)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    global_batch: int | None = Field(None, gt=0)
    sharding: str = "fsdp"
    hsdp_shard_size: int | None = Field(None, gt=0)
    reshard_after_forward: bool = True
    tp: int = Field(1, gt=0)
    sequence_parallel: bool = True
    pp: int = Field(1, gt=0)
    pp_schedule: str = "1f1b"
    virtual_stages: int = Field(1, gt=0)
    cp: int = Field(1, gt=0)
    micro_batch: int = Field(1, gt=0)
    recompute: str = "none"
    precision: str = "bf16"
    attention: str = "flash"


class SweepFile(BaseModel):
    """The YAML file `scalelab sweep` reads."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    models: list[str] = Field(min_length=1)
    cluster: str | None = Field(
        None, description="catalog cluster or YAML: search, validation, MFU peak, prediction"
    )
    nodes: list[int] = Field(default_factory=lambda: [1], min_length=1)
    gpus_per_node: int | list[int] | None = Field(
        None,
        description="one value or a list (single-node scaling); default: the cluster's, else 1",
    )
    seq_len: int | None = Field(None, gt=0, description="default: the model's")
    global_batch_per_gpu: int | None = Field(
        None, gt=0, description="weak scaling: global batch = GPUs × this (default 1)"
    )
    global_batch: int | None = Field(None, gt=0, description="strong scaling: a fixed batch")
    layouts: list[dict[str, Any]] = Field(default_factory=lambda: [{"sharding": "fsdp"}])
    runs: int = Field(1, gt=0, description="independent jobs of each point")
    bench: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    slurm: SlurmOptions = Field(default_factory=SlurmOptions)


class Point(BaseModel):
    """One `scalelab bench` job of a sweep."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    name: str = Field(description="the record's file stem")
    sweep: str
    model: str = Field(description="what bench is given: a catalog name or a YAML path")
    model_name: str
    nodes: int
    gpus_per_node: int
    layout: dict[str, Any]
    run: int
    series: tuple[str, ...]
    bench: dict[str, Any]
    cluster: str | None
    env: dict[str, str]

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def tags(self) -> dict[str, Any]:
        """What the record carries about the sweep (`workload["tags"]`)."""
        return {
            "sweep": self.sweep,
            "point": self.id,
            "series": list(self.series),
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "run": self.run,
        }

    def describe(self) -> str:
        return f"{self.model_name} {layout_label(self.layout)} on {self.nodes}x{self.gpus_per_node} run {self.run}"


def layout_label(layout: dict[str, Any]) -> str:
    """A short layout name without the GPU count: `fsdp`, `hsdp4-tp2`, `fsdp-pp2-1f1b-ac-full`."""
    sharding = layout.get("sharding", "fsdp")
    if sharding == "hsdp" and layout.get("hsdp_shard_size"):
        sharding = f"hsdp{layout['hsdp_shard_size']}"
    parts = [sharding]
    if layout.get("tp", 1) > 1:
        parts.append(f"tp{layout['tp']}" + ("sp" if layout.get("sequence_parallel") else ""))
    if layout.get("pp", 1) > 1:
        parts.append(f"pp{layout['pp']}-{layout.get('pp_schedule', '1f1b')}")
        if layout.get("virtual_stages", 1) > 1:
            parts.append(f"v{layout['virtual_stages']}")
    if layout.get("cp", 1) > 1:
        parts.append(f"cp{layout['cp']}")
    if layout.get("micro_batch", 1) > 1:
        parts.append(f"mb{layout['micro_batch']}")
    if layout.get("recompute", "none") != "none":
        parts.append(f"ac-{layout['recompute']}")
    if not layout.get("reshard_after_forward", True):
        parts.append("noreshard")
    return "-".join(parts)


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def _first_error(exc: ValidationError, prefix: str) -> InputError:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    field = f"{prefix}.{where}" if prefix and where else (prefix or where or "sweep")
    return InputError(field, str(err["msg"]))


def _resolve_path(text: str, base: Path) -> str:
    """A path relative to the sweep file, made absolute; catalog names are left alone."""
    candidate = base / text
    if not Path(text).is_absolute() and candidate.exists():
        return str(candidate.resolve())
    return text


def load_sweep(path: str | Path) -> tuple[SweepFile, Path]:
    """Read and check a sweep file; returns it and the folder relative paths start from."""
    p = Path(path)
    if not p.is_file():
        raise InputError("sweep", f"no such file: {p}")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise InputError("sweep", f"{p} is not valid YAML ({exc.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise InputError("sweep", f"{p} must hold a YAML mapping (models, nodes, layouts, ...)")
    try:
        sweep = SweepFile(**data)
    except ValidationError as exc:
        raise _first_error(exc, "") from None
    if sweep.name is None:
        sweep = sweep.model_copy(update={"name": p.stem})
    return sweep, p.resolve().parent


def _local_cluster(cluster: ClusterSpec, gpus_per_node: int) -> ClusterSpec:
    if cluster.gpus_per_node == gpus_per_node:
        return cluster
    update: dict[str, Any] = {"gpus_per_node": gpus_per_node}
    if cluster.nvlink_domain == cluster.gpus_per_node or cluster.nvlink_domain < gpus_per_node:
        update["nvlink_domain"] = gpus_per_node
    return cluster.model_copy(update=update)


def point_id(description: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a point's description, 16 hex digits."""
    text = json.dumps(description, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_SBATCH_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
_SWEEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_sweep_name(name: str) -> str:
    """A sweep name: it names the SLURM job and the output folder, so one plain word."""
    if not _SWEEP_NAME.fullmatch(name):
        raise InputError(
            "name",
            f"{name!r}: 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    return name


def check_slurm_value(field: str, value: str) -> str:
    """A value for an `#SBATCH` line: one line, no backslash (sbatch reads `\\` as an escape)."""
    if _SAFE_SLURM.search(value):
        raise InputError(
            field, f"{value!r} may not contain a newline, a backslash or a NUL character"
        )
    return value


def expand(sweep: SweepFile, base: Path) -> list[Point]:
    """Every point of the sweep, in order (models, then nodes, then layouts, then runs).

    Every layout is checked against its model and the cluster before anything runs; an invalid
    one is an `InputError` naming the layout and the scale.
    """
    from scalelab.config.catalog import load_cluster, load_model
    from scalelab.config.layout import check
    from scalelab.measure.config import BenchOptions, check_layout, check_model

    assert sweep.name is not None
    check_sweep_name(sweep.name)
    for i, n in enumerate(sweep.nodes):
        if n < 1:
            raise InputError(f"nodes[{i}]", f"must be a positive integer, not {n}")
    if sweep.global_batch is not None and sweep.global_batch_per_gpu is not None:
        raise InputError("global_batch", "give global_batch or global_batch_per_gpu, not both")
    for key in ("out_dir", "cluster"):
        if key in sweep.bench:
            raise InputError(f"bench.{key}", "set by the sweep (--out, cluster), not under bench")
    bench = dict(sweep.bench)
    if bench.get("data"):
        bench["data"] = _resolve_path(str(bench["data"]), base)
    try:
        options = BenchOptions(**bench)
    except ValidationError as exc:
        raise _first_error(exc, "bench") from None
    for key, value in sweep.slurm.model_dump().items():
        if isinstance(value, str):
            check_slurm_value(f"slurm.{key}", value)
    for key, value in sweep.slurm.additional.items():
        if not _SBATCH_KEY.fullmatch(key):
            raise InputError(
                f"slurm.additional.{key}",
                "an sbatch option name: letters, digits and - or _ (e.g. gres, mail-type)",
            )
        check_slurm_value(f"slurm.additional.{key}", f"{key}={value}")

    cluster_arg = _resolve_path(sweep.cluster, base) if sweep.cluster else None
    try:
        reference = load_cluster(cluster_arg or "h100-ib")
    except InputError as exc:
        raise InputError("cluster", exc.message) from None
    if sweep.gpus_per_node is None:
        gpns = [reference.gpus_per_node if sweep.cluster else 1]
    elif isinstance(sweep.gpus_per_node, int):
        gpns = [sweep.gpus_per_node]
    else:
        gpns = list(sweep.gpus_per_node)
    if not gpns:
        raise InputError("gpus_per_node", "give at least one value")
    for g in gpns:
        if g < 1:
            raise InputError("gpus_per_node", f"must be a positive integer, not {g}")
    measured = options.model_dump(exclude=set(_NOT_IN_ID))

    points: dict[str, Point] = {}
    for mi, model_text in enumerate(sweep.models):
        model_arg = _resolve_path(model_text, base)
        try:
            spec = load_model(model_arg)
            check_model(spec)
        except InputError as exc:
            raise InputError(f"models[{mi}]", exc.message) from None
        seq_len = sweep.seq_len or spec.seq_len
        for n, gpn in ((n, g) for n in sweep.nodes for g in gpns):
            cluster = _local_cluster(reference, gpn)
            gpus = n * gpn
            if sweep.global_batch is not None:
                batch = sweep.global_batch
            else:
                batch = (sweep.global_batch_per_gpu or 1) * gpus
            for li, entry in enumerate(sweep.layouts):
                where = f"layouts[{li}]"
                for series, layout in _layouts(entry, where, spec, cluster, gpus, batch, seq_len):
                    try:
                        check(layout, spec, cluster)
                        check_layout(layout, spec)
                    except InputError as exc:
                        raise InputError(
                            where, f"{spec.name} on {n} node(s): {exc.field}: {exc.message}"
                        ) from None
                    for run in range(sweep.runs):
                        description = {
                            "model": spec.model_dump(exclude={"source"}),
                            "nodes": n,
                            "gpus_per_node": gpn,
                            "layout": layout.model_dump(),
                            "bench": measured,
                            "env": sweep.env,
                            "run": run,
                        }
                        pid = point_id(description)
                        if pid in points:
                            old = points[pid]
                            if series not in old.series:
                                points[pid] = old.model_copy(
                                    update={"series": (*old.series, series)}
                                )
                            continue
                        label = layout_label(layout.model_dump())
                        points[pid] = Point(
                            id=pid,
                            name=_safe(f"{spec.name}-{label}-n{n}x{gpn}-run{run}-{pid[:10]}"),
                            sweep=sweep.name,
                            model=model_arg,
                            model_name=spec.name,
                            nodes=n,
                            gpus_per_node=gpn,
                            layout=layout.model_dump(),
                            run=run,
                            series=(series,),
                            bench=options.model_dump(exclude={"out_dir", "cluster"}),
                            cluster=cluster_arg,
                            env=dict(sweep.env),
                        )
    return list(points.values())


def _layouts(
    entry: dict[str, Any],
    where: str,
    spec: ModelSpec,
    cluster: ClusterSpec,
    gpus: int,
    batch: int,
    seq_len: int,
) -> list[tuple[str, Layout]]:
    """The (series label, layout) pairs one entry of `layouts` gives at one scale."""
    if not isinstance(entry, dict):
        raise InputError(where, "each layout is a mapping of Layout fields, or {best: K}")
    if "best" in entry:
        try:
            best = BestLayouts(**entry)
        except ValidationError as exc:
            raise _first_error(exc, where) from None
        return _best(best, where, spec, cluster, gpus, batch, seq_len)
    try:
        explicit = ExplicitLayout(**entry)
    except ValidationError as exc:
        raise _first_error(exc, where) from None
    fields = explicit.model_dump(exclude={"name", "global_batch"})
    try:
        layout = Layout(
            gpus=gpus, global_batch=explicit.global_batch or batch, seq_len=seq_len, **fields
        )
    except ValidationError as exc:
        raise _first_error(exc, where) from None
    return [(explicit.name or layout_label(layout.model_dump()), layout)]


def _best(
    best: BestLayouts,
    where: str,
    spec: ModelSpec,
    cluster: ClusterSpec,
    gpus: int,
    batch: int,
    seq_len: int,
) -> list[tuple[str, Layout]]:
    from dataclasses import fields as dc_fields

    from scalelab.measure.config import check_layout
    from scalelab.search import Constraints, search

    known = {f.name for f in dc_fields(Constraints)}
    unknown = sorted(set(best.constraints) - known)
    if unknown:
        raise InputError(
            f"{where}.constraints", f"unknown '{unknown[0]}'; allowed: {', '.join(sorted(known))}"
        )
    try:
        constraints = Constraints(**best.constraints)
        result = search(
            spec,
            cluster,
            gpus=gpus,
            global_batch=batch,
            seq_len=seq_len,
            objective=best.objective,
            constraints=constraints,
            top_k=best.best + 50,
        )
    except InputError as exc:
        raise InputError(f"{where}.{exc.field}", exc.message) from None
    except (TypeError, ValueError) as exc:
        raise InputError(f"{where}.constraints", str(exc)) from None
    chosen: list[Layout] = []
    for row in result.top:
        layout = Layout(**row["layout"])
        try:
            check_layout(layout, spec)  # what the harness can run
        except InputError:
            continue
        chosen.append(layout)
        if len(chosen) == best.best:
            break
    if not chosen:
        raise InputError(
            where, f"search finds no layout of {spec.name} on {gpus} GPUs that fits and bench runs"
        )
    prefix = best.name or "best"
    return [(f"{prefix}-{i + 1}", layout) for i, layout in enumerate(chosen)]


def bench_args(point: Point, out: Path | str) -> list[str]:
    """`scalelab bench` arguments for a point (after `python -m scalelab`)."""
    lay = point.layout
    opts = point.bench
    args = [
        "bench", point.model,
        "--seq-len", str(lay["seq_len"]), "--global-batch", str(lay["global_batch"]),
        "--sharding", lay["sharding"],
        "--reshard-after-forward" if lay["reshard_after_forward"] else "--no-reshard-after-forward",
        "--tp", str(lay["tp"]), "--sp" if lay["sequence_parallel"] else "--no-sp",
        "--pp", str(lay["pp"]), "--pp-schedule", lay["pp_schedule"],
        "--virtual-stages", str(lay["virtual_stages"]), "--cp", str(lay["cp"]),
        "--micro-batch", str(lay["micro_batch"]), "--recompute", lay["recompute"],
        "--precision", lay["precision"], "--attention", lay["attention"],
        "--steps", str(opts["steps"]), "--warmup", str(opts["warmup"]),
        "--repeats", str(opts["repeats"]), "--seed", str(opts["seed"]),
        "--lr", repr(float(opts["lr"])), "--grad-clip", repr(float(opts["grad_clip"])),
        "--compile" if opts["compile"] else "--no-compile",
        "--compute-dtype", opts["compute_dtype"], "--profile-steps", str(opts["profile_steps"]),
        "--timeout-s", repr(float(opts["timeout_s"])), "--out", str(out),
        "--nproc-per-node", str(point.gpus_per_node),
    ]  # fmt: skip
    if lay.get("hsdp_shard_size") is not None:
        args += ["--hsdp-shard-size", str(lay["hsdp_shard_size"])]
    if opts.get("data"):
        args += ["--data", str(opts["data"])]
    if opts.get("profile"):
        args.append("--profile")
    if point.cluster is not None:
        args += ["--cluster", point.cluster]
    if opts.get("predict"):
        args.append("--predict")
    return args
