"""The sweep file (YAML) that `scalelab sweep` reads: its schema, checked by pydantic.

A sweep is models × node counts × layouts × runs, plus the bench options every job of it gets.
A layout is either a template of the config `Layout` (any field but `gpus` and `seq_len`, which
the scale and the sweep set; `global_batch` optional; the same field types, Literals and checks
as `Layout` itself, because the template is made from `Layout`'s own fields), or `best: K`: the K
best layouts that `scalelab search` finds at each scale. `plan.py` expands a sweep into jobs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from scalelab.config.layout import Layout
from scalelab.config.strict import StrictNumbers
from scalelab.errors import InputError
from scalelab.io import load_user_yaml

_SAFE_SLURM = re.compile(r"[\x00\n\r\\]")
# An environment variable's name (POSIX: letters, digits and _, not starting with a digit); a
# name with `=` or a space cannot be set (`os.environ`, `execve`), a NUL ends a value early.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Layout fields a template leaves to the sweep: the scale sets gpus, the sweep seq_len.
_SET_BY_SWEEP = ("gpus", "seq_len", "global_batch")


class SlurmOptions(StrictNumbers):
    """How each point is submitted to SLURM (one job per point, one task per node)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    time_min: int = Field(
        60,
        gt=0,
        le=5_256_000,
        description="time limit of each job, minutes (at most ten years: longer is a typo)",
    )
    cpus_per_task: int | None = Field(
        None,
        gt=0,
        le=2**16,
        description="CPUs per node (one task per node; at most 65,536: no node has more)",
    )
    mem_gb: float | None = Field(
        None,
        gt=0,
        le=1_000_000,
        description="memory per node, GB (at most 1,000,000: no node has a petabyte; SLURM "
        "takes it in MB)",
    )
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


def _layout_template() -> type[BaseModel]:
    """`Layout`'s own fields (types, defaults, checks, descriptions) minus what the sweep sets."""
    fields: dict[str, Any] = {
        name: (info.annotation, info)
        for name, info in Layout.model_fields.items()
        if name not in _SET_BY_SWEEP
    }
    fields["name"] = (str | None, Field(None, description="the series name in reports"))
    fields["global_batch"] = (
        int | None,
        Field(
            None, gt=0, description="a fixed global batch for this layout (default: the sweep's)"
        ),
    )
    return create_model(  # type: ignore[call-overload,no-any-return]
        "LayoutTemplate", __config__=ConfigDict(extra="forbid", frozen=True), **fields
    )


LayoutTemplate = _layout_template()


def layout_from_template(template: BaseModel, gpus: int, global_batch: int, seq_len: int) -> Layout:
    """The `Layout` a template gives at one scale."""
    fields = template.model_dump(exclude={"name", "global_batch"})
    batch = getattr(template, "global_batch", None) or global_batch
    return Layout(gpus=gpus, global_batch=batch, seq_len=seq_len, **fields)


class SweepFile(StrictNumbers):
    """The YAML file `scalelab sweep` reads."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

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
    env: dict[str, str] = Field(
        default_factory=dict, description="environment variables every job of the sweep gets"
    )
    slurm: SlurmOptions = Field(default_factory=SlurmOptions)

    @field_validator("env")
    @classmethod
    def _env_can_be_set(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(
                    f"{name!r} is not a variable name: letters, digits and _, not starting with "
                    "a digit"
                )
            if "\x00" in value:
                raise ValueError(f"{name}: a value may not contain a NUL character")
        return env


def first_error(exc: ValidationError, prefix: str) -> InputError:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    field = f"{prefix}.{where}" if prefix and where else (prefix or where or "sweep")
    return InputError(field, str(err["msg"]).removeprefix("Value error, "))


def resolve_path(text: str, base: Path) -> str:
    """A path relative to the sweep file, made absolute; catalog names are left alone."""
    candidate = base / text
    if not Path(text).is_absolute() and candidate.exists():
        return str(candidate.resolve())
    return text


def load_sweep(path: str | Path) -> tuple[SweepFile, Path]:
    """Read and check a sweep file; returns it and the folder relative paths start from."""
    p = Path(path)
    data = load_user_yaml("sweep", p)  # missing, a folder, a device, too large: one line
    if not isinstance(data, dict):
        raise InputError("sweep", f"{p} must hold a YAML mapping (models, nodes, layouts, ...)")
    try:
        sweep = SweepFile(**data)
    except ValidationError as exc:
        raise first_error(exc, "") from None
    if sweep.name is None:
        sweep = sweep.model_copy(update={"name": p.stem})
    return sweep, p.resolve().parent


SBATCH_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
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
