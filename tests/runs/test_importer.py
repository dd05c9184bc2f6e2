"""The importer on hand-made raw rows: each rule that fills, derives or skips a field."""

from __future__ import annotations

import pytest

from scalelab.runs.importer import ReviewEntry, read_review, read_row, target_tokens_per_s_per_gpu
from scalelab.runs.schema import FlopFormula, MeasuredQuantity

BASE = {
    "source": "somewhere, some table",
    "model": "Llama 2 7B",
    "params": "",
    "layers": "32",
    "hidden_size": "4096",
    "heads": "32",
    "kv_heads": "32",
    "ffn_size": "11008",
    "vocab": "32000",
    "seq_len": "4096",
    "global_batch_seqs": "64",
    "micro_batch": "1",
    "gpu_type": "H100-SXM5-80GB (DGX H100, 8x400Gb/s NDR)",
    "num_gpus": "16",
    "gpus_per_node": "8",
    "tp": "1",
    "pp": "1",
    "dp": "16",
    "cp": "1",
    "sharding": "FSDP2 full shard",
    "activation_checkpointing": "none",
    "precision": "bf16",
    "virtual_pipeline_stages": "",
    "tokens_per_sec_global": "",
    "tokens_per_sec_per_gpu": "3000",
    "tflops_per_gpu": "",
    "mfu_pct": "",
    "hfu_pct": "",
    "step_time_s": "",
    "notes": "FlashAttention",
    # The architecture stated, so that a complete row assumes nothing (the family rule is tested
    # without these columns in tests/runs/test_table.py).
    "ffn": "SwiGLU",
    "norm": "RMSNorm",
    "position": "RoPE",
    "bias": "no",
    "tied_embeddings": "no",
}
NO_ARCH = dict.fromkeys(("ffn", "norm", "position", "bias", "tied_embeddings"), "")


def read(**changes: str):
    return read_row(0, {**BASE, **changes})


def test_a_complete_row_is_read_with_nothing_assumed() -> None:
    reading = read()
    assert reading.skipped is None and reading.run is not None
    run = reading.run
    assert (run.gpu, run.cluster, run.nics_per_node, run.nic_gbps) == (
        "H100-SXM5",
        "h100-ib",
        8,
        400,
    )
    assert (run.sharding, run.sequence_parallel, run.attention) == ("fsdp", False, "flash")
    assert run.assumed == ""
    assert run.tokens_per_s_per_gpu == 3000


def test_sequence_parallel_0_keeps_it_off_and_a_seqpara_path_does_not_switch_it_on() -> None:
    tp2 = {"tp": "2", "dp": "8"}
    off = read(
        **tp2, notes="FlashAttention; file seqpara/x_sequence_parallelism.xlsx; sequence_parallel=0"
    )
    assert off.run is not None and off.run.sequence_parallel is False
    on = read(**tp2, notes="FlashAttention; file seqpara/x.xlsx; sequence_parallel=1")
    assert on.run is not None and on.run.sequence_parallel is True
    unsaid = read(**tp2, notes="FlashAttention; file seqpara/x_sequence_parallelism.xlsx")
    assert unsaid.skipped == "sequence parallelism not stated (sequence_parallel; tp > 1)"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        (
            {"tp": "", "pp": ""},
            "tensor-parallel degree not stated (tp); pipeline-parallel degree not stated (pp)",
        ),
        ({"micro_batch": ""}, "micro-batch not stated (micro_batch)"),
        (
            {"global_batch_seqs": ""},
            "global batch not stated (global_batch_seqs; or a step time with a throughput)",
        ),
        ({"vocab": "", "model": "Custom 7B"}, "vocabulary not stated (vocab)"),
        ({"sharding": ""}, "sharding not stated (sharding)"),
        (
            {"activation_checkpointing": ""},
            "activation checkpointing not stated (activation_checkpointing)",
        ),
        ({"notes": ""}, "attention kernel not stated (attention, or kernel= in the notes)"),
        ({"gpu_type": "TPU v5p"}, "GPU not in the catalog (TPU v5p) (gpu_type)"),
        (
            {"gpu_type": "MI300X", "gpus_per_node": ""},
            "GPUs per node not stated (gpus_per_node; or name the system or GPU part)",
        ),
        ({"gpu_type": "MI300X"}, "network not stated (network; a multi-node run)"),
        ({"dp": "4"}, "degrees do not multiply to the GPU count (1x1x1x4 != 16)"),
        (
            {"tokens_per_sec_per_gpu": ""},
            "no throughput to compare (tokens/s per GPU or of the job, step time x global batch, "
            "MFU with its peak or TFLOP/s, each with its FLOP formula)",
        ),
        (
            {"tokens_per_sec_per_gpu": "", "mfu_pct": "50"},
            "MFU without its FLOP formula (flop_formula, e.g. 6N+12LHQT)",
        ),
        ({"precision": "mixed (16-bit)"}, "precision not readable (precision = 'mixed (16-bit)')"),
    ],
)
def test_what_a_row_does_not_state_is_skipped_with_the_reason(changes: dict, reason: str) -> None:
    reading = read(**changes)
    assert reading.run is None
    assert reading.skipped == reason


def test_an_unknown_family_without_architecture_cells_names_what_to_state() -> None:
    reading = read(model="Mamba 7B", **NO_ARCH)
    assert reading.run is None and reading.skipped is not None
    assert reading.skipped.startswith("model family not recognised from the name 'Mamba 7B' (state")
    assert "Llama 3" in reading.skipped and "GPT-3-style" in reading.skipped


def test_a_skipped_row_lists_every_reason_not_only_the_first() -> None:
    reading = read(
        micro_batch="", sharding="", activation_checkpointing="", tokens_per_sec_per_gpu=""
    )
    assert reading.run is None
    assert [reason.split(" (")[0] for reason in reading.reasons] == [
        "micro-batch not stated",
        "sharding not stated",
        "activation checkpointing not stated",
        "no throughput to compare",
    ]


def test_a_single_node_run_needs_no_network() -> None:
    reading = read(gpu_type="MI300X", num_gpus="8", dp="8")
    assert reading.run is not None
    assert any("single node" in how for f, _, how in reading.how if f == "network")


def test_throughput_from_step_time_times_global_batch_times_sequence() -> None:
    reading = read(tokens_per_sec_per_gpu="", step_time_s="~5.0")
    run = reading.run
    assert run is not None and run.measured_quantity == MeasuredQuantity.STEP_TIME_S
    assert run.tokens_per_s_per_gpu == pytest.approx(64 * 4096 / 5.0 / 16)


def test_global_batch_from_tokens_per_s_and_step_time_or_a_local_batch() -> None:
    derived = read(global_batch_seqs="", step_time_s="5.46", tokens_per_sec_global="48k")
    assert derived.run is not None and derived.run.global_batch == 64  # 48,000 x 5.46 / 4096
    local = read(global_batch_seqs="", notes="FlashAttention; local batch 2")
    assert local.run is not None and local.run.global_batch == 32


def test_suffixed_and_approximate_numbers_in_cells() -> None:
    run = read(tokens_per_sec_global="~50k", tokens_per_sec_per_gpu="", seq_len="4K").run
    assert run is not None
    assert run.seq_len == 4096
    assert run.tokens_per_s_per_gpu == pytest.approx(50_000 / 16)


def test_mfu_with_its_formula_and_peak() -> None:
    run = read(
        tokens_per_sec_per_gpu="",
        params="7B",
        mfu_pct="50",
        notes="FlashAttention; MFU=(6N+12LHQT)*tokens/s / 989e12",
    ).run
    assert run is not None and run.measured_quantity == MeasuredQuantity.MFU
    assert run.flop_formula == FlopFormula.PALM and run.peak_tflops == 989
    assert run.tokens_per_s_per_gpu == pytest.approx(
        0.5 * 989e12 / (6 * 7e9 + 12 * 32 * 4096 * 4096), rel=1e-6
    )
    assert read(tokens_per_sec_per_gpu="", mfu_pct="50").skipped is not None  # no formula stated


def test_tflops_with_the_megatron_formula() -> None:
    run = read(
        tokens_per_sec_per_gpu="",
        tflops_per_gpu="150",
        model="GPT 7B",
        notes="FlashAttention; formula 96*B*s*l*h^2*(1+s/6h+V/16lh)",
    ).run
    assert run is not None and run.flop_formula == FlopFormula.MEGATRON
    h, s, layers, v = 4096, 4096, 32, 32000
    per_token = 96 * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    assert run.tokens_per_s_per_gpu == pytest.approx(150e12 / per_token, rel=1e-6)
    assert target_tokens_per_s_per_gpu(run) == pytest.approx(run.tokens_per_s_per_gpu, rel=1e-6)


def test_megatron_stack_without_a_sharding_is_the_distributed_optimizer_and_is_marked_assumed() -> (
    None
):
    run = read(sharding="", framework="a Megatron-based trainer").run
    assert run is not None and run.sharding == "zero1"
    assert "sharding" in run.assumed_fields
    assert (
        read(sharding="", framework="a custom trainer").skipped == "sharding not stated (sharding)"
    )


def test_grace_blackwell_rack_nvl72() -> None:
    run = read(
        gpu_type="GB200 NVL72 (4x400Gb/s per tray)", gpus_per_node="", num_gpus="72", dp="72"
    ).run
    assert run is not None
    assert (run.gpu, run.cluster, run.gpus_per_node, run.nvlink_domain) == (
        "GB200",
        "gb200-nvl72",
        4,
        72,
    )
    assert (run.nics_per_node, run.nic_gbps) == (4, 400)


def test_blackwell_and_a_stated_network() -> None:
    run = read(gpu_type="B200 (2x 100 GbE RoCE per node)").run
    assert run is not None and (run.gpu, run.cluster) == ("B200", "b200-ib")
    assert (run.nics_per_node, run.nic_gbps) == (2, 100)


def test_review_sheet_fills_only_empty_cells_and_records_assumptions() -> None:
    review = read_review(
        "where,column,value,kind,reason\n"
        "source~somewhere & model~Llama,vocab,32000,assumed,reviewer says so\n"
        "source~elsewhere,vocab,1,assumed,must not match\n"
        "source~somewhere,framework,MyStack 1.0,stated,the source names it\n"
    )
    assert isinstance(review[0], ReviewEntry)
    reading = read_row(0, {**BASE, "vocab": ""}, review)
    assert reading.run is not None and reading.run.vocab_size == 32000
    assert reading.run.stack == "MyStack 1.0"
    assert reading.run.assumed_fields == ["vocab_size"]
    kept = read_row(0, BASE, review)
    assert kept.run is not None and kept.run.assumed == ""


def test_explain_lists_every_field_and_the_verdict() -> None:
    lines = read(sharding="").explain()
    assert lines[-2:] == ["  SKIPPED (1 reasons):", "    - sharding not stated (sharding)"]
    lines = read().explain()
    assert any(line.startswith("  -> sharding = fsdp") for line in lines)
    assert lines[-1] == "  used"


def test_a_review_sheet_cross_entropy_is_read_and_an_unknown_one_skips_the_row() -> None:
    """How the loss ran (for a framework version that compiles it) comes from the review sheet,
    marked assumed; without an entry it is not stated (the stack's applies)."""
    review = read_review(
        "where,column,value,kind,reason\n"
        "source~somewhere & notes~torch\\.compile,cross_entropy,fused,assumed,compiled loss\n"
    )
    compiled = read_row(0, {**BASE, "notes": "FlashAttention; torch.compile"}, review)
    assert compiled.run is not None and compiled.run.cross_entropy == "fused"
    assert compiled.run.assumed_fields == ["cross_entropy"]
    eager = read_row(0, BASE, review)
    assert eager.run is not None and eager.run.cross_entropy is None
    bad = read_review("where,column,value,kind,reason\nsource~somewhere,cross_entropy,x,stated,y\n")
    assert read_row(0, BASE, bad).skipped == "unreadable cross_entropy ('x')"


def test_a_review_sheet_replaces_an_unreadable_cell_and_states_an_architecture() -> None:
    review = read_review(
        "where,column,value,kind,reason,replace\n"
        "precision~^mixed \\(16-bit\\)$,precision,fp16,stated,the paper's setup says fp16,true\n"
        "model~Custom,ffn,swiglu,stated,the model card,\n"
        "model~Custom,norm,rmsnorm,stated,the model card,\n"
        "model~Custom,position,rope,stated,the model card,\n"
        "model~Custom,bias,false,stated,the model card,\n"
        "model~Custom,tied_embeddings,false,stated,the model card,\n"
    )
    row = {**BASE, **NO_ARCH, "model": "Custom 7B", "precision": "mixed (16-bit)"}
    assert read_row(0, row).run is None
    reading = read_row(0, row, review)
    assert reading.run is not None and reading.run.precision == "fp16"
    assert reading.run.ffn == "swiglu" and reading.run.assumed == ""
    assert any("in place of 'mixed (16-bit)'" in how for _, _, how in reading.how)


def test_a_frameworks_fp8_default_and_a_gpu_without_flash_attention() -> None:
    run = read(precision="amp_fp8", framework="llm-foundry").run
    assert run is not None and run.precision == "fp8-delayed"
    assert "precision" in run.assumed_fields and run.assumption_kind == "named"
    assert (
        read(precision="amp_fp8").skipped == "fp8 scaling recipe not stated (precision = 'amp_fp8')"
    )
    v100 = read(
        gpu_type="V100-SXM2-32GB", notes="", framework="Megatron-LM", num_gpus="8", dp="8"
    ).run
    assert v100 is not None and v100.attention == "fused"
    on_a100 = read(
        gpu_type="A100-SXM4-80GB", notes="", framework="Megatron-LM", num_gpus="8", dp="8"
    )
    assert on_a100.skipped == "attention kernel not stated (attention, or kernel= in the notes)"


OPTIONAL_COLUMNS = {
    "framework", "source_group", "network", "sequence_parallel", "attention", "fp8_scaling",
    "norm_kernel", "cross_entropy", "peak_tflops", "flop_formula", "hsdp_shard_size", "pp_schedule",
}  # fmt: skip


@pytest.mark.parametrize("column", sorted(set(BASE) | OPTIONAL_COLUMNS))
@pytest.mark.parametrize("cell", ["", "??", "-3", "1e999"])
def test_any_cell_blank_or_unreadable_gives_reasons_never_an_error(column: str, cell: str) -> None:
    reading = read(**{column: cell})
    assert reading.run is not None or reading.reasons


def test_a_formula_named_after_a_framework_in_the_notes_names_no_framework() -> None:
    reading = read(notes="FlashAttention; TFLOP/s by the Megatron formula")
    assert reading.run is not None and reading.run.stack == ""
    named = read(notes="FlashAttention", model="Llama 2 7B (Megatron-LM)")
    assert named.run is not None and named.run.stack == "Megatron-LM"


def test_a_column_named_twice_is_one_line_naming_it() -> None:
    """Two headers that read as one column (`GPUs`, `gpus `) would silently drop one: refused."""
    import pytest

    from scalelab.errors import InputError
    from scalelab.io import csv_records
    from scalelab.runs.importer import read_table

    with pytest.raises(InputError, match="'gpus' appears more than once"):
        csv_records("gpus,gpus\n8,16\n", "data")
    with pytest.raises(InputError, match="two columns read as 'gpus'"):
        read_table("GPUs;gpus \n8;16\n")
