"""GPU and cluster specs. A cluster is a GPU type, how GPUs are wired, and its calibrated parameters."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Precision = Literal["bf16", "fp16", "fp8"]


class GPUSpec(BaseModel):
    """One accelerator's datasheet numbers (dense peaks, HBM, NVLink per direction, power)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    peak_tflops: dict[str, float]
    hbm_gib: float = Field(gt=0)
    hbm_gbs: float = Field(gt=0)
    nvlink_gbs: float = Field(gt=0)
    nvls: bool = False
    tdp_w: float = Field(gt=0)
    idle_w: float = Field(ge=0)
    device: Literal["gpu", "cpu"] = Field(
        "gpu",
        description=(
            "what the harness runs a rank on: a GPU, or one CPU core standing in for one (gloo);"
            " a SLURM sweep asks for GPUs only for a gpu device"
        ),
    )
    source: str = ""

    @property
    def is_gpu(self) -> bool:
        return self.device == "gpu"

    def peak_flops(self, precision: str) -> float:
        """Dense peak in FLOP/s for a training precision (fp16 rate where bf16/fp8 units are missing)."""
        if precision in self.peak_tflops:
            return self.peak_tflops[precision] * 1e12
        return self.peak_tflops["fp16"] * 1e12

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gib * 2**30

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_gbs * 1e9

    @property
    def nvlink_bytes_per_s(self) -> float:
        return self.nvlink_gbs * 1e9


class ClusterParams(BaseModel):
    """Free parameters of the predictor for one cluster: what `calibrate` fits.

    Latencies follow NCCL's tuning model (src/graph/tuning.cc): a collective costs a base latency,
    plus a per-step latency for each ring step (intra- or inter-node) or tree level, plus its bus
    traffic over the bus bandwidth. Efficiencies are achieved fractions of datasheet rates.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    nvlink_bus_efficiency: float = Field(0.80, gt=0, le=1.2)
    net_bus_efficiency: float = Field(0.85, gt=0, le=1.2)
    base_latency_us: float = Field(8.4, ge=0)
    net_base_latency_us: float = Field(20.0, ge=0)
    nvlink_step_latency_us: float = Field(3.4, ge=0)
    net_step_latency_us: float = Field(9.6, ge=0)
    tree_level_latency_us: float = Field(20.0, ge=0)
    bandwidth_ramp_mib: float = Field(4.0, ge=0)
    net_scale_degradation: float = Field(0.02, ge=0)
    gemm_efficiency: float = Field(0.75, gt=0, le=1)
    gemm_half_gflop: float = Field(2.0, ge=0)
    attention_efficiency: float = Field(0.5, gt=0, le=1)
    fp8_efficiency_ratio: float = Field(0.75, gt=0, le=1)
    hbm_efficiency: float = Field(0.8, gt=0, le=1)
    overlap_slowdown: float = Field(0.10, ge=0, le=1)
    layer_overhead_us: float = Field(150.0, ge=0)
    collective_overhead_us: float = Field(0.0, ge=0)
    step_overhead_ms: float = Field(20.0, ge=0)
    compute_power_fraction: float = Field(0.85, ge=0, le=1)
    comm_power_fraction: float = Field(0.72, ge=0, le=1)
    memory_reserve_gib: float = Field(4.0, ge=0)
    source: str = ""


class ClusterSpec(BaseModel):
    """Nodes of `gpus_per_node` GPUs joined by NVLink (a domain of `nvlink_domain` GPUs) and NICs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    gpu: GPUSpec
    gpus_per_node: int = Field(gt=0)
    nvlink_domain: int = Field(gt=0)
    nics_per_node: int = Field(gt=0)
    nic_gbps: float = Field(gt=0)
    max_gpus: int = Field(default=65536, gt=0)
    params: ClusterParams = ClusterParams()
    source: str = ""

    @model_validator(mode="after")
    def _check_domain(self) -> ClusterSpec:
        if self.nvlink_domain % self.gpus_per_node and self.gpus_per_node % self.nvlink_domain:
            raise ValueError("nvlink_domain and gpus_per_node must divide one another")
        return self

    @property
    def nic_bytes_per_s_per_gpu(self) -> float:
        """Network bandwidth per GPU per direction, bytes/s."""
        return self.nics_per_node * self.nic_gbps * 1e9 / 8 / self.gpus_per_node
