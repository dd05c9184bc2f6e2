"""Input that used to give silently wrong numbers with exit 0: now refused (or read right)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from scalelab.cli import main
from scalelab.config.catalog import load_cluster, load_model
from scalelab.errors import InputError
from scalelab.search import _divisors, search
from scalelab.trace import analyze_file
from tests.hostile.cases import INLINE_GPU, bench_record, build


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[object, str, str]:
    code: object = 0
    try:
        main(list(args))
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def _trace(path: Path, ts: object) -> Path:
    events = [
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 1.0e15, "dur": 10.0},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": ts, "dur": 10.0},
    ]
    path.write_text(json.dumps({"traceEvents": events}))
    return path


@pytest.mark.parametrize("parser", ["auto", "general"])
@pytest.mark.parametrize("ts", [True, False, 2**62, 9.2233720368e15, -(2**62), 2**53 + 2], ids=str)
def test_trace_timestamps_out_of_range_or_boolean_are_refused(
    tmp_path: Path, ts: object, parser: str
) -> None:
    """Near int64's end (µs x 1000) a wall time came out negative; `true` was read as 1 µs."""
    with pytest.raises(InputError) as err:
        analyze_file(_trace(tmp_path / "t.json", ts), parser=parser)  # type: ignore[arg-type]
    assert "traceEvents[1].ts" in err.value.field


def test_trace_timestamps_of_today_still_read(tmp_path: Path) -> None:
    report = analyze_file(_trace(tmp_path / "t.json", 1.0e15 + 20))
    assert report.total.wall_ns == 30_000 and report.total.compute_ns == 20_000


def test_search_of_a_huge_gpu_count_returns_at_once() -> None:
    start = time.perf_counter()
    with pytest.raises(InputError) as err:
        search(load_model("llama2-7b"), load_cluster("h100-ib"), gpus=100_000_000,
               global_batch=8, seq_len=4096)  # fmt: skip
    assert err.value.field == "gpus" and "1,048,576" in err.value.message
    assert time.perf_counter() - start < 2


def test_divisors_by_factorisation() -> None:
    for n in [*list(range(1, 400)), 2**20, 3 * 5 * 7 * 11 * 13, 999983]:
        assert _divisors(n) == [d for d in range(1, n + 1) if n % d == 0]


@pytest.mark.parametrize(
    ("flag", "value", "field"),
    [("--global-batch", str(2**62), "global-batch"), ("--global-batch", "0", "global-batch"),
     ("--seq-len", "0", "seq-len")],
)  # fmt: skip
@pytest.mark.parametrize("verb", ["predict", "search"])
def test_batch_and_sequence_are_not_silently_replaced(
    capsys: pytest.CaptureFixture[str], verb: str, flag: str, value: str, field: str
) -> None:
    """2^62 sequences gave 0 tokens/s (int64 overflow); 0 quietly became the default."""
    code, out, err = _run(capsys, verb, "llama2-7b", flag, value, "--json")
    assert code == 2 and out == "" and err.startswith(f"scalelab: error: {field}: ")


@pytest.mark.parametrize("peak", ["0", "-900", ".nan", ".inf"])
def test_zero_negative_or_nan_gpu_peak_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], peak: str
) -> None:
    """A zero peak gave NaN MFU, a negative one a negative MFU."""
    cluster = tmp_path / "c.yaml"
    cluster.write_text(INLINE_GPU.replace("bf16: 900", f"bf16: {peak}"))
    code, _out, err = _run(capsys, "predict", "llama2-7b", "--cluster", str(cluster), "--json")
    assert code == 2 and "peak_tflops" in err


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_readme_inline_gpu_without_fp8_peak_predicts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], precision: str
) -> None:
    """The README's inline form gives one peak: other precisions use it (was KeyError: 'fp16')."""
    cluster = tmp_path / "c.yaml"
    cluster.write_text(INLINE_GPU)
    code, out, err = _run(capsys, "predict", "llama2-7b", "--cluster", str(cluster),
                          "--precision", precision, "--json")  # fmt: skip
    assert code == 0, err
    mfu = json.loads(out)["mfu"]
    assert 0 < mfu < 1


def test_validate_refuses_negative_and_nan_measurements(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A negative measurement gave a MAPE of -1, one NaN row made the whole MAPE null."""
    build(tmp_path)
    for tag in ("neg", "nan", "inf"):
        code, out, err = _run(capsys, "validate", "--data", str(tmp_path / f"typed-{tag}.csv"))
        assert code == 2 and "line 3: tokens_per_s_per_gpu" in err, (tag, err)
    code, out, err = _run(capsys, "validate", "--data", str(tmp_path / "typed.csv"), "--json")
    assert code == 0 and json.loads(out)["mape_tokens_per_gpu"] > 0


def test_report_reads_a_string_series_tag_as_one_series(tmp_path: Path) -> None:
    """`series: fsdp` became the series f, s, d and p."""
    from scalelab.report.data import observations
    from scalelab.results import Record

    record = Record(**bench_record("a"))
    record.workload["tags"]["series"] = "fsdp-baseline"
    (obs,) = observations([(tmp_path / "a.json", record)])
    assert obs.series == ["fsdp-baseline"]


def test_model_name_with_rich_markup_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build(tmp_path)
    for verb in (["predict"], ["search", "--gpus", "2"]):
        code, out, err = _run(capsys, verb[0], str(tmp_path / "model-markup.yaml"), *verb[1:])
        assert code == 0, err
        assert "[/]x[bold" in out
