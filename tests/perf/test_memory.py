"""Memory per GPU (perf/memory.py): pipeline micro-batches in flight, the layer recomputed in
backward, and the loss's bytes per logit element, each against a value computed by hand."""

import numpy as np
import pytest

from scalelab.config.catalog import load_cluster, load_model, load_stack
from scalelab.config.layout import Layout, LayoutTable
from scalelab.config.options import PipelineSchedule, Recompute, Sharding
from scalelab.perf.memory import (
    LOSS_BYTES_PER_LOGIT,
    activation_bytes_per_layer,
    alternate_matmul_bytes_per_layer,
    memory_per_gpu,
    pipeline_microbatches_in_flight,
)
from scalelab.perf.predict import predict

H100 = load_cluster("h100-ib")
L3_8B = load_model("llama3-8b")
ONE = np.ones(1, dtype=np.int64)
NO = np.zeros(1, dtype=bool)


def _in_flight(pp: int, m: int, v: int, schedule: PipelineSchedule) -> float:
    a = np.array([pp]), np.array([m]), np.array([v]), np.array([schedule.code])
    return float(pipeline_microbatches_in_flight(*a)[0])


def test_first_stage_holds_pp_microbatches_with_1f1b_and_zbv() -> None:
    """1F1B: pp - 1 warm-up forwards and one more before the first backward (Megatron's
    num_warmup_microbatches = pp - rank - 1); ZB-V the same peak as 1F1B; interleaved
    pp (1 + (pp-1)/(pp v)) (Korthikanti et al. 2022); GPipe every micro-batch."""
    assert _in_flight(4, 16, 1, PipelineSchedule.ONE_F_ONE_B) == 4.0
    assert _in_flight(4, 16, 2, PipelineSchedule.ZBV) == 4.0
    assert _in_flight(4, 16, 2, PipelineSchedule.INTERLEAVED) == pytest.approx(4 * (1 + 3 / 8))
    assert _in_flight(4, 16, 1, PipelineSchedule.GPIPE) == 16.0
    assert _in_flight(4, 2, 1, PipelineSchedule.ONE_F_ONE_B) == 2.0  # fewer micro-batches
    assert _in_flight(1, 16, 1, PipelineSchedule.ONE_F_ONE_B) == 1.0  # no pipeline


def _memory(recompute: Recompute, pp: int, **extra: object) -> float:
    n = np.array
    m = memory_per_gpu(
        L3_8B,
        H100,
        tp=ONE,
        pp=n([pp]),
        cp=ONE,
        dp=n([8]),
        dp_shard=n([8]),
        sharding=n([Sharding.FSDP.code]),
        micro_batch=n([2]),
        seq_len=n([4096]),
        n_microbatches=n([16]),
        virtual_stages=ONE,
        schedule=n([PipelineSchedule.ONE_F_ONE_B.code]),
        recompute=n([recompute.code]),
        sequence_parallel=NO,
        math_attention=NO,
        **extra,  # type: ignore[arg-type]
    )
    return float(m.activations_bytes[0])


def test_1f1b_stage_activations_are_its_layers_for_pp_microbatches() -> None:
    """llama3-8b, pp 4, 1F1B, 16 micro-batches of 2 x 4096 tokens, no recompute: the first stage
    holds its 8 layers for 4 micro-batches (32 layers' worth), no logits (last stage's)."""
    per_layer = activation_bytes_per_layer(L3_8B, np.array([8192.0]), ONE, NO, NO, np.zeros(1))[0]
    assert _memory(Recompute.NONE, pp=4) == pytest.approx(per_layer * 8 * 4)


def test_full_recompute_holds_the_recomputed_layer_once() -> None:
    """Full recompute: each layer's input for every micro-batch in flight, plus one layer's
    other activations while it is recomputed (not once per micro-batch in flight)."""
    tokens = np.array([8192.0])
    per_layer = activation_bytes_per_layer(L3_8B, tokens, ONE, NO, NO, np.zeros(1))[0]
    layer_input = 2.0 * 8192 * L3_8B.d_model
    expected = layer_input * 8 * 4 + (per_layer - layer_input)
    assert _memory(Recompute.FULL, pp=4) == pytest.approx(expected)


def test_per_op_selective_recompute_holds_one_recomputed_layer() -> None:
    """torchtitan's per-op SAC keeps its saved ops for every layer and, while one layer is in
    backward, that layer's recomputed rest; plus the logits under the stack's loss (pp 1)."""
    tokens = np.array([8192.0])
    per_layer = activation_bytes_per_layer(L3_8B, tokens, ONE, NO, NO, np.zeros(1))[0]
    kept = alternate_matmul_bytes_per_layer(L3_8B, tokens, ONE, NO)[0]
    logits = 12.0 * 8192 * L3_8B.vocab_size + 2.0 * 8192 * L3_8B.d_model  # + the head's input
    expected = kept * L3_8B.n_layers + (per_layer - kept) + logits
    got = _memory(Recompute.SELECTIVE, pp=1, selective_alternate=True)
    assert got == pytest.approx(expected)


@pytest.mark.parametrize(
    ("stack", "per_logit"),
    [("torchtitan", 12.0), ("megatron-core-te", 6.0), ("composer", 4.0), ("generic", 12.0)],
)
def test_logits_hold_the_bytes_of_the_stacks_loss(stack: str, per_logit: float) -> None:
    """Without a pipeline, the activations are the layers' plus bytes-per-logit x tokens x vocab
    (12 for an eager fp32 cross-entropy, 6 for Megatron's in-place vocab-parallel one, 4 for a
    fused kernel on the bf16 logits) plus the LM head's bf16 input."""
    spec = load_stack(stack)
    assert LOSS_BYTES_PER_LOGIT[spec.cross_entropy] == per_logit
    layout = Layout(gpus=8, global_batch=8, seq_len=4096, micro_batch=1, sharding="fsdp")
    p = predict(L3_8B, H100, LayoutTable.from_layouts([layout]), spec)
    per_layer = activation_bytes_per_layer(L3_8B, np.array([4096.0]), ONE, NO, NO, np.zeros(1))[0]
    logits = float(p["memory_activations_bytes"][0]) - per_layer * L3_8B.n_layers
    head_input = 2.0 * 4096 * L3_8B.d_model
    assert logits == pytest.approx(per_logit * 4096 * L3_8B.vocab_size + head_input)


def test_dtensor_tp_keeps_the_gathered_matmul_inputs_megatron_the_local_shard() -> None:
    """With TP 8 and sequence parallelism, the two norm outputs feeding the column-parallel
    matmuls are kept whole (2 x tokens x d_model x 2 bytes) by DTensor TP and as a 1/8 shard by
    Megatron, which gathers them again in backward; the norm inputs are a shard either way."""
    tokens, tp8, sp = np.array([8192.0]), np.array([8]), np.ones(1, dtype=bool)
    local = activation_bytes_per_layer(L3_8B, tokens, tp8, sp, NO, np.zeros(1))[0]
    whole = activation_bytes_per_layer(L3_8B, tokens, tp8, sp, NO, np.zeros(1), True)[0]
    assert whole - local == pytest.approx(2.0 * 8192 * 2 * L3_8B.d_model * (1 - 1 / 8))
    assert load_stack("torchtitan").tp_saves_gathered_inputs
    assert not load_stack("megatron-core-te").tp_saves_gathered_inputs
    # Without sequence parallelism every rank holds the whole tensors in both frameworks.
    no_sp = [
        activation_bytes_per_layer(L3_8B, tokens, tp8, NO, NO, np.zeros(1), g)[0] for g in (0, 1)
    ]
    assert no_sp[0] == no_sp[1]
