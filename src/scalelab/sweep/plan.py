"""A sweep expanded into its points: one `BenchJob` each, with a stable id.

A point's id is a hash of what determines the measurement (the model's architecture, nodes, GPUs
per node, layout, bench options, environment, run index), so the same point always gets the same
id and record name, and a sweep that is run again finds what it already measured. Every layout is
checked against its model and the cluster (and against what the harness runs) before anything
runs. An executor runs `point.job_for(out, created_utc)`, the point's job with its identity and
output folder.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scalelab.config.hardware import ClusterSpec
from scalelab.config.layout import Layout
from scalelab.config.model import ModelSpec
from scalelab.errors import InputError
from scalelab.measure.config import BenchOptions
from scalelab.measure.job import BenchJob, RunIdentity
from scalelab.sweep.schema import (
    SBATCH_KEY,
    BestLayouts,
    LayoutTemplate,
    SweepFile,
    check_slurm_value,
    check_sweep_name,
    first_error,
    layout_from_template,
    resolve_path,
)

# Bench options that do not change what is measured stay out of a point's id.
_NOT_IN_ID = ("out_dir", "predict", "timeout_s")


class Point(BaseModel):
    """One job of a sweep: its `BenchJob` and where it sits in the sweep."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    name: str = Field(description="the record's file stem")
    sweep: str
    model: str = Field(description="the model as the sweep names it: a catalog name or a YAML path")
    model_name: str
    nodes: int
    gpus_per_node: int
    run: int
    series: tuple[str, ...]
    env: dict[str, str]
    job: BenchJob = Field(description="the measurement (identity and output folder set per run)")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def layout(self) -> Layout:
        return self.job.layout

    @property
    def bench(self) -> BenchOptions:
        return self.job.options

    @property
    def cluster(self) -> str | None:
        return self.job.cluster

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

    def identity(self, created_utc: str) -> RunIdentity:
        return RunIdentity(
            run_id=self.id, created_utc=created_utc, name=self.name, tags=self.tags()
        )

    def job_for(self, out: str | Path, created_utc: str) -> BenchJob:
        """The job to run: the record `<out>/<name>.json` with the point's id and tags."""
        options = self.job.options.model_copy(update={"out_dir": str(out)})
        return self.job.model_copy(
            update={"options": options, "identity": self.identity(created_utc)}
        )

    def describe(self) -> str:
        return f"{self.model_name} {self.layout.label} on {self.nodes}x{self.gpus_per_node} run {self.run}"


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


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


def expand(sweep: SweepFile, base: Path) -> list[Point]:
    """Every point of the sweep, in order (models, then nodes, then layouts, then runs).

    Every layout is checked against its model and the cluster before anything runs; an invalid
    one is an `InputError` naming the layout and the scale.
    """
    from scalelab.config.catalog import load_cluster, load_model
    from scalelab.config.layout import check
    from scalelab.measure.config import (
        BenchOptions,
        check_layout,
        check_layout_options,
        check_model,
    )

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
        bench["data"] = resolve_path(str(bench["data"]), base)
    try:
        options = BenchOptions(**bench)
    except ValidationError as exc:
        raise first_error(exc, "bench") from None
    for key in ("steps", "warmup", "repeats", "profile_steps"):
        value = getattr(options, key, None)
        if isinstance(value, int) and value > 1_000_000:  # a typo that would run for ever
            raise InputError(f"bench.{key}", f"must be at most 1,000,000, not {value:,}")
    for key, value in sweep.slurm.model_dump().items():
        if isinstance(value, str):
            check_slurm_value(f"slurm.{key}", value)
    for key, value in sweep.slurm.additional.items():
        if not SBATCH_KEY.fullmatch(key):
            raise InputError(
                f"slurm.additional.{key}",
                "an sbatch option name: letters, digits and - or _ (e.g. gres, mail-type)",
            )
        check_slurm_value(f"slurm.additional.{key}", f"{key}={value}")

    cluster_arg = resolve_path(sweep.cluster, base) if sweep.cluster else None
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
        model_arg = resolve_path(model_text, base)
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
                        check_layout(layout, spec, gpn)
                        check_layout_options(options, layout, spec)
                    except InputError as exc:
                        raise InputError(
                            where, f"{spec.name} on {n} node(s): {exc.field}: {exc.message}"
                        ) from None
                    for run in range(sweep.runs):
                        description = {
                            "model": spec.identity(),
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
                        label = layout.slug
                        job = BenchJob(
                            model=spec,
                            layout=layout,
                            options=options,
                            cluster=cluster_arg,
                            nproc_per_node=gpn,
                        )
                        points[pid] = Point(
                            id=pid,
                            name=_safe(f"{spec.name}-{label}-n{n}x{gpn}-run{run}-{pid[:10]}"),
                            sweep=sweep.name,
                            model=model_arg,
                            model_name=spec.name,
                            nodes=n,
                            gpus_per_node=gpn,
                            run=run,
                            series=(series,),
                            env=dict(sweep.env),
                            job=job,
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
            raise first_error(exc, where) from None
        return _best(best, where, spec, cluster, gpus, batch, seq_len)
    try:
        template = LayoutTemplate(**entry)
        layout = layout_from_template(template, gpus, batch, seq_len)
    except ValidationError as exc:
        raise first_error(exc, where) from None
    return [(getattr(template, "name", None) or layout.slug, layout)]


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
