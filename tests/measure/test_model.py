"""The PyTorch model matches its ModelSpec; initialisation is layout-independent; no torch at import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scalelab.config.catalog import load_model
from scalelab.config.layout import Layout
from scalelab.config.model import ModelSpec
from scalelab.measure.config import resolve_cluster
from scalelab.measure.job import BenchJob
from scalelab.measure.record import workload

torch = pytest.importorskip("torch")

from scalelab.measure.model import build_model, canonical_name, materialize  # noqa: E402


@pytest.mark.parametrize("name", ["llama-tiny", "llama2-7b", "llama2-70b", "llama3-8b"])
def test_parameter_count_equals_the_spec(name: str) -> None:
    spec = load_model(name)
    model = build_model(spec, seq_len=64)  # meta: no memory even for 70B
    assert sum(p.numel() for p in model.parameters()) == spec.n_params


def test_forward_shapes_and_causality() -> None:
    spec = load_model("llama-tiny")
    model = build_model(spec, seq_len=16)
    materialize(model, spec, seed=0, device=torch.device("cpu"))
    tokens = torch.randint(0, spec.vocab_size, (2, 16))
    logits = model(tokens)
    assert logits.shape == (2, 16, spec.vocab_size)
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % spec.vocab_size
    later = model(changed)
    assert torch.equal(logits[:, :10], later[:, :10]), "a token saw the future"
    assert not torch.equal(logits[:, 10:], later[:, 10:])


def test_initialisation_depends_on_names_not_on_wrapping() -> None:
    spec = ModelSpec(
        name="t", n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=64, seq_len=8
    )
    a = build_model(spec, 8)
    b = build_model(spec, 8)
    del b.layers["0"]  # a pipeline stage without layer 0
    materialize(a, spec, seed=3, device=torch.device("cpu"))
    materialize(b, spec, seed=3, device=torch.device("cpu"))
    pa = dict(a.named_parameters())
    for fqn, p in b.named_parameters():
        assert torch.equal(p, pa[fqn]), fqn
    c = build_model(spec, 8)
    materialize(c, spec, seed=4, device=torch.device("cpu"))
    wq = "layers.1.attention.wq.weight"
    assert not torch.equal(dict(c.named_parameters())[wq], pa[wq])
    assert canonical_name("layers.3._checkpoint_wrapped_module._orig_mod.attention.wq.weight") == (
        "layers.3.attention.wq.weight"
    )


def test_flops_and_cluster_come_from_the_config() -> None:
    """The harness counts FLOPs with config.model's functions (the predictor's) and maps a CUDA
    device name to a catalog cluster through the GPU catalog."""
    spec = load_model("llama2-7b")
    for recompute in ("none", "selective", "full"):
        layout = Layout(gpus=8, global_batch=8, seq_len=4096, recompute=recompute)  # type: ignore[arg-type]
        work = workload(BenchJob(model=spec, layout=layout))
        assert work["model_flops_per_token"] == spec.model_flops_per_token(4096)
        assert work["hardware_flops_per_token"] == spec.hardware_flops_per_token(recompute, 4096)
    assert resolve_cluster(None, "NVIDIA H200")[1] == "h200-ib"
    assert resolve_cluster(None, "NVIDIA H100 80GB HBM3")[1] == "h100-ib"
    assert resolve_cluster(None, "Tesla T4") == (None, None)
    assert resolve_cluster("a100-ib", "NVIDIA H200")[1] == "a100-ib"


def test_scalelab_imports_without_torch() -> None:
    """`import scalelab`, the CLI (with bench registered) and results must not import torch."""
    src = Path(__file__).resolve().parents[2] / "src"
    code = (
        "import sys; import scalelab, scalelab.cli, scalelab.results, scalelab.measure, "
        "scalelab.measure.config, scalelab.measure.launch, scalelab.measure.job, "
        "scalelab.measure.record, scalelab.measure.worker, scalelab.cli.bench; assert 'torch' not in sys.modules, 'torch imported'"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONPATH": str(src)}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


# Mixture of experts (measure/moe.py). -------------------------------------------------------
MOE_TINY = str(Path(__file__).resolve().parents[2] / "examples" / "moe-tiny.yaml")


def test_moe_model_matches_its_spec() -> None:
    """moe-tiny: layer 0 dense, layers 1-3 MoE; every parameter of the spec's count exists."""
    spec = load_model(MOE_TINY)
    model = build_model(spec, seq_len=32)
    assert sum(p.numel() for p in model.parameters()) == spec.n_params
    blocks = list(model.layers.values())
    assert [b.moe_enabled for b in blocks] == [spec.is_moe_layer(i) for i in range(4)]
    assert [b.moe_enabled for b in blocks] == [False, True, True, True]
    assert tuple(blocks[1].moe.experts.w1.shape) == (8, 64, 64)


def _naive_moe(moe: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Token by token: the top-k experts' SwiGLU weighted by the renormalised router scores,
    plus the shared experts."""
    from torch.nn import functional

    out = []
    for token in x.reshape(-1, x.shape[-1]):
        scores = moe.router.gate(token).float().softmax(-1)
        top, idx = scores.topk(moe.top_k)
        top = top / top.sum()
        y = moe.shared_experts(token)
        for weight, e in zip(top, idx.tolist(), strict=True):
            w1, w2, w3 = moe.experts.w1[e], moe.experts.w2[e], moe.experts.w3[e]
            y = y + weight * (w2 @ (functional.silu(w1 @ token) * (w3 @ token)))
        out.append(y)
    return torch.stack(out).reshape(x.shape)


def test_moe_layer_routes_like_the_token_by_token_definition() -> None:
    """Sorting the (token, choice) slots by expert, running each expert on its block and adding
    the weighted outputs back gives what each token's top-k experts compute one by one."""
    spec = load_model(MOE_TINY)
    model = build_model(spec, seq_len=32)
    materialize(model, spec, seed=0, device=torch.device("cpu"))
    moe = model.layers["1"].moe
    x = torch.randn(2, 8, spec.d_model)
    with torch.no_grad():
        got, want = moe(x), _naive_moe(moe, x)
    assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()
    # Every token's two choices were counted (the load-imbalance counts).
    assert float(moe.tokens_per_expert.sum()) == 2 * 8 * spec.experts_per_token


def test_sigmoid_router_bias_chooses_but_does_not_weight() -> None:
    """DeepSeek-V3's selection bias changes which experts are chosen, not their weights."""
    from scalelab.measure.moe import Router

    spec = load_model(MOE_TINY).model_copy(update={"router": "sigmoid", "router_bias": True})
    router = Router(spec)
    torch.nn.init.normal_(router.gate.weight, std=0.1)
    assert router.expert_bias is not None
    router.expert_bias.zero_()
    router.expert_bias[5] = 10.0  # expert 5 always chosen
    x = torch.randn(16, spec.d_model)
    top, idx = router(x)
    assert (idx == 5).any(dim=-1).all()
    raw = torch.sigmoid(router.gate(x).float()).gather(-1, idx)
    assert torch.allclose(top, raw / raw.sum(-1, keepdim=True))


def test_expert_slices_materialise_to_the_full_models_values() -> None:
    """An expert-parallel, expert-TP rank's experts are exactly its slice of the one-process
    model's (init is drawn at the full shape, then sliced)."""
    spec = load_model(MOE_TINY)
    full = build_model(spec, seq_len=32)
    materialize(full, spec, seed=3, device=torch.device("cpu"))
    part = build_model(spec, seq_len=32)
    part.layers["2"].moe.shard(ep_rank=1, ep_size=2, tp_rank=1, tp_size=2)
    materialize(part, spec, seed=3, device=torch.device("cpu"))
    mine, whole = part.layers["2"].moe, full.layers["2"].moe
    assert torch.equal(mine.experts.w1, whole.experts.w1[4:, 32:])
    assert torch.equal(mine.experts.w2, whole.experts.w2[4:, :, 32:])
    assert torch.equal(mine.shared_experts.w1.weight, whole.shared_experts.w1.weight[32:])
    assert torch.equal(mine.shared_experts.w2.weight, whole.shared_experts.w2.weight[:, 32:])
    assert torch.equal(mine.router.gate.weight, whole.router.gate.weight)
