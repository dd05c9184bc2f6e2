"""Software stacks (issue 11 item 6): `generic` changes nothing; each other stack's behaviour moves
the prediction the way its mechanism says, and what a stack does not offer is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scalelab.config.catalog import load_cluster, load_model, load_stack, stack_names
from scalelab.config.layout import Layout, LayoutTable
from scalelab.config.options import AttentionKernel
from scalelab.errors import InputError
from scalelab.perf.predict import predict, predict_layout
from scalelab.runs.rules import read_stack
from scalelab.search import search

H100 = load_cluster("h100-ib")
LAYERNORM_MODEL = "gpt3-175b"


def _row(model: str, layout: Layout, stack: str) -> dict:
    table = LayoutTable.from_layouts([layout])
    return predict(load_model(model), H100, table, load_stack(stack)).row(0)


def test_every_catalog_stack_loads_and_states_its_source() -> None:
    for name in stack_names():
        assert load_stack(name).source


def test_generic_is_the_default_prediction() -> None:
    rng = np.random.default_rng(3)
    layouts = [
        Layout(gpus=64, global_batch=int(b), seq_len=4096, tp=int(t), pp=int(p), micro_batch=1)
        for t, p, b in zip(
            rng.choice([1, 2, 8], 30),
            rng.choice([1, 2, 4], 30),
            rng.choice([256, 512], 30),
            strict=True,
        )
    ]
    table = LayoutTable.from_layouts(layouts)
    model = load_model("llama2-13b")
    plain, generic = predict(model, H100, table), predict(model, H100, table, load_stack("generic"))
    for key, values in plain.values.items():
        np.testing.assert_array_equal(values, generic.values[key])


def test_gradient_sync_every_microbatch_multiplies_the_reduction() -> None:
    # 64 GPUs, 512 sequences: 8 micro-batches per data-parallel rank, no pipeline.
    layout = Layout(gpus=64, global_batch=512, seq_len=4096)
    once, each = _row("llama2-7b", layout, "generic"), _row("llama2-7b", layout, "torchtitan")
    assert each["dp_grad_reduce_s"] == pytest.approx(8 * once["dp_grad_reduce_s"])
    assert each["step_time_s"] > once["step_time_s"]
    # With a pipeline the schedule reduces once per step in every stack.
    piped = Layout(gpus=64, global_batch=512, seq_len=4096, pp=4)
    a, b = _row("llama2-7b", piped, "generic"), _row("llama2-7b", piped, "torchtitan")
    assert a["dp_grad_reduce_s"] == pytest.approx(b["dp_grad_reduce_s"])


def test_composer_fsdp_reduces_every_microbatch_and_ddp_once() -> None:
    # Composer enters no_sync only for a DistributedDataParallel model; with FSDP (its submodules
    # wrapped) FSDP1 reduce-scatters each micro-batch. 8 GPUs, 512 sequences, micro-batch 4: 16.
    a100 = load_cluster("a100-ib")

    def row(sharding: str, stack: str) -> dict:
        layout = Layout(gpus=8, global_batch=512, seq_len=2048, micro_batch=4, sharding=sharding)
        table = LayoutTable.from_layouts([layout])
        return predict(load_model("llama2-7b"), a100, table, load_stack(stack)).row(0)

    fsdp, fsdp_once = row("fsdp", "composer"), row("fsdp", "generic")
    assert fsdp["dp_grad_reduce_s"] == pytest.approx(16 * fsdp_once["dp_grad_reduce_s"])
    assert fsdp["step_time_s"] > fsdp_once["step_time_s"]
    ddp, ddp_once = row("ddp", "composer"), row("ddp", "generic")
    assert ddp["dp_grad_reduce_s"] == pytest.approx(ddp_once["dp_grad_reduce_s"])


def test_tp_and_p2p_overlap_only_hide_communication() -> None:
    layout = Layout(
        gpus=256,
        global_batch=512,
        seq_len=4096,
        sharding="ddp",
        tp=8,
        pp=4,
        pp_schedule="interleaved",
        virtual_stages=2,
    )
    plain, overlapped = (
        _row("llama2-70b", layout, "generic"),
        _row("llama2-70b", layout, "megatron-core-te"),
    )
    assert overlapped["tp_comm_s"] < plain["tp_comm_s"]
    assert overlapped["pp_p2p_s"] < plain["pp_p2p_s"]
    # Compute moves only through interference beside the now shorter passes.
    assert overlapped["compute_s"] == pytest.approx(plain["compute_s"], rel=1e-2)
    assert overlapped["step_time_s"] < plain["step_time_s"]


def test_a_schedule_the_stack_lacks_is_refused_in_one_line(cli) -> None:
    layout = Layout(
        gpus=64, global_batch=64, seq_len=4096, pp=2, pp_schedule="zbv", virtual_stages=2
    )
    with pytest.raises(
        InputError, match="stack megatron-core-te offers 1f1b, interleaved, not zbv"
    ):
        predict_layout(load_model("llama2-7b"), H100, layout, load_stack("megatron-core-te"))
    r = cli("predict", "llama2-7b", "--gpus", "8", "--stack", "composer", "--tp", "2")
    assert r.returncode == 2
    assert r.stderr.strip() == "scalelab: error: tp: stack composer offers tp up to 1, not 2"


def test_search_ranks_only_what_the_stack_offers() -> None:
    result = search(
        load_model("llama2-13b"),
        H100,
        gpus=64,
        global_batch=64,
        seq_len=4096,
        top_k=50,
        stack=load_stack("composer"),
    )
    assert result.stack == "composer" and result.top
    assert all(r["layout"]["tp"] == r["layout"]["pp"] == r["layout"]["cp"] == 1 for r in result.top)
    assert any("stack composer" in reason for reason in result.invalid_by_reason)


def test_unknown_stack_and_a_stack_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown stack 'nemo'; choose one of generic"):
        load_stack("nemo")
    path = tmp_path / "mine.yaml"
    path.write_text("schedules: [1f1b]\nshardings: [fsdp]\ntp_comm_overlap: true\n")
    mine = load_stack(str(path))
    assert mine.name == "mine" and mine.tp_comm_overlap
    path.write_text("schedules: [dualpipe]\n")
    with pytest.raises(InputError, match=r"^stack: .*schedules"):
        load_stack(str(path))


@pytest.mark.parametrize(
    ("text", "stack"),
    [
        ("torchtitan (PyTorch FSDP2; commit in the source citation)", "torchtitan"),
        ("NeMo 24.07 container (Megatron-Core)", "megatron-core-te"),
        ("Megatron-LM (April 2021)", "megatron-lm-2021"),
        ("llm-foundry / Composer (Jan 2024)", "composer"),
        ("Aleph Alpha Megatron-based codebase", "aleph-alpha-scaling"),
        ("OneFlow-GPT (2021)", "oneflow-gpt"),
    ],
)
def test_the_stack_a_run_states_is_read(text: str, stack: str | None) -> None:
    assert read_stack(text) == stack


def test_eager_rmsnorm_pays_its_counted_hbm_passes() -> None:
    """An eager RMSNorm (torch.nn.RMSNorm before PyTorch 2.8, torchtitan's default) moves 32 B per
    element more than a fused kernel forward and 52 B backward, twice per layer; LayerNorm and
    fused stacks are unchanged."""
    from scalelab.perf.compute import layer_compute

    model = load_model("llama2-13b")
    one = np.ones(1, dtype=np.int64)
    args = dict(
        micro_batch=2 * one,
        seq_len=4096 * one,
        tp=one,
        cp=one,
        sequence_parallel=np.zeros(1, dtype=bool),
        fp8=np.zeros(1, dtype=bool),
        attention=np.full(1, AttentionKernel.FLASH.code),
    )
    fused = layer_compute(model, H100, **args)
    eager = layer_compute(model, H100, **args, eager_norm=True)
    hbm = H100.gpu.hbm_bytes_per_s * H100.params.hbm_efficiency
    elems = 2 * (2 * 4096) * model.d_model  # two norms over micro-batch x sequence x d_model
    assert eager.forward_s[0] - fused.forward_s[0] == pytest.approx(32 * elems / hbm)
    assert eager.backward_s[0] - fused.backward_s[0] == pytest.approx(52 * elems / hbm)
    gpt = load_model(LAYERNORM_MODEL)
    assert gpt.norm == "layernorm"
    assert layer_compute(gpt, H100, **args, eager_norm=True).forward_s[0] == pytest.approx(
        layer_compute(gpt, H100, **args).forward_s[0]
    )
    # Through the stack: torchtitan runs it eager, so the same layout is slower than generic's.
    layout = Layout(gpus=8, global_batch=8, seq_len=4096)
    assert (
        _row("llama2-7b", layout, "torchtitan")["compute_s"]
        > _row("llama2-7b", layout, "generic")["compute_s"]
    )


@pytest.mark.parametrize("pp", [1, 4])
def test_gradient_allreduce_after_backward_is_exposed(pp: int) -> None:
    """A stack that all-reduces every gradient after the last backward (Aleph Alpha's codebase:
    ZeRO-1 by AllReduce, in the optimizer step) exposes all of it; ZeRO-1 by ReduceScatter
    overlapped with backward (generic) hides most of it and moves half the bytes (the AllReduce
    takes at least 1.3x as long: 2x as a ring, less where NCCL's cost model picks a tree, as at
    pp 4, where each replica group has one rank per node)."""
    layout = Layout(gpus=64, global_batch=256, seq_len=2048, sharding="zero1", tp=2, pp=pp)
    plain = _row("llama2-13b", layout, "generic")
    late = _row("llama2-13b", layout, "aleph-alpha-scaling")
    assert late["dp_grad_reduce_s"] > 1.3 * plain["dp_grad_reduce_s"]
    assert late["dp_grad_reduce_exposed_s"] == pytest.approx(late["dp_grad_reduce_s"], rel=1e-6)
    assert plain["dp_grad_reduce_exposed_s"] < 0.5 * plain["dp_grad_reduce_s"]
    assert late["step_time_s"] - plain["step_time_s"] > 0.5 * late["dp_grad_reduce_s"]


def test_torchtitan_selective_recompute_keeps_every_other_matmul_and_recomputes_the_rest() -> None:
    """torchtitan's per-op SAC (stacks.yaml selective_recompute: alternate-matmuls) recomputes
    wk, wo and w3 in backward, not the attention core, and keeps only the saved ops' outputs."""
    from scalelab.perf.memory import alternate_matmul_bytes_per_layer

    layout = Layout(gpus=8, global_batch=16, seq_len=8192, micro_batch=2, recompute="selective")
    generic = load_stack("generic")
    titan_like = generic.model_copy(update={"selective_recompute": "alternate-matmuls"})
    model = load_model("llama3-8b")
    table = LayoutTable.from_layouts([layout])
    a = predict(model, H100, table, generic).row(0)
    b = predict(model, H100, table, titan_like).row(0)
    lc = __import__("scalelab.perf.compute", fromlist=["layer_compute"]).layer_compute(
        model, H100, micro_batch=table.micro_batch, seq_len=table.seq_len, tp=table.tp,
        cp=table.cp, sequence_parallel=np.zeros(1, dtype=bool), fp8=table.is_fp8,
        attention=table.attention,
    )  # fmt: skip
    per_layer = lc.alternate_gemm_forward_s[0] + lc.elementwise_forward_s[0]
    assert b["recompute_s"] == pytest.approx(model.n_layers * per_layer, rel=1e-9)
    tokens = np.array([2 * 8192.0])
    kept = alternate_matmul_bytes_per_layer(
        model, tokens, np.ones(1, dtype=np.int64), np.zeros(1, dtype=bool)
    )
    d, kv, ff = model.d_model, model.kv_dim, model.d_ff
    assert kept[0] == pytest.approx(2 * tokens[0] * (d + kv + ff + d + d + d))
    assert b["memory_activations_bytes"] < a["memory_activations_bytes"]


def _v100_row(model: str, layout: Layout, stack: str) -> dict:
    table = LayoutTable.from_layouts([layout])
    return predict(load_model(model), load_cluster("v100-ib"), table, load_stack(stack)).row(0)


def test_oneflow_reduces_on_the_compute_stream_only_with_model_parallelism() -> None:
    """OneFlow-GPT turns on nccl_use_compute_stream when tp x pp > 1: the gradient AllReduce is
    then serialised with compute (all of it exposed); with data parallelism alone NCCL keeps its
    own stream and the reduction overlaps backward as the generic stack's does. Either way it
    moves fp16 gradients: half the generic stack's fp32 bytes."""
    dp_only = Layout(gpus=32, global_batch=64, seq_len=2048, micro_batch=2, sharding="ddp")
    hybrid = Layout(gpus=32, global_batch=32, seq_len=2048, micro_batch=8, sharding="ddp", tp=8)
    for layout in (dp_only, hybrid):
        of, generic = (
            _v100_row("llama2-1b", layout, "oneflow-gpt"),
            _v100_row("llama2-1b", layout, "generic"),
        )
        assert 0.4 < of["dp_grad_reduce_s"] / generic["dp_grad_reduce_s"] < 0.6
    of = _v100_row("llama2-1b", hybrid, "oneflow-gpt")
    assert of["dp_grad_reduce_exposed_s"] == pytest.approx(of["dp_grad_reduce_s"], rel=1e-6)
    of = _v100_row("llama2-1b", dp_only, "oneflow-gpt")
    assert of["dp_grad_reduce_exposed_s"] < 0.5 * of["dp_grad_reduce_s"]


def test_oneflow_pipeline_copies_overlap_compute() -> None:
    """PipelineBufferPass double-buffers the cross-stage copies: only warm-up and cool-down
    transfers stay exposed, so send/recv costs less than the generic stack's."""
    layout = Layout(gpus=32, global_batch=512, seq_len=2048, micro_batch=8, tp=8, pp=2)
    of, generic = (
        _v100_row("llama2-1b", layout, "oneflow-gpt"),
        _v100_row("llama2-1b", layout, "generic"),
    )
    assert of["pp_p2p_s"] < generic["pp_p2p_s"]
    assert of["step_time_s"] < generic["step_time_s"]


def test_module_partition_by_hand() -> None:
    """Aleph-Alpha/scaling's pipe_partition_uniform over [embedding, L layers, norm, head]: for
    L = 60 on 16 stages, 63 modules give stages 0-14 four modules and stage 15 three (layer 60,
    the norm, the head): the slowest stage holds 4 layers and no head. For L = 40 on 2 stages,
    43 modules: stage 0 the embedding and 21 layers, stage 1 layers 22-40 (19), norm and head."""
    from scalelab.perf.schedule import module_partition_slowest_stage

    one = np.ones(1)
    layers, head = module_partition_slowest_stage(60, np.array([16]), one, one, 1.6 * one)
    assert (layers[0], head[0]) == (4, 0)
    layers, head = module_partition_slowest_stage(40, np.array([2]), one, one, 2.07 * one)
    assert (layers[0], head[0]) == (19, 1)  # 19 + 2.07 > 21
    layers, head = module_partition_slowest_stage(40, np.array([2]), one, one, 1.9 * one)
    assert (layers[0], head[0]) == (21, 0)


def test_module_partition_puts_the_head_in_place_of_layers() -> None:
    """The head's stage holds fewer layers. With 61 layers on 16 stages (64 modules, 4 each) the
    slowest stage holds 4 layers where Megatron's split holds ceil(61/16) = 4 layers and the head:
    faster. With 80 (83 modules: stages 0-2 take 6) it holds 6 layers where Megatron's holds 5 and
    a head of 0.3 layers: slower. Without a pipeline nothing changes."""
    generic = load_stack("generic")
    modules = generic.model_copy(update={"pp_partition": "modules"})
    deep = Layout(gpus=128, global_batch=512, seq_len=4096, tp=8, pp=16)
    flat = Layout(gpus=128, global_batch=512, seq_len=4096, tp=8, pp=1, sharding="fsdp")
    table = LayoutTable.from_layouts([deep, flat])
    seventy = load_model("llama2-70b")
    for n_layers, faster in ((61, True), (80, False)):
        model = seventy.model_copy(update={"n_layers": n_layers})
        a = predict(model, H100, table, generic)
        b = predict(model, H100, table, modules)
        assert (b.row(0)["step_time_s"] < a.row(0)["step_time_s"]) == faster
        assert b.row(1)["step_time_s"] == a.row(1)["step_time_s"]
