"""The Python API: `scalelab.predict(...)` and `scalelab.search(...)` give the CLI's numbers,
typed, with `.to_pandas()`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import scalelab
from scalelab.api import LayoutPrediction, LayoutSearch
from scalelab.config.catalog import load_cluster, load_model, load_stack
from scalelab.config.layout import Layout
from scalelab.errors import InputError
from scalelab.perf.predict import predict_layout
from scalelab.search import Constraints
from scalelab.search import search as rank_layouts


def test_predict_is_the_predictors_answer_typed() -> None:
    p = scalelab.predict("llama2-7b", "h100-ib", gpus=8, tp=2, micro_batch=2, stack="torchtitan")
    assert isinstance(p, LayoutPrediction)
    spec = load_model("llama2-7b")
    layout = Layout(gpus=8, tp=2, micro_batch=2, seq_len=spec.seq_len, global_batch=8)
    assert p.layout == layout  # seq_len the model's, global batch one micro-batch per DP rank
    direct = predict_layout(spec, load_cluster("h100-ib"), layout, load_stack("torchtitan"))
    assert p.step_time_s == direct["step_time_s"] and p.mfu == direct["mfu"]
    assert p.fields["pp_bubble_s"] == direct["pp_bubble_s"] and p.fits is direct["fits"]
    assert p.to_dict()["layout"] == layout.model_dump(mode="json")
    frame = p.to_pandas()
    assert len(frame) == 1 and frame.loc[0, "layout.tp"] == 2
    assert frame.loc[0, "tokens_per_s"] == pytest.approx(p.tokens_per_s)
    assert frame.loc[0, "layout"] == layout.description
    # A Layout object is accepted as well as its fields.
    assert scalelab.predict(spec, "h100-ib", layout=layout, stack="torchtitan") == p


def test_predict_matches_the_cli_json(cli) -> None:
    r = cli("predict", "llama2-7b", "-g", "16", "--tp", "2", "--pp", "2", "--json")
    assert r.returncode == 0, r.stderr
    p = scalelab.predict("llama2-7b", gpus=16, tp=2, pp=2)
    cli_json = json.loads(r.stdout)
    for summary in ("memory_needed_gib", "memory_available_gib", "memory_headroom_gib"):
        cli_json.pop(summary)  # the CLI's fit summary, derived from memory_total/capacity_bytes
    assert json.loads(json.dumps(p.to_dict())) == cli_json


def test_search_is_the_rankings_answer_typed() -> None:
    s = scalelab.search("llama2-7b", "h100-ib", gpus=16, top=3, tp=[1, 2], stack="generic")
    assert isinstance(s, LayoutSearch)
    spec = load_model("llama2-7b")
    direct = rank_layouts(
        spec, load_cluster("h100-ib"), gpus=16, global_batch=16, seq_len=spec.seq_len,
        constraints=Constraints(tp=[1, 2]), top_k=3,
    )  # fmt: skip
    assert [p.tokens_per_s for p in s.ranked] == [r["tokens_per_s"] for r in direct.top]
    assert s.ranked_total == direct.ranked and s.considered == direct.considered
    assert s.best is s.ranked[0] and all(p.layout.tp in (1, 2) for p in s.ranked)
    assert s.baseline is not None and s.baseline.layout.tp == 1
    frame = s.to_pandas()
    assert list(frame["rank"]) == [1, 2, 3, pd_na()] and list(frame["baseline"]) == [
        False, False, False, True,
    ]  # fmt: skip
    assert list(frame["tokens_per_s"])[:3] == [p.tokens_per_s for p in s.ranked]


def pd_na():  # type: ignore[no-untyped-def]
    import pandas as pd

    return pd.NA


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: scalelab.predict("llama2-7b", tpp=2), "tpp"),
        (lambda: scalelab.predict("llama2-7b", gpus=8, tp=3), "gpus"),
        (lambda: scalelab.predict("no-such-model"), "model"),
        (lambda: scalelab.search("llama2-7b", colour=["red"]), "colour"),
        (lambda: scalelab.search("llama2-7b", objective="speed"), "objective"),
    ],
)
def test_bad_input_raises_an_input_error_naming_the_field(call, field) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError) as info:
        call()
    assert info.value.field == field


def test_the_api_imports_no_torch_and_import_scalelab_stays_light() -> None:
    code = (
        "import sys, scalelab; light = 'numpy' not in sys.modules; "
        "scalelab.search('llama2-7b', gpus=8, top=1); scalelab.predict('llama2-7b'); "
        "print(light, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "False"]
