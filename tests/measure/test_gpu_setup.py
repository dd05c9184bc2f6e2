"""The precision set-up of each layout, NCCL flight recorder settings, and GPU-only checks."""

from __future__ import annotations

import pytest

from scalelab.cli.common import build_layout
from scalelab.measure.parallel import ParallelDims
from scalelab.measure.train import precision_plan


def _plan(gpus: int, bf16: bool = True, **layout: object) -> object:
    built = build_layout(gpus=gpus, seq_len=32, global_batch=8, **layout)
    return precision_plan(built, ParallelDims.from_layout(built, gpus), bf16)


def test_one_gpu_trains_like_fsdp() -> None:
    """1 -> N GPU points are like for like: bf16 through FSDP2's mixed precision on both."""
    one, two = _plan(1), _plan(2)
    assert one.fsdp and two.fsdp  # type: ignore[attr-defined]
    assert not one.autocast and not two.autocast  # type: ignore[attr-defined]
    assert one.compute_dtype == two.compute_dtype == "bf16"  # type: ignore[attr-defined]


@pytest.mark.parametrize("layout", [{"tp": 2}, {"pp": 2}])
def test_tp_or_pp_without_fsdp_has_no_autocast(layout: dict[str, int]) -> None:
    plan = _plan(2, **layout)
    assert not plan.autocast and not plan.fsdp  # type: ignore[attr-defined]
    assert plan.compute_dtype == "fp32" and "needs FSDP" in plan.note  # type: ignore[attr-defined]


def test_ddp_uses_autocast_and_fp32_stays_fp32() -> None:
    ddp = _plan(2, sharding="ddp")
    assert ddp.autocast and ddp.ddp and ddp.compute_dtype == "bf16"  # type: ignore[attr-defined]
    fp32 = _plan(1, bf16=False)
    assert not fp32.fsdp and not fp32.autocast and fp32.compute_dtype == "fp32"  # type: ignore[attr-defined]


@pytest.mark.gpu
def test_gpu_optimizer_is_fused_per_mesh_and_comm_uses_cuda_events() -> None:
    """On a GPU: one fused AdamW per mesh (no per-parameter loop) and nccl-tests' batched
    CUDA-event timing in `comm`."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import torch.distributed as dist

    from scalelab.config.catalog import load_model
    from scalelab.measure.comm_bench import sweep
    from scalelab.measure.config import BenchOptions
    from scalelab.measure.train import PerMeshOptimizer, Trainer, init_distributed

    info = init_distributed(timeout_s=60)
    try:
        layout = build_layout(gpus=1, seq_len=32, global_batch=2)
        trainer = Trainer(load_model("llama-tiny"), layout, BenchOptions(), info)
        opts = (
            trainer.optimizer.optimizers
            if isinstance(trainer.optimizer, PerMeshOptimizer)
            else [trainer.optimizer]
        )
        assert all(o.defaults.get("fused") for o in opts)
        assert trainer.compute_dtype == "bf16" and trainer.uses_fsdp and not trainer.autocast
        rows = sweep(["all_reduce"], [1 << 20], iters=5, warmup=1, device=info.device)
        assert rows[0]["timing"] == "cuda_events_batched"
    finally:
        dist.destroy_process_group()


def test_flight_recorder_is_configured_for_nccl(tmp_path: object) -> None:
    from pathlib import Path

    from scalelab.measure.train import flight_recorder_env

    env = flight_recorder_env(Path("/runs/.flight/x-rank"))
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert int(env["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == "/runs/.flight/x-rank"


def test_flight_recorder_dumps_name_the_stuck_collective_and_missing_ranks(
    tmp_path: object,
) -> None:
    """Synthetic dumps in the recorder's format: ranks 0 and 2 issued all_reduce #7 of group 0,
    rank 1 never did (it was still computing), so #7 is where the job hung."""
    import pickle
    from pathlib import Path

    from scalelab.measure.flight import explain, read_dumps, stuck_collective

    def entry(seq: int, state: str, name: str = "nccl:all_reduce") -> dict[str, object]:
        return {
            "process_group": ("0", "default_pg"), "collective_seq_id": seq, "is_p2p": False,
            "profiling_name": name, "state": state, "input_sizes": [[1024]],
        }  # fmt: skip

    folder = Path(str(tmp_path))
    done = [entry(5, "completed", "nccl:all_gather"), entry(6, "completed")]
    dumps = {0: [*done, entry(7, "started")], 1: done, 2: [*done, entry(7, "scheduled")]}
    paths = []
    for rank, entries in dumps.items():
        path = folder / f"job-rank{rank}"
        path.write_bytes(pickle.dumps({"version": "2.10", "entries": entries, "pg_config": {}}))
        paths.append(path)
    (folder / "job-rank3").write_bytes(b"not a pickle")  # a rank that died mid-dump is skipped
    paths.append(folder / "job-rank3")
    stuck = stuck_collective(read_dumps(paths).entries)
    assert stuck is not None
    assert (stuck.collective, stuck.seq, stuck.arrived, stuck.missing) == (
        "AllReduce",  # the recorder's profiling name, named as the collective
        7,
        [0, 2],
        [1],
    )
    sentence, unread = explain(paths)
    assert sentence is not None and "rank(s) 1 never arrived" in sentence, sentence
    assert any("job-rank3" in note for note in unread)  # the rank that died mid-dump, said
    assert stuck_collective({0: done, 1: done}) is None
