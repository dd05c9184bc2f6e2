"""Hostile and careless input for every verb: the files, and the table of cases.

`build(folder)` writes every file the cases refer to; `CASES` says, for each, the command line
(`{d}` is that folder) and a word the one line on stderr must contain (the field or file it names).
Every case must end with exit code 2, exactly one line on stderr, no traceback, and no file left
in its output folder (`out`, relative to the folder) — nothing half written.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[2] / "src" / "scalelab"
TYPED = SRC / "data" / "published_runs_typed.csv"
RAW = SRC / "data" / "published_runs.csv"
REVIEW = SRC / "data" / "published_runs_review.csv"

BINARY = bytes(range(256)) * 4 + b"\xff\xfe\x00\x00garbage\x80\x81"

MODEL = """\
name: hostile-model
n_layers: 4
d_model: 256
n_heads: 4
n_kv_heads: 4
d_ff: 688
vocab_size: 1000
ffn: swiglu
tied_embeddings: false
seq_len: 256
"""

# The README's inline-GPU form: a mapping of GPU fields, with no fp8 (nor fp16) peak.
INLINE_GPU = """\
gpu: {name: custom, peak_tflops: {bf16: 900}, hbm_gib: 80, hbm_gbs: 3000, nvlink_gbs: 450,
      tdp_w: 700, idle_w: 80}
gpus_per_node: 8
nics_per_node: 4
nic_gbps: 200
"""

SWEEP = """\
name: hostile
models: [llama-tiny]
nodes: [1]
gpus_per_node: [1]
layouts:
  - {sharding: fsdp}
bench: {steps: 1, warmup: 0, repeats: 1}
"""


def _csv_rows(path: Path, n: int) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        rows = [r for r, _ in zip(reader, range(n), strict=False)]
        return list(reader.fieldnames or []), rows


def _write_csv(path: Path, fields: list[str], rows: list[dict[str, str]]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(buf.getvalue())


def bench_record(name: str, **changes: Any) -> dict[str, Any]:
    """A small, valid bench record (schema 2) of llama-tiny on 2 GPUs; `changes` replace parts."""
    record: dict[str, Any] = {
        "schema_version": 2,
        "kind": "bench",
        "run_id": name,
        "name": name,
        "created_utc": "2026-12-03T00:00:00Z",
        "status": "ok",
        "workload": {
            "model": "llama-tiny",
            "steps": 2,
            "tokens_per_step": 512,
            "tags": {"sweep": "s", "series": ["fsdp"], "nodes": 1, "run": 0},
        },
        "layout": {"gpus": 2, "global_batch": 2, "seq_len": 256, "sharding": "fsdp", "tp": 1},
        "cluster": "cpu-gloo",
        "measurements": {
            "repeats": [
                {
                    "repeat": 0,
                    "window_s": 0.5,
                    "step_time_s": [0.25, 0.25],
                    "tokens_per_s_per_gpu": 1024.0,
                    "mfu": 0.01,
                }
            ]
        },
        "summary": {"step_time_s": {"mean": 0.25}},
    }
    record.update(changes)
    return record


def comm_record(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "schema_version": 2,
        "kind": "comm",
        "run_id": "c",
        "name": "comm-c",
        "created_utc": "2026-12-03T00:00:00Z",
        "status": "ok",
        "workload": {"world_size": 8, "nproc_per_node": 8},
        "measurements": {"rows": rows},
    }


def _trace(ts: Any = 1.0e15) -> dict[str, Any]:
    events = [
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": ts, "dur": 10.0,
         "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
         "pid": 0, "tid": 8, "ts": 1.0e15 + 5, "dur": 10.0, "args": {"correlation": 2}},
    ]  # fmt: skip
    return {"schemaVersion": 1, "traceEvents": events}


def build(d: Path) -> None:
    """Write every file the cases use into `d`."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "bin.yaml").write_bytes(BINARY)
    (d / "bin.csv").write_bytes(BINARY)
    (d / "bin.json").write_bytes(BINARY)
    (d / "model.yaml").write_text(MODEL)
    (d / "list.yaml").write_text("- 1\n- 2\n")
    (d / "nested.yaml").write_text("[" * 5000 + "]" * 5000 + "\n")
    (d / "model-inf.yaml").write_text(MODEL.replace("n_layers: 4", "n_layers: .inf"))
    (d / "model-huge.yaml").write_text(MODEL.replace("n_layers: 4", f"n_layers: {10**40}"))
    (d / "model-bigvocab.yaml").write_text(
        MODEL.replace("vocab_size: 1000", f"vocab_size: {2**70}")
    )
    (d / "model-markup.yaml").write_text(MODEL.replace("hostile-model", "'[/]x[bold'"))
    (d / "model-dmodel-inf.yaml").write_text(MODEL.replace("d_model: 256", "d_model: 1e400"))
    (d / "inline.yaml").write_text(INLINE_GPU)
    (d / "cluster-params-list.yaml").write_text(INLINE_GPU + "params: [1, 2]\n")
    (d / "cluster-params-str.yaml").write_text("gpu: H100-SXM5\ngpus_per_node: 8\nparams: fast\n")
    (d / "cluster-peak0.yaml").write_text(INLINE_GPU.replace("bf16: 900", "bf16: 0"))
    (d / "cluster-peakneg.yaml").write_text(INLINE_GPU.replace("bf16: 900", "bf16: -900"))
    (d / "cluster-peakinf.yaml").write_text(INLINE_GPU.replace("bf16: 900", "bf16: .inf"))
    (d / "cluster-gpus-huge.yaml").write_text(
        INLINE_GPU.replace("gpus_per_node: 8", f"gpus_per_node: {10**30}")
    )
    # CSVs: the shipped typed runs, cut mid-line, with an inf and a huge integer
    fields, rows = _csv_rows(TYPED, 4)
    _write_csv(d / "typed.csv", fields, rows)
    text = (d / "typed.csv").read_text()
    (d / "typed-cut.csv").write_text(text[: len(text) - len(text.splitlines()[-1]) // 2 - 1])
    (d / "typed-quote.csv").write_text(text + '1,99,"an open quote\n')
    for tag, col, value in (
        ("inf", "tokens_per_s_per_gpu", "inf"),
        ("nan", "tokens_per_s_per_gpu", "nan"),
        ("neg", "tokens_per_s_per_gpu", "-5"),
        ("hugeint", "gpus", "9" * 40),
        ("hugefloat", "gpus", "1e400"),
    ):
        changed = [dict(r) for r in rows]
        changed[1][col] = value
        _write_csv(d / f"typed-{tag}.csv", fields, changed)
    raw_fields, raw_rows = _csv_rows(RAW, 600)
    raw_rows = [r for r in raw_rows if r["tokens_per_sec_per_gpu"].strip()][:4]
    for tag, col, value in (
        ("hugefloat", "num_gpus", "1e400"),
        ("hugeint", "num_gpus", "9" * 40),
        ("inf", "seq_len", "inf"),
        ("nan", "num_gpus", "nan"),
    ):
        changed = [dict(r) for r in raw_rows]
        changed[0][col] = value
        _write_csv(d / f"raw-{tag}.csv", raw_fields, changed)
    # sweeps
    (d / "llama-tiny2.yaml").write_text(MODEL)
    (d / "sweep-name.yaml").write_text(SWEEP.replace("name: hostile", 'name: "a\\n#SBATCH --x"'))
    (d / "sweep-params.yaml").write_text(SWEEP + "cluster: cluster-params-list.yaml\n")
    (d / "sweep-gpus-huge.yaml").write_text(
        SWEEP.replace("gpus_per_node: [1]", f"gpus_per_node: [{10**30}]")
    )
    (d / "sweep-inf.yaml").write_text(SWEEP.replace("steps: 1", "steps: .inf"))
    (d / "sweep-steps-huge.yaml").write_text(SWEEP.replace("steps: 1", f"steps: {2**70}"))
    # traces
    (d / "trace-nested.json").write_text('{"traceEvents": ' + "[" * 100000 + "]" * 100000 + "}")
    (d / "trace-bool.json").write_text(json.dumps(_trace(ts=True)))
    (d / "trace-huge.json").write_text(json.dumps(_trace(ts=2**62)))
    (d / "trace-near.json").write_text(json.dumps(_trace(ts=9.2233720368e15)))
    (d / "trace-nan.json").write_text(json.dumps(_trace(ts=float("nan"))))
    good = json.dumps(_trace())
    for sub in ("traces", "traces-bad"):
        (d / sub).mkdir(exist_ok=True)
        (d / sub / "rank0.json").write_text(good)
        (d / sub / "rank1.json").write_text(good)
    (d / "traces-bad" / "rank2.json").write_bytes(BINARY)
    (d / "traces-bad" / "rank3.json").write_text('{"traceEvents": [')
    # records (bench, comm) with bad numbers, for report and calibrate
    records = {
        "rec-gpus-str": bench_record("g", layout={"gpus": "eight", "seq_len": 256}),
        "rec-gpus-inf": bench_record("i", layout={"gpus": 1e308 * 10, "seq_len": 256}),
        "rec-tags-list": bench_record("t", workload={"model": "llama-tiny", "tags": [1]}),
        "rec-repeats-str": bench_record("r", measurements={"repeats": "fast"}),
        "rec-repeat-str": bench_record("q", measurements={"repeats": [{"tokens_per_s_per_gpu": "x"}]}),
        "rec-nested": None,
        "comm-str": comm_record([{"collective": "all_reduce", "bytes": "many", "time_s": 1.0}]),
        "comm-neg": comm_record([{"collective": "all_reduce", "bytes": 1024, "time_s": -1.0}]),
        "comm-rows-str": comm_record("rows"),  # type: ignore[arg-type]
        "comm-huge": comm_record([{"collective": "all_reduce", "bytes": 10**400, "time_s": 1.0}]),
        "bench-step-str": bench_record("s", summary={"step_time_s": {"mean": "slow"}},
                                       workload={"model": "llama-tiny", "model_spec": None}),
    }  # fmt: skip
    for name, doc in records.items():
        folder = d / name
        folder.mkdir(exist_ok=True)
        if doc is None:
            text = (
                '{"schema_version": 2, "kind": "bench", "x": ' + "[" * 100000 + "]" * 100000 + "}"
            )
        else:
            text = json.dumps(doc)
        (folder / f"{name}.json").write_text(text)


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    names: str  # a word the one error line must contain (the field or the file)
    out: str | None = None  # an output folder (relative to the case folder) left without files

    def argv(self, d: Path) -> list[str]:
        return [a.replace("{d}", str(d)) for a in self.args]


def _c(id: str, line: str, names: str, out: str | None = None) -> Case:
    return Case(id, tuple(line.split()), names, out)


CASES: list[Case] = [
    # predict
    _c("predict-model-binary", "predict {d}/bin.yaml", "bin.yaml"),
    _c("predict-model-list", "predict {d}/list.yaml", "model"),
    _c("predict-model-nested", "predict {d}/nested.yaml", "nested.yaml"),
    _c("predict-model-inf", "predict {d}/model-inf.yaml", "n_layers"),
    _c("predict-model-huge", "predict {d}/model-huge.yaml", "n_layers"),
    _c("predict-model-vocab", "predict {d}/model-bigvocab.yaml", "vocab_size"),
    _c("predict-model-dmodel", "predict {d}/model-dmodel-inf.yaml", "d_model"),
    _c("predict-cluster-binary", "predict llama2-7b --cluster {d}/bin.yaml", "bin.yaml"),
    _c("predict-params-list", "predict llama2-7b --cluster {d}/cluster-params-list.yaml", "params"),
    _c("predict-params-str", "predict llama2-7b --cluster {d}/cluster-params-str.yaml", "params"),
    _c("predict-peak-0", "predict llama2-7b --cluster {d}/cluster-peak0.yaml", "peak_tflops"),
    _c("predict-peak-neg", "predict llama2-7b --cluster {d}/cluster-peakneg.yaml", "peak_tflops"),
    _c("predict-peak-inf", "predict llama2-7b --cluster {d}/cluster-peakinf.yaml", "peak_tflops"),
    _c(
        "predict-cluster-gpus",
        "predict llama2-7b --cluster {d}/cluster-gpus-huge.yaml",
        "gpus_per_node",
    ),
    _c("predict-batch-2^62", f"predict llama2-7b --global-batch {2**62}", "global-batch"),
    _c("predict-batch-0", "predict llama2-7b --global-batch 0", "global-batch"),
    _c("predict-seq-0", "predict llama2-7b --seq-len 0", "seq-len"),
    _c("predict-gpus-huge", f"predict llama2-7b --gpus {10**30}", "gpus"),
    _c("predict-unknown-markup", "predict [/]x[bold]", "model"),
    # search
    _c("search-gpus-1e8", "search llama2-7b --gpus 100000000", "gpus"),
    _c("search-seq-0", "search llama2-7b --seq-len 0", "seq-len"),
    _c("search-batch-0", "search llama2-7b --global-batch 0", "global-batch"),
    _c("search-batch-huge", f"search llama2-7b --global-batch {2**62}", "global-batch"),
    _c("search-model-binary", "search {d}/bin.yaml", "bin.yaml"),
    # validate
    _c("validate-binary", "validate --data {d}/bin.csv", "bin.csv"),
    _c("validate-cut", "validate --data {d}/typed-cut.csv", "line"),
    _c("validate-quote", "validate --data {d}/typed-quote.csv", "data"),
    _c("validate-inf", "validate --data {d}/typed-inf.csv", "tokens_per_s_per_gpu"),
    _c("validate-nan", "validate --data {d}/typed-nan.csv", "tokens_per_s_per_gpu"),
    _c("validate-neg", "validate --data {d}/typed-neg.csv", "tokens_per_s_per_gpu"),
    _c("validate-hugeint", "validate --data {d}/typed-hugeint.csv", "gpus"),
    _c("validate-hugefloat", "validate --data {d}/typed-hugefloat.csv", "gpus"),
    _c(
        "validate-raw-hugefloat",
        "validate --data {d}/raw-hugefloat.csv --review {d}/bin.csv",
        "bin.csv",
    ),
    _c("validate-review-binary", "validate --data {d}/raw-nan.csv --review {d}/bin.csv", "bin.csv"),
    # runs import
    _c(
        "runs-binary", "runs import {d}/bin.csv --out {d}/runs-out/typed.csv", "bin.csv", "runs-out"
    ),
    _c(
        "runs-quote",
        "runs import {d}/typed-quote.csv --out {d}/runs-out/typed.csv",
        "line 6",
        "runs-out",
    ),
    # bench and comm: the output folder first
    _c("bench-out-file", "bench llama-tiny --out {d}/model.yaml/x", "out"),
    _c("bench-model-binary", "bench {d}/bin.yaml --out {d}/bench-out", "bin.yaml", "bench-out"),
    _c("bench-seq-0", "bench llama-tiny --seq-len 0 --out {d}/bench-out", "seq-len", "bench-out"),
    _c("comm-out-file", "comm --out {d}/model.yaml", "out"),
    _c("comm-sizes", "comm --sizes 1e400 --out {d}/comm-out", "sizes", "comm-out"),
    # trace
    _c("trace-binary", "trace {d}/bin.json", "bin.json"),
    _c("trace-nested", "trace {d}/trace-nested.json", "trace-nested.json"),
    _c("trace-bool-ts", "trace {d}/trace-bool.json", "ts"),
    _c("trace-huge-ts", "trace {d}/trace-huge.json", "ts"),
    _c("trace-near-overflow", "trace {d}/trace-near.json", "ts"),
    _c("trace-nan-ts", "trace {d}/trace-nan.json", "trace-nan.json"),
    _c("trace-folder-bad", "trace {d}/traces-bad", "rank2.json"),
    # calibrate
    _c(
        "calibrate-comm-str",
        "calibrate {d}/comm-str --base cpu-gloo --out {d}/cal-out/c.yaml",
        "bytes",
        "cal-out",
    ),
    _c(
        "calibrate-comm-neg",
        "calibrate {d}/comm-neg --base cpu-gloo --out {d}/cal-out/c.yaml",
        "time_s",
        "cal-out",
    ),
    _c(
        "calibrate-comm-rows",
        "calibrate {d}/comm-rows-str --base cpu-gloo --out {d}/cal-out/c.yaml",
        "rows",
        "cal-out",
    ),
    _c(
        "calibrate-comm-huge",
        "calibrate {d}/comm-huge --base cpu-gloo --out {d}/cal-out/c.yaml",
        "rows[0]",
        "cal-out",
    ),
    _c(
        "calibrate-bench-str",
        "calibrate {d}/bench-step-str --base cpu-gloo --out {d}/cal-out/c.yaml",
        "model_spec",
        "cal-out",
    ),
    _c(
        "calibrate-nested",
        "calibrate {d}/rec-nested --out {d}/cal-out/c.yaml",
        "rec-nested.json",
        "cal-out",
    ),
    _c(
        "calibrate-base-binary",
        "calibrate {d}/comm-str --base {d}/bin.yaml --out {d}/cal-out/c.yaml",
        "bin.yaml",
        "cal-out",
    ),
    # report
    _c("report-gpus-str", "report {d}/rec-gpus-str --out {d}/rep-out", "gpus", "rep-out"),
    _c("report-gpus-inf", "report {d}/rec-gpus-inf --out {d}/rep-out", "gpus", "rep-out"),
    _c("report-tags-list", "report {d}/rec-tags-list --out {d}/rep-out", "tags", "rep-out"),
    _c("report-repeats-str", "report {d}/rec-repeats-str --out {d}/rep-out", "repeats", "rep-out"),
    _c(
        "report-repeat-str",
        "report {d}/rec-repeat-str --out {d}/rep-out",
        "tokens_per_s_per_gpu",
        "rep-out",
    ),
    _c("report-nested", "report {d}/rec-nested --out {d}/rep-out", "rec-nested.json", "rep-out"),
    # sweep
    _c("sweep-binary", "sweep {d}/bin.yaml --out {d}/sweep-out --dry-run", "bin.yaml", "sweep-out"),
    _c("sweep-list", "sweep {d}/list.yaml --out {d}/sweep-out --dry-run", "sweep", "sweep-out"),
    _c(
        "sweep-nested",
        "sweep {d}/nested.yaml --out {d}/sweep-out --dry-run",
        "nested.yaml",
        "sweep-out",
    ),
    _c(
        "sweep-name-newline",
        "sweep {d}/sweep-name.yaml --out {d}/sweep-out --dry-run",
        "name",
        "sweep-out",
    ),
    _c(
        "sweep-params-list",
        "sweep {d}/sweep-params.yaml --out {d}/sweep-out --dry-run",
        "params",
        "sweep-out",
    ),
    _c(
        "sweep-gpus-huge",
        "sweep {d}/sweep-gpus-huge.yaml --out {d}/sweep-out --dry-run",
        "gpus",
        "sweep-out",
    ),
    _c(
        "sweep-steps-inf",
        "sweep {d}/sweep-inf.yaml --out {d}/sweep-out --dry-run",
        "steps",
        "sweep-out",
    ),
    # more flags with hostile values
    _c("predict-tp-huge", f"predict llama2-7b --tp {2**70}", "tp"),
    _c("predict-cluster-list", "predict llama2-7b --cluster {d}/list.yaml", "cluster"),
    _c("search-tp-words", "search llama2-7b --tp abc", "tp"),
    _c("search-tp-huge", f"search llama2-7b --tp {2**70}", "tp"),
    _c("validate-explain-huge", f"validate --explain {2**70}", "row"),
    _c(
        "bench-steps-huge",
        f"bench llama-tiny --steps {2**70} --out {{d}}/bench-out",
        "steps",
        "bench-out",
    ),
    _c(
        "bench-data-binary",
        "bench llama-tiny --data {d}/bin.json --out {d}/bench-out",
        "data",
        "bench-out",
    ),
    _c("comm-iters-huge", f"comm --iters {2**70} --out {{d}}/comm-out", "iters", "comm-out"),
    _c("comm-sizes-zero", "comm --sizes 0 --out {d}/comm-out", "sizes", "comm-out"),
    _c("trace-cluster-binary", "trace {d}/traces --cluster {d}/bin.yaml", "bin.yaml"),
    _c("trace-plot-file", "trace {d}/traces --plot {d}/model.yaml", "model.yaml"),
    _c(
        "calibrate-trace-bad",
        "calibrate --trace {d}/bin.json --out {d}/cal-out/c.yaml",
        "bin.json",
        "cal-out",
    ),
    _c(
        "report-cluster-binary",
        "report {d}/rec-gpus-str --cluster {d}/bin.yaml --predict --out {d}/rep-out",
        "bin.yaml",
        "rep-out",
    ),
    _c("study-out-file", "study hardware --out {d}/model.yaml", "out"),
    _c(
        "sweep-steps-huge",
        "sweep {d}/sweep-steps-huge.yaml --out {d}/sweep-out --dry-run",
        "bench.steps",
        "sweep-out",
    ),
    # study
    _c("study-unknown-markup", "study [/]x --out {d}/study-out", "study", "study-out"),
]
