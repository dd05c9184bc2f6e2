"""`scalelab report` on hand-made records: intervals computed by hand, predictions, the page."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scalelab.cli import main
from scalelab.config.catalog import load_model
from scalelab.report import build_report
from scalelab.results import Record, write_record
from tests.sweep.conftest import dump_dom

SPEC = load_model("llama2-7b")


def _record(name: str, gpus: int, per_gpu: list[float], v1: bool = False, **extra: Any) -> Record:
    """A bench record of llama2-7b on `gpus` GPUs with these per-repeat per-GPU throughputs.

    `v1`: as schema 1 wrote it (`avg_power_w`, the whole job's power)."""
    seq, batch, steps = 4096, gpus, 10
    tokens = batch * seq * steps
    repeats = []
    for v in per_gpu:
        window = tokens / (v * gpus)
        repeats.append(
            {
                "repeat": len(repeats),
                "window_s": window,
                "step_time_s": [window / steps] * steps,
                "tokens_per_s_per_gpu": v,
                "mfu": v * SPEC.model_flops_per_token(seq) / 989e12,
                **({"avg_power_w": 600.0 * gpus} if v1 else {"power_w_per_gpu": 600.0}),
                "tokens_per_j": v / 600.0,
            }
        )
    layout = {"gpus": gpus, "global_batch": batch, "seq_len": seq, "sharding": "fsdp", "tp": 1}
    return Record(
        schema_version=1 if v1 else 2,
        kind="bench",
        run_id=name,
        name=name,
        created_utc="2026-01-01T00:00:00Z",
        status=extra.pop("status", "ok"),
        error=extra.pop("error", None),
        workload={
            "model": "llama2-7b",
            "model_spec": SPEC.model_dump(),
            "steps": steps,
            "tokens_per_step": batch * seq,
            "tags": {"sweep": "weak", "series": ["fsdp"], "nodes": gpus // 8, "run": 0},
        },
        layout=layout,
        cluster="h100-ib",
        measurements={"repeats": repeats, **extra.pop("measurements", {})},
        **extra,
    )


@pytest.fixture
def records(tmp_path: Path) -> Path:
    folder = tmp_path / "records"
    write_record(_record("a8", 8, [3000.0, 3100.0, 3200.0]), folder)
    # Two runs of the 16-GPU point: their repeats are pooled.
    write_record(_record("a16", 16, [2900.0, 3000.0]), folder)
    # The trace report's schema 2 (nanoseconds), as bench --profile stores it now.
    profiled_ns = {
        "exposed_comm": {
            "schema": "scalelab.trace/2",
            "summary": {"metrics": {"exposed_comm_ns": {"mean": 25e6}, "wall_ns": {"mean": 400e6}}},
        }
    }
    write_record(_record("b16", 16, [2950.0], measurements=profiled_ns), folder)
    profiled = {
        "exposed_comm": {
            "summary": {
                "metrics": {"exposed_comm_us": {"mean": 50_000.0}, "wall_us": {"mean": 400_000.0}}
            }
        }
    }
    # A record of schema 1 (whole-job power) is read as schema 2 (power per GPU).
    write_record(_record("a32", 32, [2500.0, 2600.0], v1=True, measurements=profiled), folder)
    write_record(
        _record("x64", 64, [], status="oom", error="rank 3: OutOfMemoryError: CUDA out of memory"),
        folder,
    )
    (folder / ".sweep").mkdir()
    (folder / ".sweep" / "plan.json").write_text("{}")  # a sweep's state is not a record
    return folder


def _rows(path: Path) -> dict[int, dict[str, str]]:
    with path.open() as fh:
        return {int(r["gpus"]): r for r in csv.DictReader(fh)}


def test_intervals_pool_repeats_and_figures_load(records: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = build_report(records, out)
    assert (result.records, result.ok, result.failed, result.configurations) == (5, 4, 1, 3)
    rows = _rows(out / "summary.csv")
    # 8 GPUs: mean 3100, sample std 100, t(2) = 4.3027: 3100 ± 4.3027·100/√3.
    half = 4.3026527 * 100.0 / math.sqrt(3)
    assert float(rows[8]["tokens_per_s_per_gpu.mean"]) == pytest.approx(3100.0)
    assert float(rows[8]["tokens_per_s_per_gpu.ci95_low"]) == pytest.approx(3100.0 - half)
    assert float(rows[8]["tokens_per_s_per_gpu.ci95_high"]) == pytest.approx(3100.0 + half)
    # 16 GPUs: two records, three repeats pooled.
    assert rows[16]["records"] == "2" and rows[16]["tokens_per_s_per_gpu.n"] == "3"
    assert float(rows[16]["tokens_per_s_per_gpu.mean"]) == pytest.approx(2950.0)
    assert float(rows[16]["tokens_per_s.mean"]) == pytest.approx(2950.0 * 16)
    # Power per GPU (the schema-1 record stored the sum over GPUs); exposed communication
    # from the trace.
    assert float(rows[32]["power_w_per_gpu.mean"]) == pytest.approx(600.0)
    assert float(rows[8]["power_w_per_gpu.mean"]) == pytest.approx(600.0)
    assert float(rows[32]["exposed_comm_fraction.mean"]) == pytest.approx(0.125)
    assert float(rows[16]["exposed_comm_fraction.mean"]) == pytest.approx(0.0625)
    assert 64 not in rows  # the OOM point has no numbers, but is listed as failed
    assert set(result.figures) == {
        "tokens_per_s_per_gpu", "tokens_per_s", "mfu", "exposed_comm_fraction",
        "power_w_per_gpu", "tokens_per_j", "step_time_s", "breakdown",
    }  # fmt: skip
    for name in ("records.parquet", "records.csv"):
        assert (out / name).stat().st_size > 0
    import pandas as pd

    assert len(pd.read_parquet(out / "records.parquet")) == 5
    dom = dump_dom(out / "index.html")
    assert 'data-figures-total="8"' in dom and 'data-figures-loaded="8"' in dom
    assert "OutOfMemoryError" in dom
    # A figure that went missing is flagged by the page.
    (out / "mfu.png").unlink()
    dom = dump_dom(out / "index.html")
    assert 'data-figures-loaded="7"' in dom and 'data-figures-broken="mfu.png"' in dom


def test_predicted_beside_measured(
    records: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    main(["report", str(records), "--out", str(out), "--predict", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert "ratio" in doc["figures"]
    rows = _rows(out / "summary.csv")
    from scalelab.config.catalog import load_cluster
    from scalelab.config.layout import Layout
    from scalelab.perf.predict import predict_layout

    expected = predict_layout(
        SPEC, load_cluster("h100-ib"), Layout(gpus=8, global_batch=8, seq_len=4096)
    )
    assert float(rows[8]["tokens_per_s.predicted"]) == pytest.approx(expected["tokens_per_s"])
    assert float(rows[8]["mfu.predicted"]) == pytest.approx(expected["mfu"])


def test_report_imports_no_torch(records: Path, tmp_path: Path) -> None:
    code = (
        "import sys; from scalelab.report import build_report; "
        f"build_report({str(records)!r}, {str(tmp_path / 'r')!r}, predict=True, "
        f"tensorboard={str(tmp_path / 'tb')!r}); "
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["/no/such/folder"], "records"),
        (["{empty}"], "records"),
        (["{records}", "--cluster", "nope"], "cluster"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], field: str, records: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    argv = [a.format(empty=tmp_path / "empty", records=records) for a in args]
    with pytest.raises(SystemExit) as exit_info:
        main(["report", *argv, "--out", str(tmp_path / "r")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"scalelab: error: {field}:"), err


def _tagless(record: Record, **layout: Any) -> Record:
    """`record` as bench wrote it by hand (no sweep tags), with these layout fields."""
    record.workload = {k: v for k, v in record.workload.items() if k != "tags"}
    record.layout = {**(record.layout or {}), **layout}
    return record


def test_layouts_never_pool_and_labels_are_full(tmp_path: Path) -> None:
    folder = tmp_path / "records"
    pp = {"pp": 8, "global_batch": 16}
    for schedule, v in (("1f1b", 3000.0), ("gpipe", 2000.0)):
        # One sweep series holding two pipeline schedules at 8 GPUs: two rows, not one mean.
        r = _record(f"pp-{schedule}", 8, [v, v + 10])
        r.layout = {**(r.layout or {}), **pp, "pp_schedule": schedule}
        r.workload["tags"]["series"] = ["pp"]
        write_record(r, folder)
    # Pure pipeline without tags: its label has no sharding word; compile is part of it.
    write_record(_tagless(_record("pure", 8, [2500.0]), **pp, pp_schedule="zbv", virtual_stages=2), folder)  # fmt: skip
    compiled = _tagless(_record("fsdp-compiled", 8, [3300.0]))
    compiled.workload["compile"] = True
    write_record(compiled, folder)
    build_report(folder, tmp_path / "report")
    with (tmp_path / "report" / "summary.csv").open() as fh:
        rows = {r["series"]: r for r in csv.DictReader(fh)}
    assert set(rows) == {"pp · pp8-1f1b", "pp · pp8-gpipe", "pp8-zbv v2", "fsdp compile"}, rows
    assert float(rows["pp · pp8-gpipe"]["tokens_per_s_per_gpu.mean"]) == pytest.approx(2005.0)


def test_intervals_never_go_below_zero(tmp_path: Path) -> None:
    folder = tmp_path / "records"
    write_record(_record("noisy", 8, [100.0, 3000.0]), folder)  # n = 2: t = 12.7
    build_report(folder, tmp_path / "report")
    row = _rows(tmp_path / "report" / "summary.csv")[8]
    assert float(row["tokens_per_s_per_gpu.ci95_low"]) == 0.0
    assert float(row["tokens_per_s_per_gpu.ci95_high"]) > 3000.0


def test_predictions_name_their_cluster_and_cpu_records_need_one(tmp_path: Path) -> None:
    folder = tmp_path / "records"
    write_record(_record("gpu", 8, [3000.0, 3100.0]), folder)
    cpu = _record("cpu", 16, [50.0, 52.0])
    cpu.cluster = None  # a CPU run names no cluster
    write_record(cpu, folder)
    result = build_report(folder, tmp_path / "report", predict=True)
    assert any("cpu" in n and "names no cluster" in n for n in result.notes), result.notes
    rows = _rows(tmp_path / "report" / "summary.csv")
    assert rows[8]["tokens_per_s.predicted"] and not rows[16]["tokens_per_s.predicted"]
    page = (tmp_path / "report" / "index.html").read_text()
    assert "Predicted for cluster <b>h100-ib</b>" in page
    # Asked for a cluster, every record is predicted for it, and the page says so.
    result = build_report(folder, tmp_path / "r2", predict=True, cluster="a100-ib")
    assert not result.notes
    assert "Predicted for cluster <b>a100-ib</b>" in (tmp_path / "r2" / "index.html").read_text()


def test_report_files_have_the_usual_mode(records: Path, tmp_path: Path) -> None:
    import os

    old = os.umask(0o022)
    try:
        build_report(records, tmp_path / "report")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "report").iterdir()}
    assert modes and all(m == 0o644 for m in modes.values()), modes


def test_loss_curves_show_each_record(tmp_path: Path) -> None:
    from scalelab.report import data, figures

    folder = tmp_path / "records"
    good, bad = _record("good", 8, [3000.0, 3000.0]), _record("bad", 16, [3000.0, 3000.0])
    for record, losses in ((good, [5.5, 5.4, 5.3, 5.2]), (bad, [5.5, 5.6, 5.7, 5.8])):
        for i, rep in enumerate(record.measurements["repeats"]):
            rep["warmup_loss"], rep["loss"] = [losses[2 * i]], [losses[2 * i + 1]]
        write_record(record, folder)
    result = build_report(folder, tmp_path / "report")
    assert result.figures["loss"] == tmp_path / "report" / "loss.png"
    assert result.figures["loss"].stat().st_size > 0
    assert 'src="loss.png"' in (tmp_path / "report" / "index.html").read_text()
    curves = figures.loss_curves(data.observations(data.load(folder)))
    # One curve per repeat (1 warm-up + 10 measured steps each, the second starting at step 12),
    # not the repeats joined into one line.
    assert curves == {
        "llama2-7b fsdp 8 GPUs": [([1, 2], [5.5, 5.4]), ([12, 13], [5.3, 5.2])],
        "llama2-7b fsdp 16 GPUs": [([1, 2], [5.5, 5.6]), ([12, 13], [5.7, 5.8])],
    }


def _per_step_record(name: str, gpus: int) -> Record:
    """A record as bench writes it: 2 repeats of 2 warm-up and 3 measured steps, each with its
    loss, grad norm, step time, throughput and memory per step."""
    record = _record(name, gpus, [3000.0, 2000.0])
    tokens_per_step = record.workload["tokens_per_step"]
    record.workload["steps"] = 3
    for i, rep in enumerate(record.measurements["repeats"]):
        times = [1.0 + i, 2.0 + i, 3.0 + i]
        rep.update(
            window_s=sum(times),
            step_time_s=times,
            tokens_per_s=[tokens_per_step / t for t in times],
            warmup_loss=[9.0 - 5 * i, 8.0 - 5 * i],
            loss=[7.0 - 5 * i, 6.0 - 5 * i, 5.0 - 5 * i],
            grad_norm=[0.5, 0.4, 0.3],
            memory_bytes=[2**30, 2 * 2**30, 3 * 2**30],
            memory_bytes_kind="cuda_peak_allocated",
            mfu=0.4,
        )
    record.prediction = {"step_time_s": 2.5, "mfu": 0.45, "tokens_per_s": 1e5, "cluster": "h100-ib"}
    return record


def test_tensorboard_files_read_back_with_tensorboards_reader(tmp_path: Path) -> None:
    """`report --tensorboard DIR`: one run per record and repeat, read back with TensorBoard's
    own EventAccumulator: every per-step value at its training step, and the record's prediction
    as a flat line over the measured steps."""
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    folder = tmp_path / "records"
    write_record(_per_step_record("r8", 8), folder)
    board = tmp_path / "tb"
    main(["report", str(folder), "--out", str(tmp_path / "report"), "--tensorboard", str(board)])
    runs = sorted(str(p.relative_to(board)) for p in board.glob("*/*") if p.is_dir())
    assert runs == ["r8/predicted", "r8/repeat-1", "r8/repeat-2"]

    def scalars(run: str) -> dict[str, list[tuple[int, float]]]:
        acc = event_accumulator.EventAccumulator(str(board / run))
        acc.Reload()
        return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}

    first, second = scalars("r8/repeat-1"), scalars("r8/repeat-2")
    assert set(first) == {
        "loss", "grad_norm", "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu",
        "mfu_percent", "memory_peak_GiB",
    }  # fmt: skip
    assert first["loss"] == [(1, 9.0), (2, 8.0), (3, 7.0), (4, 6.0), (5, 5.0)]
    assert second["loss"] == [(6, 4.0), (7, 3.0), (8, 2.0), (9, 1.0), (10, 0.0)]
    assert first["step_time_s"] == [(3, 1.0), (4, 2.0), (5, 3.0)]
    assert first["memory_peak_GiB"] == [(3, 1.0), (4, 2.0), (5, 3.0)]
    assert [s for s, _ in second["grad_norm"]] == [8, 9, 10]
    tokens = 8 * 4096
    assert [v for _, v in first["tokens_per_s"]] == pytest.approx([tokens / t for t in (1, 2, 3)])
    assert [v for _, v in first["tokens_per_s_per_gpu"]] == pytest.approx(
        [tokens / t / 8 for t in (1, 2, 3)]
    )
    # MFU per step: the repeat's 40 % over its window (3 steps in 6 s) scaled by each step's speed.
    assert [v for _, v in first["mfu_percent"]] == pytest.approx([80.0, 40.0, 80.0 / 3])
    predicted = scalars("r8/predicted")
    assert predicted["step_time_s"] == [(3, 2.5), (10, 2.5)]
    assert predicted["mfu_percent"] == [(3, pytest.approx(45.0)), (10, pytest.approx(45.0))]
    assert not list(board.rglob(".*"))  # no staging folder left behind


def test_step_breakdown_of_profiled_records(records: Path, tmp_path: Path) -> None:
    from scalelab.report import data, figures

    breakdown = figures.step_breakdowns(data.observations(data.load(records)))
    # b16 (schema 2, ns): exposed 25 ms of a 400 ms step; a32 (schema 1, us): 50 of 400 ms.
    assert set(breakdown) == {("llama2-7b", "fsdp", 16), ("llama2-7b", "fsdp", 32)}
    assert breakdown[("llama2-7b", "fsdp", 16)]["exposed_comm"] == pytest.approx(0.025)
    assert breakdown[("llama2-7b", "fsdp", 32)]["other"] == pytest.approx(0.35)
    result = build_report(records, tmp_path / "report")
    assert result.figures["breakdown"].stat().st_size > 0


def test_tensorboard_without_the_report_extra_is_one_line(
    records: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No tensorboard installed: one line naming the extra, before any work, no traceback."""
    monkeypatch.setitem(sys.modules, "tensorboard.summary.writer.event_file_writer", None)
    with pytest.raises(SystemExit) as info:
        main(["report", str(records), "--out", str(tmp_path / "r"), "--tensorboard", str(tmp_path)])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "scalelab: error: tensorboard: writing TensorBoard files needs tensorboard: "
        "pip install 'scalelab[report]'"
    ]
    assert not (tmp_path / "r").exists()


def test_the_page_escapes_what_records_say(tmp_path: Path) -> None:
    """A series tag or an error holding markup is text on the page (jinja2 autoescape)."""
    folder = tmp_path / "records"
    record = _record("x", 8, [3000.0])
    record.workload["tags"]["series"] = ["<b>fsdp</b>"]
    write_record(record, folder)
    failed = _record("y", 16, [3000.0], status="failed", error="<script>alert(1)</script>")
    write_record(failed, folder)
    build_report(folder, tmp_path / "report")
    page = (tmp_path / "report" / "index.html").read_text()
    assert '<td class="text">&lt;b&gt;fsdp&lt;/b&gt;</td>' in page
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<h2>Failed and OOM runs</h2>" in page and 'class="failed">failed</span>' in page


def test_report_tells_its_steps_when_asked(
    records: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SCALELAB_PROGRESS", "1")  # stderr is not a terminal here: plain lines
    main(["report", str(records), "--out", str(tmp_path / "report"), "--predict", "--json"])
    captured = capsys.readouterr()
    steps = [line.split(": ", 1)[1].rsplit(" (", 1)[0] for line in captured.err.splitlines()]
    assert steps[0] == "reading records" and "predicting 5 records" in steps
    assert steps[-1] == "index.html"
    json.loads(captured.out)  # stdout is still one JSON document
