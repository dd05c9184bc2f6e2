"""The Python API: `scalelab.predict(...)` and `scalelab.search(...)`, for notebooks and scripts.

Both take what the CLI takes (a model and a cluster by catalog name or YAML path, or as loaded
specs; a stack; the layout's fields as keyword arguments) and return typed results with
`.to_pandas()`. They run the same code as `scalelab predict` and `scalelab search`, so the numbers
are the CLI's. Bad input raises `scalelab.errors.InputError` (a `ValueError`) naming the field.

    >>> import scalelab
    >>> p = scalelab.predict("llama2-7b", "h100-ib", gpus=8, tp=2)
    >>> round(p.mfu, 2) > 0
    True
    >>> s = scalelab.search("llama2-7b", "h100-ib", gpus=16, top=3)
    >>> s.to_pandas()[["layout", "tokens_per_s"]]  # doctest: +SKIP

No torch is imported: the predictor is numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scalelab.config.hardware import ClusterSpec
from scalelab.config.layout import Layout
from scalelab.config.model import ModelSpec
from scalelab.config.stack import DEFAULT_STACK, StackSpec
from scalelab.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["LayoutPrediction", "LayoutSearch", "predict", "search"]


@dataclass(frozen=True)
class LayoutPrediction:
    """One layout's predicted training step (what `scalelab predict --json` prints).

    The headline figures are attributes; `fields` holds every predicted field (the step's
    breakdown in seconds, memory in bytes, ...) under the names the CLI's JSON uses.
    """

    model: str
    cluster: str
    stack: str
    gpu: str
    layout: Layout
    #: Seconds per training step.
    step_time_s: float
    #: Global throughput, tokens per second.
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    #: Model FLOPs utilisation: model FLOPs/s ÷ (GPUs × dense peak of the precision), 0..1.
    mfu: float
    #: Hardware FLOPs utilisation (recomputation counted), 0..1.
    hfu: float
    #: Communication with no compute running, seconds per step.
    exposed_comm_s: float
    exposed_comm_fraction: float
    #: Predicted memory per GPU and the GPU's HBM, bytes.
    memory_total_bytes: float
    memory_capacity_bytes: float
    fits: bool
    #: GPU board power per GPU (not the whole node), watts.
    power_w_per_gpu: float
    tokens_per_j: float
    fields: dict[str, Any] = field(repr=False)
    assumptions: list[str] = field(repr=False, default_factory=list)

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> LayoutPrediction:
        """From the predictor's flat dict (`scalelab.perf.predict.predict_layout`, a search row)."""
        layout = row["layout"]
        names = (
            "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "hfu",
            "exposed_comm_s", "exposed_comm_fraction", "memory_total_bytes",
            "memory_capacity_bytes", "power_w_per_gpu", "tokens_per_j",
        )  # fmt: skip
        return cls(
            model=str(row.get("model", "")),
            cluster=str(row.get("cluster", "")),
            stack=str(row.get("stack", "")),
            gpu=str(row.get("gpu", "")),
            layout=layout if isinstance(layout, Layout) else Layout(**layout),
            fits=bool(row.get("fits", True)),  # a search ranks only layouts that fit
            fields={k: v for k, v in row.items() if k not in ("layout", "assumptions")},
            assumptions=list(row.get("assumptions", [])),
            **{name: float(row[name]) for name in names},
        )

    def to_dict(self) -> dict[str, Any]:
        """Every field as `scalelab predict --json` prints it."""
        return {
            **self.fields,
            "layout": self.layout.model_dump(mode="json"),
            "assumptions": list(self.assumptions),
        }

    def to_pandas(self) -> pd.DataFrame:
        """One row: the layout's description and fields (`layout.tp`, ...) and every predicted
        field."""
        import pandas as pd

        return pd.DataFrame([_flat_row(self)])


@dataclass(frozen=True)
class LayoutSearch:
    """Every layout of a job ranked (what `scalelab search --json` prints), typed.

    `ranked` holds the best `top` layouts by the objective (one per distinct prediction), best
    first; `baseline` the best plain-FSDP layout (None when none fits); `pareto` the layouts on
    the front of throughput against energy per token.
    """

    model: str
    cluster: str
    stack: str
    gpus: int
    global_batch: int
    seq_len: int
    objective: str
    ranked: list[LayoutPrediction]
    baseline: LayoutPrediction | None
    pareto: list[LayoutPrediction]
    #: Layouts considered, invalid ones (and why, by first failing rule), and those too large.
    considered: int
    invalid: int
    invalid_by_reason: dict[str, int]
    not_fitting: int
    #: Valid layouts that fit (before keeping the `top`).
    ranked_total: int
    #: Why the winner beats the baseline, from their breakdowns.
    explanation: list[str]
    seconds: float

    @property
    def best(self) -> LayoutPrediction | None:
        """The first ranked layout (None when no layout fits)."""
        return self.ranked[0] if self.ranked else None

    def to_pandas(self) -> pd.DataFrame:
        """One row per ranked layout, best first (`rank` 1, 2, ...), then the FSDP baseline
        (`rank` None, `baseline` True): the layout's description and fields and every predicted
        field."""
        import pandas as pd

        rows = [
            {"rank": i, "baseline": False, **_flat_row(p)} for i, p in enumerate(self.ranked, 1)
        ]
        if self.baseline is not None:
            rows.append({"rank": None, "baseline": True, **_flat_row(self.baseline)})
        frame = pd.DataFrame(rows)
        if not frame.empty:
            frame["rank"] = frame["rank"].astype("Int64")
        return frame


def _flat_row(p: LayoutPrediction) -> dict[str, Any]:
    layout = {f"layout.{k}": v for k, v in p.layout.model_dump(mode="json").items()}
    return {"layout": p.layout.description, **layout, **p.fields}


def _model(model: str | ModelSpec) -> ModelSpec:
    from scalelab.config.catalog import load_model

    return model if isinstance(model, ModelSpec) else load_model(model)


def _cluster(cluster: str | ClusterSpec) -> ClusterSpec:
    from scalelab.config.catalog import load_cluster

    return cluster if isinstance(cluster, ClusterSpec) else load_cluster(cluster)


def _stack(stack: str | StackSpec | None) -> StackSpec:
    from scalelab.config.catalog import load_stack

    return stack if isinstance(stack, StackSpec) else load_stack(stack)


def _layout(spec: ModelSpec, gpus: int, fields: dict[str, Any]) -> Layout:
    from pydantic import ValidationError

    unknown = sorted(set(fields) - set(Layout.model_fields) - {"gpus"})
    if unknown:
        raise InputError(
            unknown[0], f"is not a layout field; allowed: {', '.join(Layout.model_fields)}"
        )
    values = {"gpus": gpus, **fields}
    if values.get("seq_len") is None:
        values["seq_len"] = spec.seq_len
    if values.get("global_batch") is None:
        values["global_batch"] = Layout.default_global_batch(
            gpus, **{k: values[k] for k in ("tp", "pp", "cp", "micro_batch") if k in values}
        )
    try:
        return Layout(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InputError(str(err["loc"][0]) if err["loc"] else "layout", err["msg"]) from None


def predict(
    model: str | ModelSpec,
    cluster: str | ClusterSpec = "h100-ib",
    *,
    gpus: int = 8,
    stack: str | StackSpec | None = DEFAULT_STACK,
    layout: Layout | None = None,
    **layout_fields: Any,
) -> LayoutPrediction:
    """Predict one training step of `model` on `gpus` GPUs of `cluster`, as `scalelab predict`.

    Args:
        model: a catalog model name (`scalelab models`), a YAML file, or a `ModelSpec`.
        cluster: a catalog cluster name (`scalelab hardware`), a YAML file, or a `ClusterSpec`.
        gpus: number of GPUs.
        stack: the framework that runs the job (`scalelab stacks`), a YAML file, or a `StackSpec`.
        layout: a whole `scalelab.config.Layout`; otherwise it is built from `layout_fields`.
        **layout_fields: `Layout` fields (`tp=2`, `pp=4`, `pp_schedule="1f1b"`,
            `sharding="hsdp"`, `micro_batch=2`, `recompute="full"`, `precision="fp8"`,
            `global_batch`, `seq_len`, ...); the sequence length defaults to the model's and the
            global batch to one micro-batch per data-parallel rank.

    Returns:
        The prediction; `.fits` says whether the layout fits in memory.

    Raises:
        InputError: an unknown name, a field the layout does not have, or a layout the model,
            cluster or stack does not allow (the message names the field).
    """
    from scalelab.perf.predict import predict_layout

    spec = _model(model)
    if layout is not None and layout_fields:
        raise InputError("layout", "give a Layout or its fields, not both")
    built = layout if layout is not None else _layout(spec, gpus, layout_fields)
    return LayoutPrediction.from_dict(predict_layout(spec, _cluster(cluster), built, _stack(stack)))


def search(
    model: str | ModelSpec,
    cluster: str | ClusterSpec = "h100-ib",
    *,
    gpus: int = 8,
    stack: str | StackSpec | None = DEFAULT_STACK,
    global_batch: int | None = None,
    seq_len: int | None = None,
    objective: str = "throughput",
    top: int = 5,
    **constraints: Any,
) -> LayoutSearch:
    """Rank every valid layout of `model` on `gpus` GPUs of `cluster` that fits, as
    `scalelab search`.

    Args:
        model: a catalog model name, a YAML file, or a `ModelSpec`.
        cluster: a catalog cluster name, a YAML file, or a `ClusterSpec`.
        gpus: number of GPUs.
        stack: the framework whose rules and behaviour apply (default `torchtitan`, as the CLI's; `generic`: any combination, for what-if questions).
        global_batch: sequences per step (default: one per GPU).
        seq_len: tokens per sequence (default: the model's).
        objective: `throughput`, `tokens-per-joule` or `mfu`.
        top: how many layouts to keep in `ranked`.
        **constraints: allowed values per knob, as `scalelab.search.Constraints` takes them
            (`tp=[1, 2]`, `sharding=["fsdp"]`, `recompute=["none"]`, `precision="fp8"`, ...).

    Returns:
        The ranking, the FSDP baseline and the Pareto front.

    Raises:
        InputError: an unknown name or objective, a constraint that is not a knob, or a
            non-positive count.
    """
    from scalelab.search import Constraints
    from scalelab.search import search as rank_layouts

    spec, cluster_spec = _model(model), _cluster(cluster)
    allowed = {f for f in Constraints.__dataclass_fields__}
    unknown = sorted(set(constraints) - allowed)
    if unknown:
        raise InputError(
            unknown[0], f"is not a search constraint; allowed: {', '.join(sorted(allowed))}"
        )
    result = rank_layouts(
        spec,
        cluster_spec,
        gpus=gpus,
        global_batch=Layout.default_global_batch(max(gpus, 1))
        if global_batch is None
        else global_batch,
        seq_len=spec.seq_len if seq_len is None else seq_len,
        objective=objective,
        constraints=Constraints(**constraints),
        top_k=top,
        stack=_stack(stack),
    )
    context = {
        "model": result.model,
        "cluster": result.cluster,
        "stack": result.stack,
        "gpu": cluster_spec.gpu.name,
        "memory_capacity_bytes": float(cluster_spec.gpu.hbm_bytes),
    }

    def typed(row: dict[str, Any]) -> LayoutPrediction:
        return LayoutPrediction.from_dict({**context, **row})

    return LayoutSearch(
        model=result.model,
        cluster=result.cluster,
        stack=result.stack,
        gpus=result.gpus,
        global_batch=result.global_batch,
        seq_len=result.seq_len,
        objective=result.objective,
        ranked=[typed(r) for r in result.top],
        baseline=typed(result.baseline) if result.baseline is not None else None,
        pareto=[typed(r) for r in result.pareto],
        considered=result.considered,
        invalid=result.invalid,
        invalid_by_reason=dict(result.invalid_by_reason),
        not_fitting=result.not_fitting,
        ranked_total=result.ranked,
        explanation=list(result.explanation),
        seconds=result.seconds,
    )
