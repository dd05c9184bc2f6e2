"""Run a benchmark: as a worker (one process of the job) or as the launcher of a torchrun job.

`scalelab bench ... --nproc-per-node N` on a machine starts `torchrun --standalone` with itself
as the program; each process then runs `run_worker`. Under a torchrun (or srun + torchrun) that
the user started, the processes are workers directly. Rank 0 writes the record; a rank that fails
writes a `failed` (or `oom`) record naming itself, the first writer winning. A rank that merely
lost its peers (closed connection, collective timeout, SIGTERM) marks its record as secondary;
the launcher then names the rank torchrun saw die by a signal, and writes the record itself if no
rank could. Nothing is written until the run ends, and writes are atomic, so a killed run leaves
no record at all rather than a partial one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import traceback
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from scalelab.config.hardware import ClusterSpec
from scalelab.config.layout import Layout
from scalelab.config.model import ModelSpec
from scalelab.measure.config import BenchOptions, hardware_flops_per_token, under_torchrun
from scalelab.results import (
    Record,
    load_record,
    new_run_id,
    record_name,
    summarize,
    utc_now,
    write_record,
)

SECONDARY_NOTE = (
    "reported by a rank that lost its peers or was stopped; another rank may have failed first"
)

SUMMARY_METRICS = (
    "step_time_s",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "hfu",
    "peak_memory_allocated_bytes",
    "peak_memory_reserved_bytes",
    "peak_rss_bytes",
    "energy_j",
    "avg_power_w",
    "tokens_per_j",
    "energy_per_token_j",
    "final_loss",
)


def layout_label(layout: Layout) -> str:
    """A short name for file names: `fsdp-g2`, `hsdp-g4-tp2`, `fsdp-g4-pp2-1f1b`."""
    parts = [layout.sharding, f"g{layout.gpus}"]
    if layout.tp > 1:
        parts.append(f"tp{layout.tp}" + ("sp" if layout.sequence_parallel else ""))
    if layout.pp > 1:
        parts.append(f"pp{layout.pp}-{layout.pp_schedule}")
    if layout.cp > 1:
        parts.append(f"cp{layout.cp}")
    if layout.recompute != "none":
        parts.append(f"ac-{layout.recompute}")
    return "-".join(parts)


class RunIdentity:
    """The run id, creation time and file name every rank of one run shares.

    A caller that runs many benchmarks (`scalelab sweep`) chooses them itself, so that it finds a
    run's record by name, and may attach `tags` (JSON) that land in the record's
    `workload["tags"]`; it passes them as `SCALELAB_RUN_*` environment variables.
    """

    def __init__(
        self, run_id: str, created_utc: str, name: str, tags: dict[str, Any] | None = None
    ) -> None:
        self.run_id, self.created_utc, self.name = run_id, created_utc, name
        self.tags = tags

    @classmethod
    def new(cls, spec: ModelSpec, layout: Layout) -> RunIdentity:
        run_id, created = new_run_id(), utc_now()
        return cls(
            run_id,
            created,
            record_name("bench", f"{spec.name}-{layout_label(layout)}", created, run_id),
        )

    @classmethod
    def from_env(cls) -> RunIdentity | None:
        env = os.environ
        if all(k in env for k in ("SCALELAB_RUN_ID", "SCALELAB_RUN_CREATED", "SCALELAB_RUN_NAME")):
            tags = None
            if env.get("SCALELAB_RUN_TAGS"):
                with contextlib.suppress(ValueError):
                    loaded = json.loads(env["SCALELAB_RUN_TAGS"])
                    tags = loaded if isinstance(loaded, dict) else None
            return cls(
                env["SCALELAB_RUN_ID"],
                env["SCALELAB_RUN_CREATED"],
                env["SCALELAB_RUN_NAME"],
                tags,
            )
        return None

    def to_env(self) -> dict[str, str]:
        env = {
            "SCALELAB_RUN_ID": self.run_id,
            "SCALELAB_RUN_CREATED": self.created_utc,
            "SCALELAB_RUN_NAME": self.name,
        }
        if self.tags:
            env["SCALELAB_RUN_TAGS"] = json.dumps(self.tags, sort_keys=True)
        return env


def workload(spec: ModelSpec, layout: Layout, options: BenchOptions) -> dict[str, Any]:
    return {
        "model": spec.name,
        "model_spec": spec.model_dump(),
        "n_params": spec.n_params,
        "seq_len": layout.seq_len,
        "global_batch": layout.global_batch,
        "tokens_per_step": layout.global_batch * layout.seq_len,
        "model_flops_per_token": spec.model_flops_per_token(layout.seq_len),
        "hardware_flops_per_token": hardware_flops_per_token(
            spec, layout.seq_len, layout.recompute
        ),
        "steps": options.steps,
        "warmup": options.warmup,
        "repeats": options.repeats,
        "seed": options.seed,
        "lr": options.lr,
        "grad_clip": options.grad_clip,
        "compile": options.compile,
        "compute_dtype": options.compute_dtype,
        "data": options.data or "synthetic",
        "profile": options.profile,
    }


def base_record(
    identity: RunIdentity,
    spec: ModelSpec,
    layout: Layout,
    options: BenchOptions,
    cluster_name: str | None,
    status: str,
    error: str | None = None,
) -> Record:
    work = workload(spec, layout, options)
    if identity.tags:
        work["tags"] = identity.tags
    return Record(
        kind="bench",
        run_id=identity.run_id,
        name=identity.name,
        created_utc=identity.created_utc,
        status=status,  # type: ignore[arg-type]
        error=error,
        workload=work,
        layout=layout.model_dump(),
        cluster=cluster_name,
    )


def prediction(spec: ModelSpec, cluster: ClusterSpec, layout: Layout) -> dict[str, Any]:
    """The predictor's numbers for the same layout (imported lazily; checked by the CLI first)."""
    from scalelab.perf.predict import predict_layout

    try:
        result = dict(predict_layout(spec, cluster, layout))
    except Exception as exc:
        return {"cluster": cluster.name, "error": f"{type(exc).__name__}: {exc}"}
    return {"cluster": cluster.name, **result}


class TerminatedError(Exception):
    """This rank got SIGTERM: torchrun stopping it after another rank failed, or a cancelled job."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise TerminatedError("terminated by SIGTERM (torchrun stops the other ranks when one fails)")


_PEER_LOSS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "timed out",
    "remote process exited",
    "communicator was aborted",
    "ncclremoteerror",
)


def _secondary(exc: BaseException) -> bool:
    """An error that reports another rank's failure rather than this rank's own."""
    return isinstance(exc, TerminatedError) or any(s in str(exc).lower() for s in _PEER_LOSS)


def _error_text(rank: int, exc: BaseException) -> str:
    text = f"rank {rank}: {type(exc).__name__}: {exc}".strip()
    return text if len(text) <= 2000 else text[:2000] + " ..."


def _is_oom(exc: BaseException) -> bool:
    import torch

    return (
        isinstance(exc, (torch.OutOfMemoryError, MemoryError))
        or "out of memory" in str(exc).lower()
    )


def run_worker(
    spec: ModelSpec,
    layout: Layout,
    options: BenchOptions,
    cluster: ClusterSpec | None,
    cluster_name: str | None,
    predict_cluster: ClusterSpec | None,
) -> tuple[int, Path | None]:
    """Run this process's part of the benchmark; returns (exit code, record path on rank 0)."""
    import torch.distributed as dist

    from scalelab.measure.train import init_distributed

    identity = RunIdentity.from_env()
    rank = int(os.environ.get("RANK", "0"))
    out_dir = Path(options.out_dir)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        info = init_distributed(options.timeout_s)
        rank = info.rank
        if identity is None:
            shared: list[Any] = [RunIdentity.new(spec, layout) if rank == 0 else None]
            dist.broadcast_object_list(shared, src=0)
            identity = shared[0]
        assert identity is not None
        record = _measure(
            spec, layout, options, info, identity, cluster, cluster_name, predict_cluster
        )
        path = write_record(record, out_dir) if rank == 0 else None
        dist.barrier()
        dist.destroy_process_group()
        return 0, path
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        if identity is None:
            identity = RunIdentity.new(spec, layout)
        status = "oom" if _is_oom(exc) else "failed"
        record = base_record(
            identity, spec, layout, options, cluster_name, status, _error_text(rank, exc)
        )
        if _secondary(exc):
            record.notes["error"] = SECONDARY_NOTE
        path = None
        try:
            path = write_record(record, out_dir, overwrite=False)
            print(f"scalelab bench: {status} on rank {rank}; record {path}", file=sys.stderr)
        except FileExistsError:
            pass
        if not under_torchrun():
            if dist.is_initialized():
                dist.destroy_process_group()
            return 1, path
        sys.stderr.flush()
        sys.stdout.flush()
        # Other ranks may wait in a collective: leave at once, torchrun stops the rest.
        os._exit(1)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _measure(
    spec: ModelSpec,
    layout: Layout,
    options: BenchOptions,
    info: Any,
    identity: RunIdentity,
    cluster: ClusterSpec | None,
    cluster_name: str | None,
    predict_cluster: ClusterSpec | None,
) -> Record:
    import torch
    import torch.distributed as dist

    from scalelab.measure.energy import EnergyMeter
    from scalelab.measure.env import environment, local_facts
    from scalelab.measure.train import Trainer, profile_window, run_repeat

    device = info.device
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    facts: list[Any] = [None] * info.world_size
    dist.all_gather_object(facts, local_facts(device_name))
    trainer = Trainer(spec, layout, options, info)
    meter = EnergyMeter(device.index if device.type == "cuda" else None)
    log = _progress if info.rank == 0 else None

    repeats = []
    step = 0
    for r in range(options.repeats):
        result = run_repeat(trainer, meter, step)
        step += options.warmup + options.steps
        repeats.append(result)
        if log:
            tps = layout.global_batch * layout.seq_len * options.steps / result.window_s
            log(
                f"repeat {r + 1}/{options.repeats}: {tps:,.0f} tokens/s, loss {result.loss[-1]:.4f}"
            )

    trace_paths: list[str] = []
    trace_dir = Path(options.out_dir) / "traces" / identity.name
    if options.profile:
        profile_window(trainer, step, trace_dir)
        dist.barrier()
        trace_paths = [str(trace_dir / f"rank{r}.json.gz") for r in range(info.world_size)]

    if info.rank != 0:
        return base_record(identity, spec, layout, options, cluster_name, "ok")

    record = base_record(identity, spec, layout, options, cluster_name, "ok")
    record.workload["compute_dtype"] = trainer.compute_dtype
    record.workload["mesh"] = {
        "pp": trainer.dims.pp,
        "dp_replicate": trainer.dims.dp_replicate,
        "dp_shard": trainer.dims.dp_shard,
        "cp": trainer.dims.cp,
        "tp": trainer.dims.tp,
    }
    record.environment = environment(facts, info.backend, info.world_size)
    if meter.driver_version:
        record.environment["nvidia_driver"] = meter.driver_version
    notes: dict[str, str] = {}
    peak = None
    if device.type != "cuda":
        notes["mfu"] = "CPU run: no GPU dense peak to compare with"
    elif cluster is None:
        notes["mfu"] = f"unknown GPU '{device_name}': pass --cluster to set its dense peak"
    else:
        peak = cluster.gpu.peak_flops(layout.precision)
    if device.type != "cuda":
        notes["peak_memory_allocated_bytes"] = "CPU run: CUDA allocator figures do not apply"
    if not meter.available and meter.reason:
        notes["energy_j"] = meter.reason

    tokens_per_step = layout.global_batch * layout.seq_len
    model_flops = spec.model_flops_per_token(layout.seq_len)
    hw_flops = hardware_flops_per_token(spec, layout.seq_len, layout.recompute)
    per_repeat = []
    raw = []
    for i, res in enumerate(repeats):
        tokens = tokens_per_step * options.steps
        tps = tokens / res.window_s
        energy = res.energy_j
        figures: dict[str, Any] = {
            "step_time_s": sum(res.step_time_s) / len(res.step_time_s),
            "tokens_per_s": tps,
            "tokens_per_s_per_gpu": tps / info.world_size,
            "mfu": model_flops * tps / (info.world_size * peak) if peak else None,
            "hfu": hw_flops * tps / (info.world_size * peak) if peak else None,
            "peak_memory_allocated_bytes": res.peak_memory_allocated_bytes,
            "peak_memory_reserved_bytes": res.peak_memory_reserved_bytes,
            "peak_rss_bytes": res.peak_rss_bytes,
            "energy_j": energy,
            "avg_power_w": energy / res.window_s if energy is not None else None,
            "tokens_per_j": tokens / energy if energy else None,
            "energy_per_token_j": energy / tokens if energy is not None else None,
            "final_loss": res.loss[-1] if res.loss else None,
        }
        per_repeat.append(figures)
        raw.append(
            {
                "repeat": i,
                "window_s": res.window_s,
                "step_time_s": res.step_time_s,
                "tokens_per_s": [tokens_per_step / t for t in res.step_time_s],
                "loss": res.loss,
                "grad_norm": res.grad_norm,
                "warmup_step_time_s": res.warmup_step_time_s,
                "warmup_loss": res.warmup_loss,
                **{
                    k: figures[k]
                    for k in SUMMARY_METRICS
                    if k not in ("step_time_s", "tokens_per_s")
                },
            }
        )
    record.measurements = {"repeats": raw}
    record.summary = summarize(per_repeat, SUMMARY_METRICS)

    if options.profile:
        record.measurements["trace_paths"] = trace_paths
        record.measurements["exposed_comm"] = _exposed_comm(trace_paths, notes)
    if predict_cluster is not None:
        record.prediction = prediction(spec, predict_cluster, layout)
    record.notes = notes
    return record


def _exposed_comm(paths: list[str], notes: dict[str, str]) -> Any:
    try:
        from scalelab.trace import analyze
    except ImportError:
        notes["exposed_comm"] = "trace analyser not installed"
        return None
    try:
        report = analyze(paths)
    except Exception as exc:
        notes["exposed_comm"] = f"trace analysis failed: {type(exc).__name__}: {exc}"
        return None
    if hasattr(report, "model_dump"):
        return report.model_dump()
    if hasattr(report, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(report)
    return {"report": str(report)}


def _progress(message: str) -> None:
    print(f"scalelab bench: {message}", file=sys.stderr, flush=True)


# Launcher ----------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the launcher dies (Linux), so no orphan job keeps running."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


_RANK_FIELD = re.compile(r"rank\s*:\s*(\d+)")
_EXITCODE = re.compile(r"exitcode\s*:\s*(-?\d+)")


def launch(
    worker_argv: list[str],
    nproc_per_node: int,
    identity: RunIdentity,
    out_dir: Path,
    failed_record: Record | None,
    torchrun_args: Sequence[str] = ("--standalone",),
) -> tuple[int, Path | None]:
    """Run `python -m scalelab <worker_argv>` under torchrun; returns (rc, record).

    `torchrun_args` set up the rendezvous: `--standalone` on one machine, or `--nnodes`,
    `--node-rank`, `--rdzv-backend c10d`, `--rdzv-endpoint HOST:PORT` on each node of a multi-node
    job. torchrun's stderr is passed through and its tail kept to name the failed rank if the job
    dies without writing a record itself; then `failed_record` is written (pass None on every node
    but the first, so that one node speaks for the job). A run interrupted with Ctrl-C writes no
    record: it was stopped, not failed.
    """
    env = dict(os.environ)
    env.update(identity.to_env())
    env["SCALELAB_QUIET_WORKER"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", *torchrun_args,
        f"--nproc-per-node={nproc_per_node}", "-m", "scalelab", *worker_argv,
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        preexec_fn=_die_with_parent,
    )
    tail: deque[str] = deque(maxlen=400)

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            tail.append(line)
            sys.stderr.write(line)
            sys.stderr.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()

    interrupted = False

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupted
        interrupted = True
        proc.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        interrupted = True
        proc.send_signal(signal.SIGINT)
        rc = proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
        reader.join(timeout=5)
    final = out_dir / f"{identity.name}.json"
    # SIGTERM from outside (scancel, a time limit, pre-emption) may reach torchrun before us.
    interrupted = interrupted or rc == -signal.SIGTERM
    if rc == 0 or interrupted:
        return rc, final if final.exists() else None
    culprit = _culprit("".join(tail))
    who = f"rank {culprit[0]}" if culprit else "an unknown rank"
    how = ""
    if culprit and culprit[1] is not None:
        code = culprit[1]
        how = f" by signal {_signal_name(-code)}" if code < 0 else f" with exit code {code}"
    if final.exists():
        record = load_record(final)
        reporter = (record.error or "").split(":", 1)[0]
        if culprit and record.notes.get("error") == SECONDARY_NOTE and reporter != who:
            record.error = f"{who} died{how}; then {record.error}"
            record.notes.pop("error")
            write_record(record, out_dir)
        return rc, final
    if failed_record is None:
        return rc, None
    failed_record.error = (
        f"{who} died{how} without reporting an error; torchrun exited with code {rc}"
    )
    try:
        return rc, write_record(failed_record, out_dir, overwrite=False)
    except FileExistsError:
        return rc, final


def _culprit(report: str) -> tuple[int, int | None] | None:
    """The rank that failed first, from torchrun's failure report.

    A rank killed by a signal other than SIGTERM (SIGKILL from the OOM killer, SIGSEGV, SIGABRT)
    died on its own, while ranks that exit 1 or get SIGTERM are usually its consequences; failing
    that, torchrun's root cause (its earliest observed failure, which ties can misorder).
    """
    entries: list[tuple[int, int | None]] = []
    for block in report.split("\n[")[1:]:
        rank_match, code_match = _RANK_FIELD.search(block), _EXITCODE.search(block)
        if rank_match:
            entries.append(
                (int(rank_match.group(1)), int(code_match.group(1)) if code_match else None)
            )
    for rank, code in entries:
        if code is not None and code < 0 and code != -signal.SIGTERM:
            return rank, code
    root = report[report.rfind("Root Cause") :] if "Root Cause" in report else ""
    rank_match, code_match = _RANK_FIELD.search(root), _EXITCODE.search(root)
    if rank_match:
        return int(rank_match.group(1)), (int(code_match.group(1)) if code_match else None)
    return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
