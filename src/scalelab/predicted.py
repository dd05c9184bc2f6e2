"""The predictor's numbers for a measured record, joined above both engines.

The harness (`measure/`) and the predictor (`perf/`) never import each other; this module is where
a measured record meets its prediction. `bench --predict` and `sweep` (with `predict: true`)
attach one to the record they wrote (`attach_prediction`), `report --predict` reads the record's
prediction or makes one (`prediction_of`), and `calibrate` reads a record's model and layout the
same way (`record_model`, `record_layout`). (`validate` predicts published runs, not records: it
reads the run data in `scalelab.runs`.) A prediction is the predictor's flat
result (`predict_layout`) with the cluster's name; its metric names are the records' own.
"""

from __future__ import annotations

from typing import Any

from scalelab.config.hardware import ClusterSpec
from scalelab.config.layout import Layout
from scalelab.config.model import ModelSpec
from scalelab.errors import InputError
from scalelab.results import Record


def predictor_available() -> bool:
    """False in an install without the predictor (then `--predict` is a clear input error)."""
    try:
        from scalelab.perf.predict import predict_layout  # noqa: F401
    except ImportError:
        return False
    return True


def require_predictor(field: str = "predict") -> None:
    if not predictor_available():
        raise InputError(
            field, "the predictor (scalelab.perf.predict) is not available in this install"
        )


def record_model(record: Record) -> ModelSpec:
    """The model a record ran: its stored architecture, else the catalog entry of its name."""
    spec = record.workload.get("model_spec")
    if isinstance(spec, dict):
        return ModelSpec(**spec)
    from scalelab.config.catalog import load_model

    return load_model(str(record.workload.get("model")))


def record_layout(record: Record) -> Layout:
    if not record.layout:
        raise InputError("record", f"{record.name} has no layout")
    return Layout(**record.layout)


def predict_for(model: ModelSpec, cluster: ClusterSpec, layout: Layout) -> dict[str, Any]:
    """The prediction of one layout as a record stores it: `cluster` and the predictor's fields.

    A layout the predictor rejects gives `{"cluster": ..., "error": ...}` instead of raising, so a
    measured record always keeps its measurement.
    """
    from scalelab.perf.predict import predict_layout

    try:
        result = dict(predict_layout(model, cluster, layout))
    except Exception as exc:
        return {"cluster": cluster.name, "error": f"{type(exc).__name__}: {exc}"}
    return {"cluster": cluster.name, **result}


GRAD_SYNC_NOTE = (
    "the predictor reduces gradients once per optimizer step; this run reduced them on every "
    "micro-batch (bench --grad-sync microbatch), so its data-parallel communication is "
    "under-predicted"
)


def attach_prediction(record: Record, cluster: ClusterSpec) -> Record:
    """Set `record.prediction` to the prediction of its model and layout on `cluster` (with a
    note where the run did something the predictor does not model)."""
    record.prediction = predict_for(record_model(record), cluster, record_layout(record))
    if record.workload.get("grad_sync") == "microbatch":
        record.prediction["note"] = GRAD_SYNC_NOTE
    return record


def prediction_of(
    record: Record, cluster: str | None, clusters: dict[str, ClusterSpec] | None = None
) -> tuple[dict[str, Any], str]:
    """A record's prediction and where it came from.

    The record's own (`bench --predict`) when it has one without error on the cluster asked for;
    else a new one on `cluster`, the record's cluster, or h100-ib. Raises InputError when the
    cluster cannot be loaded, and the predictor's error when the layout cannot be predicted.
    """
    pred = record.prediction
    if pred and "error" not in pred and (cluster is None or pred.get("cluster") == cluster):
        return pred, "record"
    from scalelab.config.catalog import load_cluster
    from scalelab.perf.predict import predict_layout

    name = cluster or record.cluster or "h100-ib"
    cache = clusters if clusters is not None else {}
    if name not in cache:
        cache[name] = load_cluster(name)
    result = dict(predict_layout(record_model(record), cache[name], record_layout(record)))
    return result, f"predict_layout on {name}"
