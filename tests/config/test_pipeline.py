"""The pipeline split: every layer in exactly one stage, torchtitan's uneven division."""

from __future__ import annotations

import pytest

from scalelab.config.catalog import load_model, model_names
from scalelab.config.layout import Layout
from scalelab.config.options import PipelineSchedule
from scalelab.config.pipeline import describe_stages, layout_stages, rank_stage_ids, split_stages


def test_uneven_counts_match_torchtitan() -> None:
    # torchtitan generate_llm_fqn_per_model_part(num_stages, num_layers) with weights 1 and 1,
    # worked by hand: (L + 2) effective layers, the first (L + 2) % S stages one more.
    assert [s.n_layers for s in split_stages(3, 2)] == [2, 1]
    assert [s.n_layers for s in split_stages(5, 2)] == [3, 2]
    assert [s.n_layers for s in split_stages(40, 3)] == [13, 14, 13]
    assert [s.n_layers for s in split_stages(126, 8)] == [15, 16, 16, 16, 16, 16, 16, 15]
    assert [s.n_layers for s in split_stages(5, 4)] == [1, 2, 2, 0]  # last: norm + output only
    stages = split_stages(5, 4)
    assert stages[0].modules() == ["tok_embeddings", "layers.0"]
    assert stages[-1].modules() == ["norm", "output"]


def test_fewer_layers_on_first_and_last_stage_and_split_points() -> None:
    assert [s.n_layers for s in split_stages(8, 2, input_weight=2, output_weight=2)] == [4, 4]
    assert [s.n_layers for s in split_stages(10, 3, input_weight=2, output_weight=2)] == [3, 5, 2]
    assert [s.n_layers for s in split_stages(8, 3, split_points=[2, 5])] == [2, 3, 3]
    with pytest.raises(ValueError, match="split points"):
        split_stages(8, 3, split_points=[5, 2])
    with pytest.raises(ValueError, match="effective layers"):
        split_stages(2, 5)


@pytest.mark.parametrize("name", model_names())
def test_every_catalog_model_every_layer_once(name: str) -> None:
    spec = load_model(name)
    for pp in (2, 3, 4, 8, 16):
        for v in (1, 2, 3, 4):
            if pp * v > spec.n_layers:
                continue
            stages = split_stages(spec.n_layers, pp * v)
            layers = [i for s in stages for i in s.layers]
            assert layers == list(range(spec.n_layers)), (pp, v)
            assert stages[0].embedding and stages[-1].head
            assert sum(s.embedding for s in stages) == sum(s.head for s in stages) == 1
            assert max(s.n_layers for s in stages) - min(s.n_layers for s in stages) <= 2


def test_ranks_and_description() -> None:
    spec = load_model("llama2-7b")
    layout = Layout(
        gpus=4,
        global_batch=16,
        seq_len=128,
        pp=4,
        pp_schedule=PipelineSchedule.INTERLEAVED,
        virtual_stages=3,
    )
    assert [s.n_layers for s in layout_stages(spec, layout)] == [2] + [3] * 9 + [2, 1]
    assert rank_stage_ids(layout, 1) == [1, 5, 9]
    text = describe_stages(spec, layout)
    assert text.splitlines()[0].startswith("pp rank 0: stage 0: layers 0-1, embedding (2 layers)")
    assert "stage 11: layer 31, norm+output (1 layer)" in text
    zbv = Layout(
        gpus=2,
        global_batch=8,
        seq_len=128,
        pp=2,
        pp_schedule=PipelineSchedule.ZBV,
        virtual_stages=2,
    )
    assert rank_stage_ids(zbv, 0) == [0, 3]
