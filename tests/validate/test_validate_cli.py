import json
from pathlib import Path

import numpy as np


def test_validate_reaches_the_accuracy_target(cli) -> None:
    r = cli("validate", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) >= {
        "rows_used",
        "rows_skipped",
        "mape_tokens_per_gpu",
        "by_source",
        "spearman_median",
        "memory",
    }
    assert "cross_validated" not in doc
    assert doc["rows_used"] >= 600
    assert doc["mape_tokens_per_gpu"] <= 0.15
    assert doc["median_spearman_within_sweeps"] > 0.6
    assert doc["rows_predicted_not_to_fit"] < 0.2 * doc["rows_used"]
    # Without --cross-validate each sweep has its in-sample rho and no held-out one.
    assert all(s["spearman_held_out"] is None for s in doc["sweep_spearman"])


def test_cross_validate_adds_held_out_errors_per_source(cli) -> None:
    r = cli("validate", "--cross-validate", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    cv = doc["cross_validated"]
    assert set(cv) >= {"mape_tokens_per_gpu", "by_source"}
    assert set(cv["by_source"]) == set(doc["by_source"])
    for stats in cv["by_source"].values():
        assert stats["rows"] > 0 and stats["mape"] > 0 and stats["clusters"]
    # held out is harder than in sample, but not absurd
    assert doc["mape_tokens_per_gpu"] < cv["mape_tokens_per_gpu"] < 0.5
    # Each sweep is listed with its runs and rho in-sample and held out; the medians are theirs.
    sweeps = doc["sweep_spearman"]
    assert len(sweeps) == doc["sweeps"]
    assert {"source", "model", "gpu", "seq_len", "runs", "spearman", "spearman_held_out"} <= set(
        sweeps[0]
    )
    assert all(s["runs"] >= 3 and -1 <= s["spearman_held_out"] <= 1 for s in sweeps)
    assert [s["spearman"] for s in sweeps] == sorted(s["spearman"] for s in sweeps)
    assert float(np.median([s["spearman"] for s in sweeps])) == doc["spearman_median"]
    assert float(np.median([s["spearman_held_out"] for s in sweeps])) == cv["spearman_median"]


def test_validate_skips_rows_it_cannot_read_with_a_reason(cli, tmp_path) -> None:
    header = (
        "source,model,layers,hidden_size,heads,kv_heads,ffn_size,vocab,seq_len,global_batch_seqs,"
        "micro_batch,gpu_type,num_gpus,gpus_per_node,tp,pp,dp,cp,sharding,"
        "activation_checkpointing,precision,tokens_per_sec_per_gpu,notes\n"
    )
    ok = "a,Llama 2 7B,32,4096,32,32,11008,32000,4096,16,1,{gpu},8,8,1,1,8,1,FSDP,none,bf16,{tps},FlashAttention\n"
    rows = (
        ok.format(gpu="H100-SXM5-80GB (DGX H100)", tps="3000")
        + ok.format(gpu="TPU v5p", tps="3000")
        + ok.format(gpu="H100-SXM5-80GB", tps="")
    )
    path = tmp_path / "runs.csv"
    path.write_text(header + rows)
    doc = json.loads(cli("validate", "--data", str(path), "--json").stdout)
    assert doc["rows_used"] == 1
    assert doc["rows_skipped"] == 2
    assert set(doc["skipped_by_reason"]) == {
        "GPU not in the catalog (TPU v5p) (gpu_type)",
        "no throughput to compare (tokens/s per GPU or of the job, step time x global batch, "
        "MFU with its peak or TFLOP/s, each with its FLOP formula)",
    }
    assert doc["by_assumption"]["all"]["rows"] == 1


def test_validate_answers_in_json_when_no_row_is_usable(cli, tmp_path) -> None:
    path = tmp_path / "runs.csv"
    path.write_text("model,gpu_type,num_gpus\nLlama 2 7B,H100-SXM5-80GB,8\n")
    r = cli("validate", "--data", str(path), "--json")
    assert r.returncode == 2
    doc = json.loads(r.stdout)
    assert doc["rows_read"] == 1 and doc["rows_used"] == 0 and doc["rows_skipped"] == 1
    assert doc["mape_tokens_per_gpu"] is None
    assert "micro-batch not stated (micro_batch)" in doc["skipped_by_reason"]
    assert len(doc["skipped_by_reason"]) > 5  # every reason of the row, not only its first
    reasons = tmp_path / "why.csv"
    plain = cli("validate", "--data", str(path), "--skipped", str(reasons))
    assert plain.returncode == 2 and plain.stdout == ""
    lines = reasons.read_text().splitlines()
    assert lines[0] == "row,column,reason" and len(lines) == 1 + len(doc["skipped_by_reason"])
    assert "0,micro_batch,micro-batch not stated (micro_batch)" in lines
    assert plain.stderr.startswith("scalelab validate: data: none of 1 rows could be used")


def test_validate_refuses_a_csv_of_another_schema(cli, tmp_path) -> None:
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    r = cli("validate", "--data", str(path))
    assert r.returncode == 2
    assert r.stderr.strip().startswith("scalelab: error: data: CSV lacks the columns")


def test_explain_prints_how_a_row_was_read(cli) -> None:
    r = cli("validate", "--explain", "204")
    assert r.returncode == 0, r.stderr
    assert "-> sharding = zero1" in r.stdout and "ASSUMED" in r.stdout
    assert "predicted" in r.stdout
    skipped = cli("validate", "--explain", "22")
    assert "    - micro-batch not stated (micro_batch)" in skipped.stdout
    assert "step time: predicted" in r.stdout and "compute" in r.stdout
    bad = cli("validate", "--explain", "100000")
    assert bad.returncode == 2 and bad.stderr.startswith("scalelab: error: row:")


def test_runs_import_writes_a_typed_file_validate_reads(cli, tmp_path: Path) -> None:
    from importlib import resources

    data = resources.files("scalelab").joinpath("data")
    out = tmp_path / "runs.csv"
    r = cli(
        "runs",
        "import",
        str(data.joinpath("published_runs.csv")),
        "--review",
        str(data.joinpath("published_runs_review.csv")),
        "--out",
        str(out),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["imported"] + summary["skipped"] == summary["rows"]
    assert out.read_text() == data.joinpath("published_runs_typed.csv").read_text()
    bad = tmp_path / "broken.csv"
    bad.write_text(
        out.read_text()
        .replace(",a100-ib,", ",a100-ib,x", 1)
        .replace(",8,8,8,200,", ",eight,8,8,200,", 1)
    )
    r = cli("validate", "--data", str(bad))
    assert r.returncode == 2 and r.stderr.startswith("scalelab: error: data: line 2:")


def test_explain_gives_a_memory_verdict_resting_on_unstated_values_as_unknown(cli) -> None:
    """NeMo's Nemotron-340B row does not state its recompute: its memory verdict is unknown."""
    r = cli("validate", "--explain", "62")
    assert r.returncode == 0, r.stderr
    assert "memory verdict unknown (" in r.stdout and "recompute not stated" in r.stdout
    assert "predicted NOT to fit" not in r.stdout


def test_cross_validation_of_one_source_group_says_why_it_cannot_run(cli, tmp_path) -> None:
    header = (
        "source,model,layers,hidden_size,heads,kv_heads,ffn_size,vocab,seq_len,global_batch_seqs,"
        "micro_batch,gpu_type,num_gpus,gpus_per_node,tp,pp,dp,cp,sharding,"
        "activation_checkpointing,precision,tokens_per_sec_per_gpu,notes\n"
    )
    row = "a,Llama 2 7B,32,4096,32,32,11008,32000,4096,16,1,H100-SXM5-80GB,8,8,1,1,8,1,FSDP,none,bf16,3000,FlashAttention\n"
    path = tmp_path / "runs.csv"
    path.write_text(header + row)
    r = cli("validate", "--data", str(path), "--json", "--cross-validate")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert "cross_validated" not in doc
    assert doc["cross_validation_skipped"].startswith("leave-one-source-out needs")
