"""Each rule of data/run_reading_rules.yaml: its example reads to it (order matters: specific
before general), its sizes are valid model shapes that agree with the model catalog, and every
entry carries a source."""

from __future__ import annotations

import pytest

from scalelab.config.catalog import load_gpu, load_model
from scalelab.config.model import ModelSpec
from scalelab.runs.knowledge import ReadingRules, reading_rules

RULES: ReadingRules = reading_rules()


@pytest.mark.parametrize("family", RULES.model_families, ids=lambda f: f.family)
def test_each_family_reads_its_example_and_nothing_earlier_takes_it(family) -> None:
    assert RULES.family(family.example) is family
    assert family.source.strip()
    assert family.moe or family.not_modelled or family.architecture is not None


@pytest.mark.parametrize(
    ("family", "size"),
    [(f, s) for f in RULES.model_families for s in f.sizes],
    ids=lambda x: getattr(x, "family", None) or getattr(x, "size", ""),
)
def test_each_size_is_a_valid_model_named_by_its_size(family, size) -> None:
    assert family.size_named(f"{family.family} {size.size}") == size
    assert family.architecture is not None
    arch = family.architecture.model_dump()
    if size.tied_embeddings is not None:
        arch["tied_embeddings"] = size.tied_embeddings
    d_ff = size.d_ff or (family.shape.d_ff_per_d_model or 0) * size.d_model
    spec = ModelSpec(
        name=f"{family.family} {size.size}",
        n_layers=size.n_layers,
        d_model=size.d_model,
        n_heads=size.n_heads,
        n_kv_heads=size.n_kv_heads or size.n_heads,
        d_ff=d_ff,
        vocab_size=size.vocab_size or family.shape.vocab_size,
        seq_len=2048,
        **arch,
    )
    # the parameter count agrees with the size the name states (embeddings included)
    assert spec.n_params == pytest.approx(size.parameters, rel=0.3)


@pytest.mark.parametrize(
    ("catalog", "name"),
    [
        ("llama2-7b", "Llama 2 7B"),
        ("llama2-13b", "Llama 2 13B"),
        ("llama2-70b", "Llama 2 70B"),
        ("llama3-8b", "Llama 3 8B"),
        ("llama3-70b", "Llama 3 70B"),
        ("llama3-405b", "Llama 3.1 405B"),
    ],
)
def test_family_sizes_agree_with_the_model_catalog(catalog: str, name: str) -> None:
    spec = load_model(catalog)
    family = RULES.family(name)
    assert family is not None
    size = family.size_named(name)
    assert size is not None
    assert (size.n_layers, size.d_model, size.n_heads, size.n_kv_heads, size.d_ff) == (
        spec.n_layers,
        spec.d_model,
        spec.n_heads,
        spec.n_kv_heads,
        spec.d_ff,
    )
    assert (size.vocab_size or family.shape.vocab_size) == spec.vocab_size


@pytest.mark.parametrize("system", RULES.systems, ids=lambda s: s.label)
def test_each_system_or_part_reads_its_example(system) -> None:
    if system.part:
        load_gpu(system.example)  # a catalog GPU
        assert RULES.system("", system.example) is system
    else:
        assert RULES.system(system.example, "") is system
    assert system.source.strip()
    assert (system.nics_per_node is None) == (system.nic_gbps is None)


@pytest.mark.parametrize("stack", RULES.stacks, ids=lambda s: s.stack)
def test_each_framework_reads_its_example(stack) -> None:
    assert RULES.stack(stack.example) is stack
    assert stack.source.strip()


def test_gpus_without_flash_attention() -> None:
    assert not RULES.has_flash(RULES.no_flash_attention.example)
    assert RULES.has_flash("A100-SXM4-80GB")


def test_a_framework_named_in_a_bracket_is_read_whole() -> None:
    assert RULES.framework_named(["LLaMA 13B (Aleph Alpha Megatron-based codebase)"]) == (
        "Aleph Alpha Megatron-based codebase",
        0,
    )
    assert RULES.framework_named(["Llama 2 7B", "github pytorch/torchtitan docs"]) == (
        "torchtitan",
        1,
    )
    assert RULES.framework_named(["a model", "a paper"]) is None
