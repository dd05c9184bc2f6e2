"""Mixture-of-experts models: total and active parameter counts pinned against the published
figures, FLOPs per token from active parameters, and the harness's refusal until it measures expert
parallelism (issue 16)."""

from __future__ import annotations

import pytest

from scalelab.cli import main
from scalelab.config.catalog import load_cluster, load_model, model_names
from scalelab.config.layout import Layout
from scalelab.config.model import ModelSpec
from scalelab.errors import InputError

# name: (exact total, exact active, published total, published active, source of the figures).
# The exact counts are computed from config.json shapes and checked by hand below; the published
# figures are rounded (46.7 B, 12.9 B, ...), hence a relative tolerance, not equality.
COUNTS = {
    "mixtral-8x7b": (46_702_792_704, 12_879_925_248, 46.7e9, 12.9e9),  # model card
    "mixtral-8x22b": (140_630_071_296, 39_161_468_928, 141e9, 39e9),  # mistral.ai news
    "deepseek-v3": (671_026_419_200, 37_552_297_472, 671e9, 37e9),  # arXiv 2412.19437
    "qwen3-30b-a3b": (30_532_122_624, 3_353_032_704, 30.5e9, 3.3e9),  # model card
    "qwen3-235b-a22b": (235_093_634_560, 22_190_763_520, 235e9, 22e9),  # model card
    "llama4-scout": (107_769_861_120, 17_172_894_720, 109e9, 17e9),  # model card
    "llama4-maverick": (400_711_848_960, 17_184_691_200, 400e9, 17e9),  # model card
}
# 2 %: published figures are rounded to 2-3 significant digits (Qwen3's "3.3B" is itself up to
# 1.5 % off any count it rounds, "22B" up to 2.3 % but 22.19 B sits well inside), and Llama 4's
# totals include the vision encoder (about 1.2 B for Scout's 109 B), which the text model here
# leaves out: 107.77 B is 1.1 % under 109 B.
TOLERANCE = 0.02


@pytest.mark.parametrize("name", list(COUNTS))
def test_total_and_active_match_published(name: str) -> None:
    m = load_model(name)
    total, active, pub_total, pub_active = COUNTS[name]
    assert m.source
    assert m.is_moe
    assert m.n_params == total
    assert m.active_params == active
    assert abs(m.n_params / pub_total - 1) < TOLERANCE
    assert abs(m.active_params / pub_active - 1) < TOLERANCE


def test_deepseek_v3_active_matches_the_official_36_6b_without_embedding() -> None:
    # deepseek-ai/DeepSeek-V3 README_WEIGHTS.md: main model 671B total, 36.6B activated
    # "including 0.9B for the output head" (the input embedding, a lookup, is not counted).
    m = load_model("deepseek-v3")
    assert abs((m.active_params - m.input_embedding_params) / 36.6e9 - 1) < 0.002
    assert m.n_moe_layers == 58


def test_mixtral_8x7b_by_hand() -> None:
    m = load_model("mixtral-8x7b")
    d, kv, ff, v = 4096, 1024, 14336, 32000
    attention = 2 * d * d + 2 * d * kv
    expert = 3 * d * ff
    layer = attention + 8 * expert + 8 * d + 2 * d
    assert m.n_params == 32 * layer + 2 * v * d + d
    assert m.active_params == 32 * (attention + 2 * expert + 8 * d + 2 * d) + 2 * v * d + d


def test_deepseek_v3_mla_by_hand() -> None:
    m = load_model("deepseek-v3")
    d, h = 7168, 128
    mla = (
        d * 1536
        + 1536
        + 1536 * h * (128 + 64)  # q_a, q_a_layernorm, q_b
        + d * (512 + 64)
        + 512  # kv_a_proj_with_mqa, kv_a_layernorm
        + 512 * h * (128 + 128)  # kv_b
        + h * 128 * d  # o_proj
    )
    assert m.attention_params == mla == 187_107_328
    assert m.router_params == 256 * d + 256


def test_llama4_maverick_interleaves_moe_layers() -> None:
    m = load_model("llama4-maverick")
    assert [i for i in range(m.n_layers) if m.is_moe_layer(i)] == list(range(1, 48, 2))
    assert load_model("llama4-scout").n_moe_layers == 48


def test_flops_per_token_from_active_parameters() -> None:
    m = load_model("mixtral-8x7b")
    s = m.seq_len
    expected = 6.0 * (m.active_params - m.input_embedding_params) + 12.0 * 32 * 4096 * s
    assert m.model_flops_per_token() == expected
    # Qwen3: heads span n_heads * d_head = 4096, twice d_model; MLA: 128 heads * (192 + 128).
    q = load_model("qwen3-30b-a3b")
    assert q.attention_core_width == 2 * 32 * 128
    assert q.model_flops_per_token(1000) == 6.0 * q.dense_params + 6.0 * 48 * 8192 * 1000
    ds = load_model("deepseek-v3")
    assert ds.model_flops_per_token(4096) == 6.0 * ds.dense_params + 6.0 * 61 * 128 * 320 * 4096
    assert ds.hardware_flops_per_token("full") == pytest.approx(
        ds.model_flops_per_token() + 2.0 * ds.dense_params + 2.0 * 61 * 128 * 320 * ds.seq_len
    )


def test_dense_models_unchanged() -> None:
    for name in model_names():
        m = load_model(name)
        if not m.is_moe:
            assert m.active_params == m.n_params
            assert m.attention_core_width == 2 * m.d_model


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"n_experts": 8, "experts_per_token": 9}, "experts_per_token"),
        ({"n_experts": 8}, "experts_per_token"),
        ({"experts_per_token": 2}, "n_experts > 0"),
        ({"n_experts": 8, "experts_per_token": 2, "first_dense_layers": 2}, "no layer is MoE"),
        ({"attention": "mla"}, "kv_lora_rank"),
    ],
)
def test_bad_moe_fields_are_refused(extra: dict[str, object], needle: str) -> None:
    base = dict(
        n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, vocab_size=100, seq_len=16
    )
    with pytest.raises(ValueError, match=needle):
        ModelSpec(**base, **extra)  # type: ignore[arg-type]


def test_library_predict_accepts_moe() -> None:
    from scalelab.perf.predict import predict_layout

    row = predict_layout(
        load_model("mixtral-8x7b"),
        load_cluster("h100-ib"),
        Layout(gpus=64, global_batch=64, seq_len=4096, ep=8),
    )
    assert row["moe_all_to_all_s"] > 0 and 0 < row["mfu"] < 1


def test_harness_builds_moe_but_not_mla_or_qk_norm() -> None:
    """bench trains MoE models (measure/moe.py, issue 16 item 4); multi-head latent attention
    and QK norm are refused with one line naming the model."""
    from scalelab.measure.config import check_model

    check_model(load_model("llama4-scout"))
    check_model(load_model("mixtral-8x7b"))
    for name, needle in (("deepseek-v3", "attention mla"), ("qwen3-30b-a3b", "qk_norm")):
        with pytest.raises(InputError, match=needle) as info:
            check_model(load_model(name))
        assert info.value.field == "model" and "\n" not in str(info.value)


def test_models_listing_shows_total_and_active(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    try:
        main(["models", "--json"])
    except SystemExit as exc:
        assert exc.code in (0, None)
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["deepseek-v3"]["active_params"] == COUNTS["deepseek-v3"][1]
    assert rows["llama2-7b"]["active_params"] == rows["llama2-7b"]["n_params"]


def test_dense_identity_has_only_the_original_fields() -> None:
    m = load_model("llama2-7b")
    first = "name n_layers d_model n_heads n_kv_heads d_ff vocab_size ffn tied_embeddings seq_len"
    assert set(m.identity()) == set(first.split()) | {"norm", "bias", "position"}
    assert {"n_experts", "attention", "d_ff_expert"} <= set(load_model("deepseek-v3").identity())


# Expert-parallel layout rules (issue 16 item 2) ---------------------------------------------------


def _moe_violations(model: str, **kwargs: int) -> list[str]:
    from scalelab.config.layout import rule_violations

    m = load_model(model)
    layout = Layout(gpus=kwargs.pop("gpus"), global_batch=64, seq_len=4096, **kwargs)
    return [str(e) for e in rule_violations(layout, m, load_cluster("h100-ib"))]


def test_ep_borrows_data_and_context_parallel_ranks() -> None:
    # qwen3-30b-a3b: 128 experts. 64 GPUs, tp 2 -> dp 32: ep 32 over the dp ranks is fine,
    # ep 64 needs expert_tp 1 (EP then also spans the TP ranks), and ep 128 is too many.
    assert _moe_violations("qwen3-30b-a3b", gpus=64, tp=2, ep=32, expert_tp=2) == []
    assert _moe_violations("qwen3-30b-a3b", gpus=64, tp=2, ep=64) == []
    bad = _moe_violations("qwen3-30b-a3b", gpus=64, tp=2, ep=64, expert_tp=2)
    assert len(bad) == 1 and bad[0].startswith("ep: ep (64) must divide dp (32)")
    assert any("ep (128)" in v for v in _moe_violations("qwen3-30b-a3b", gpus=64, tp=2, ep=128))


def test_ep_must_divide_the_experts_and_expert_tp_is_1_or_tp() -> None:
    # mixtral-8x7b: 8 experts.
    assert _moe_violations("mixtral-8x7b", gpus=16, ep=16) == [
        "ep: ep (16) must divide n_experts (8)"
    ]
    assert _moe_violations("mixtral-8x7b", gpus=16, tp=4, expert_tp=2) == [
        "expert_tp: expert_tp (2) must be 1 or tp (4)"
    ]


def test_ep_on_a_dense_model_is_refused() -> None:
    bad = _moe_violations("llama2-7b", gpus=8, ep=2)
    assert bad[0] == "ep: ep (2) and expert_tp (1) must be 1 for llama2-7b, which has no experts"


def test_expert_dp_counts_the_ranks_sharing_an_expert() -> None:
    from scalelab.config.layout import LayoutTable

    layouts = [
        Layout(gpus=64, global_batch=64, seq_len=4096, tp=2, ep=8, expert_tp=2),
        Layout(gpus=64, global_batch=64, seq_len=4096, tp=2, ep=8),
        Layout(gpus=64, global_batch=64, seq_len=4096, tp=2, cp=2, ep=16, expert_tp=2),
    ]
    # dp 32 / ep 8; dp 32 x tp 2 / ep 8; dp 16 x cp 2 / ep 16.
    assert LayoutTable.from_layouts(layouts).expert_dp.tolist() == [4, 8, 2]
    assert [x.label for x in layouts] == [
        "fsdp tp2sp ep8 etp2",
        "fsdp tp2sp ep8",
        "fsdp tp2sp cp2 ep16 etp2",
    ]
