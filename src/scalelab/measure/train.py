"""The timed training loop: build the parallel model, train W warm-up and M measured steps, R times.

Each repeat runs `warmup` steps, then `steps` measured steps, timed by a synchronised wall clock
(`torch.cuda.synchronize` on GPU) on every rank; a step's time is the slowest rank's. Around the
measured window it reads peak memory (CUDA allocated/reserved, or process RSS on CPU) and the
GPU energy counter. Training continues across repeats (the model is not re-initialised), so
repeats measure run-to-run variance of a warmed-up job, as the study's repeated runs did.

Data is synthetic and learnable (each sequence an arithmetic progression modulo the vocabulary,
seeded per step), or windows of a token file; every layout sees exactly the same global batch.

Fault injection for tests: `SCALELAB_FAULT=RANK:STEP[:KIND]` makes that rank fail at that global
step: raise a RuntimeError (default), raise torch.OutOfMemoryError (`oom`), die by SIGKILL
(`kill`) or stop answering (`hang`).
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional

from scalelab.config.layout import Layout
from scalelab.config.model import ModelSpec
from scalelab.config.options import AttentionKernel, Precision, Sharding
from scalelab.config.pipeline import Stage, stage_count
from scalelab.measure import forensics
from scalelab.measure.config import BenchOptions, load_tokens, under_torchrun
from scalelab.measure.energy import EnergyMeter
from scalelab.measure.model import Transformer, build_model, materialize
from scalelab.measure.parallel import (
    Meshes,
    ParallelDims,
    apply_ac,
    apply_compile,
    apply_ddp,
    apply_fsdp,
    apply_moe,
    apply_tp,
    build_meshes,
    build_schedule,
    clip_grad_norm_,
    cp_context,
    moe_layers,
    pipeline_modules,
)
from scalelab.measure.record import RepeatResult


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str


def flight_recorder_env(prefix: Path) -> dict[str, str]:
    """NCCL's flight recorder: each rank keeps its last collectives in a ring buffer and, when a
    collective times out, dumps it to `<prefix><rank>` (what every rank had issued and
    completed names the stuck collective and the ranks that never arrived)."""
    return {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": str(prefix),
    }


def init_distributed(timeout_s: float, flight_prefix: Path | None = None) -> DistInfo:
    """NCCL on GPUs, gloo on CPU; a one-process group when not launched by torchrun. On GPUs
    with `flight_prefix`, the NCCL flight recorder is on (variables already set are kept)."""
    cuda = torch.cuda.is_available()
    if cuda and flight_prefix is not None:
        flight_prefix.parent.mkdir(parents=True, exist_ok=True)
        for key, value in flight_recorder_env(flight_prefix).items():
            os.environ.setdefault(key, value)
    backend = "nccl" if cuda else "gloo"
    timeout = timedelta(seconds=timeout_s)
    if under_torchrun():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    else:
        rank, world, local_rank, local_world = 0, 1, 0, 1
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    elif os.environ.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    if not dist.is_initialized():
        if under_torchrun():
            dist.init_process_group(backend, timeout=timeout, device_id=device if cuda else None)
        else:
            dist.init_process_group(
                backend,
                store=dist.HashStore(),
                rank=0,
                world_size=1,
                timeout=timeout,
                device_id=device if cuda else None,
            )
    return DistInfo(rank, world, local_rank, local_world, device, backend)


class TokenData:
    """The global batch of each step: (inputs, labels), both (global_batch, seq_len) int64 on CPU."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int, path: str | None = None) -> None:
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.seed = seed
        self.tokens = None if path is None else load_tokens(path)

    def batch(
        self, step: int, global_batch: int, rows: slice | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows `rows` (default all) of step `step`'s global batch. Only the per-row seeds (two
        integers, or one offset, a row) are drawn for the whole batch; the sequences are built
        for the requested rows only, so a rank never materialises the global batch."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        rows = rows if rows is not None else slice(0, global_batch)
        if self.tokens is None:
            start = torch.randint(0, self.vocab_size, (global_batch, 1), generator=g)[rows]
            stride = torch.randint(1, self.vocab_size, (global_batch, 1), generator=g)[rows]
            seq = (start + stride * torch.arange(self.seq_len + 1)) % self.vocab_size
        else:
            n = self.tokens.shape[0] - self.seq_len - 1
            offsets = torch.randint(0, max(1, n), (global_batch,), generator=g)[rows].tolist()
            windows = [self.tokens[o : o + self.seq_len + 1].astype(np.int64) for o in offsets]
            seq = torch.from_numpy(np.stack(windows))
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def cross_entropy(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss in fp32 (works on vocab-sharded logits under loss parallelism)."""
    return functional.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _fault(rank: int, step: int) -> None:
    spec = os.environ.get("SCALELAB_FAULT")
    if not spec:
        return
    parts = spec.split(":")
    if int(parts[0]) == rank and int(parts[1]) == step:
        kind = parts[2] if len(parts) > 2 else "error"
        if kind == "oom":
            raise torch.OutOfMemoryError(f"injected out-of-memory on rank {rank} at step {step}")
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "hang":
            time.sleep(3600)
        raise RuntimeError(f"injected failure on rank {rank} at step {step}")


@dataclass(frozen=True)
class PrecisionPlan:
    """How a layout trains in the requested dtype (torchtitan's rules).

    bf16 goes through FSDP2's MixedPrecisionPolicy (bf16 parameters, fp32 reduction) wherever
    FSDP applies, including one process (FSDP on a one-rank mesh), so that 1 -> N GPU points
    run the same precision set-up; through autocast under DDP/ZeRO-1; and not at all under TP
    or PP without FSDP (torchtitan: mixed precision with TP or PP needs FSDP), which then
    trains in fp32 and says so (`note`)."""

    fsdp: bool
    ddp: bool
    autocast: bool
    compute_dtype: str
    note: str | None = None


def precision_plan(layout: Layout, dims: ParallelDims, bf16: bool) -> PrecisionPlan:
    dp_ranks = dims.dp_replicate * dims.fsdp_degree
    fsdp_kind = layout.sharding in (Sharding.FSDP, Sharding.ZERO2, Sharding.HSDP)
    single = dims.world_size == 1
    fsdp = fsdp_kind and (dp_ranks > 1 or (single and bf16))
    ddp = layout.sharding in (Sharding.DDP, Sharding.ZERO1) and dims.dp * dims.cp > 1
    if not bf16 or fsdp:
        return PrecisionPlan(fsdp, ddp, False, "bf16" if bf16 else "fp32")
    if layout.tp > 1 or layout.pp > 1:
        note = (
            "bf16 asked, trained in fp32: mixed precision with TP or PP needs FSDP (torchtitan); "
            "use fsdp/hsdp with dp > 1"
        )
        return PrecisionPlan(fsdp, ddp, False, "fp32", note)
    return PrecisionPlan(fsdp, ddp, True, "bf16")


def mesh_groups(params: list[nn.Parameter]) -> list[list[nn.Parameter]]:
    """Parameters grouped by device mesh (plain tensors together), in first-seen order."""
    from torch.distributed.tensor import DTensor

    groups: dict[Any, list[nn.Parameter]] = {}
    for p in params:
        key = id(p.device_mesh) if isinstance(p, DTensor) else "plain"
        groups.setdefault(key, []).append(p)
    return list(groups.values())


class PerMeshOptimizer:
    """Several optimizers stepped as one (one per device mesh)."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for o in self.optimizers for g in o.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for o in self.optimizers:
            o.step()


class Trainer:
    """The model(s), optimizer and one training step for a layout on this rank."""

    def __init__(
        self, spec: ModelSpec, layout: Layout, options: BenchOptions, info: DistInfo
    ) -> None:
        self.spec, self.layout, self.options, self.info = spec, layout, options, info
        device = info.device
        self.dims = ParallelDims.from_layout(layout, info.local_world_size)
        if self.dims.world_size != info.world_size:
            raise RuntimeError(
                f"layout needs {self.dims.world_size} processes, the job has {info.world_size}"
            )
        self.meshes: Meshes = build_meshes(self.dims, device.type)
        dtype = options.compute_dtype
        requested = ("bf16" if device.type == "cuda" else "fp32") if dtype == "auto" else dtype
        plan = precision_plan(layout, self.dims, requested == "bf16")
        self.uses_fsdp, self.uses_ddp, self.autocast = plan.fsdp, plan.ddp, plan.autocast
        self.compute_dtype, self.precision_note = plan.compute_dtype, plan.note
        bf16 = self.compute_dtype == "bf16"
        self.loss_parallel = layout.tp > 1
        self.pp_rank = self.meshes["pp"].get_local_rank()
        self.dp_rank = self.meshes.dp.get_local_rank()

        def build(stage: Stage) -> nn.Module:
            return build_model(
                spec, layout.seq_len, "meta", stage.layers, stage.embedding, stage.head
            )

        if layout.pp > 1:
            stage_modules = pipeline_modules(spec, layout, self.pp_rank, build)
        else:
            stage_modules = [(0, build_model(spec, layout.seq_len, "meta"))]
        # Under a pipeline, parameters stay gathered from forward to backward (torchtitan's
        # default: resharding would re-gather them on every micro-batch) and the pipeline stage
        # keeps them gathered until the last micro-batch's backward, so FSDP gathers and reduces
        # once per step, as the predictor assumes.
        reshard = (
            layout.reshard_after_forward and layout.sharding != Sharding.ZERO2 and layout.pp == 1
        )
        self.reshard_after_forward = reshard and self.uses_fsdp
        self.fp8 = layout.precision == Precision.FP8
        self.fp8_all_gather = self.fp8 and options.fp8_all_gather and self.uses_fsdp
        self.fp8_note: str | None = None
        block_styles = None
        if self.fp8:  # torchtitan's Float8Converter: convert before parallelising
            from scalelab.measure import fp8

            recipe = options.fp8_recipe
            fp8.check_local_device()
            if device.type != "cuda":
                fp8.check_gloo(recipe, layout.tp, layout.sequence_parallel)
            n_fp8 = sum(len(fp8.convert(m, recipe, self.fp8_all_gather)) for _, m in stage_modules)
            block_styles = fp8.tp_styles(recipe)
            self.fp8_note = fp8.note(recipe, n_fp8, self.fp8_all_gather, layout.tp > 1)
        self.stages: list[tuple[int, nn.Module]] = []
        # Ranks FSDP averages an expert's gradient over (see parallel.apply_moe).
        dims = self.dims
        expert_reducers = dims.dp_replicate * dims.dp_shard_mod_ep if self.uses_fsdp else 1
        for index, module in stage_modules:
            if layout.tp > 1:
                apply_tp(
                    module,
                    self.meshes["tp"],
                    layout.sequence_parallel,
                    self.loss_parallel,
                    block_styles,
                )
            if spec.is_moe:
                apply_moe(module, self.meshes, expert_reducers)
            apply_ac(module, layout.recompute)
            if options.compile:
                apply_compile(module)
            if self.uses_fsdp:
                apply_fsdp(
                    module,
                    self.meshes.fsdp,
                    torch.bfloat16 if bf16 else None,
                    reshard,
                    self.meshes.expert_fsdp,
                )
            materialize(module, spec, options.seed, device)
            if self.uses_ddp:
                module = apply_ddp(module, self.meshes.dp_cp.get_group())
            self.stages.append((index, module))
        self.modules = [module for _, module in self.stages]
        self.params = [p for m in self.modules for p in m.parameters()]
        self._init_moe()
        self.optimizer = self._optimizer()
        self.schedule: Any = None
        if layout.pp > 1:
            n_stages = stage_count(layout)
            self.schedule = build_schedule(
                self.stages, layout, n_stages, device, self.meshes["pp"].get_group(), cross_entropy
            )
            self.has_first = any(idx == 0 for idx, _ in self.stages)
            self.has_last = any(idx == n_stages - 1 for idx, _ in self.stages)
        self.rope_buffers = [
            buf
            for m in self.modules
            for t in m.modules()
            if isinstance(t, Transformer)
            for buf in (t.rope_cos, t.rope_sin)
        ]
        self.data = TokenData(spec.vocab_size, layout.seq_len, options.seed, options.data)
        self.local_batch = layout.global_batch // self.dims.dp
        self.local_seq_len: int | None = None  # tokens per sequence a rank sees (seq_len / cp)

    def _init_moe(self) -> None:
        """The MoE layers of this rank (global layer index, module), the gradients to sum over
        TP after backward, the sliced expert weights for the gradient norm, and the per-step
        routed-token counts (load imbalance)."""
        self.moe_modules = [pair for m in self.modules for pair in moe_layers(m)]
        self.tp_partial = [p for _, m in self.moe_modules for p in m.tp_partial_params()]
        routed_groups, shared_groups = [], []
        if self.meshes.ep is not None:
            routed_groups.append(self.meshes.ep.get_group())
        if self.dims.tp > 1 and self.dims.etp > 1:
            routed_groups.append(self.meshes["tp"].get_group())
            shared_groups.append(self.meshes["tp"].get_group())
        routed, shared = [], []
        for _, m in self.moe_modules:
            r, s = m.sliced_params()
            routed += r
            shared += s
        self.sliced = [
            (ps, gs) for ps, gs in ((routed, routed_groups), (shared, shared_groups)) if gs
        ]
        # Per step: an (n_layers, n_experts) tensor of routed (token, choice) slots (of the
        # tokens this rank routed), and an (n_layers,) tensor of the rows its experts computed.
        self.expert_counts: list[torch.Tensor] = []
        self.expert_rows: list[torch.Tensor] = []

    def _sum_tp_partial_grads(self) -> None:
        """Sum over TP the gradients each TP rank holds only part of (`MoE.tp_partial_params`)."""
        from torch.distributed.tensor import DTensor

        grads = [
            g.to_local() if isinstance(g, DTensor) else g
            for p in self.tp_partial
            if (g := p.grad) is not None
        ]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.meshes["tp"].get_group())
        for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
            g.copy_(part.view_as(g))

    def _record_expert_counts(self) -> None:
        if not self.spec.is_moe:
            return
        counts = torch.zeros(
            self.spec.n_layers, self.spec.n_experts, dtype=torch.float64, device=self.info.device
        )
        rows = torch.zeros(self.spec.n_layers, dtype=torch.float64, device=self.info.device)
        for index, m in self.moe_modules:
            counts[index] += m.tokens_per_expert
            rows[index] += m.experts.rows_computed
            m.tokens_per_expert.zero_()
            m.experts.rows_computed.zero_()
        self.expert_counts.append(counts)
        self.expert_rows.append(rows)

    def _optimizer(self) -> Any:
        kwargs: dict[str, Any] = {"lr": self.options.lr, "betas": (0.9, 0.95), "weight_decay": 0.1}
        if self.layout.sharding == Sharding.ZERO1 and self.uses_ddp:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            return ZeroRedundancyOptimizer(
                self.params,
                optimizer_class=torch.optim.AdamW,
                process_group=self.meshes.dp_cp.get_group(),
                # One broadcast per rank's shard (an all-gather), not one per parameter.
                parameters_as_bucket_view=True,
                **kwargs,
            )
        # Multi-tensor kernels need every parameter of one call on one mesh (or none): one AdamW
        # per mesh, fused on GPU, foreach on CPU, instead of a per-parameter loop over all.
        fast: dict[str, Any] = (
            {"fused": True} if self.info.device.type == "cuda" else {"foreach": True}
        )
        groups = mesh_groups(self.params)
        if len(groups) == 1:
            return torch.optim.AdamW(groups[0], **fast, **kwargs)
        return PerMeshOptimizer([torch.optim.AdamW(g, **fast, **kwargs) for g in groups])

    def _context(
        self, inputs: torch.Tensor | None, labels: torch.Tensor | None
    ) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        if self.layout.cp > 1:
            buffers = [b for b in (inputs, labels) if b is not None]
            seq_dims = [1] * len(buffers) + [0] * len(self.rope_buffers)
            stack.enter_context(
                cp_context(self.meshes["cp"], buffers + self.rope_buffers, seq_dims, set(buffers))
            )
        if self.loss_parallel:
            from torch.distributed.tensor.parallel import loss_parallel

            stack.enter_context(loss_parallel())
        if self.autocast:
            stack.enter_context(torch.autocast(self.info.device.type, dtype=torch.bfloat16))
        if self.layout.attention == AttentionKernel.MATH:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
        return stack

    def local_data(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This data-parallel rank's rows of step `step`'s global batch, on the device (built
        before the step's timer starts: `_timed_steps`)."""
        rows = slice(self.dp_rank * self.local_batch, (self.dp_rank + 1) * self.local_batch)
        inputs, labels = self.data.batch(step, self.layout.global_batch, rows)
        device = self.info.device
        return inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)

    def step(
        self, step: int, batch: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step on `batch` (this rank's rows; built here if None); returns this
        rank's loss contribution and the gradient norm."""
        forensics.at(step, "start of step")
        _fault(self.info.rank, step)
        inputs, labels = batch if batch is not None else self.local_data(step)
        self.optimizer.zero_grad(set_to_none=True)
        if self.schedule is not None:
            forensics.at(step, "pipeline schedule (forward and backward)")
            loss = self._pipeline_step(inputs, labels)
        else:
            loss = self._flat_step(inputs, labels)
        if self.tp_partial:
            self._sum_tp_partial_grads()
        pp_group = self.meshes["pp"].get_group() if self.layout.pp > 1 else None
        forensics.at(step, "gradient clipping")
        with torch.profiler.record_function("scalelab::clip_grad_norm"):
            norm = clip_grad_norm_(self.params, self.options.grad_clip, pp_group, self.sliced)
        forensics.at(step, "optimizer")
        self.optimizer.step()
        if self.fp8_all_gather:
            from scalelab.measure.fp8 import precompute_scales

            precompute_scales(self.modules)
        self._record_expert_counts()
        return loss, norm

    def _grad_sync(self, model: nn.Module, sync: bool) -> contextlib.AbstractContextManager[Any]:
        """Reduce this micro-batch's gradients now (`sync`) or let them accumulate locally:
        DDP's `no_sync`, FSDP2's `set_requires_gradient_sync` (reduce-scatter and HSDP's
        all-reduce both skipped; the unsharded gradients accumulate until the last micro-batch)."""
        if self.uses_fsdp:
            from torch.distributed.fsdp import FSDPModule

            if isinstance(model, FSDPModule):
                model.set_requires_gradient_sync(sync)
                if self.layout.sharding == Sharding.ZERO2:
                    # ZeRO-2 keeps the parameters gathered until the step's last backward.
                    model.set_reshard_after_backward(sync)
            return contextlib.nullcontext()
        if self.uses_ddp and not sync:
            return model.no_sync()  # type: ignore[operator, no-any-return]
        return contextlib.nullcontext()

    def _flat_step(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        n_micro, mb = self.layout.n_microbatches, self.layout.micro_batch
        total = torch.zeros((), device=self.info.device)
        model = self.modules[0]
        per_step = self.options.grad_sync == "step"
        for j in range(n_micro):
            x = inputs[j * mb : (j + 1) * mb].clone()
            y = labels[j * mb : (j + 1) * mb].clone()
            sync = not per_step or j == n_micro - 1
            with self._grad_sync(model, sync), self._context(x, y):
                self.local_seq_len = x.shape[1]
                forensics.at(forensics.PROGRESS.step, f"forward (micro-batch {j + 1}/{n_micro})")
                loss = cross_entropy(model(x), y)
                forensics.at(forensics.PROGRESS.step, f"backward (micro-batch {j + 1}/{n_micro})")
                (loss / n_micro).backward()
            total += _local(loss.detach()).float()
        return total / n_micro

    def _pipeline_step(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        x = inputs if self.has_first else None
        y = labels if self.has_last else None
        seen = x if x is not None else y
        with self._context(x, y):
            if seen is not None:
                self.local_seq_len = seen.shape[1]
            if self.has_first and self.has_last:
                self.schedule.step(x, target=y, losses=losses)
            elif self.has_first:
                self.schedule.step(x)
            elif self.has_last:
                self.schedule.step(target=y, losses=losses)
            else:
                self.schedule.step()
        if not losses:
            return torch.zeros((), device=self.info.device)
        return torch.stack([_local(loss.detach()).float() for loss in losses]).mean()

    @property
    def loss_divisor(self) -> int:
        """Ranks holding a loss: all of them, or the last pipeline stage's."""
        return self.info.world_size // self.layout.pp


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step_memory(device: torch.device) -> tuple[float, float, float]:
    """After a step (outside its timer): the CUDA allocator's peak allocated and reserved bytes
    during the step (then reset), and the process's resident set now (bytes)."""
    rss = float("nan")
    try:
        with open("/proc/self/statm") as fh:
            rss = float(int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        pass
    if device.type != "cuda":
        return 0.0, 0.0, rss
    alloc = float(torch.cuda.max_memory_allocated(device))
    reserved = float(torch.cuda.max_memory_reserved(device))
    torch.cuda.reset_peak_memory_stats(device)
    return alloc, reserved, rss


def _timed_steps(
    trainer: Trainer,
    first_step: int,
    n: int,
    memory: list[tuple[float, float, float]] | None = None,
) -> tuple[list[float], list[torch.Tensor], list[torch.Tensor]]:
    device = trainer.info.device
    times, losses, norms = [], [], []
    for i in range(n):
        batch = trainer.local_data(first_step + i)  # outside the timed step
        _sync(device)
        t0 = time.perf_counter()
        loss, norm = trainer.step(first_step + i, batch)
        _sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss)
        norms.append(norm)
        if memory is not None:
            memory.append(_step_memory(device))
    return times, losses, norms


def _reduce(values: list[float], op: dist.ReduceOp.RedOpType, device: torch.device) -> list[float]:
    if not values:
        return []
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return [float(v) for v in t.tolist()]


def run_repeat(trainer: Trainer, meter: EnergyMeter, first_step: int) -> RepeatResult:
    """Warm-up then measured steps from global step `first_step`."""
    opts, device = trainer.options, trainer.info.device
    trainer.expert_counts.clear()
    trainer.expert_rows.clear()
    w_times, w_losses, _ = _timed_steps(trainer, first_step, opts.warmup)
    forensics.at(None, "barrier after the warm-up steps")
    dist.barrier()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    energy0 = meter.read_j()
    _sync(device)
    memory: list[tuple[float, float, float]] = []
    t0 = time.perf_counter()
    times, losses, norms = _timed_steps(trainer, first_step + opts.warmup, opts.steps, memory)
    window = time.perf_counter() - t0
    energy1 = meter.read_j()

    max_op, sum_op = dist.ReduceOp.MAX, dist.ReduceOp.SUM
    forensics.at(None, "reducing the repeat's measurements")
    divisor = trainer.loss_divisor
    loss_all = torch.stack([*w_losses, *losses]).double() if (w_losses or losses) else None
    if loss_all is not None:
        dist.all_reduce(loss_all, op=sum_op)
        loss_list = [float(v) / divisor for v in loss_all.tolist()]
    else:
        loss_list = []
    norm_list = [float(n) for n in torch.stack(norms).tolist()] if norms else []
    w_times_r = _reduce(w_times, max_op, device)
    times_r = _reduce(times, max_op, device)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    # Per measured step, the largest over ranks: CUDA peak allocated (GPU) or resident set (CPU).
    cuda = device.type == "cuda"
    per_step = _reduce([m[0] if cuda else m[2] for m in memory], max_op, device)
    if cuda:  # the window's peaks: the largest of the steps' (each step reset the counters)
        alloc = max((m[0] for m in memory), default=0.0)
        reserved = max((m[1] for m in memory), default=0.0)
    else:
        alloc, reserved = 0, 0
    window_r, rss_r, alloc_r, reserved_r = _reduce([window, rss, alloc, reserved], max_op, device)
    # Every rank's own GPU energy over the window (NaN where its counter is unavailable).
    local = (energy1 - energy0) if energy0 is not None and energy1 is not None else float("nan")
    gathered = [
        torch.zeros(1, dtype=torch.float64, device=device) for _ in range(trainer.info.world_size)
    ]
    dist.all_gather(gathered, torch.tensor([local], dtype=torch.float64, device=device))
    per_rank = [float(t.item()) for t in gathered]
    has_energy = all(v == v for v in per_rank)  # no NaN: every rank read its counter
    extra: dict[str, Any] = {}
    if trainer.spec.is_moe and opts.steps:
        extra["expert_load_imbalance"] = expert_load_imbalance(
            trainer.spec, trainer.expert_counts[-opts.steps :]
        )
        extra["ep_load_imbalance"] = ep_load_imbalance(trainer, trainer.expert_rows[-opts.steps :])
    return RepeatResult(
        warmup_step_time_s=w_times_r,
        warmup_loss=loss_list[: len(w_losses)],
        step_time_s=times_r,
        loss=loss_list[len(w_losses) :],
        grad_norm=norm_list,
        window_s=window_r,
        peak_memory_allocated_bytes=int(alloc_r) if cuda else None,
        peak_memory_reserved_bytes=int(reserved_r) if cuda else None,
        peak_rss_bytes=int(rss_r),
        window_energy_j_per_rank=per_rank if has_energy else None,
        memory_bytes=[int(v) if v == v else None for v in per_step],
        extra=extra,
    )


def ep_load_imbalance(trainer: Trainer, per_step: list[torch.Tensor]) -> list[float]:
    """Per step, the MoE layers' mean of max over an EP group's ranks / mean over them of the
    (token, choice) rows each rank's experts computed, averaged over the EP groups: how much
    more the busiest EP rank computes than the average one (the predictor's load-imbalance
    factor, perf/moe.py). 1.0 without expert parallelism."""
    rows = torch.stack(per_step)  # (steps, n_layers): this rank's
    ratio = torch.ones_like(rows)
    if trainer.meshes.ep is not None:
        group = trainer.meshes.ep.get_group()
        busiest, total = rows.clone(), rows.clone()
        dist.all_reduce(busiest, op=dist.ReduceOp.MAX, group=group)
        dist.all_reduce(total, group=group)
        ratio = busiest / (total / trainer.dims.ep).clamp_min(1e-12)
    # Average over the ranks that hold each MoE layer (pipeline stages hold different layers).
    here = torch.zeros(trainer.spec.n_layers, dtype=rows.dtype, device=rows.device)
    for index, _ in trainer.moe_modules:
        here[index] = 1.0
    summed = torch.stack([ratio * here, here.expand_as(ratio)])
    dist.all_reduce(summed)
    layers = [i for i in range(trainer.spec.n_layers) if trainer.spec.is_moe_layer(i)]
    mean = summed[0][:, layers] / summed[1][:, layers].clamp_min(1.0)
    return [float(v) for v in mean.mean(dim=-1).tolist()]


def expert_load_imbalance(spec: ModelSpec, per_step: list[torch.Tensor]) -> list[float]:
    """Per step, the MoE layers' mean of max over experts / mean over experts of the (token,
    choice) slots routed to each expert in the whole global batch (1.0: perfectly balanced; the
    busiest expert's excess work). Each rank's counts of the tokens it routed are summed over all
    ranks (ranks that route the same tokens, TP ranks under expert_tp = tp, only scale all
    counts alike, which leaves the ratio unchanged)."""
    counts = torch.stack(per_step)
    dist.all_reduce(counts)
    rows = [i for i in range(spec.n_layers) if spec.is_moe_layer(i)]
    moe = counts[:, rows]
    ratio = moe.max(dim=-1).values / moe.mean(dim=-1).clamp_min(1e-12)
    return [float(v) for v in ratio.mean(dim=-1).tolist()]


# Kineto's least severe level that prints nothing: its logger prints lines at or above
# KINETO_LOG_LEVEL, and its levels are VERBOSE 0, INFO 1, WARNING 2, STAGE 3, ERROR 4, USDT 5
# (pytorch/kineto libkineto/src/Logger.h; USDT "profiler_start/stop" since kineto PR #1325), so 6
# silences the "STAGE:..." and "USDT:... profiler_start" lines every rank wrote to stderr. A
# KINETO_LOG_LEVEL the user set is kept.
KINETO_QUIET_LEVEL = "6"


def profile_window(trainer: Trainer, first_step: int, trace_dir: Path) -> Path:
    """One warm-up and `profile_steps` active profiled steps; one Kineto trace per rank."""
    os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET_LEVEL)  # read when profiling starts
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]
    if trainer.info.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    trace_dir.mkdir(parents=True, exist_ok=True)
    path = trace_dir / f"rank{trainer.info.rank}.json.gz"
    active = trainer.options.profile_steps
    with profile(
        activities=activities,
        schedule=schedule(wait=0, warmup=1, active=active, repeat=1),
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)),
    ) as prof:
        for i in range(1 + active):
            batch = trainer.local_data(first_step + i)
            trainer.step(first_step + i, batch)
            _sync(trainer.info.device)
            prof.step()
    return path
