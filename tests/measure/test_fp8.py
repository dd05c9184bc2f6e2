"""FP8 training through torchao's float8 linears (torchtitan's Float8Converter), on CPU.

PyTorch 2.13 runs `torch._scaled_mm` on CPU, so torchao's float8 path really runs here: the
block linears are converted and the output head is not, the converted model trains (FSDP2 with
and without fp8 all-gather, TP with Float8Colwise/RowwiseParallel, both recipes) with losses within
fp8 rounding of the fp32 single-process reference; on 2 ranks FSDP matches one process running
the same fp8 recipe on the same micro-batches within parity's 1e-5 over five steps, TP within what
fp8 rounding does to the reference (TP changes what is quantised together), and every refusal is
one line naming its field.
The GPU-only part (compute capability 8.9+, the fp8 GEMMs' speed) is in benchmarks/gpu_check.sh
and behind the `gpu` marker.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from scalelab.cli.common import build_layout
from scalelab.errors import InputError
from scalelab.measure.config import BenchOptions, check_layout, check_layout_options
from tests.measure.conftest import FP8_WORLD2, PARITY_STEPS, fp8_reference_name

torchao = pytest.importorskip("torchao", reason="the fp8 extra (torchao) is not installed")
torch = pytest.importorskip("torch")

# fp8 (e4m3) rounding of the block GEMMs' inputs against fp32: observed 4e-4 on step 1, growing to
# 6.2e-3 by step 5 as the updates differ (2026-12-03).
FP8_ATOL = 1e-2
BLOCK_LINEARS = 4 * 7  # llama-tiny: 4 blocks x (wq, wk, wv, wo, w1, w2, w3)


def _tiny() -> Any:
    from scalelab.config.catalog import load_model

    return load_model("llama-tiny")


def _layout(gpus: int = 2, **kw: Any) -> Any:
    base: dict[str, Any] = {"seq_len": 32, "global_batch": 8, "precision": "fp8"}
    return build_layout(gpus=gpus, **(base | kw))


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_block_linears_converted_and_head_skipped(recipe: str) -> None:
    from torch import nn
    from torchao.float8.float8_linear import Float8Linear

    from scalelab.measure import fp8
    from scalelab.measure.model import build_model, materialize

    model = build_model(_tiny(), 32, "meta")  # converted on meta, as the Trainer does
    names = fp8.convert(model, recipe)
    assert len(names) == BLOCK_LINEARS
    assert sorted(names) == sorted(fp8.converted(model))
    assert all(n.startswith("layers.") for n in names)
    assert type(model.output) is nn.Linear and not isinstance(model.output, Float8Linear)
    assert isinstance(model.layers["0"].attention.wq, Float8Linear)
    assert isinstance(model.layers["3"].feed_forward.w2, Float8Linear)
    materialize(model, _tiny(), 0, torch.device("cpu"))
    tokens = torch.randint(0, 256, (2, 32))
    logits = model(tokens)
    logits.float().mean().backward()
    assert model.layers["0"].attention.wq.weight.grad is not None


def test_linears_not_multiple_of_16_stay_in_high_precision() -> None:
    from torch import nn

    from scalelab.measure import fp8

    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 24), nn.Linear(24, 64))
    assert fp8.convert(model, "tensorwise") == ["0"]
    assert [type(m).__name__ for m in model] == ["Float8Linear", "Linear", "Linear"]


def test_tp_styles_follow_the_recipe() -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel

    from scalelab.measure import fp8

    assert fp8.tp_styles("tensorwise")[0].__name__ == "Float8ColwiseParallel"
    assert fp8.tp_styles("rowwise")[0] is ColwiseParallel


def test_hardware_without_fp8_is_refused() -> None:
    from scalelab.measure import fp8

    with pytest.raises(InputError, match=r"compute capability 8\.9 .*A100.* is 8\.0"):
        fp8.check_device("cuda", (8, 0), "NVIDIA A100-SXM4-80GB")
    for ok in ((8, 9), (9, 0), (10, 0)):
        fp8.check_device("cuda", ok, "H100")
    fp8.check_device("cpu", None)  # CPU: torch._scaled_mm runs (emulated), so not refused


def test_missing_torchao_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a)
    )
    with pytest.raises(InputError, match=r"scalelab\[fp8\]") as info:
        check_layout(_layout(), _tiny())
    assert info.value.field == "precision"
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("layout", "options", "field"),
    [
        ({"precision": "bf16"}, {"fp8_recipe": "rowwise"}, "fp8-recipe"),
        ({"precision": "bf16"}, {"fp8_all_gather": True}, "fp8-all-gather"),
        ({}, {"fp8_all_gather": True, "fp8_recipe": "rowwise"}, "fp8-all-gather"),
        ({"sharding": "ddp"}, {"fp8_all_gather": True}, "fp8-all-gather"),
        ({"gpus": 1}, {"fp8_all_gather": True}, "fp8-all-gather"),
    ],
)
def test_fp8_options_refused_where_they_cannot_apply(
    layout: dict[str, Any], options: dict[str, Any], field: str
) -> None:
    with pytest.raises(InputError) as info:
        check_layout_options(BenchOptions(**options), _layout(**layout))
    assert info.value.field == field


def test_moe_models_are_refused() -> None:
    from scalelab.config.catalog import load_model

    moe = load_model("examples/moe-tiny.yaml")
    with pytest.raises(InputError, match="mixture-of-experts") as info:
        check_layout(_layout(), moe)
    assert info.value.field == "precision"


def test_gloo_cannot_carry_fp8_activations() -> None:
    from scalelab.measure import fp8

    with pytest.raises(InputError, match="gloo") as info:
        fp8.check_gloo("tensorwise", 2, True)
    assert info.value.field == "sp"
    fp8.check_gloo("tensorwise", 2, False)
    fp8.check_gloo("rowwise", 2, True)


@pytest.mark.distributed
@pytest.mark.parametrize("case", [c["name"] for c in FP8_WORLD2])
def test_fp8_trains_like_the_reference_on_two_ranks(
    case: str, world2: dict[str, Any], reference: dict[str, Any]
) -> None:
    """Each 2-rank fp8 case (conftest's FP8_WORLD2, run in the 2-rank parity launch: both recipes
    on FSDP, with the fp8 all-gather for tensorwise, and on TP) converts every block linear and
    trains within fp8 rounding of the fp32 single-process run over the five steps (FP8_ATOL)."""
    got = world2[case]
    assert got["fp8_modules"] == BLOCK_LINEARS
    assert len(got["loss"]) == len(reference["loss"]) == PARITY_STEPS
    diffs = [abs(a - b) for a, b in zip(got["loss"], reference["loss"], strict=True)]
    assert max(diffs) < FP8_ATOL, diffs
    assert diffs[0] > 1e-5  # really fp8: the forward alone is farther than parity's 1e-5 from fp32


def _fp8_pair(
    case: str, world2: dict[str, Any], references: dict[str, Any]
) -> tuple[list[float], list[float]]:
    """A 2-rank fp8 case's losses and those of one process running its recipe on its micro-batches."""
    wanted = next(c for c in FP8_WORLD2 if c["name"] == case)
    got, ref = world2[case], references[fp8_reference_name(wanted)]
    assert got["fp8_modules"] == ref["fp8_modules"] == BLOCK_LINEARS
    assert len(got["loss"]) == len(ref["loss"]) == PARITY_STEPS
    return got["loss"], ref["loss"]


@pytest.mark.distributed
@pytest.mark.parametrize("case", ["fp8_fsdp_tensorwise_gather", "fp8_fsdp_rowwise"])
def test_fp8_fsdp_matches_single_process_fp8(
    case: str, world2: dict[str, Any], references: dict[str, Any]
) -> None:
    """2-rank FSDP in fp8 (tensorwise with the fp8 all-gather, rowwise) matches one process running
    the same recipe on the same micro-batches within parity's 1e-5 over five steps (issue 13;
    observed 5e-7, 2026-12-03). Same micro-batches matter: the weight-gradient GEMM's scales are
    taken over a micro-batch's tokens (rowwise: per weight row over the tokens), so against one
    micro-batch of 8 the rowwise losses of steps 2-5 differ by up to 4e-4. What remains is fp32
    reduction order (a rank sums its micro-batches, then the ranks are summed), which fp8 could
    amplify: a weight one ulp away can round to the next fp8 value. In these runs it did not (at
    micro-batch 1, tensorwise did: 5e-4 from step 3; rowwise's scales are powers of two)."""
    losses, expected = _fp8_pair(case, world2, references)
    diffs = [abs(a - b) for a, b in zip(losses, expected, strict=True)]
    assert max(diffs) <= 1e-5, (losses, expected)
    # The 1e-5 says something: the fp8 losses are farther than that from the fp32 ones.
    assert abs(expected[0] - references["reference"]["loss"][0]) > 1e-5


@pytest.mark.distributed
@pytest.mark.parametrize("case", ["fp8_tp_rowwise_sp", "fp8_tp_tensorwise"])
def test_fp8_tp_matches_single_process_fp8_within_fp8_rounding(
    case: str, world2: dict[str, Any], references: dict[str, Any]
) -> None:
    """TP in fp8 against one process running the same recipe on the same micro-batch of 8. Not
    within 1e-5, and no single process can be: TP changes what is quantised together. Rowwise
    scales each weight row over its input features, which RowwiseParallel (wo, w2) splits between
    the ranks, so the forward alone differs (step 1: 4e-5, 2026-12-03); tensorwise's scales are
    whole-tensor (step 1-3: 5e-7), but are not powers of two, so the TP partial sums' fp32
    reduction order moves values across fp8 rounding boundaries (5e-5 from step 4). The
    tolerance is what fp8 rounding itself does to this training: the reference's largest
    distance from fp32 over the same five steps (4.9e-3 rowwise, 6.2e-3 tensorwise; observed TP
    differences at most 1.8e-3 and 5e-5); the forward alone within 1e-4 (a tenth of that)."""
    losses, expected = _fp8_pair(case, world2, references)
    fp32 = references["reference"]["loss"]
    rounding = max(abs(a - b) for a, b in zip(expected, fp32, strict=True))
    diffs = [abs(a - b) for a, b in zip(losses, expected, strict=True)]
    assert diffs[0] <= 1e-4, (losses, expected)
    assert max(diffs) <= rounding, (losses, expected, rounding)


@pytest.mark.gpu
def test_gpu_fp8_linear_runs_on_fp8_hardware() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from scalelab.measure import fp8
    from scalelab.measure.model import build_model, materialize

    if torch.cuda.get_device_capability(0) < fp8.MIN_CAPABILITY:
        with pytest.raises(InputError):
            fp8.check_local_device()
        return
    model = build_model(_tiny(), 32, "meta")
    fp8.convert(model, "tensorwise")
    materialize(model, _tiny(), 0, torch.device("cuda"))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(torch.randint(0, 256, (2, 32), device="cuda"))
    logits.float().mean().backward()
    assert torch.isfinite(model.layers["0"].feed_forward.w1.weight.grad).all()


def test_predictor_prices_what_the_harness_converts() -> None:
    """The predictor's fp8 speeds up the block GEMMs only; the attention core and the LM head
    stay at bf16, as the harness leaves them (`fp8.SKIPPED_FQNS`, SDPA is not a linear)."""
    import numpy as np
    from torch import nn

    from scalelab.config.catalog import load_cluster, load_model
    from scalelab.config.options import AttentionKernel
    from scalelab.measure import fp8
    from scalelab.measure.model import build_model
    from scalelab.perf.compute import layer_compute

    spec, cluster = load_model("llama2-7b"), load_cluster("h100-ib")
    one = np.ones(1)

    def cost(is_fp8: bool) -> Any:
        return layer_compute(
            spec, cluster, micro_batch=one, seq_len=4096 * one, tp=one.astype(int),
            cp=one.astype(int), sequence_parallel=np.zeros(1, bool),
            fp8=np.array([is_fp8]), attention=np.array([AttentionKernel.FLASH.code]),
        )  # fmt: skip

    bf16, f8 = cost(False), cost(True)
    assert f8.gemm_forward_s[0] < 0.75 * bf16.gemm_forward_s[0]
    assert f8.attention_forward_s[0] == bf16.attention_forward_s[0]
    assert f8.head_forward_s[0] == bf16.head_forward_s[0]
    model = build_model(_tiny(), 32, "meta")
    fp8.convert(model, "tensorwise")
    plain = [n for n, m in model.named_modules() if type(m) is nn.Linear]
    assert plain == ["output"]  # every other linear (all in the blocks) runs in fp8
