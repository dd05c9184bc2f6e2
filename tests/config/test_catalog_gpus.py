"""Catalog GPUs of issue 11 item 7 (B300/GB300, MI300X/MI325X/MI355X): datasheet peaks including the
block-scaled formats, and a prediction on each of their clusters."""

from __future__ import annotations

import math

import pytest

from scalelab.config.catalog import load_cluster, load_gpu, load_model
from scalelab.config.hardware import GPUSpec
from scalelab.config.layout import Layout, LayoutTable
from scalelab.perf.predict import predict

# gpu: (dense bf16, dense fp8, the block-scaled formats it lists), TFLOP/s from the datasheets
# named in gpus.yaml.
PEAKS = {
    "B300": (2250.0, 4500.0, {"mxfp8": 4500.0, "nvfp4": 13500.0}),
    "GB300": (2500.0, 5000.0, {"mxfp8": 5000.0, "nvfp4": 15000.0}),
    "MI300X": (1307.4, 2614.9, {}),
    "MI325X": (1307.4, 2614.9, {}),
    "MI355X": (2516.6, 5033.2, {"mxfp8": 5033.2, "mxfp4": 10066.3}),
}


@pytest.mark.parametrize("name", list(PEAKS))
def test_peaks_are_the_datasheets(name: str) -> None:
    gpu = load_gpu(name)
    bf16, fp8, block = PEAKS[name]
    assert gpu.peak_tflops["bf16"] == bf16 and gpu.peak_tflops["fp8"] == fp8
    for fmt, value in block.items():
        assert gpu.peak_tflops[fmt] == value
    assert gpu.source


def test_an_unknown_format_is_refused_with_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="mxfp8, nvfp4, mxfp4"):
        GPUSpec(
            name="x",
            peak_tflops={"bf16": 1.0, "int4": 2.0},
            hbm_gib=1,
            hbm_gbs=1,
            nvlink_gbs=1,
            tdp_w=1,
            idle_w=0,
        )


@pytest.mark.parametrize(
    "cluster", ["b300-ib", "gb300-nvl72", "mi300x-ib", "mi325x-ib", "mi355x-ib"]
)
def test_each_new_cluster_predicts(cluster: str) -> None:
    c = load_cluster(cluster)
    layout = Layout(gpus=512, global_batch=512, seq_len=4096, tp=8, pp=4)
    row = predict(load_model("llama3-70b"), c, LayoutTable.from_layouts([layout])).row(0)
    assert math.isfinite(float(row["tokens_per_s_per_gpu"])) and row["tokens_per_s_per_gpu"] > 0
    assert 0 < row["mfu"] < 1
    assert c.gpu.idle_w < row["power_w_per_gpu"] < c.gpu.tdp_w
