"""What one bench or comm run is asked to do, checked before any process is launched (no torch
here, so that bad input fails before torch's import, ~3 s)."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from scalelab.config.hardware import ClusterSpec
from scalelab.config.layout import Layout
from scalelab.config.model import ModelSpec
from scalelab.config.options import PipelineSchedule, Precision, Sharding
from scalelab.config.stack import StackSpec
from scalelab.config.stack_rules import data_parallel_degrees, ep_problem  # noqa: F401 (measure/parallel.py imports them from here)
from scalelab.errors import InputError

# The catalog stack whose refusals are the harness's (config/catalog/stacks.yaml).
HARNESS_STACK = "torchtitan"

ComputeDtype = Literal["auto", "fp32", "bf16"]
GradSync = Literal["step", "microbatch"]
Fp8Recipe = Literal["tensorwise", "rowwise"]


# The longest collective timeout a run may ask for (a week): more is a typo, and torch's timedelta
# overflows on inf.
MAX_TIMEOUT_S = 7 * 24 * 3600.0
# Processes per CPU core `--oversubscribe` allows (a CI runner with 2 cores runs 4 ranks).
OVERSUBSCRIBE_PER_CORE = 8


def local_cores() -> int:
    """The cores this process may run on (its CPU affinity, as a container or Slurm limits it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_timeout(flag: str, value: float) -> float:
    """A collective timeout: finite, more than 0 and at most a week."""
    if not math.isfinite(value) or value <= 0 or value > MAX_TIMEOUT_S:
        raise InputError(
            flag,
            f"must be a finite number of seconds above 0 and at most {MAX_TIMEOUT_S:.0f}, not {value}",
        )
    return value


def visible_gpus() -> int:
    """NVIDIA GPUs this process may use, without importing torch: CUDA_VISIBLE_DEVICES when set,
    else the /dev/nvidiaN device files (0 on a machine without the driver)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [e for e in visible.split(",") if e.strip()]
        return 0 if not entries or entries[0].strip() == "-1" else len(entries)
    return sum(1 for p in Path("/dev").glob("nvidia*") if p.name[len("nvidia") :].isdigit())


def check_nproc(nproc_per_node: int, gpus: int | None, oversubscribe: bool) -> None:
    """Processes to start here: at most the GPUs (on a GPU machine) or the cores, unless
    `oversubscribe` (CPU only: then at most OVERSUBSCRIBE_PER_CORE per core)."""
    if nproc_per_node < 1:
        raise InputError("nproc-per-node", f"must be a positive integer, not {nproc_per_node}")
    if gpus:
        if nproc_per_node > gpus:
            raise InputError("nproc-per-node", f"{nproc_per_node} processes but {gpus} GPUs here")
        return
    cores = local_cores()
    limit = cores * OVERSUBSCRIBE_PER_CORE if oversubscribe else cores
    if nproc_per_node > limit:
        hint = "" if oversubscribe else "; pass --oversubscribe to run more ranks than cores"
        raise InputError(
            "nproc-per-node",
            f"{nproc_per_node} processes but {cores} cores here (at most {limit}{hint})",
        )


class BenchOptions(BaseModel):
    """Options of `scalelab bench` that are not part of the layout."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(50, gt=0, description="measured steps per repeat")
    warmup: int = Field(10, ge=0, description="warm-up steps per repeat (not measured)")
    repeats: int = Field(3, gt=0)
    seed: int = 0
    lr: float = Field(3e-4, gt=0, allow_inf_nan=False)
    grad_clip: float = Field(
        1.0, ge=0, allow_inf_nan=False, description="max gradient norm; 0 disables clipping"
    )
    compile: bool = False
    compute_dtype: ComputeDtype = "auto"
    grad_sync: GradSync = Field(
        "step",
        description=(
            "when gradients are reduced with gradient accumulation: once per optimizer step "
            "(DDP no_sync / FSDP2 set_requires_gradient_sync(False) on the earlier micro-batches, "
            "as the predictor assumes) or on every micro-batch; pipelines always reduce per step"
        ),
    )
    fp8_recipe: Fp8Recipe = Field(
        "tensorwise",
        description=(
            "with --precision fp8: torchao's float8 scaling, one scale per tensor (tensorwise) "
            "or per row (rowwise); a harness choice like torchtitan's float8.recipe_name, "
            "which the predictor does not distinguish (one fp8 GEMM efficiency per cluster)"
        ),
    )
    fp8_all_gather: bool = Field(
        False,
        description=(
            "with --precision fp8, tensorwise and FSDP: gather the fp8 weights (torchao's "
            "enable_fsdp_float8_all_gather, scales precomputed after each optimizer step); off "
            "as in torchtitan, and as the predictor prices gathers (bf16)"
        ),
    )
    data: str | None = Field(
        None, description="token file (.npy or uint16 .bin); synthetic if None"
    )
    profile: bool = False
    profile_steps: int = Field(3, gt=0)
    timeout_s: float = Field(
        600.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        allow_inf_nan=False,
        description="process-group (collective) timeout",
    )
    predict: bool = Field(
        False, description="attach the predictor's numbers to the record (done above the harness)"
    )
    out_dir: str = "runs"


_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    """A message size of the collective benchmark: `64`, `1K`, `64M` or `4G` (binary units)."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", text.upper())
    if not match:
        raise ValueError(f"'{text}' is not a size such as 1K, 64M or 4G")
    return int(match.group(1)) * _UNITS[match.group(2)]


def parse_sizes(text: str) -> list[int]:
    """`1K:4G` (powers of two from 1 KiB to 4 GiB), `1M:1G:4` (x4 steps) or `1M,8M,64M`."""
    if ":" in text:
        parts = text.split(":")
        lo, hi = parse_size(parts[0]), parse_size(parts[1])
        factor = int(parts[2]) if len(parts) > 2 else 2
        if lo <= 0 or hi < lo or factor < 2:
            raise ValueError(f"'{text}' needs 0 < start <= end and a factor of at least 2")
        sizes = []
        size = lo
        while size <= hi:
            sizes.append(size)
            size *= factor
        return sizes
    return [parse_size(s) for s in text.split(",") if s.strip()]


def under_torchrun() -> bool:
    """True in a process that torchrun (or torch.distributed.run) started."""
    env = os.environ
    return "TORCHELASTIC_RUN_ID" in env or all(
        k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    )


def check_model(model: ModelSpec) -> None:
    """The harness builds Llama-style decoders (dense, or with mixture-of-experts layers:
    measure/moe.py) only; say which field rules a model out."""
    if model.attention != "gqa":
        raise InputError(
            "model",
            f"bench builds grouped-query attention; {model.name} has attention {model.attention}",
        )
    if model.qk_norm:
        raise InputError(
            "model", f"bench builds attention without QK norm; {model.name} has qk_norm true"
        )
    unsupported = {
        "ffn": (model.ffn, "swiglu"),
        "norm": (model.norm, "rmsnorm"),
        "position": (model.position, "rope"),
        "bias": (model.bias, False),
        "tied_embeddings": (model.tied_embeddings, False),
    }
    for field, (value, wanted) in unsupported.items():
        if value != wanted:
            raise InputError(
                "model",
                f"bench builds Llama-style decoders ({field} {wanted}); {model.name} has {field} {value}",
            )


def harness_stack() -> StackSpec:
    """The stack profile whose refusals are this harness's own (catalog/stacks.yaml `torchtitan`):
    search ranks for it exactly the layouts bench runs."""
    from scalelab.config.catalog import load_stack

    return load_stack(HARNESS_STACK)


def check_layout(layout: Layout, model: ModelSpec, gpus_per_node: int | None = None) -> None:
    """Layouts the predictor accepts but this harness cannot run, each with its reason and
    source: the `torchtitan` stack profile's refusals (config/stack_rules.py), after torchao's
    presence for fp8."""
    if layout.precision == Precision.FP8:
        from scalelab.measure.fp8 import require_torchao

        require_torchao()
    harness_stack().check_combinations(layout, model, gpus_per_node)


def check_layout_options(
    options: BenchOptions, layout: Layout, model: ModelSpec | None = None
) -> None:
    """Options that a layout (or model) rules out. Per-micro-batch reduction is a choice for flat
    layouts only (torch.distributed.pipelining reduces a stage's gradients once per step whatever
    is asked); PyTorch's ZBV schedule refuses compiled stage modules (measured, torch 2.13); a
    compiled MoE block recompiles whenever the per-expert token counts change (measured: a
    one-process moe-tiny run was still compiling after 6 minutes), so MoE runs eager."""
    if options.compile and model is not None and model.is_moe:
        raise InputError(
            "compile",
            f"--compile with a mixture-of-experts model ({model.name}): the per-expert token "
            "counts change every step and torch.compile recompiles the block each time; "
            "use --no-compile",
        )
    if options.compile and layout.pp > 1 and layout.pp_schedule == PipelineSchedule.ZBV:
        raise InputError(
            "compile",
            "--compile with pp_schedule zbv: PyTorch's ZBV schedule does not support compiled "
            "stage modules (RuntimeError at start); use --no-compile or another schedule",
        )
    if layout.precision != Precision.FP8 and (
        options.fp8_all_gather or options.fp8_recipe != "tensorwise"
    ):
        field = "fp8-all-gather" if options.fp8_all_gather else "fp8-recipe"
        raise InputError(field, f"--{field} needs --precision fp8")
    if options.fp8_all_gather and (
        options.fp8_recipe != "tensorwise"
        or layout.sharding not in (Sharding.FSDP, Sharding.ZERO2, Sharding.HSDP)
        or layout.dp * layout.cp == 1
    ):
        raise InputError(
            "fp8-all-gather",
            "fp8 all-gather needs the tensorwise recipe and FSDP (fsdp, zero2 or hsdp) over more "
            "than one rank (torchao enable_fsdp_float8_all_gather)",
        )
    if options.grad_sync == "microbatch" and layout.pp > 1:
        raise InputError(
            "grad_sync",
            "pipelines reduce gradients once per step (torch.distributed.pipelining); "
            "use --grad-sync step with pp > 1",
        )


def check_options(options: BenchOptions) -> None:
    if options.data is not None:
        path = Path(options.data)
        if not path.is_file():
            raise InputError("data", f"no such token file: {options.data}")
        if path.suffix not in (".npy", ".bin"):
            raise InputError("data", f"token file must be .npy or a uint16 .bin, not {path.name}")


def load_tokens(path: str) -> np.ndarray:
    """A token file as a flat integer array (memory-mapped): `.npy`, or raw uint16 `.bin`."""
    p = Path(path)
    try:
        tokens = np.load(p, mmap_mode="r") if p.suffix == ".npy" else np.memmap(p, np.uint16, "r")
    except (OSError, ValueError) as exc:
        raise InputError("data", f"cannot read {path}: {exc}") from None
    if not np.issubdtype(tokens.dtype, np.integer):
        raise InputError("data", f"{path} holds {tokens.dtype}, not integer token ids")
    return tokens.reshape(-1)


def check_tokens(path: str, vocab_size: int, seq_len: int) -> None:
    """The token file fits the model: enough tokens for one sequence, ids below the vocabulary."""
    tokens = load_tokens(path)
    if tokens.shape[0] < seq_len + 1:
        raise InputError("data", f"{path} has {tokens.shape[0]} tokens, fewer than seq_len + 1")
    top = int(tokens.max())
    if top >= vocab_size or int(tokens.min()) < 0:
        raise InputError(
            "data", f"{path} has token id {top}, outside the model's vocabulary of {vocab_size}"
        )


def resolve_cluster(
    name: str | None, gpu_name: str | None
) -> tuple[ClusterSpec | None, str | None]:
    """The cluster a run is measured against: `name` (catalog or YAML), else the catalog cluster
    whose GPU matches the CUDA device's name; (None, None) when neither applies."""
    from scalelab.config.catalog import cluster_for_device, load_cluster

    if name is not None:
        return load_cluster(name), name
    if gpu_name is not None:
        detected = cluster_for_device(gpu_name)
        if detected is not None:
            return load_cluster(detected), detected
    return None, None
