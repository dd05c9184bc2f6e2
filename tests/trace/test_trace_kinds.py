"""Communication that is not NCCL, gloo collectives named by their enqueue, device types the
analyser does not model, and work launched before profiling."""

from __future__ import annotations

from pathlib import Path

import pytest
from trace_helpers import write_trace, x

from scalelab.errors import InputError
from scalelab.trace import analyze_file

HOST, DEVICE = 100, 0
US = 1000


def _launch(ts: float, corr: int) -> dict:
    return x("cudaLaunchKernel", ts, 2, cat="cuda_runtime", pid=HOST, tid=HOST, correlation=corr)


def _kernel(name: str, ts: float, dur: float, corr: int, stream: int = 7, **args: object) -> dict:
    return x(
        name, ts, dur, cat="kernel", pid=DEVICE, tid=stream, correlation=corr, stream=stream, **args
    )


def _step(n: int, ts: float, dur: float) -> dict:
    return x(f"ProfilerStep#{n}", ts, dur, cat="user_annotation", pid=HOST, tid=HOST)


MULTIMEM = (
    "void c10d::symmetric_memory::multimem_all_reduce_kernel<float, 16, 8>"
    "(float*, unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long)"
)


def test_symmetric_memory_all_reduce_is_communication(tmp_path: Path) -> None:
    """gemm [0,100); multimem all-reduce [80,180) on another stream: 100 µs of AllReduce, 20
    hidden under the gemm. Before, it was counted as compute (comm 0)."""
    events = [
        _step(1, 0, 200),
        _launch(1, 1),
        _launch(2, 2),
        _kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 0, 100, 1),
        _kernel(MULTIMEM, 80, 100, 2, stream=9),
    ]
    total = analyze_file(write_trace(tmp_path / "t.json", events)).total
    assert (total.compute_ns, total.comm_ns, total.overlap_ns) == (100 * US, 100 * US, 20 * US)
    assert total.collectives["AllReduce"].count == 1
    assert total.collectives["AllReduce"].exposed_ns == 80 * US


def test_nvshmem_and_custom_all_reduce_are_communication(tmp_path: Path) -> None:
    events = [
        _step(1, 0, 200),
        _launch(1, 1),
        _launch(2, 2),
        _kernel("void nvshmemi_alltoall_kernel(...)", 0, 50, 1),
        _kernel("void vllm::cross_device_reduce_2stage<half, 8>(...)", 60, 40, 2),
    ]
    total = analyze_file(write_trace(tmp_path / "t.json", events)).total
    assert total.compute_ns == 0 and total.comm_ns == 90 * US
    assert {k: v.count for k, v in total.collectives.items()} == {"AllReduce": 1, "AllToAll": 1}


def _fsdp2_cpu_trace(with_rpc: bool) -> list[dict]:
    """FSDP2 on gloo: the reduce-scatter executes as gloo:all_reduce on a worker thread."""
    main, worker = 1, 2
    events = [
        _step(5, 0, 300) | {"pid": 1, "tid": main},
        x("aten::mm", 0, 50, cat="cpu_op", tid=main),
        x("c10d::_allgather_base_", 50, 5, cat="cpu_op", tid=main),
        x("gloo:all_gather", 56, 40, cat="user_annotation", tid=worker),
        x("c10d::_reduce_scatter_base_", 100, 5, cat="cpu_op", tid=main),
        x("gloo:all_reduce", 106, 60, cat="user_annotation", tid=worker),
    ]
    if with_rpc:
        events += [
            x(
                "record_param_comms",
                50,
                4,
                cat="cpu_op",
                tid=main,
                **{
                    "Collective name": "_allgather_base",
                    "dtype": "Float",
                    "In msg nelems": 100,
                    "Out msg nelems": 400,
                    "Group size": 4,
                    "Process Group Name": "0",
                    "Seq": 1,
                },
            ),
            x(
                "record_param_comms",
                100,
                4,
                cat="cpu_op",
                tid=main,
                **{
                    "Collective name": "_reduce_scatter_base",
                    "dtype": "BFloat16",
                    "In msg nelems": 400,
                    "Out msg nelems": 100,
                    "Group size": 4,
                    "Process Group Name": "0",
                    "Seq": 2,
                },
            ),
        ]
    return events


@pytest.mark.parametrize("with_rpc", [True, False])
def test_gloo_reduce_scatter_is_named_by_its_enqueue(tmp_path: Path, with_rpc: bool) -> None:
    """record_param_comms' collective name where present, else the c10d:: operator."""
    path = write_trace(tmp_path / "t.json", _fsdp2_cpu_trace(with_rpc))
    rank = analyze_file(path)
    assert rank.mode == "cpu"
    counts = {k: v.count for k, v in rank.total.collectives.items()}
    assert counts == {"AllGather": 1, "ReduceScatter": 1}
    assert rank.total.collectives["ReduceScatter"].total_ns == 60 * US


def test_unmodelled_device_types_are_refused(tmp_path: Path) -> None:
    events = [
        _step(1, 0, 100),
        x("mtiaLaunchKernel", 1, 2, cat="mtia_runtime", pid=HOST, tid=HOST, correlation=1),
        x("my_mtia_kernel", 5, 50, cat="mtia_ccp_events", pid=DEVICE, tid=3, correlation=1),
    ]
    with pytest.raises(InputError, match="MTIA"):
        analyze_file(write_trace(tmp_path / "t.json", events))
    events = [_step(1, 0, 100), x("k", 5, 50, cat="xpu_runtime", pid=HOST, tid=HOST)]
    with pytest.raises(InputError, match="XPU"):
        analyze_file(write_trace(tmp_path / "t.json", events))


def test_work_launched_before_profiling_is_reported_apart(tmp_path: Path) -> None:
    """Two kernels of an earlier step, launched before the profiler started (no launch call in
    the trace), still run [0,40) and [30,70); step 1's gemm [100,150) and all-reduce [150,190)."""
    events = [
        _kernel("gemm_of_an_earlier_step", 0, 40, 91),
        _kernel("ncclKernel_AllReduce_RING_LL_Sum_float(x)", 30, 40, 92, stream=20),
        _step(1, 80, 100),
        _launch(81, 1),
        _launch(82, 2),
        _kernel("gemm", 100, 50, 1),
        _kernel("ncclKernel_AllReduce_RING_LL_Sum_float(x)", 150, 40, 2, stream=20),
    ]
    rank = analyze_file(write_trace(tmp_path / "t.json", events))
    (step,) = rank.steps
    assert (step.start_ns, step.wall_ns, step.comm_ns) == (100 * US, 90 * US, 40 * US)
    assert rank.launched_before_profiling == 2
    before = rank.before_steps
    assert (before.wall_ns, before.compute_ns, before.comm_ns) == (100 * US, 40 * US, 40 * US)
    assert before.exposed_comm_ns == 30 * US
    assert rank.after_steps.wall_ns == 0
    assert rank.outside_steps == before
    assert rank.to_dict()["launched_before_profiling"] == 2


def test_cpu_traces_are_decoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU trace used to be decoded by the typed path, refused, and decoded again."""
    import sys

    from trace_helpers import TRACES

    from scalelab.trace.load import read_trace

    analyze_module = sys.modules["scalelab.trace.analyze"]  # the module, not the function

    calls: list[str] = []

    def counting(path: object, *, parser: str = "auto") -> object:
        calls.append(parser)
        return read_trace(path, parser=parser)  # type: ignore[arg-type]

    monkeypatch.setattr(analyze_module, "read_trace", counting)
    rank = analyze_module.analyze_file(TRACES / "cpu-gloo-rank34-of-300.json.gz")
    assert rank.mode == "cpu"
    assert calls == ["auto"]
