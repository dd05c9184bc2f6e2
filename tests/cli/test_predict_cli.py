import json

import pytest

from tests.conftest import CliResult, run_cli_all


def test_predict_json_has_every_field(cli) -> None:
    r = cli("predict", "llama2-7b", "--cluster", "h100-ib", "--gpus", "128", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    for key in (
        "step_time_s",
        "tokens_per_s",
        "tokens_per_s_per_gpu",
        "mfu",
        "hfu",
        "exposed_comm_s",
        "dp_all_gather_s",
        "tp_comm_s",
        "pp_bubble_s",
        "recompute_s",
        "optimizer_s",
        "memory_parameters_bytes",
        "memory_activations_bytes",
        "fits",
        "power_w_per_gpu",
        "tokens_per_j",
        "assumptions",
        "layout",
    ):
        assert key in doc
    assert doc["layout"]["gpus"] == 128


def test_predict_table_for_people(cli) -> None:
    r = cli(
        "predict", "llama2-70b", "--gpus", "64", "--tp", "8", "--pp", "2", "--global-batch", "64"
    )
    assert r.returncode == 0, r.stderr
    assert "tokens/s/GPU" in r.stdout and "memory per GPU" in r.stdout


BAD_INPUT = [
    (["predict", "llama-9000"], "model: unknown model"),
    (["predict", "llama2-7b", "--cluster", "nowhere"], "cluster: unknown cluster"),
    (["predict", "llama2-7b", "--gpus", "128", "--tp", "3"], "gpus: tp (3)"),
    (["predict", "llama2-7b", "--sharding", "zero9"], "sharding: 'zero9'"),
    (["predict", "llama2-7b", "--gpus", "-4"], "gpus: must be a positive integer"),
    (["predict", "llama2-7b", "--gpus", "lots"], "Invalid value for '--gpus'"),
    (["predict", "llama2-7b", "--cluster", "missing.yaml"], "cluster: no such file"),
    (["models", "--bogus"], "No such option"),
]


@pytest.fixture(scope="module")
def bad_input_runs() -> dict[tuple[str, ...], CliResult]:
    """Every BAD_INPUT command, each in its own process as a user would run it, two at a time."""
    argvs = [tuple(args) for args, _ in BAD_INPUT]
    return dict(zip(argvs, run_cli_all(argvs), strict=True))


@pytest.mark.parametrize(("args", "needle"), BAD_INPUT)
def test_bad_input_is_one_line_and_exit_2(
    bad_input_runs: dict[tuple[str, ...], CliResult], args: list[str], needle: str
) -> None:
    r = bad_input_runs[tuple(args)]
    assert r.returncode == 2
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    assert needle in lines[0]
    assert "Traceback" not in r.stderr


def test_catalog_listings() -> None:
    models_run, hw_run = run_cli_all([("models", "--json"), ("hardware", "--json")])
    models = json.loads(models_run.stdout)
    assert {m["name"] for m in models} >= {"llama2-7b", "llama3-405b"}
    hw = json.loads(hw_run.stdout)
    assert {c["name"] for c in hw["clusters"]} >= {
        "v100-ib",
        "a100-ib",
        "h100-ib",
        "h200-ib",
        "b200-ib",
        "gb200-nvl72",
    }
    assert {g["name"] for g in hw["gpus"]} >= {
        "V100-SXM2",
        "A100-SXM4-40GB",
        "A100-SXM4-80GB",
        "H100-SXM5",
        "H100-SXM5-HBM2e-500W",
        "H200",
        "B200",
        "GB200",
    }


def test_custom_cluster_yaml(tmp_path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(
        "gpu: H100-SXM5\ngpus_per_node: 8\nnics_per_node: 4\nnic_gbps: 200\nparams:\n  gemm_efficiency: 0.5\n"
    )
    slow_run, base_run = run_cli_all(
        [
            ("predict", "llama2-7b", "--gpus", "256", "--cluster", str(path), "--json"),
            ("predict", "llama2-7b", "--gpus", "256", "--json"),
        ]
    )
    slow, base = json.loads(slow_run.stdout), json.loads(base_run.stdout)
    assert slow["cluster"] == "mine"
    assert slow["tokens_per_s"] < base["tokens_per_s"]
