"""`--recompute selective` means one thing in both engines (issue 10, item 2).

Selective recompute recomputes the attention core (scaled_dot_product_attention: the scores and
the attention over values, Korthikanti et al. 2022) and keeps every other activation. The
harness's policy must run exactly that again in backward, and the FLOPs it runs again must be
the ones HFU counts, in the harness's record and in the predictor.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest

from scalelab.config.catalog import load_cluster, load_model
from scalelab.config.layout import Layout
from scalelab.measure.config import BenchOptions
from scalelab.measure.job import BenchJob, RunIdentity
from scalelab.measure.record import RepeatResult, bench_record
from scalelab.perf.predict import predict_layout

torch = pytest.importorskip("torch")

from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from scalelab.measure.model import build_model, materialize  # noqa: E402
from scalelab.measure.parallel import apply_ac  # noqa: E402

SPEC = load_model("llama-tiny")
BATCH, SEQ = 2, 32


class _OpCounter(TorchDispatchMode):
    """Counts aten calls by name (overload packet)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _model(mode: str) -> Any:
    model = build_model(SPEC, SEQ, "meta")
    apply_ac(model, mode)
    materialize(model, SPEC, 0, torch.device("cpu"))
    return model


def _tokens() -> Any:
    return torch.randint(
        0, SPEC.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(0)
    )


def _backward_calls(mode: str) -> collections.Counter[str]:
    model = _model(mode)
    loss = model(_tokens()).float().square().mean()
    with _OpCounter() as counter:
        loss.backward()
    return counter.calls


def _sdpa_forward(calls: collections.Counter[str]) -> int:
    return sum(
        n for name, n in calls.items() if "scaled_dot_product" in name and "backward" not in name
    )


def test_selective_recomputes_exactly_the_attention_core() -> None:
    none, selective, full = (_backward_calls(m) for m in ("none", "selective", "full"))
    # Backward runs each layer's attention core again, and nothing else.
    assert _sdpa_forward(none) == 0
    assert _sdpa_forward(selective) == SPEC.n_layers
    assert selective["mm"] == none["mm"], "a matmul outside the attention core was recomputed"
    # Full recompute runs each block's matmuls again too.
    assert _sdpa_forward(full) == SPEC.n_layers and full["mm"] > none["mm"]


def test_selective_recompute_trains_like_no_recompute() -> None:
    grads = []
    for mode in ("none", "selective"):
        model = _model(mode)
        model(_tokens()).float().square().mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        assert torch.allclose(grads[1][name], g, rtol=0, atol=1e-6), name


def test_executed_recompute_flops_are_the_ones_hfu_counts() -> None:
    """FLOPs counted while training (math SDPA, so that attention is counted) with selective
    recompute minus without: exactly what the hardware-FLOP function adds, per token."""
    totals = {}
    for mode in ("none", "selective"):
        model = _model(mode)
        with sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as counter:
            model(_tokens()).float().square().mean().backward()
        totals[mode] = counter.get_total_flops()
    tokens = BATCH * SEQ
    added = SPEC.hardware_flops_per_token("selective", SEQ) - SPEC.model_flops_per_token(SEQ)
    assert added == 4 * SPEC.n_layers * SPEC.d_model * SEQ
    assert totals["selective"] - totals["none"] == added * tokens


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_measured_and_predicted_hfu_use_the_same_flop_count(recompute: str) -> None:
    """A run's measured HFU/MFU (the record) equals the predicted HFU/MFU for its layout."""
    spec = load_model("llama2-7b")
    layout = Layout(gpus=8, global_batch=8, seq_len=4096, recompute=recompute)  # type: ignore[arg-type]
    job = BenchJob(model=spec, layout=layout, options=BenchOptions(steps=2, repeats=1))
    repeat = RepeatResult(
        warmup_step_time_s=[],
        warmup_loss=[],
        step_time_s=[1.0, 1.0],
        loss=[4.0, 4.0],
        grad_norm=[1.0, 1.0],
        window_s=2.0,
        peak_memory_allocated_bytes=None,
        peak_memory_reserved_bytes=None,
        peak_rss_bytes=1,
    )
    identity = RunIdentity(run_id="r", created_utc="2026-12-03T00:00:00Z", name="r")
    record = bench_record(job, identity, [repeat], 8, peak_flops=989e12)
    measured = record.summary["hfu"]["mean"] / record.summary["mfu"]["mean"]
    predicted = predict_layout(spec, load_cluster("h100-ib"), layout)
    assert measured == pytest.approx(predicted["hfu"] / predicted["mfu"], rel=1e-12)
    assert record.workload["hardware_flops_per_token"] == pytest.approx(
        predicted["hfu"] / predicted["mfu"] * spec.model_flops_per_token(4096), rel=1e-12
    )
    if recompute == "selective":
        assert measured > 1.0
