import itertools

import pytest

from scalelab.config.catalog import load_cluster, load_model
from scalelab.config.layout import Layout, rule_violations
from scalelab.errors import InputError
from scalelab.perf.predict import predict_layout
from scalelab.search import Constraints, search

H100 = load_cluster("h100-ib")


def test_finds_the_optimum_of_a_space_enumerated_by_hand() -> None:
    model = load_model("llama2-13b")
    gpus, batch, seq = 32, 64, 4096
    best, best_tps = None, 0.0
    for tp, pp, sharding, mb, rc in itertools.product(
        (1, 2, 4), (1, 2), ("ddp", "fsdp"), (1, 2), ("none", "full")
    ):
        for sched in (("1f1b", 1), ("gpipe", 1)) if pp > 1 else (("1f1b", 1),):
            layout = Layout(
                gpus=gpus,
                global_batch=batch,
                seq_len=seq,
                tp=tp,
                pp=pp,
                sharding=sharding,
                micro_batch=mb,
                recompute=rc,
                pp_schedule=sched[0],
                virtual_stages=sched[1],
            )
            if rule_violations(layout, model, H100):
                continue
            r = predict_layout(model, H100, layout)
            if r["fits"] and r["tokens_per_s"] > best_tps:
                best, best_tps = layout, r["tokens_per_s"]
    c = Constraints(
        tp=[1, 2, 4],
        pp=[1, 2],
        cp=[1],
        sharding=["ddp", "fsdp"],
        micro_batch=[1, 2],
        recompute=["none", "full"],
        pp_schedule=["1f1b", "gpipe"],
        sequence_parallel=[True],
        reshard_after_forward=[True],
    )
    result = search(model, H100, gpus=gpus, global_batch=batch, seq_len=seq, constraints=c, top_k=3)
    assert result.top[0]["tokens_per_s"] == pytest.approx(best_tps)
    assert Layout(**result.top[0]["layout"]) == best


def test_invalid_layouts_are_counted_by_reason() -> None:
    model = load_model("llama2-7b")
    c = Constraints(
        tp=[1, 2],
        pp=[1],
        cp=[1],
        sharding=["fsdp"],
        micro_batch=[1, 2, 4],
        recompute=["none"],
        reshard_after_forward=[True],
        sequence_parallel=[True],
    )
    r = search(model, H100, gpus=16, global_batch=48, seq_len=4096, constraints=c)
    # tp=1: dp 16, 3 sequences per rank: micro-batch 1 is valid, 2 does not divide 48 / 16.
    # tp=2: dp 8, 6 per rank: micro-batch 1 and 2 valid, 4 does not divide.
    assert r.considered == 5
    assert r.invalid == 2
    assert r.invalid_by_reason == {
        "global batch does not divide into data-parallel ranks x micro-batch": 2
    }
    assert r.ranked + r.not_fitting == 3


def test_layouts_that_do_not_fit_are_counted() -> None:
    model = load_model("llama2-70b")
    c = Constraints(tp=[1], pp=[1], cp=[1], sharding=["ddp"], recompute=["none", "full"])
    r = search(model, H100, gpus=8, global_batch=8, seq_len=4096, constraints=c)
    assert r.considered == 2 and r.invalid == 0
    assert r.not_fitting == 2 and r.ranked == 0 and r.top == []
    assert "no layout" in r.explanation[0]


def test_the_winner_is_explained_against_plain_fsdp() -> None:
    model = load_model("llama2-7b")
    r = search(model, H100, gpus=2048, global_batch=2048, seq_len=4096, top_k=3)
    assert r.baseline is not None
    assert r.baseline["layout"]["sharding"] == "fsdp" and r.baseline["layout"]["tp"] == 1
    assert r.top[0]["tokens_per_s"] >= r.baseline["tokens_per_s"]
    assert "throughput of" in r.explanation[0]
    assert r.considered > 100_000
    assert sum(r.invalid_by_reason.values()) == r.invalid
    energies = [p["energy_per_token_j"] for p in r.pareto]
    speeds = [p["tokens_per_s"] for p in r.pareto]
    assert speeds == sorted(speeds, reverse=True) and energies == sorted(energies, reverse=True)


def test_objective_changes_the_ranking_field() -> None:
    model = load_model("llama2-7b")
    r = search(
        model, H100, gpus=64, global_batch=64, seq_len=4096, objective="tokens-per-joule", top_k=5
    )
    values = [t["tokens_per_j"] for t in r.top]
    assert values == sorted(values, reverse=True)


@pytest.mark.parametrize(
    ("kwargs", "field"), [({"objective": "speed"}, "objective"), ({"gpus": 0}, "gpus")]
)
def test_bad_search_arguments(kwargs: dict, field: str) -> None:
    base = {"gpus": 8, "global_batch": 8, "seq_len": 4096}
    with pytest.raises(InputError) as err:
        search(load_model("llama2-7b"), H100, **{**base, **kwargs})
    assert err.value.field == field


def test_search_cli_json(cli) -> None:
    import json

    r = cli("search", "llama2-7b", "--gpus", "64", "--global-batch", "64", "--tp", "1,2", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {
        "considered",
        "invalid",
        "invalid_by_reason",
        "not_fitting",
        "top",
        "baseline",
        "pareto",
    } <= set(doc)
    assert all(t["layout"]["tp"] in (1, 2) for t in doc["top"])
    bad = cli("search", "llama2-7b", "--tp", "two")
    assert bad.returncode == 2 and "tp:" in bad.stderr
