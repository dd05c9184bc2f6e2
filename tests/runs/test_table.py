"""A synthetic table in the published-runs layout, exported the way people export tables (Excel's
"CSV UTF-8" with a BOM, semicolons, CRLF, a quoted line break), read as a person would read it:
each rule that fills what a row names (model family and size, system, framework default) and
each throughput form."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from scalelab.runs.importer import import_rows, read_raw_csv, read_table
from scalelab.runs.schema import MeasuredQuantity

# Llama 3 8B: 32 layers, d 4096, 32 heads, 8 kv heads, FFN 14336, vocabulary 128256 (reading
# rules); seq 8192; 6N + 12 L H Q T with N = 8.03e9 (the stated params).
N_PARAMS = 8.03e9
FLOPS_PER_TOKEN = 6 * N_PARAMS + 12 * 32 * 4096 * 8192

HEADER = [
    "source",
    "model",
    "params",
    "seq_len",
    "global_batch_seqs",
    "micro_batch",
    "gpu_type",
    "num_gpus",
    "tp",
    "pp",
    "cp",
    "activation_checkpointing",
    "precision",
    "framework",
    "tokens_per_sec_global",
    "tokens_per_sec_per_gpu",
    "step_time_s",
    "tflops_per_gpu",
    "mfu_pct",
    "peak_tflops",
    "flop_formula",
    "notes",
]
COMMON = {
    "source": "my cluster, June",
    "model": "Llama 3 8B",
    "params": "8.03B",
    "seq_len": "8K",
    "global_batch_seqs": "64",
    "micro_batch": "1",
    "gpu_type": "H100 SXM5 80GB (DGX H100)",
    "num_gpus": "16",
    "tp": "2",
    "pp": "1",
    "cp": "1",
    "activation_checkpointing": "selective",
    "precision": "bf16",
    "framework": "Megatron-Bridge 0.2",
    "notes": 'first line\nsecond line; "quoted"',
}
ROWS = [
    {"tokens_per_sec_per_gpu": "~4,100"},
    {"tokens_per_sec_global": "65.6k"},
    {"step_time_s": "8.0", "global_batch_seqs": "64"},
    {"tflops_per_gpu": "260", "flop_formula": "6N+12LHQT"},
    {"mfu_pct": "26.3", "peak_tflops": "989", "flop_formula": "6N+12LHQT"},
    {"tokens_per_sec_per_gpu": "4100", "model": "Mamba 7B", "micro_batch": "", "tp": ""},
]


def excel_export(rows: list[dict[str, str]]) -> str:
    """The table as Excel's "CSV UTF-8" with a semicolon list separator writes it."""
    out = io.StringIO()
    writer = csv.writer(out, delimiter=";", lineterminator="\r\n")
    writer.writerow([h.replace("_", " ").title() for h in HEADER])  # 'Num Gpus', 'Seq Len'
    for row in rows:
        merged = {**COMMON, **row}
        writer.writerow([merged.get(h, "") for h in HEADER])
    return "\ufeff" + out.getvalue()


@pytest.fixture(scope="module")
def readings():
    return import_rows(read_raw_csv(excel_export(ROWS)))


def test_bom_semicolons_crlf_and_a_quoted_line_break_are_read() -> None:
    header, rows = read_table(excel_export(ROWS))
    assert header == HEADER
    assert len(rows) == len(ROWS)
    assert rows[0]["notes"] == 'first line\nsecond line; "quoted"'


def test_the_named_family_gives_the_shape_marked_as_following_from_the_name(readings) -> None:
    run = readings[0].run
    assert run is not None, readings[0].skipped
    assert (run.n_layers, run.d_model, run.n_heads, run.n_kv_heads, run.d_ff, run.vocab_size) == (
        32,
        4096,
        32,
        8,
        14336,
        128256,
    )
    assert (run.ffn, run.norm, run.position, run.tied_embeddings) == (
        "swiglu",
        "rmsnorm",
        "rope",
        False,
    )
    assert {"n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size"} <= set(
        run.assumed_fields
    )
    assert run.assumption_kind == "named"


def test_the_named_system_gives_the_node_and_its_links(readings) -> None:
    run = readings[0].run
    assert run is not None
    assert (run.gpus_per_node, run.nics_per_node, run.nic_gbps) == (8, 8, 400)
    assert {"gpus_per_node", "nics_per_node", "nic_gbps"} <= set(run.assumed_fields)


def test_the_frameworks_documented_defaults_fill_what_the_row_leaves_out(readings) -> None:
    run = readings[0].run
    assert run is not None
    assert (run.sequence_parallel, run.sharding, run.attention) == (True, "zero1", "flash")
    assert {"sequence_parallel", "sharding", "attention"} <= set(run.assumed_fields)
    # what the run chose is read, never filled: micro-batch, degrees, recompute, precision
    assert (run.micro_batch, run.tp, run.recompute, run.precision) == (1, 2, "selective", "bf16")


@pytest.mark.parametrize(
    ("index", "quantity", "tokens_per_s_per_gpu"),
    [
        (0, MeasuredQuantity.TOKENS_PER_S_PER_GPU, 4100.0),
        (1, MeasuredQuantity.TOKENS_PER_S, 65_600 / 16),
        (2, MeasuredQuantity.STEP_TIME_S, 64 * 8192 / 8.0 / 16),
        (3, MeasuredQuantity.TFLOPS_PER_GPU, 260e12 / FLOPS_PER_TOKEN),
        (4, MeasuredQuantity.MFU, 0.263 * 989e12 / FLOPS_PER_TOKEN),
    ],
)
def test_each_throughput_form_becomes_tokens_per_s_per_gpu(
    readings, index: int, quantity: str, tokens_per_s_per_gpu: float
) -> None:
    run = readings[index].run
    assert run is not None, readings[index].skipped
    assert run.measured_quantity == quantity
    assert run.tokens_per_s_per_gpu == pytest.approx(tokens_per_s_per_gpu, rel=1e-6)


def test_a_table_without_a_source_column_is_its_own_source() -> None:
    table = "model,gpu_type,num_gpus,seq_len,micro_batch,global_batch_seqs,tp,pp,cp,"
    table += "activation_checkpointing,precision,sharding,notes,tokens_per_sec_per_gpu\n"
    table += "Llama 2 7B,H100 SXM5 (DGX H100),8,4096,1,8,1,1,1,none,bf16,FSDP,FlashAttention,3000\n"
    (reading,) = import_rows(read_raw_csv(table))
    assert reading.run is not None, reading.reasons
    assert reading.run.source == "(source not stated)"


def test_a_row_that_cannot_be_read_gives_every_reason(readings) -> None:
    reasons = readings[5].reasons
    assert readings[5].run is None
    assert any(r.startswith("model family not recognised") for r in reasons)
    assert "micro-batch not stated (micro_batch)" in reasons
    assert "tensor-parallel degree not stated (tp)" in reasons


def test_runs_import_and_validate_on_the_exported_table(cli, tmp_path: Path) -> None:
    table = tmp_path / "runs.csv"
    table.write_bytes(excel_export(ROWS).encode("utf-8"))
    skipped = tmp_path / "skipped.csv"
    r = cli(
        "runs", "import", str(table), "--out", str(tmp_path / "typed.csv"),
        "--skipped", str(skipped), "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["rows"], doc["imported"], doc["skipped"]) == (6, 5, 1)
    assert doc["imported_with_assumptions"] == 5
    lines = list(csv.DictReader(skipped.read_text().splitlines()))
    assert {line["column"] for line in lines} >= {"micro_batch", "tp"}
    assert all(line["row"] == "5" for line in lines) and len(lines) >= 3
    v = cli("validate", "--data", str(table), "--json")
    assert v.returncode == 0, v.stderr
    report = json.loads(v.stdout)
    assert report["rows_read"] == 6 and report["rows_used"] == 5
    assert report["by_assumption"]["only_what_the_row_names"]["rows"] == 5
    assert report["by_assumption"]["nothing_assumed"]["rows"] == 0
    rows = json.loads(cli("validate", "--data", str(table), "--json", "--rows").stdout)["rows"]
    assert {r["assumption_kind"] for r in rows} == {"named"}
    explained = cli("validate", "--data", str(tmp_path / "typed.csv"), "--explain", "0")
    assert explained.returncode == 0, explained.stderr
    assert "step time: predicted" in explained.stdout
    assert "(reading rules)" in explained.stdout
