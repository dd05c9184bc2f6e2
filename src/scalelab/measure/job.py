"""What one harness run is asked to do, as one typed value: a `BenchJob` or a `CommJob`.

A job holds everything a worker process needs (model, layout, bench options, cluster, the run's
identity), is checked by pydantic when it is made and when it is read back, and travels to the
processes torchrun starts as a JSON file (`write_job`, `read_job`), so there is one description of
a run instead of command-line flags rebuilt by each caller. `scalelab bench`, `scalelab comm`
and `scalelab sweep` build jobs; `scalelab.measure.launch` starts one under torchrun;
`scalelab.measure.worker` runs it. No torch here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from scalelab.config.layout import Layout
from scalelab.config.model import ModelSpec
from scalelab.io import atomic_write_text
from scalelab.measure.config import BenchOptions
from scalelab.results import new_run_id, record_name, utc_now

JOB_SUFFIX = ".job"  # job files are JSON, named so that record loaders (`*.json`) never see them


class RunIdentity(BaseModel):
    """The run id, creation time and record file name every rank of one run shares.

    A caller that runs many benchmarks (`scalelab sweep`) chooses them itself, so that it finds a
    run's record by name, and may attach `tags` that land in the record's `workload["tags"]`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    created_utc: str
    name: str = Field(description="the record's file stem")
    tags: dict[str, Any] | None = None

    @classmethod
    def new(cls, kind: str, label: str) -> RunIdentity:
        run_id, created = new_run_id(), utc_now()
        return cls(
            run_id=run_id, created_utc=created, name=record_name(kind, label, created, run_id)
        )


def layout_label(layout: Layout) -> str:
    """A short name for file names: `g2-fsdp`, `g4-hsdp-tp2sp`, `g4-fsdp-pp2-1f1b`."""
    return f"g{layout.gpus}-{layout.slug}"


class BenchJob(BaseModel):
    """One training benchmark: train `model` under `layout` with `options`; one record."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["bench"] = "bench"
    model: ModelSpec
    layout: Layout
    options: BenchOptions = Field(default_factory=BenchOptions)
    cluster: str | None = Field(
        None,
        description="catalog cluster or YAML path for the GPU's dense peak (MFU); default: "
        "from the CUDA device's name. Recorded as given.",
    )
    nproc_per_node: int = Field(1, gt=0, description="processes per node (GPUs, or CPU ranks)")
    identity: RunIdentity | None = Field(
        None, description="the run's identity; None: rank 0 makes one and shares it"
    )

    @property
    def out_dir(self) -> Path:
        return Path(self.options.out_dir)

    @property
    def timeout_s(self) -> float:
        return self.options.timeout_s

    def new_identity(self, world_size: int | None = None) -> RunIdentity:
        return RunIdentity.new("bench", f"{self.model.name}-{layout_label(self.layout)}")


class CommJob(BaseModel):
    """One collective sweep (nccl-tests definitions) over message sizes; one record."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["comm"] = "comm"
    collectives: list[str] = Field(min_length=1)
    sizes_bytes: list[int] = Field(min_length=1)
    iters: int = Field(20, gt=0)
    warmup: int = Field(5, ge=0)
    check_iters: int = Field(
        1, ge=0, description="result checks per size and mode (nccl-tests' -c); 0: none"
    )
    timeout_s: float = Field(300.0, gt=0)
    cluster: str | None = Field(None, description="cluster name to record (for calibrate)")
    nproc_per_node: int = Field(2, gt=0)
    out: str = "runs"
    identity: RunIdentity | None = None

    @property
    def out_dir(self) -> Path:
        return Path(self.out)

    def new_identity(self, world_size: int | None = None) -> RunIdentity:
        world = world_size or self.nproc_per_node
        label = f"{'-'.join(c.replace('_', '') for c in self.collectives)}-n{world}"
        return RunIdentity.new("comm", label)


Job = Annotated[BenchJob | CommJob, Field(discriminator="kind")]
_JOB: TypeAdapter[BenchJob | CommJob] = TypeAdapter(Job)


def write_job(job: BenchJob | CommJob, path: str | Path) -> Path:
    """The job as a JSON file (written atomically) for the worker processes to read."""
    return atomic_write_text(Path(path), job.model_dump_json(indent=1) + "\n")


def read_job(path: str | Path) -> BenchJob | CommJob:
    """A job file back as a typed job (validated again: a hand-edited file fails here)."""
    return _JOB.validate_json(Path(path).read_text(encoding="utf-8"))
