"""GPU and cluster specs. A cluster is a GPU type, how GPUs are wired, and its calibrated parameters."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Precision = Literal["bf16", "fp16", "fp8"]


class GPUSpec(BaseModel):
    """One accelerator's datasheet numbers (dense peaks, HBM, NVLink per direction, power)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="catalog name (gpus.yaml key) or `custom` for an inline GPU")
    cuda_names: tuple[str, ...] = Field(
        default=(),
        description="the strings torch.cuda.get_device_name() returns for this GPU (catalog "
        "gpus.yaml); `catalog.cluster_for_device` maps a device to a cluster with them",
    )
    peak_tflops: dict[str, float] = Field(
        description="dense (no sparsity) tensor-core peak, TFLOP/s, by precision (fp16, bf16, fp8); "
        "vendor datasheet"
    )
    hbm_gib: float = Field(gt=0, description="HBM capacity, GiB (datasheet)")
    hbm_gbs: float = Field(gt=0, description="HBM bandwidth, GB/s (datasheet)")
    nvlink_gbs: float = Field(
        gt=0,
        description="NVLink bandwidth per GPU per direction, GB/s (datasheet: half the bidirectional)",
    )
    nvls: bool = Field(
        default=False,
        description="NVLink SHARP (in-switch all-reduce) available (NVSwitch 3 and later)",
    )
    tdp_w: float = Field(gt=0, description="board power limit (TDP), W (datasheet)")
    idle_w: float = Field(
        ge=0, description="typical idle board power, W (a measured reading; says so)"
    )
    device: Literal["gpu", "cpu"] = Field(
        "gpu",
        description=(
            "what the harness runs a rank on: a GPU, or one CPU core standing in for one (gloo);"
            " a SLURM sweep asks for GPUs only for a gpu device"
        ),
    )
    source: str = Field("", description="the datasheets and readings the numbers come from")

    @property
    def is_gpu(self) -> bool:
        return self.device == "gpu"

    @field_validator("peak_tflops")
    @classmethod
    def _positive_peaks(cls, peaks: dict[str, float]) -> dict[str, float]:
        for precision, value in peaks.items():
            if precision not in ("bf16", "fp16", "fp8"):
                raise ValueError(f"'{precision}' is not a precision: give bf16, fp16 or fp8")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{precision}: must be a positive number of TFLOP/s, not {value}")
        if "bf16" not in peaks and "fp16" not in peaks:
            raise ValueError("give at least the bf16 or the fp16 peak")
        return peaks

    def peak_flops(self, precision: str) -> float:
        """Dense peak in FLOP/s for a training precision; where the GPU lists none for it (no fp8
        units, or an inline GPU that gives one 16-bit rate) the 16-bit rate (bf16, else fp16)."""
        for name in (precision, "bf16", "fp16"):
            if name in self.peak_tflops:
                return self.peak_tflops[name] * 1e12
        raise KeyError(precision)  # unreachable: the validator asks for bf16 or fp16

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

    nvlink_bus_efficiency: float = Field(
        0.80,
        gt=0,
        le=1.2,
        description="achieved fraction of the GPU's datasheet NVLink rate (per direction) as nccl-tests bus bandwidth inside an NVLink domain, Simple-protocol ring. Fitted by `calibrate` to one-node nccl-tests sweeps (catalog: params.source).",
    )
    net_bus_efficiency: float = Field(
        0.85,
        gt=0,
        le=1.2,
        description="achieved fraction of the NIC line rate as nccl-tests bus bandwidth across nodes. From multi-node nccl-tests (the study's Figure 2) or `calibrate`.",
    )
    base_latency_us: float = Field(
        8.4,
        ge=0,
        description="µs: fixed latency of one collective launch (NCCL baseLat for the Simple protocol; LL and LL128 scale from it as in NCCL's tuning.cc). Fitted to small-message nccl-tests.",
    )
    net_base_latency_us: float = Field(
        20.0,
        ge=0,
        description="µs: extra fixed latency once a collective spans nodes (network setup, proxy thread). Assumed, or fitted to multi-node nccl-tests.",
    )
    nvlink_step_latency_us: float = Field(
        3.4,
        ge=0,
        description="µs per ring step over NVLink, Simple protocol (NCCL hwLat NVLink ring = 3.4 µs). Fitted to one-node nccl-tests.",
    )
    net_step_latency_us: float = Field(
        9.6,
        ge=0,
        description="µs per ring step over the network, Simple protocol (NCCL hwLat network ring = 9.6 µs). Fitted to the study's F1 on h100-ib (docs/calibration.md).",
    )
    tree_level_latency_us: float = Field(
        20.0,
        ge=0,
        description="µs per level of NCCL's inter-node tree (all-reduce only). Assumed from NCCL's tuning model.",
    )
    bandwidth_ramp_mib: float = Field(
        4.0,
        ge=0,
        description="MiB: the buffer size at which bus bandwidth reaches half its plateau (NCCL spreads larger buffers over more channels). Fitted to nccl-tests size sweeps.",
    )
    net_scale_degradation: float = Field(
        0.02,
        ge=0,
        description="fractional loss of network bus bandwidth per doubling of the nodes a collective spans (the study's Figure 2). Fitted to multi-node nccl-tests.",
    )
    gemm_efficiency: float = Field(
        0.75,
        gt=0,
        le=1,
        description="achieved fraction of the dense peak for large GEMMs. Fitted to published runs (benchmarks/fit_catalog.py) or to measured step times by `calibrate`.",
    )
    gemm_half_gflop: float = Field(
        2.0,
        ge=0,
        description="GFLOP: the GEMM size at which efficiency is half of gemm_efficiency (small GEMMs run slower). Fitted with gemm_efficiency.",
    )
    attention_efficiency: float = Field(
        0.5,
        gt=0,
        le=1,
        description="achieved fraction of the bf16 dense peak for FlashAttention-2's causal FLOPs. Fitted to published runs.",
    )
    fp8_efficiency_ratio: float = Field(
        0.75,
        gt=0,
        le=1,
        description="fp8 GEMM efficiency relative to bf16's (scaling and casts). Assumed from Transformer Engine reports.",
    )
    hbm_efficiency: float = Field(
        0.8,
        gt=0,
        le=1,
        description="achieved fraction of the datasheet HBM bandwidth for element-wise ops, the optimizer and memory-bound GEMMs. Fitted to published runs.",
    )
    overlap_slowdown: float = Field(
        0.10,
        ge=0,
        le=1,
        description="fractional slowdown of compute while communication overlaps it (shared SMs and HBM). Assumed; fitted by `calibrate` when traces are given.",
    )
    layer_overhead_us: float = Field(
        150.0,
        ge=0,
        description="µs of host and kernel-launch overhead per layer per forward (twice in backward). Fitted to published runs / measured steps.",
    )
    collective_overhead_us: float = Field(
        0.0,
        ge=0,
        description="µs of framework host cost per collective (hooks, copies, launch). Fitted by `calibrate`.",
    )
    step_overhead_ms: float = Field(
        20.0,
        ge=0,
        description="ms of fixed per-step overhead (data loading, logging, synchronisation). Fitted by `calibrate`.",
    )
    compute_power_fraction: float = Field(
        0.85,
        ge=0,
        le=1,
        description="fraction of (TDP − idle) a GPU draws while computing. Fitted to the study's power (F2) or to NVML measurements by `calibrate`.",
    )
    comm_power_fraction: float = Field(
        0.72,
        ge=0,
        le=1,
        description="fraction of (TDP − idle) a GPU draws while only communicating (NCCL kernels keep SMs and HBM busy). Fitted to the study's F2.",
    )
    memory_reserve_gib: float = Field(
        4.0,
        ge=0,
        description="GiB per GPU not available to tensors (CUDA context, allocator fragmentation, workspaces). Assumed from PyTorch measurements.",
    )
    source: str = Field("", description="where the values set for this cluster come from")


class ClusterSpec(BaseModel):
    """Nodes of `gpus_per_node` GPUs joined by NVLink (a domain of `nvlink_domain` GPUs) and NICs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="catalog name or the YAML file's stem")
    gpu: GPUSpec = Field(description="the accelerator: a gpus.yaml entry or an inline mapping")
    gpus_per_node: int = Field(gt=0, le=2**16, description="GPUs per node (system datasheet)")
    nvlink_domain: int = Field(
        gt=0,
        le=2**20,
        description="GPUs joined by NVLink/NVSwitch (8 on DGX nodes, 72 on GB200 NVL72)",
    )
    nics_per_node: int = Field(
        gt=0, le=2**10, description="compute-network NICs per node (datasheet)"
    )
    nic_gbps: float = Field(
        gt=0, description="line rate of one NIC, Gb/s per direction (datasheet)"
    )
    max_gpus: int = Field(
        default=65536, gt=0, le=2**20, description="the largest job the cluster can run"
    )
    params: ClusterParams = Field(
        default=ClusterParams(), description="the predictor's fitted parameters (`calibrate`)"
    )
    source: str = Field("", description="the datasheets the fields come from")

    @model_validator(mode="after")
    def _check_domain(self) -> ClusterSpec:
        if self.nvlink_domain % self.gpus_per_node and self.gpus_per_node % self.nvlink_domain:
            raise ValueError("nvlink_domain and gpus_per_node must divide one another")
        return self

    @property
    def nic_bytes_per_s_per_gpu(self) -> float:
        """Network bandwidth per GPU per direction, bytes/s."""
        return self.nics_per_node * self.nic_gbps * 1e9 / 8 / self.gpus_per_node
