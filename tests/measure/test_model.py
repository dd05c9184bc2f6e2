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
