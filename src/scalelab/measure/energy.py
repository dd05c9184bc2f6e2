"""GPU energy from NVML's cumulative energy counter (nvidia-ml-py), per process's GPU.

`nvmlDeviceGetTotalEnergyConsumption` counts millijoules since the driver loaded (Volta and
newer). Reading it at both ends of the measured window gives the GPU's energy for the window:
GPU power only, not the node's. Where there is no NVML, no GPU or no counter, the meter says why
and every energy field of the record stays null.
"""

from __future__ import annotations

from typing import Any


class EnergyMeter:
    """Reads one GPU's energy counter; `available` is False with a `reason` when it cannot."""

    def __init__(self, cuda_device: int | None) -> None:
        self.available = False
        self.reason: str | None = None
        self.driver_version: str | None = None
        self._nvml: Any = None
        self._handle: Any = None
        if cuda_device is None:
            self.reason = "no CUDA device (CPU run): GPU energy is not measured"
            return
        try:
            import pynvml
        except ImportError:
            self.reason = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            return
        try:
            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = _handle_for(pynvml, cuda_device)
            self.driver_version = _text(pynvml.nvmlSystemGetDriverVersion())
            pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
        except Exception as exc:
            self.reason = f"NVML energy counter unavailable: {type(exc).__name__}: {exc}"
            return
        self.available = True

    def read_j(self) -> float | None:
        """The counter in joules, or None when unavailable."""
        if not self.available:
            return None
        return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)) / 1000.0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _handle_for(pynvml: Any, cuda_device: int) -> Any:
    """The NVML handle of a CUDA device, matched by UUID (CUDA_VISIBLE_DEVICES renumbers devices)."""
    import torch

    try:
        uuid = str(torch.cuda.get_device_properties(cuda_device).uuid)
    except (AttributeError, RuntimeError):
        uuid = ""
    if uuid:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            if _text(pynvml.nvmlDeviceGetUUID(handle)).removeprefix("GPU-") == uuid.removeprefix(
                "GPU-"
            ):
                return handle
    return pynvml.nvmlDeviceGetHandleByIndex(cuda_device)
