"""The layout flags are generated from `Layout`'s fields: one flag per field, same names."""

from __future__ import annotations

import inspect
import json

import pytest

from scalelab.cli.common import build_layout, flag_name, layout_options
from scalelab.cli.predict import predict
from scalelab.cli.search import search_command
from scalelab.config import Layout
from scalelab.errors import InputError


def test_every_layout_field_is_a_predict_flag() -> None:
    params = inspect.signature(predict).parameters
    for field in Layout.model_fields:
        name = "sp" if field == "sequence_parallel" else field
        assert name in params, field
    # The old flag spellings are kept.
    assert flag_name("sequence_parallel") == "sp" and flag_name("pp_schedule") == "pp-schedule"


def test_a_verb_receives_the_layout_by_name() -> None:
    seen = {}

    @layout_options(exclude=("gpus", "seq_len"))
    def verb(gpus: int = 8, **layout: object) -> None:
        seen.update(layout)

    verb(gpus=8, tp=2)
    assert seen == {"tp": 2}
    names = list(inspect.signature(verb).parameters)
    assert names[0] == "gpus" and "seq_len" not in names and "attention" in names


def test_build_layout_defaults_and_errors() -> None:
    layout = build_layout(gpus=128, seq_len=4096, tp=2, pp=4)
    assert layout.global_batch == Layout.default_global_batch(128, tp=2, pp=4) == 64
    with pytest.raises(InputError, match="pp-schedule: 'zb' is not one of"):
        build_layout(gpus=8, seq_len=4096, pp_schedule="zb")
    with pytest.raises(InputError, match="virtual-stages: must be a positive integer"):
        build_layout(gpus=8, seq_len=4096, virtual_stages=0)


def test_search_constraints_are_generated(cli) -> None:
    params = inspect.signature(search_command).parameters
    assert {"tp", "pp", "cp", "sharding", "hsdp_shard_size", "pp_schedule", "micro_batch"} <= set(
        params
    )
    r = cli(
        "search", "llama2-7b", "--gpus", "16", "--sharding", "fsdp", "--sp", "false",
        "--tp", "2", "--top", "1", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    top = json.loads(r.stdout)["top"][0]["layout"]
    assert top["sharding"] == "fsdp" and top["tp"] == 2 and top["sequence_parallel"] is False
    bad = cli("search", "llama2-7b", "--recompute", "some")
    assert bad.returncode == 2 and "recompute: 'some' must list values from" in bad.stderr
