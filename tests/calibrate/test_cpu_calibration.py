"""Calibration of CPU ranks (cpu-gloo): the host-overhead mechanisms the predictor has for CPU,
what CPU step times cannot determine, and that the chosen parameters are recoverable from a
2-rank layout grid like benchmarks/calibrate_cpu.py's (synthetic data with known values)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from scalelab.calibrate import (
    CPU_HOST,
    CPU_UNDETERMINED,
    StepPoint,
    _predict_all,
    _with,
    collinear_groups,
    fit,
    free_parameters,
)
from scalelab.config.catalog import load_cluster, load_model
from scalelab.config.hardware import ClusterParams
from scalelab.config.layout import Layout, LayoutTable
from scalelab.config.model import ModelSpec
from scalelab.perf.predict import predict

CPU = load_cluster("cpu-gloo")
TINY = load_model("llama-tiny")
SMALL = TINY.model_copy(update={"name": "d128-8l", "n_layers": 8, "d_model": 128, "d_ff": 256})
HOST = (
    "layer_overhead_us",
    "tp_layer_overhead_us",
    "collective_overhead_us",
    "microbatch_overhead_us",
    "step_overhead_ms",
)


def _step(cluster: Any, model: ModelSpec, **layout: Any) -> float:
    lay = Layout(gpus=2, seq_len=model.seq_len, **layout)
    return float(predict(model, cluster, LayoutTable.from_layouts([lay]))["step_time_s"][0])


def _bare(**params: float) -> Any:
    """cpu-gloo with every host overhead 0 except `params`."""
    zero = {n: 0.0 for n in HOST}
    return _with(CPU, zero | params)


def test_gpu_clusters_keep_the_cpu_mechanisms_off() -> None:
    defaults = ClusterParams()
    assert defaults.microbatch_overhead_us == 0.0
    assert defaults.tp_layer_overhead_us == 0.0
    assert defaults.ddp_bucket_mib == 0.0
    assert defaults.compute_bytes == 2.0
    for name in ("h100-ib", "a100-ib", "h200-ib"):
        p = load_cluster(name).params
        assert (p.microbatch_overhead_us, p.tp_layer_overhead_us, p.ddp_bucket_mib) == (0, 0, 0)
        assert p.compute_bytes == 2.0
    cpu = CPU.params
    assert cpu.compute_bytes == 4.0 and cpu.ddp_bucket_mib == 25.0  # fp32 training, DDP buckets


def test_ddp_issues_one_bucket_not_one_allreduce_per_layer() -> None:
    """A tiny model's gradients fill one 25 MiB bucket: one host call per step (DDP), where FSDP
    pays one per layer and root collective."""
    delta = 1000.0  # µs per collective
    layout = {"global_batch": 8, "micro_batch": 4}
    ddp = _step(_bare(collective_overhead_us=delta), TINY, sharding="ddp", **layout) - _step(
        _bare(), TINY, sharding="ddp", **layout
    )
    assert ddp == pytest.approx(delta * 1e-6, rel=1e-6)
    fsdp = _step(_bare(collective_overhead_us=delta), TINY, sharding="fsdp", **layout) - _step(
        _bare(), TINY, sharding="fsdp", **layout
    )
    assert fsdp > 2 * TINY.n_layers * delta * 1e-6  # a gather and a reduce-scatter per layer


def test_tp_layer_overhead_applies_to_tp_layouts_only() -> None:
    delta = 500.0
    tp = {"tp": 2, "global_batch": 4, "micro_batch": 2}  # 2 micro-batches
    got = _step(_bare(tp_layer_overhead_us=delta), TINY, **tp) - _step(_bare(), TINY, **tp)
    assert got == pytest.approx(2 * 3 * TINY.n_layers * delta * 1e-6, rel=1e-6)  # fwd + 2 bwd
    flat = {"global_batch": 8, "micro_batch": 4}
    assert _step(_bare(tp_layer_overhead_us=delta), TINY, **flat) == _step(_bare(), TINY, **flat)


def test_microbatch_overhead_is_paid_once_per_microbatch() -> None:
    delta = 2000.0
    layout = {"global_batch": 8, "micro_batch": 1, "sharding": "ddp"}  # 4 micro-batches a rank
    got = _step(_bare(microbatch_overhead_us=delta), TINY, **layout) - _step(
        _bare(), TINY, **layout
    )
    assert got == pytest.approx(4 * delta * 1e-6, rel=1e-6)


def test_cpu_fits_host_overheads_and_names_what_it_cannot_determine() -> None:
    points = [StepPoint(TINY, Layout(gpus=2, seq_len=32, global_batch=8), 0.1)]
    names = free_parameters([], points, cpu=True)
    assert set(CPU_HOST) <= set(names) and "gemm_efficiency" in names
    assert not set(CPU_UNDETERMINED) & set(names)
    assert "microbatch_overhead_us" not in free_parameters([], points, cpu=False)
    result = fit(CPU, [], points, max_nfev=3)
    assert set(result.reasons) == set(CPU_UNDETERMINED)


def test_collinear_parameters_are_grouped() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=20), rng.normal(size=20)
    columns = np.stack([a, 3.0 * a + 1e-4 * b, b], axis=1)
    assert collinear_groups(["x", "y", "z"], columns) == [["x", "y"]]
    assert collinear_groups(["x", "z"], np.stack([a, b], axis=1)) == []


GRID: list[dict[str, Any]] = [
    {"sharding": "fsdp", "global_batch": 8, "micro_batch": 4},
    {"sharding": "fsdp", "global_batch": 8, "micro_batch": 1},
    {"sharding": "ddp", "global_batch": 8, "micro_batch": 4},
    {"sharding": "ddp", "global_batch": 16, "micro_batch": 2},
    {"sharding": "zero2", "global_batch": 8, "micro_batch": 4},
    {"tp": 2, "global_batch": 4, "micro_batch": 4},
    {"tp": 2, "sequence_parallel": False, "global_batch": 4, "micro_batch": 2},
    {"pp": 2, "pp_schedule": "1f1b", "global_batch": 8, "micro_batch": 2},
    {"pp": 2, "pp_schedule": "gpipe", "global_batch": 8, "micro_batch": 1},
]


def test_host_overheads_are_recovered_from_a_two_rank_grid() -> None:
    """Step times made by the predictor with known host overheads on the two models of the
    CPU grid (2 % noise): the fit from another start gets them back, none collinear."""
    truth = {
        "gemm_efficiency": 0.4,
        "layer_overhead_us": 900.0,
        "tp_layer_overhead_us": 6000.0,
        "collective_overhead_us": 3000.0,
        "microbatch_overhead_us": 4000.0,
        "step_overhead_ms": 15.0,
    }
    rng = np.random.default_rng(1)
    points = [
        StepPoint(model, Layout(gpus=2, seq_len=model.seq_len, **lay), 0.0)
        for model in (TINY, SMALL)
        for lay in GRID
    ]
    _, times = _predict_all(_with(CPU, truth), [], points)
    noisy = [
        StepPoint(p.model, p.layout, float(t * np.exp(rng.normal(0, 0.02))))
        for p, t in zip(points, times[: len(points)], strict=True)
    ]
    result = fit(CPU, [], noisy, names=["gemm_efficiency", *HOST])
    assert result.collinear == []
    for name, value in truth.items():
        assert result.fitted[name] == pytest.approx(value, rel=0.25), name
    assert result.error_after < 0.03
