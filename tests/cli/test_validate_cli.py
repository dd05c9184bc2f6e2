import json


def test_validate_reaches_the_accuracy_target(cli) -> None:
    r = cli("validate", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) >= {"rows_used", "rows_skipped", "mape_tokens_per_gpu", "by_source"}
    assert doc["rows_used"] >= 600
    assert doc["mape_tokens_per_gpu"] <= 0.15
    assert doc["median_spearman_within_sweeps"] > 0.6
    assert doc["rows_predicted_not_to_fit"] < 0.2 * doc["rows_used"]


def test_validate_skips_rows_it_cannot_read_with_a_reason(cli, tmp_path) -> None:
    header = (
        "source,model,layers,hidden_size,heads,seq_len,gpu_type,num_gpus,tokens_per_sec_per_gpu\n"
    )
    rows = (
        "github pytorch/torchtitan x,Llama 2 7B,32,4096,32,4096,H100-SXM5-80GB (DGX H100),8,3000\n"
        "somewhere,Llama 2 7B,32,4096,32,4096,TPU v5p,8,3000\n"
        "somewhere,Llama 2 7B,32,4096,32,4096,H100-SXM5-80GB,8,\n"
    )
    path = tmp_path / "runs.csv"
    path.write_text(header + rows)
    doc = json.loads(cli("validate", "--data", str(path), "--json").stdout)
    assert doc["rows_used"] == 1
    assert doc["rows_skipped"] == 2
    assert set(doc["skipped_by_reason"]) == {
        "GPU type not in the catalog",
        "no throughput to compare (no tokens/s, MFU or TFLOP/s usable)",
    }


def test_validate_refuses_a_csv_of_another_schema(cli, tmp_path) -> None:
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    r = cli("validate", "--data", str(path))
    assert r.returncode == 2
    assert r.stderr.strip().startswith("scalelab: error: data: CSV lacks the columns")
