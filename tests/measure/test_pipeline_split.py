"""The harness builds each pipeline stage from the shared split: every layer exactly once."""

from __future__ import annotations

import pytest

from scalelab.config.catalog import load_model, model_names
from scalelab.config.layout import Layout
from scalelab.config.options import PipelineSchedule
from scalelab.config.pipeline import stage_count
from scalelab.errors import InputError
from scalelab.measure.config import check_model

torch = pytest.importorskip("torch")

from scalelab.measure.model import build_model  # noqa: E402
from scalelab.measure.parallel import pipeline_modules  # noqa: E402


def _buildable() -> list[str]:
    names = []
    for name in model_names():
        try:
            check_model(load_model(name))
        except InputError:
            continue
        names.append(name)
    return names


# Uneven for most catalog layer counts (tests/config/test_pipeline.py checks the split itself
# on a wider grid).
GRID = [
    (2, PipelineSchedule.ONE_F_ONE_B, 1),
    (3, PipelineSchedule.ONE_F_ONE_B, 1),
    (8, PipelineSchedule.ONE_F_ONE_B, 1),
    (4, PipelineSchedule.INTERLEAVED, 3),
    (3, PipelineSchedule.ZBV, 2),
]


@pytest.mark.parametrize("name", _buildable())
def test_every_stage_built_on_meta_holds_each_layer_once(name: str) -> None:
    # The catalog model's layers, heads and experts at tiny widths: the split depends on the
    # layer count only, and building 126 full-width layers per stage would take minutes.
    catalog = load_model(name)
    tiny = {"d_model": 16, "d_head": 2, "d_ff": 8, "vocab_size": 32}
    if catalog.is_moe:
        tiny["d_ff_expert"] = 8
    spec = catalog.model_copy(update=tiny)
    n_params = sum(p.numel() for p in build_model(spec, seq_len=16).parameters())

    for pp, schedule, v in GRID:
        if pp * v > spec.n_layers:
            continue
        layout = Layout(
            gpus=pp, global_batch=pp, seq_len=16, pp=pp, pp_schedule=schedule, virtual_stages=v
        )
        built: list[int] = []
        params = 0
        embeddings = heads = 0
        seen_stages: list[int] = []
        for rank in range(pp):
            for index, module in pipeline_modules(
                spec,
                layout,
                rank,
                lambda st: build_model(spec, 16, "meta", st.layers, st.embedding, st.head),
            ):
                seen_stages.append(index)
                m: object = module
                built += [int(k) for k in m.layers]  # type: ignore[attr-defined]
                params += sum(p.numel() for p in module.parameters())
                embeddings += m.tok_embeddings is not None  # type: ignore[attr-defined]
                heads += m.output is not None  # type: ignore[attr-defined]
        assert sorted(built) == list(range(spec.n_layers)), (pp, schedule, v)
        assert sorted(seen_stages) == list(range(stage_count(layout)))
        assert embeddings == heads == 1
        assert params == n_params, (pp, schedule, v)
