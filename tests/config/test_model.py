import pytest

from scalelab.config.catalog import load_model, model_names
from scalelab.errors import InputError

PUBLISHED_PARAMS = {
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3-405b": 405_853_388_800,
    "llama2-1b": 1_100_048_384,  # TinyLlama-1.1B, the documented stand-in
}


@pytest.mark.parametrize(("name", "count"), sorted(PUBLISHED_PARAMS.items()))
def test_parameter_counts_are_exact(name: str, count: int) -> None:
    assert load_model(name).n_params == count


def test_gpt3_is_about_175b() -> None:
    assert 174e9 < load_model("gpt3-175b").n_params < 176e9


def test_model_flops_per_token_by_hand() -> None:
    m = load_model("llama2-7b")
    embedding = 32_000 * 4096
    expected = 6 * (6_738_415_616 - embedding) + 12 * 32 * 4096 * 4096
    assert m.model_flops_per_token() == expected
    assert m.model_flops_per_token(2048) == expected - 12 * 32 * 4096 * 2048


def test_tied_embeddings_keep_the_lm_head_flops() -> None:
    m = load_model("gpt3-175b")
    assert m.model_flops_per_token() > 6 * (m.n_params - m.input_embedding_params)


def test_every_catalog_model_loads() -> None:
    assert {"llama2-7b", "llama3-405b", "gpt3-175b"} <= set(model_names())
    for name in model_names():
        assert load_model(name).source


def test_model_from_yaml(tmp_path) -> None:
    path = tmp_path / "mini.yaml"
    path.write_text(
        "n_layers: 2\nd_model: 64\nn_heads: 4\nn_kv_heads: 2\nd_ff: 128\nvocab_size: 100\n"
        "ffn: swiglu\ntied_embeddings: true\nseq_len: 16\n"
    )
    m = load_model(str(path))
    assert m.name == "mini"
    attention = 64 * 64 * 2 + 2 * 64 * 32
    mlp = 3 * 64 * 128
    assert m.n_params == 2 * (attention + mlp + 2 * 64) + 100 * 64 + 64


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("n_layers: 2\n", "d_model"),
        (
            "n_layers: 2\nd_model: 65\nn_heads: 4\nn_kv_heads: 4\nd_ff: 8\nvocab_size: 8\nseq_len: 8\n",
            "divisible",
        ),
        ("- a list\n", "mapping"),
    ],
)
def test_bad_model_yaml_names_the_problem(tmp_path, text: str, needle: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        load_model(str(path))
    assert err.value.field == "model"
    assert needle in str(err.value)


def test_unknown_model_lists_the_catalog() -> None:
    with pytest.raises(InputError, match="llama2-7b"):
        load_model("llama-9000")
