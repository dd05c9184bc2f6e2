"""Row adapters: published runs turned into the predictor's inputs, and predicted.

Runs come typed (`scalelab.runs`): the shipped `published_runs_typed.csv`, another typed file, or a
raw CSV in the `published_runs.csv` column layout read by the generic importer. A `RunCase` is one
run the predictor can express (its model, cluster and layout); the statistics
(`scalelab.validate.stats`) see only the arrays these cases give.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import ValidationError

from scalelab.config.catalog import load_stack

if TYPE_CHECKING:
    from scalelab.calibrate import StepPoint
from scalelab.config.hardware import ClusterSpec
from scalelab.config.layout import Layout, LayoutTable, rule_violations
from scalelab.config.model import ModelSpec
from scalelab.config.stack import StackSpec
from scalelab.errors import InputError
from scalelab.io import read_user_text
from scalelab.perf.predict import predict
from scalelab.runs.importer import Reading, import_rows, read_raw_csv, read_review, read_table
from scalelab.runs.rules import read_stack
from scalelab.runs.schema import MoERun, Run, is_typed_header, read_runs

TYPED_DATA = "data/published_runs_typed.csv"
SKIPPED_DATA = "data/published_runs_skipped.csv"
RAW_DATA = "data/published_runs.csv"
REVIEW_DATA = "data/published_runs_review.csv"
# Mixture-of-experts runs: typed directly (no raw reading), reported apart from the dense runs.
MOE_DATA = "data/published_runs_moe.csv"
MOE_SKIPPED_DATA = "data/published_runs_moe_skipped.csv"


@dataclass
class RunCase:
    """One run the predictor can express: the run and its predictor inputs."""

    run: Run
    model: ModelSpec
    cluster: ClusterSpec
    layout: Layout
    stack: StackSpec = field(default_factory=load_stack)

    @property
    def index(self) -> int:
        return self.run.row

    @property
    def source(self) -> str:
        return self.run.source_group

    @property
    def measured_tokens_per_s_per_gpu(self) -> float:
        return self.run.tokens_per_s_per_gpu

    def step_point(self, **options: Any) -> StepPoint:
        """This run as a calibration point: its measured step time, its own cluster and stack
        unless `options` say otherwise (weight, source, another stack)."""
        from scalelab.calibrate import StepPoint

        layout = self.layout
        step_s = (
            layout.global_batch
            * layout.seq_len
            / (self.measured_tokens_per_s_per_gpu * layout.gpus)
        )
        given: dict[str, Any] = {"hardware": self.cluster, "stack": self.stack, **options}
        return StepPoint(self.model, layout, step_s, **given)

    @property
    def sweep(self) -> tuple[str, str, str, int]:
        """Sweeps are defined by the data: same source group, model, GPU and sequence length."""
        return (self.run.source_group, self.run.model, self.run.gpu, self.run.seq_len)


# The run's fields the memory model reads (perf/memory.py through the model, layout and GPU).
MEMORY_INPUTS = frozenset(
    {
        "n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "tied_embeddings",
        "seq_len", "gpus", "gpu_memory_gib", "global_batch", "micro_batch", "sharding",
        "hsdp_shard_size", "tp", "sequence_parallel", "pp", "pp_schedule", "virtual_stages", "cp",
        "recompute", "attention", "cross_entropy",
    }
)  # fmt: skip


def memory_unstated(case: RunCase) -> list[str]:
    """What a memory verdict on this run rests on that the run does not state: each memory input
    it leaves to an assumption, and a framework without a stack profile (whose loss and
    checkpointing the generic stack then assumes). Empty when the verdict rests on the run."""
    run = case.run
    # What follows from what the row names (a family's architecture) is known, not guessed.
    reasons = [f"{name} not stated" for name in run.assumed_beyond_named if name in MEMORY_INPUTS]
    if read_stack(run.stack) is None:
        named = f"framework {run.stack!r}" if run.stack else "no framework stated"
        reasons.append(f"{named}: no stack profile, the generic stack's loss is assumed")
    return reasons


def measured(cases: list[RunCase]) -> np.ndarray:
    """Measured tokens/s per GPU of every case."""
    return np.array([c.measured_tokens_per_s_per_gpu for c in cases])


# Loading ---------------------------------------------------------------------------------------


def _package_text(name: str) -> str:
    return resources.files("scalelab").joinpath(name).read_text()


def shipped_readings() -> list[Reading]:
    """The shipped raw file read by the importer with the shipped review sheet (for --explain)."""
    return import_rows(
        read_raw_csv(_package_text(RAW_DATA)), read_review(_package_text(REVIEW_DATA))
    )


def is_typed_text(text: str) -> bool:
    """A typed runs file (its first column is schema_version), in any CSV dialect."""
    if not text.strip():
        return False
    header, _ = read_table(text.split("\n", 1)[0], "data")
    return is_typed_header(header)


def load_runs(
    data: Path | None = None, review: Path | None = None
) -> tuple[list[Run], list[tuple[int, str]]]:
    """Runs and (row, reason) for every reason a row could not be read (a row may give several).

    No `data`: the shipped typed file and the skips recorded beside it. A typed file (first column
    schema_version) is read as it is; any other CSV goes through the importer (with `review`).
    """
    if data is None:
        runs = read_runs(_package_text(TYPED_DATA))
        records = csv.DictReader(io.StringIO(_package_text(SKIPPED_DATA)))
        return runs, [(int(r["row"]), r["reason"]) for r in records]
    text = read_user_text("data", data)
    if is_typed_text(text):
        return read_runs(text.removeprefix("\ufeff"), "data"), []
    if review is not None and not review.is_file():
        raise InputError("review", f"no such file: {review}")
    entries = read_review(read_user_text("review", review)) if review else []
    readings = import_rows(read_raw_csv(text), entries)
    runs = [r.run for r in readings if r.run is not None]
    return runs, [(r.row, reason) for r in readings for reason in r.reasons]


def load_moe_cases() -> tuple[list[RunCase], list[tuple[int, str]]]:
    """The shipped MoE runs the predictor can express, and (row, reason) for the others."""
    runs = read_runs(_package_text(MOE_DATA), MOE_DATA, kind=MoERun)
    records = csv.DictReader(io.StringIO(_package_text(MOE_SKIPPED_DATA)))
    skipped = [(int(r["row"]), r["reason"]) for r in records]
    return cases_from_runs(runs, skipped)


def cases_from_runs(
    runs: list[Run], skipped: list[tuple[int, str]]
) -> tuple[list[RunCase], list[tuple[int, str]]]:
    """The runs the predictor can express, and `skipped` with (row, reason) of the others added."""
    cases: list[RunCase] = []
    for run in runs:
        case = case_from_run(run)
        if isinstance(case, str):
            skipped.append((run.row, case))
        else:
            cases.append(case)
    return cases, skipped


def case_from_run(run: Run) -> RunCase | str:
    """The predictor's inputs for a run, or why the predictor cannot express it."""
    try:
        model = run.model_spec()
        cluster = run.cluster_spec()
        layout = run.layout()
    except (ValidationError, ValueError) as exc:
        return f"not expressible by the predictor ({str(exc).splitlines()[0]})"
    errors = rule_violations(layout, model, cluster)
    if errors:
        return f"layout not valid for the predictor ({errors[0].field})"
    stack = load_stack(read_stack(run.stack))
    if run.norm_kernel is not None and run.norm_kernel != stack.norm_kernel:
        # The run states how its norm ran (a fused kernel, torch.compile, or eager ops).
        stack = stack.model_copy(update={"norm_kernel": run.norm_kernel})
    if run.cross_entropy is not None and run.cross_entropy != stack.cross_entropy:
        # The run (or its framework version) says how its loss ran.
        stack = stack.model_copy(update={"cross_entropy": run.cross_entropy})
    stack = stack.for_recipe(str(run.precision))
    try:
        stack.check(layout)
    except InputError as exc:
        return f"layout not offered by the stack it names ({exc})"
    return RunCase(run, model, cluster, layout, stack)


def load_cases(
    data: Path | None = None, review: Path | None = None
) -> tuple[list[RunCase], list[tuple[int, str]]]:
    runs, skipped = load_runs(data, review)
    return cases_from_runs(runs, skipped)


# Prediction ------------------------------------------------------------------------------------


def predict_cases_full(
    cases: list[RunCase], params: dict[str, dict[str, float]] | None = None
) -> dict[str, np.ndarray]:
    """Tokens/s per GPU, the memory verdict and the predicted peak memory (GiB) of every case.

    `params` overrides cluster parameters by catalog cluster name (for cross-validation).
    """
    out = {
        "tokens_per_s_per_gpu": np.zeros(len(cases)),
        "fits": np.zeros(len(cases), dtype=bool),
        "memory_gib": np.zeros(len(cases)),
    }
    groups: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    clusters: dict[str, ClusterSpec] = {}
    for i, case in enumerate(cases):
        cluster = case.cluster
        update = (params or {}).get(case.run.cluster)
        if update:
            cluster = cluster.model_copy(
                update={"params": cluster.params.model_copy(update=update)}
            )
        key = cluster.model_dump_json()
        clusters[key] = cluster
        groups[(case.model.model_dump_json(), key, case.stack.model_dump_json())].append(i)
    for (_, key, _), idx in groups.items():
        table = LayoutTable.from_layouts([cases[i].layout for i in idx])
        prediction = predict(cases[idx[0]].model, clusters[key], table, cases[idx[0]].stack)
        out["tokens_per_s_per_gpu"][idx] = prediction["tokens_per_s_per_gpu"]
        out["fits"][idx] = prediction["fits"]
        out["memory_gib"][idx] = prediction["memory_total_bytes"] / 2**30
    return out


def predict_cases(cases: list[RunCase]) -> np.ndarray:
    """Predicted tokens/s per GPU of each case with its catalog cluster's parameters."""
    return predict_cases_full(cases)["tokens_per_s_per_gpu"]
