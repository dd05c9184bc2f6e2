"""Careless and hostile input by class (issue 34): each class has one rule at the boundary where
input enters, and a generator (hypothesis, seeded) that makes cases of the class for every verb
it applies to. Each case must end as the hostile table's do: exit 2, one line on stderr naming
the field or file, nothing written, inputs untouched.

1. physically absurd numbers, booleans for numbers, fields that contradict one another
2. an output that is one of the inputs or another output (by inode, not by name)
3. reads without end: devices, FIFOs, folders, files over the size bound, gzip bombs
4. injection: formulas into CSV cells, control characters into the terminal
5. an option that applies only with another, given without it
6. a check that only the real sweep ran, not --dry-run
8. CSV as people export it (a UTF-8 byte-order mark, CRLF line ends)
(7, tracebacks where one line belongs, is what every case here checks.)
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import annotated_types as at
import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from scalelab.cli import main  # noqa: E402
from scalelab.config.catalog import load_cluster, load_model, load_stack  # noqa: E402
from scalelab.config.hardware import ClusterParams, ClusterSpec, GPUSpec  # noqa: E402
from scalelab.config.layout import Layout  # noqa: E402
from scalelab.config.model import ModelSpec  # noqa: E402
from scalelab.config.stack import StackParams, StackSpec  # noqa: E402
from scalelab.config.strict import _holds_number, admits_bool  # noqa: E402
from scalelab.errors import InputError  # noqa: E402
from scalelab.io import (  # noqa: E402
    MAX_INPUT_ENV,
    csv_records,
    csv_safe_cell,
    gunzip_bounded,
    read_user_bytes,
)
from tests.hostile.cases import INLINE_GPU, MODEL, RAW, REVIEW, SWEEP, TYPED, bench_record  # noqa: E402


def _settings(n: int) -> Any:
    return settings(
        max_examples=n,
        derandomize=True,  # the same examples on every run: a failure is reproducible
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        database=None,
    )


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[object, str, str]:
    code: object = 0
    try:
        main(argv)
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def _refused(result: tuple[object, str, str], names: str) -> str:
    """Exit 2 with one line on stderr naming `names`; the line."""
    code, out, err = result
    lines = [x for x in err.splitlines() if x.strip()]
    assert "Traceback" not in err, err
    assert code == 2, f"exit {code}: {err!r} {out[:300]!r}"
    assert len(lines) == 1, err
    assert names in lines[0], f"{names!r} not in {lines[0]!r}"
    return lines[0]


# 1. Physically absurd input: every numeric field has a stated range, and the models check it --

SPECS = (GPUSpec, ClusterSpec, ClusterParams, ModelSpec, StackSpec, StackParams, Layout)


def _numeric_fields(cls: Any) -> list[str]:
    return [
        name
        for name, info in cls.model_fields.items()
        if _holds_number(info.annotation) and not admits_bool(info.annotation)
    ]


def _bounds(cls: Any, name: str) -> tuple[Any, Any]:
    meta = cls.model_fields[name].metadata
    low = next((m for m in meta if isinstance(m, (at.Gt, at.Ge))), None)
    high = next((m for m in meta if isinstance(m, (at.Lt, at.Le))), None)
    return low, high


# Mappings of numbers whose range their validator states (every value is checked).
_MAPPING_FIELDS = {("GPUSpec", "peak_tflops"), ("StackSpec", "fp8_recipe_ratios")}


@pytest.mark.parametrize("cls", SPECS, ids=lambda c: c.__name__)
def test_every_numeric_field_states_its_range(cls: Any) -> None:
    """A number without an upper and a lower bound would take 1e30 or 1e-300 with exit 0."""
    for name in _numeric_fields(cls):
        if (cls.__name__, name) in _MAPPING_FIELDS:
            continue
        low, high = _bounds(cls, name)
        assert low is not None and high is not None, f"{cls.__name__}.{name} has no range"
        assert cls.model_fields[name].description or name in ("gpus",), name


def _outside(low: Any, high: Any, is_int: bool) -> st.SearchStrategy[Any]:
    """Values outside [low, high], and values that are not numbers at all."""
    options: list[Any] = [True, False, math.inf, -math.inf, math.nan, "fast", [1], {"a": 1}]
    hi = high.le if isinstance(high, at.Le) else high.lt
    lo = low.ge if isinstance(low, at.Ge) else low.gt
    options.append(hi * 1000 if hi else 10**40)
    options.append(int(hi) + 1 if is_int else (hi * 1.001 if isinstance(high, at.Le) else hi))
    options.append(lo - 1 if lo <= 0 or is_int else lo / 1000)
    if isinstance(low, at.Gt):
        options.append(lo)
    options += [10**400, -(10**40)]
    if lo > 0 and not is_int:
        options.append(1e-300)
    return st.sampled_from(options)


def _model_doc() -> dict[str, Any]:
    return dict(yaml.safe_load(MODEL))


def _cluster_doc() -> dict[str, Any]:
    return dict(yaml.safe_load(INLINE_GPU))


def _dump(path: Path, doc: dict[str, Any]) -> Path:
    # Non-finite floats and huge integers as YAML writes them (.inf, .nan, digits).
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _loaders() -> list[tuple[str, Any, str, Any]]:
    """(spec, class, field, how a bad value is placed) for every numeric field of every spec a
    user's YAML gives: the model, the cluster, its inline GPU and parameters, the stack."""
    out: list[tuple[str, Any, str, Any]] = []
    for name in _numeric_fields(ModelSpec):
        out.append(("model", ModelSpec, name, lambda d, f, v: d.__setitem__(f, v)))
    for name in _numeric_fields(ClusterSpec):
        out.append(("cluster", ClusterSpec, name, lambda d, f, v: d.__setitem__(f, v)))
    for name in _numeric_fields(GPUSpec):
        if name != "peak_tflops":
            out.append(("cluster", GPUSpec, name, lambda d, f, v: d["gpu"].__setitem__(f, v)))
    for name in _numeric_fields(ClusterParams):
        out.append(("cluster", ClusterParams, name, lambda d, f, v: d.setdefault("params", {}).__setitem__(f, v)))  # fmt: skip
    for name in _numeric_fields(StackSpec):
        if name != "fp8_recipe_ratios":
            out.append(("stack", StackSpec, name, lambda d, f, v: d.__setitem__(f, v)))
    for name in _numeric_fields(StackParams):
        out.append(("stack", StackParams, name, lambda d, f, v: d.setdefault("params", {}).__setitem__(f, v)))  # fmt: skip
    return out


LOADERS = _loaders()
LOAD = {"model": load_model, "cluster": load_cluster, "stack": load_stack}


@st.composite
def _absurd(draw: Any) -> tuple[str, str, dict[str, Any]]:
    kind, cls, field, place = draw(st.sampled_from(LOADERS))
    low, high = _bounds(cls, field)
    annotation = cls.model_fields[field].annotation
    is_int = int in (annotation, *getattr(annotation, "__args__", ()))
    value = draw(_outside(low, high, is_int))
    doc = {"model": _model_doc, "cluster": _cluster_doc, "stack": lambda: {"name": "s"}}[kind]()
    place(doc, field, value)
    return kind, field, doc


@_settings(250)
@given(case=_absurd())
def test_absurd_numbers_are_refused_naming_the_field(tmp_path: Path, case: Any) -> None:
    kind, field, doc = case
    path = _dump(tmp_path / f"{kind}.yaml", doc)
    with pytest.raises(InputError) as info:
        LOAD[kind](str(path))
    assert field in str(info.value) and "\n" not in str(info.value)


_PEAKS = st.dictionaries(
    st.sampled_from(["bf16", "fp16", "fp8", "nvfp4"]),
    st.sampled_from([1e30, 1e6, 1e-9, 0, -5, math.inf, math.nan, True, "x"]),
    min_size=1,
    max_size=3,
)


@_settings(60)
@given(peaks=_PEAKS)
def test_absurd_peaks_are_refused(tmp_path: Path, peaks: dict[str, Any]) -> None:
    doc = _cluster_doc()
    doc["gpu"]["peak_tflops"] = {"bf16": 900, **peaks}
    with pytest.raises(InputError) as info:
        load_cluster(str(_dump(tmp_path / "c.yaml", doc)))
    assert "peak_tflops" in str(info.value)


# Fields that contradict one another: each relation, generated on both sides of its edge.
@_settings(80)
@given(
    tdp=st.floats(1, 10_000),
    over=st.floats(1e-3, 5_000),
    heads=st.integers(1, 64),
    kv=st.integers(1, 64),
)
def test_relations_between_fields(
    tmp_path: Path, tdp: float, over: float, heads: int, kv: int
) -> None:
    doc = _cluster_doc()
    doc["gpu"].update(tdp_w=tdp, idle_w=min(tdp + over, 10_000))
    if doc["gpu"]["idle_w"] > tdp:
        with pytest.raises(InputError, match="idle_w"):
            load_cluster(str(_dump(tmp_path / "c.yaml", doc)))
    model = {**_model_doc(), "n_heads": heads, "n_kv_heads": kv, "d_model": 64 * heads}
    path = _dump(tmp_path / "m.yaml", model)
    if heads % kv:
        with pytest.raises(InputError, match="n_kv_heads"):
            load_model(str(path))
    else:
        load_model(str(path))


# The same class through every verb that reads a model, a cluster or a stack from a file.
VERBS_BY_KIND = {
    "model": [
        ["predict", "{f}"],
        ["search", "{f}", "--gpus", "8"],
        ["bench", "{f}", "--out", "{d}/out"],
    ],
    "cluster": [
        ["predict", "llama2-7b", "--cluster", "{f}"],
        ["search", "llama2-7b", "--cluster", "{f}"],
        ["calibrate", "{d}/rec", "--base", "{f}", "--out", "{d}/out/c.yaml"],
        ["report", "{d}/rec", "--predict", "--cluster", "{f}", "--out", "{d}/out"],
        ["bench", "llama-tiny", "--cluster", "{f}", "--out", "{d}/out"],
    ],
    "stack": [
        ["predict", "llama2-7b", "--stack", "{f}"],
        ["search", "llama2-7b", "--stack", "{f}"],
        ["calibrate", "{d}/rec", "--stack", "{f}", "--out", "{d}/out/c.yaml"],
    ],
}


@pytest.fixture
def records(tmp_path: Path) -> Path:
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "r.json").write_text(json.dumps(bench_record("r")))
    return tmp_path


@_settings(20)
@given(case=_absurd(), pick=st.integers(0, 4))
def test_absurd_numbers_through_every_verb(
    records: Path, capsys: pytest.CaptureFixture[str], case: Any, pick: int
) -> None:
    kind, field, doc = case
    path = _dump(records / f"bad-{kind}.yaml", doc)
    verbs = VERBS_BY_KIND[kind]
    argv = [a.format(f=path, d=records) for a in verbs[pick % len(verbs)]]
    _refused(_run(capsys, argv), field)
    assert not (records / "out").exists() or not any((records / "out").rglob("*.*"))


# 2. Outputs that would destroy inputs --------------------------------------------------------


def _alias(target: Path, how: str, folder: Path) -> Path:
    """Another name for `target`: itself, with ./ and .., a symlink or a hard link."""
    if how == "same":
        return target
    if how == "dotted":
        return target.parent / "." / ".." / target.parent.name / target.name
    link = folder / f"{how}-{target.name}"
    if link.exists() or link.is_symlink():
        link.unlink()
    if how == "symlink":
        link.symlink_to(target)
    else:
        os.link(target, link)
    return link


CLOBBERS = [
    # (verb argv with {raw} {review} {out} {skipped} {rec} {base}, the output flag, the input)
    ("runs", ["runs", "import", "{raw}", "--out", "{X}"], "out", "raw"),
    ("runs", ["runs", "import", "{raw}", "--review", "{review}", "--out", "{X}"], "out", "review"),
    ("runs", ["runs", "import", "{raw}", "--out", "{d}/t.csv", "--skipped", "{X}"], "skipped", "raw"),
    ("runs", ["runs", "import", "{raw}", "--out", "{out}", "--skipped", "{X}"], "skipped", "out"),
    ("cal", ["calibrate", "{rec}", "--base", "{base}", "--out", "{X}"], "out", "base"),
    ("cal", ["calibrate", "{rec}", "--out", "{X}"], "out", "records"),
    ("cal", ["calibrate", "{rec}", "--out", "{out}", "--stack-params", "step_overhead_ms", "--stack-out", "{X}"], "stack-out", "out"),
]  # fmt: skip


@_settings(25)
@given(case=st.sampled_from(CLOBBERS), how=st.sampled_from(["same", "dotted", "symlink", "hard"]))
def test_an_output_that_is_an_input_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: Any, how: str
) -> None:
    verb, args, flag, victim = case
    d = tmp_path / "w"
    d.mkdir(exist_ok=True)
    files = {
        "raw": d / "raw.csv",
        "review": d / "review.csv",
        "out": d / "out.csv" if verb == "runs" else d / "out.yaml",
        "base": d / "base.yaml",
        "records": d / "rec.json",
    }
    files["raw"].write_bytes(RAW.read_bytes())
    files["review"].write_bytes(REVIEW.read_bytes())
    files["out"].write_text("an earlier output\n")
    files["base"].write_text(INLINE_GPU)
    files["records"].write_text(json.dumps(bench_record("r")))
    before = {k: p.read_bytes() for k, p in files.items()}
    target = _alias(files[victim], how, d)
    subst = {"raw": files["raw"], "review": files["review"], "out": files["out"],
             "rec": files["records"], "base": files["base"], "d": d, "X": target}  # fmt: skip
    argv = [a.format(**subst) for a in args]
    line = _refused(_run(capsys, argv), flag)
    assert "also" in line
    assert {k: p.read_bytes() for k, p in files.items()} == before  # nothing was clobbered
    assert not (d / "t.csv").exists()


# 3. Reads without end ------------------------------------------------------------------------

READERS = [
    # (argv with {f} for the file read, the word the line names)
    (["predict", "{f}"], "model"),
    (["predict", "llama2-7b", "--cluster", "{f}"], "cluster"),
    (["predict", "llama2-7b", "--stack", "{f}"], "stack"),
    (["validate", "--data", "{f}"], "data"),
    (["validate", "--data", str(RAW), "--review", "{f}"], "review"),
    (["runs", "import", "{f}", "--out", "{d}/out/t.csv"], "data"),
    (["calibrate", "{f}", "--out", "{d}/out/c.yaml"], "record"),
    (["calibrate", "{d}/recs", "--out", "{d}/out/c.yaml"], "record"),
    (["report", "{d}/recs", "--out", "{d}/out"], "record"),
    (["sweep", "{f}", "--dry-run", "--out", "{d}/out"], "sweep"),
]


def _endless(kind: str, d: Path) -> Path:
    """A file that never ends or is not a file: a link to /dev/zero, a FIFO, a folder, a file
    over the bound (the tests lower it to 1 MiB)."""
    path = d / "recs" / "x.json"
    path.parent.mkdir(exist_ok=True)
    for p in (path, d / "x.json"):
        if p.is_dir():
            p.rmdir()
        elif p.exists() or p.is_symlink():
            p.unlink()
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path.write_bytes(b"#" * (2**20 + 1))
    return path


@_settings(30)
@given(
    reader=st.sampled_from(READERS), kind=st.sampled_from(["dev-zero", "fifo", "folder", "large"])
)
def test_reads_are_bounded_and_special_files_refused(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    reader: Any,
    kind: str,
) -> None:
    monkeypatch.setenv(MAX_INPUT_ENV, "1")
    args, names = reader
    path = _endless(kind, tmp_path)
    argv = [a.format(f=path, d=tmp_path) for a in args]
    if kind == "folder" and args[0] in ("calibrate",) and "{f}" in args:
        return  # a folder of records is what calibrate takes
    line = _refused(_run(capsys, argv), names)
    assert "x.json" in line
    if kind == "large":
        assert "1 MiB" in line and MAX_INPUT_ENV in line
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.*"))


@_settings(40)
@given(size=st.integers(0, 3 * 2**20), limit=st.integers(2**16, 2 * 2**20))
def test_gzip_inflates_only_to_the_bound(tmp_path: Path, size: int, limit: int) -> None:
    """A gzip bomb (zeros inflate ~1000x) stops at the bound; within it, the data comes back."""
    data = gzip.compress(b"\0" * size)
    path = tmp_path / "t.json.gz"
    path.write_bytes(data)
    if size > limit:
        with pytest.raises(InputError, match="once inflated"):
            gunzip_bounded("trace", path, data, limit)
    else:
        assert read_user_bytes("trace", path, limit=limit, gunzip=True) == b"\0" * size


def test_the_bound_is_configurable_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "x.yaml"
    path.write_bytes(b"a" * (3 * 2**20))
    monkeypatch.setenv(MAX_INPUT_ENV, "2")
    with pytest.raises(InputError, match="larger than the 2 MiB"):
        read_user_bytes("model", path)
    monkeypatch.setenv(MAX_INPUT_ENV, "4")
    assert len(read_user_bytes("model", path)) == 3 * 2**20
    for bad in ("0", "-1", "lots", "1e9"):
        monkeypatch.setenv(MAX_INPUT_ENV, bad)
        with pytest.raises(InputError, match=MAX_INPUT_ENV):
            read_user_bytes("model", path)


# 4. Injection into what others open ----------------------------------------------------------

FORMULA = st.builds(
    lambda head, tail: head + tail,
    st.sampled_from(["=", "+", "-", "@", "\t", "\r", "=cmd|' /C calc'!A0", "@SUM(1+1)*cmd|"]),
    st.text(max_size=12),
)
CONTROL = st.builds(
    lambda a, c, b: a + c + b,
    st.text(alphabet="abc", max_size=4),
    st.sampled_from(["\x1b[31m", "\x1b]0;pwned\x07", "\x08\x08", "\u202e", "\x9b2J", "\x00"]),
    st.text(alphabet="xyz", max_size=4),
)


@_settings(200)
@given(text=st.one_of(FORMULA, st.text(max_size=20)))
def test_csv_cells_never_start_a_formula(text: str) -> None:
    cell = csv_safe_cell(text)
    assert isinstance(cell, str)
    assert not cell.startswith(("=", "+", "-", "@", "\t", "\r", "\n"))
    assert cell in (text, "'" + text)
    assert csv_safe_cell(-1.5) == -1.5 and csv_safe_cell(3) == 3  # numbers stay numbers


def _cells(path: Path) -> list[str]:
    with path.open(newline="") as fh:
        return [c for row in csv.reader(fh) for c in row]


@pytest.mark.filterwarnings("ignore:Glyph")  # figure labels of odd names: matplotlib's notes
@settings(_settings(1), phases=[Phase.explicit, Phase.generate])  # one report of 4 records
@given(names=st.lists(st.tuples(FORMULA, FORMULA), min_size=4, max_size=4))
def test_report_csvs_escape_formulas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], names: list[tuple[str, str]]
) -> None:
    rec = tmp_path / "rec"
    rec.mkdir(exist_ok=True)
    for i, (model, series) in enumerate(names):
        doc = bench_record(f"r{i}")
        doc["workload"]["model"] = model
        doc["workload"]["tags"]["series"] = [series]
        (rec / f"r{i}.json").write_text(json.dumps(doc))
    code, _, err = _run(capsys, ["report", str(rec), "--out", str(tmp_path / "out")])
    assert code == 0, err
    cells = _cells(tmp_path / "out" / "records.csv") + _cells(tmp_path / "out" / "summary.csv")
    assert any(c.startswith("'") for c in cells)  # the names are there, escaped
    for cell in cells:
        if cell.startswith(("=", "+", "-", "@", "\t", "\r")):
            float(cell)  # only a number may start so (a negative one)


@_settings(8)
@given(name=CONTROL)
def test_names_reach_the_terminal_without_control_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    doc = {**_model_doc(), "name": name}
    path = _dump(tmp_path / "m.yaml", doc)
    code, out, err = _run(capsys, ["predict", str(path), "--gpus", "8"])
    assert code == 0, err
    shown = out + err
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]", shown), repr(shown[:400])


# 5. Flags that do nothing without saying so ---------------------------------------------------

ONLY_WITH = [
    # (argv, the flag given alone, what it needs)
    (["report", "{d}/rec", "--out", "{d}/out", "--cluster", "h100-ib"], "cluster", "--predict"),
    (["validate", "--review", str(REVIEW)], "review", "--data"),
    (["calibrate", "{d}/rec", "--out", "{d}/out/c.yaml", "--stack-out", "{d}/out/s.yaml"], "stack-out", "--stack-params"),
    (["sweep", "{d}/s.yaml", "--dry-run", "--out", "{d}/out", "--partition", "gpu"], "partition", "--executor slurm"),
    (["sweep", "{d}/s.yaml", "--dry-run", "--out", "{d}/out", "--account", "a"], "account", "--executor slurm"),
    (["sweep", "{d}/s.yaml", "--dry-run", "--out", "{d}/out", "--time-min", "5"], "time-min", "--executor slurm"),
    (["bench", "llama-tiny", "--out", "{d}/out", "--profile-steps", "5"], "profile-steps", "--profile"),
]  # fmt: skip


@_settings(14)
@given(case=st.sampled_from(ONLY_WITH))
def test_an_option_without_the_one_it_needs_is_refused(
    records: Path, capsys: pytest.CaptureFixture[str], case: Any
) -> None:
    args, flag, needs = case
    (records / "s.yaml").write_text(SWEEP)
    argv = [a.format(d=records) for a in args]
    line = _refused(_run(capsys, argv), flag)
    assert needs in line
    assert not (records / "out").exists() or not any((records / "out").rglob("*.*"))


# 6. Checks that --dry-run skipped --------------------------------------------------------------

BAD_ENV_NAMES = st.one_of(
    st.sampled_from(["A B", "A B=C", "=X", "1X", "X-Y", "", "X\nY", "X\0"]),
    st.text(min_size=1, max_size=6).filter(
        lambda s: not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", s)
    ),
)
BAD_SLURM = st.tuples(
    st.sampled_from(["mem_gb", "time_min", "cpus_per_task", "poll_s", "port"]),
    st.sampled_from([math.inf, math.nan, 1e300, 10**30, -1, 0, True]),
)


@_settings(24)
@given(
    bad=st.one_of(BAD_ENV_NAMES.map(lambda k: ("env", k)), BAD_SLURM.map(lambda kv: ("slurm", kv)))
)
def test_dry_run_runs_every_check_the_run_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: Any
) -> None:
    """The same one line from --dry-run and from the real run (local and slurm), and no job."""
    doc = yaml.safe_load(SWEEP)
    if bad[0] == "env":
        doc["env"] = {bad[1]: "1"}
        names = "env"
    else:
        field, value = bad[1]
        doc["slurm"] = {field: value}
        names = f"slurm.{field}"
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    lines = set()
    for extra in (["--dry-run"], [], ["--executor", "slurm", "--dry-run"]):
        argv = ["sweep", str(path), "--out", str(tmp_path / "out"), *extra]
        lines.add(_refused(_run(capsys, argv), names))
    assert len(lines) == 1
    assert not (tmp_path / "out").exists()


# 8. CSV as people export it ------------------------------------------------------------------


@_settings(30)
@given(bom=st.booleans(), crlf=st.booleans(), source=st.sampled_from([RAW, TYPED, REVIEW]))
def test_csv_as_spreadsheets_write_it_reads_the_same(bom: bool, crlf: bool, source: Path) -> None:
    text = source.read_text(encoding="utf-8")
    exported = ("\ufeff" if bom else "") + (text.replace("\n", "\r\n") if crlf else text)
    assert csv_records(exported, "data") == csv_records(text, "data")


@_settings(4)
@given(crlf=st.booleans())
def test_runs_import_and_validate_read_a_bom(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], crlf: bool
) -> None:
    text = RAW.read_text(encoding="utf-8")
    if crlf:
        text = text.replace("\n", "\r\n")
    plain, marked = tmp_path / "plain.csv", tmp_path / "marked.csv"
    plain.write_text(text, encoding="utf-8", newline="")
    marked.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    results = []
    for src in (plain, marked):
        code, out, err = _run(
            capsys,
            ["runs", "import", str(src), "--out", str(tmp_path / f"{src.stem}-t.csv"), "--json"],
        )
        assert code == 0, err
        results.append({k: v for k, v in json.loads(out).items() if k != "out"})
    assert results[0] == results[1]
    assert (tmp_path / "plain-t.csv").read_bytes() == (tmp_path / "marked-t.csv").read_bytes()
    typed = io.StringIO((tmp_path / "plain-t.csv").read_text())
    assert next(csv.reader(typed))  # a header


def test_every_value_calibrate_can_fit_is_one_the_cluster_accepts() -> None:
    """The ranges above must not refuse a cluster that `calibrate` wrote."""
    from scalelab.calibrate import BOUNDS

    for name, (low, high) in BOUNDS.items():
        for value in (low, high):
            ClusterParams(**{name: value})


FILE_OUTPUTS = [
    (["runs", "import", str(RAW), "--out", "{X}"], "out"),
    (["runs", "import", str(RAW), "--out", "{d}/t.csv", "--skipped", "{X}"], "skipped"),
    (["calibrate", "{d}/rec", "--out", "{X}"], "out"),
    (["calibrate", "{d}/rec", "--stack-params", "step_overhead_ms", "--stack-out", "{X}"], "stack-out"),
]  # fmt: skip


@_settings(12)
@given(case=st.sampled_from(FILE_OUTPUTS), kind=st.sampled_from(["/dev/null", "fifo", "folder"]))
def test_an_output_that_is_a_device_is_refused(
    records: Path, capsys: pytest.CaptureFixture[str], case: Any, kind: str
) -> None:
    """As root, renaming a written file over /dev/null would replace the device."""
    args, flag = case
    target = Path(kind) if kind == "/dev/null" else records / kind
    if kind == "fifo" and not target.exists():
        os.mkfifo(target)
    target.mkdir(exist_ok=True) if kind == "folder" else None
    argv = [a.format(d=records, X=target) for a in args]
    _refused(_run(capsys, argv), flag)
    assert Path("/dev/null").is_char_device()
    assert not (records / "t.csv").exists()
