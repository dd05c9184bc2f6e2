"""Software stacks (issue 11 item 6): `generic` changes nothing; each other stack's behaviour moves
the prediction the way its mechanism says, and what a stack does not offer is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scalelab.config.catalog import load_cluster, load_model, load_stack, stack_names
from scalelab.config.layout import Layout, LayoutTable
from scalelab.errors import InputError
from scalelab.perf.predict import predict, predict_layout
from scalelab.runs.rules import read_stack
from scalelab.search import search

H100 = load_cluster("h100-ib")


def _row(model: str, layout: Layout, stack: str) -> dict:
    table = LayoutTable.from_layouts([layout])
    return predict(load_model(model), H100, table, load_stack(stack)).row(0)


def test_every_catalog_stack_loads_and_states_its_source() -> None:
    for name in stack_names():
        assert load_stack(name).source


def test_generic_is_the_default_prediction() -> None:
    rng = np.random.default_rng(3)
    layouts = [
        Layout(gpus=64, global_batch=int(b), seq_len=4096, tp=int(t), pp=int(p), micro_batch=1)
        for t, p, b in zip(
            rng.choice([1, 2, 8], 30),
            rng.choice([1, 2, 4], 30),
            rng.choice([256, 512], 30),
            strict=True,
        )
    ]
    table = LayoutTable.from_layouts(layouts)
    model = load_model("llama2-13b")
    plain, generic = predict(model, H100, table), predict(model, H100, table, load_stack("generic"))
    for key, values in plain.values.items():
        np.testing.assert_array_equal(values, generic.values[key])


def test_gradient_sync_every_microbatch_multiplies_the_reduction() -> None:
    # 64 GPUs, 512 sequences: 8 micro-batches per data-parallel rank, no pipeline.
    layout = Layout(gpus=64, global_batch=512, seq_len=4096)
    once, each = _row("llama2-7b", layout, "generic"), _row("llama2-7b", layout, "torchtitan")
    assert each["dp_grad_reduce_s"] == pytest.approx(8 * once["dp_grad_reduce_s"])
    assert each["step_time_s"] > once["step_time_s"]
    # With a pipeline the schedule reduces once per step in every stack.
    piped = Layout(gpus=64, global_batch=512, seq_len=4096, pp=4)
    a, b = _row("llama2-7b", piped, "generic"), _row("llama2-7b", piped, "torchtitan")
    assert a["dp_grad_reduce_s"] == pytest.approx(b["dp_grad_reduce_s"])


def test_tp_and_p2p_overlap_only_hide_communication() -> None:
    layout = Layout(
        gpus=256,
        global_batch=512,
        seq_len=4096,
        sharding="ddp",
        tp=8,
        pp=4,
        pp_schedule="interleaved",
        virtual_stages=2,
    )
    plain, overlapped = (
        _row("llama2-70b", layout, "generic"),
        _row("llama2-70b", layout, "megatron-core-te"),
    )
    assert overlapped["tp_comm_s"] < plain["tp_comm_s"]
    assert overlapped["pp_p2p_s"] < plain["pp_p2p_s"]
    # Compute moves only through interference beside the now shorter passes.
    assert overlapped["compute_s"] == pytest.approx(plain["compute_s"], rel=1e-2)
    assert overlapped["step_time_s"] < plain["step_time_s"]


def test_a_schedule_the_stack_lacks_is_refused_in_one_line(cli) -> None:
    layout = Layout(
        gpus=64, global_batch=64, seq_len=4096, pp=2, pp_schedule="zbv", virtual_stages=2
    )
    with pytest.raises(
        InputError, match="stack megatron-core-te offers 1f1b, interleaved, not zbv"
    ):
        predict_layout(load_model("llama2-7b"), H100, layout, load_stack("megatron-core-te"))
    r = cli("predict", "llama2-7b", "--gpus", "8", "--stack", "composer", "--tp", "2")
    assert r.returncode == 2
    assert r.stderr.strip() == "scalelab: error: tp: stack composer offers tp up to 1, not 2"


def test_search_ranks_only_what_the_stack_offers() -> None:
    result = search(
        load_model("llama2-13b"),
        H100,
        gpus=64,
        global_batch=64,
        seq_len=4096,
        top_k=50,
        stack=load_stack("composer"),
    )
    assert result.stack == "composer" and result.top
    assert all(r["layout"]["tp"] == r["layout"]["pp"] == r["layout"]["cp"] == 1 for r in result.top)
    assert any("stack composer" in reason for reason in result.invalid_by_reason)


def test_unknown_stack_and_a_stack_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown stack 'nemo'; choose one of generic"):
        load_stack("nemo")
    path = tmp_path / "mine.yaml"
    path.write_text("schedules: [1f1b]\nshardings: [fsdp]\ntp_comm_overlap: true\n")
    mine = load_stack(str(path))
    assert mine.name == "mine" and mine.tp_comm_overlap
    path.write_text("schedules: [dualpipe]\n")
    with pytest.raises(InputError, match=r"^stack: .*schedules"):
        load_stack(str(path))


@pytest.mark.parametrize(
    ("text", "stack"),
    [
        ("torchtitan (PyTorch FSDP2; commit in the source citation)", "torchtitan"),
        ("NeMo 24.07 container (Megatron-Core)", "megatron-core-te"),
        ("Megatron-LM (April 2021)", "megatron-lm-2021"),
        ("llm-foundry / Composer (Jan 2024)", "composer"),
        ("Aleph Alpha Megatron-based codebase", None),
        ("OneFlow-GPT (2021)", None),
    ],
)
def test_the_stack_a_run_states_is_read(text: str, stack: str | None) -> None:
    assert read_stack(text) == stack
