"""GPU power from how a step's time splits between compute, exposed communication and idle.

Average board power = idle + (TDP - idle) x (compute_power_fraction x compute share +
comm_power_fraction x exposed-communication share). NCCL kernels keep SMs and HBM busy, so a GPU
waiting on communication still draws much of its compute power; the study saw per-GPU power fall
only ~6 % while per-GPU throughput fell 37 %. GPU power only, like NVML: not the node.
"""

from __future__ import annotations

import numpy as np

from scalelab.config.hardware import ClusterSpec


def average_power_w(
    cluster: ClusterSpec,
    step_time_s: np.ndarray,
    compute_busy_s: np.ndarray,
    exposed_comm_s: np.ndarray,
) -> np.ndarray:
    gpu, p = cluster.gpu, cluster.params
    compute_share = np.clip(compute_busy_s / step_time_s, 0.0, 1.0)
    comm_share = np.clip(exposed_comm_s / step_time_s, 0.0, 1.0 - compute_share)
    dynamic = p.compute_power_fraction * compute_share + p.comm_power_fraction * comm_share
    return gpu.idle_w + (gpu.tdp_w - gpu.idle_w) * dynamic
