"""Property-based fuzzing (hypothesis, seeded): bad input to the layout validator, the run
importer and the trace reader is an InputError (one line), never another exception."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from scalelab.config.catalog import load_cluster, load_model  # noqa: E402
from scalelab.config.layout import Layout, rule_violations  # noqa: E402
from scalelab.errors import InputError  # noqa: E402
from scalelab.runs.importer import import_rows, read_raw_csv  # noqa: E402
from scalelab.trace import analyze_file  # noqa: E402
from tests.hostile.cases import RAW  # noqa: E402

SETTINGS = settings(
    max_examples=300,
    derandomize=True,  # the same examples on every run: a failure is reproducible
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,
)


def _one_line(exc: InputError) -> None:
    assert "\n" not in str(exc) and str(exc).strip(), repr(exc)


# Hostile scalars: what a careless or malicious YAML, CSV or JSON value can be.
HOSTILE_NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 2, 3, 4, 7, 8, 16, 64, 2**31, 2**63, 2**64, -1, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=8),
)

# The layout validator -------------------------------------------------------------------------

LAYOUT_FIELDS = [f for f in Layout.model_fields if f not in ("gpus", "seq_len")]
MODEL = load_model("llama2-7b")
CLUSTER = load_cluster("h100-ib")


@SETTINGS
@given(
    template=st.dictionaries(
        st.one_of(st.sampled_from(LAYOUT_FIELDS), st.text(max_size=6)), HOSTILE_NUMBERS, max_size=6
    ),
    gpus=st.one_of(st.integers(min_value=1, max_value=4096), st.sampled_from([2**20, 2**21])),
    seq_len=st.sampled_from([1, 128, 4096, 2**24, 2**25]),
)
def test_layout_validator(template: dict[str, Any], gpus: int, seq_len: int) -> None:
    try:
        layout = Layout.from_template(template, gpus=gpus, seq_len=seq_len)
        errors = rule_violations(layout, MODEL, CLUSTER)
    except InputError as exc:
        _one_line(exc)
        return
    for err in errors:
        assert isinstance(err, InputError)
        _one_line(err)


# The run importer -----------------------------------------------------------------------------


def _raw_rows() -> tuple[list[str], list[dict[str, str]]]:
    with RAW.open(newline="") as fh:
        reader = csv.DictReader(fh)
        rows = [r for r in reader if r["tokens_per_sec_per_gpu"].strip()][:5]
        return list(reader.fieldnames or []), rows


RAW_FIELDS, RAW_ROWS = _raw_rows()
CELLS = st.one_of(
    st.sampled_from(["", "0", "-1", "1e400", "inf", "nan", "-inf", "9" * 40, "1,5", "~8", "abc",
                     "1.5e3", "8k", "2^10", "0x10", "½", "1e-400", "  ", "None"]),
    st.text(max_size=12),
    HOSTILE_NUMBERS.map(str),
)  # fmt: skip


@SETTINGS
@given(
    row=st.integers(min_value=0, max_value=len(RAW_ROWS) - 1),
    changes=st.dictionaries(st.sampled_from(RAW_FIELDS), CELLS, min_size=1, max_size=5),
)
def test_run_importer_rows(row: int, changes: dict[str, str]) -> None:
    raw = {**RAW_ROWS[row], **changes}
    (reading,) = import_rows([raw])  # a row it cannot read is skipped with a reason, not raised
    assert reading.run is not None or (reading.skipped and "\n" not in reading.skipped)
    if reading.run is not None:
        assert reading.run.tokens_per_s_per_gpu > 0


@SETTINGS
@given(
    text=st.one_of(
        st.text(max_size=300), st.binary(max_size=300).map(lambda b: b.decode("latin-1"))
    )
)
def test_run_importer_csv_text(text: str) -> None:
    header = ",".join(RAW_FIELDS) + "\n"
    for candidate in (text, header + text):
        try:
            import_rows(read_raw_csv(candidate))
        except InputError as exc:
            _one_line(exc)


# The trace reader -----------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.one_of(
        HOSTILE_NUMBERS.filter(lambda v: not isinstance(v, float) or v == v), st.text(max_size=5)
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
EVENT_KEYS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args"]


def _event() -> st.SearchStrategy[dict[str, Any]]:
    base = st.fixed_dictionaries(
        {
            "ph": st.sampled_from(["X", "X", "X", "i", "M", "s", "f", 1]),
            "cat": st.sampled_from(
                ["kernel", "gpu_memcpy", "cuda_runtime", "user_annotation", "gpu_user_annotation",
                 "cpu_op", "python_function", "Trace", ""]
            ),
            "name": st.sampled_from(
                ["ncclDevKernel_AllReduce_Sum_f32_RING_LL", "gemm", "ProfilerStep#1",
                 "cudaLaunchKernel", "record_param_comms", "nccl:all_reduce", "Memcpy DtoD"]
            ),
            "pid": st.sampled_from([0, 1, "0", None]),
            "tid": st.sampled_from([7, 8, "stream 7", None]),
            "ts": st.one_of(st.floats(1e15, 1e15 + 1e6), HOSTILE_NUMBERS),
            "dur": st.one_of(st.floats(0, 1e4), HOSTILE_NUMBERS),
            "args": st.one_of(
                st.fixed_dictionaries({"correlation": st.one_of(st.integers(0, 5), HOSTILE_NUMBERS)}),
                JSON_VALUES,
            ),
        }
    )  # fmt: skip
    return st.tuples(base, st.sets(st.sampled_from(EVENT_KEYS), max_size=2)).map(
        lambda pair: {k: v for k, v in pair[0].items() if k not in pair[1]}
    )


def _write(path: Path, data: bytes, gz: bool) -> Path:
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@SETTINGS
@given(
    events=st.lists(_event(), max_size=12),
    top=st.dictionaries(st.sampled_from(["distributedInfo", "schemaVersion", "deviceProperties"]),
                        JSON_VALUES, max_size=2),
    gz=st.booleans(),
)  # fmt: skip
def test_trace_reader_events(
    tmp_path: Path, events: list[dict[str, Any]], top: dict[str, Any], gz: bool
) -> None:
    doc = json.dumps({**top, "traceEvents": events}).encode()
    path = _write(tmp_path / "t.json", doc, gz)
    for parser in ("auto", "general"):
        try:
            analyze_file(path, parser=parser)  # type: ignore[arg-type]
        except InputError as exc:
            _one_line(exc)


@SETTINGS
@given(data=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)), gz=st.booleans(),
       cut=st.integers(0, 50))  # fmt: skip
def test_trace_reader_bytes(tmp_path: Path, data: bytes, gz: bool, cut: int) -> None:
    good = json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0,
                                         "tid": 7, "ts": 1.0, "dur": 2.0}]}).encode()  # fmt: skip
    for blob in (data, good[: max(len(good) - cut, 0)] + data):
        raw = gzip.compress(blob) if gz else blob
        path = tmp_path / "t.json.gz"
        path.write_bytes(raw[: len(raw) - cut // 10] if gz else raw)
        try:
            analyze_file(path)
        except InputError as exc:
            _one_line(exc)
