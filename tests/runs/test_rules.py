"""One test per reading rule of the importer (scalelab.runs.rules)."""

from __future__ import annotations

import pytest

from scalelab.config.catalog import gpu_names, load_gpu
from scalelab.runs import rules


@pytest.mark.parametrize(
    ("text", "binary", "value"),
    [
        ("~50k", False, 50_000),
        ("1.5M", False, 1_500_000),
        ("32K", False, 32_000),
        ("32K", True, 32_768),
        ("1,024", False, 1024),
        ("13B", False, 13e9),
        ("about 2.5k", False, 2500),
        ("≈ 7", False, 7),
        ("4096", True, 4096),
    ],
)
def test_approximate_and_suffixed_numbers(text: str, binary: bool, value: float) -> None:
    assert rules.parse_number(text, binary=binary) == pytest.approx(value)


def test_unreadable_numbers_are_none_and_approximations_are_flagged() -> None:
    assert rules.parse_number("TPU") is None
    assert rules.parse_number("") is None
    assert rules.is_approximate("~50k") and not rules.is_approximate("50k")


SP = r"sequence[\s_-]?parallel(?:ism)?\b|\bSP\b"


@pytest.mark.parametrize(
    "text",
    [
        "no sequence parallelism",
        "trained without sequence parallel",
        "sequence_parallel=0",
        "sequence parallelism off",
        "sequence parallelism disabled",
        "sequence_parallel=false",
        "sequence parallel: false",
        "sequence parallelism is not used",
        "not using sequence parallelism",
    ],
)
def test_each_negation_says_off(text: str) -> None:
    assert rules.mention(text, SP) is False


@pytest.mark.parametrize(
    "text", ["sequence_parallel=1", "with sequence parallelism", "TP + SP", "SP: true"]
)
def test_affirmations_say_on(text: str) -> None:
    assert rules.mention(text, SP) is True


def test_a_path_or_file_name_is_not_a_statement() -> None:
    text = "trial 1; file seqpara/llama_13B_bfloat16_32_GPUs_sequence_parallelism.xlsx; x"
    assert rules.mention(text, SP) is None
    assert rules.mention(text + "; sequence_parallel=0", SP) is False
    assert rules.mention("see data/seqpara/", r"seqpara") is None


def test_units_with_slashes_are_not_paths() -> None:
    assert "100Gb/s" in rules.strip_paths("V100 (100Gb/s EDR IB)")
    assert "triton/flash" in rules.strip_paths("FlashAttention (triton/flash); x")


def test_a_mention_followed_by_not_stated_says_nothing() -> None:
    assert (
        rules.mention("interleaved schedule/microbatch per row not stated", r"interleaved") is None
    )


@pytest.mark.parametrize(
    ("text", "sharding"),
    [
        ("ZeRO-1", "zero1"),
        ("ZeRO-2", "zero2"),
        ("ZeRO-3", "fsdp"),
        ("zero stage 1", "zero1"),
        ("ZeRO stage 2", "zero2"),
        ("zero_stage=3", "fsdp"),
        ("DeepSpeed stage 1", "zero1"),
        ("DeepSpeed stage 2", "zero2"),
        ("DeepSpeed stage 3", "fsdp"),
        ("ZeRO-0", "ddp"),
        ("FSDP FULL_SHARD (MP mode PURE)", "fsdp"),
        ("FSDP SHARD_GRAD_OP", "zero2"),
        ("FSDP HYBRID_SHARD", "hsdp"),
        ("FSDP _HYBRID_SHARD_ZERO2", "hsdp"),
        ("FSDP NO_SHARD", "ddp"),
        ("FSDP2 full shard", "fsdp"),
        ("fully_shard (FSDP2), reshard_after_forward=False", "zero2"),
        ("HSDP", "hsdp"),
        ("FSDP", "fsdp"),
        ("Megatron distributed optimizer", "zero1"),
        ("--use-distributed-optimizer", "zero1"),
        ("optim: distributed_fused_adam", "zero1"),
        ("DDP", "ddp"),
        ("none (DDP, Megatron)", "ddp"),
        ("none", "ddp"),
    ],
)
def test_sharding_spellings(text: str, sharding: str) -> None:
    read = rules.read_sharding(text)
    assert read is not None and read[0] == sharding


@pytest.mark.parametrize(
    "text", ["FSDP disabled", "without FSDP", "no ZeRO", "fsdp=false", "FSDP off", "ZeRO: off"]
)
def test_sharding_named_only_to_say_it_is_off_is_ddp(text: str) -> None:
    assert rules.read_sharding(text) == ("ddp", "sharding named only to say it is off = DDP")


def test_sharding_not_stated_is_none() -> None:
    assert rules.read_sharding("") is None
    assert rules.read_sharding("data parallel over nodes") is None


@pytest.mark.parametrize(
    ("text", "scaling", "recipe"),
    [
        ("bf16", "", "bf16"),
        ("amp_bf16", "", "bf16"),
        ("fp16 mixed", "", "fp16"),
        ("fp8 with delayed scaling", "", "fp8-delayed"),
        ("bf16 + float8 tensorwise", "", "fp8-tensorwise"),
        ("bf16 + float8 rowwise", "", "fp8-blockwise"),
        ("fp8 blockwise (1x128)", "", "fp8-blockwise"),
        ("MXFP8", "", "mxfp8"),
        ("NVFP4", "", "nvfp4"),
        ("fp8 (Transformer Engine)", "", "fp8-delayed"),
        ("bf16 + fp8 linears", "tensorwise", "fp8-tensorwise"),
        ("FP8-MX", "", "mxfp8"),
        ("FP8-CS", "", "fp8-tensorwise"),  # current scaling: per-tensor, dynamic
        ("FP8-DS", "", "fp8-delayed"),
        ("amp_fp8", "delayed", "fp8-delayed"),
    ],
)
def test_precision_recipes(text: str, scaling: str, recipe: str) -> None:
    read = rules.read_precision(text, scaling)
    assert isinstance(read, tuple) and read[0] == recipe


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("bf16 + fp8 linears", "fp8 scaling recipe not stated"),
        ("amp_fp8", "fp8 scaling recipe not stated"),
        ("mixed (16-bit)", "precision not readable"),
        ("fp32", "precision fp32/tf32 not modelled by the predictor"),
        ("", "precision not stated"),
    ],
)
def test_precision_that_cannot_be_read_says_why(text: str, reason: str) -> None:
    assert rules.read_precision(text) == reason


def test_every_catalog_gpu_is_read_by_its_own_name() -> None:
    for name in gpu_names():
        if name == "CPU-core":
            continue
        read = rules.read_gpu(name)
        assert isinstance(read, tuple) and read[0] == name, name


@pytest.mark.parametrize(
    ("text", "gpu", "gib"),
    [
        ("NVIDIA GB200 NVL72", "GB200", None),
        ("HGX B200 180GB", "B200", 180.0),
        ("H200 (WhiteFiber, 400Gb/s CX-7 per GPU)", "H200", None),
        ("H100-SXM5-80GB (DGX H100)", "H100-SXM5", 80.0),
        ("H100 96GB HBM2e SXM, 500W limit", "H100-SXM5-HBM2e-500W", 96.0),
        ("H100 94/95GB HBM2e SXM lower-TDP", "H100-SXM5-HBM2e-500W", 94.0),
        ("A100-SXM4-40GB", "A100-SXM4-40GB", 40.0),
        ("A100-SXM4-80GB (DGX A100, 200Gb/s HDR IB)", "A100-SXM4-80GB", 80.0),
        ("V100-SXM2-16GB (100Gb/s EDR IB)", "V100-SXM2", 16.0),
        ("AMD Instinct MI300X 192GB", "MI300X", 192.0),
        ("HGX B300", "B300", None),
    ],
)
def test_gpu_descriptions(text: str, gpu: str, gib: float | None) -> None:
    read = rules.read_gpu(text)
    assert isinstance(read, tuple)
    assert read[:2] == (gpu, gib)
    load_gpu(read[0])


@pytest.mark.parametrize("text", ["TPU v5p", "H100 PCIe", "MI250X", ""])
def test_gpus_not_in_the_catalog_are_refused(text: str) -> None:
    read = rules.read_gpu(text)
    assert isinstance(read, str) and read.startswith("GPU not in the catalog")


def test_nvl_domains() -> None:
    assert rules.read_nvlink_domain("GB200 NVL72") == 72
    assert rules.read_nvlink_domain("GB200 NVL 36") == 36
    assert rules.read_nvlink_domain("DGX H100") is None


@pytest.mark.parametrize(
    ("text", "links", "gbps"),
    [
        ("8x400Gb/s NDR", 8, 400.0),
        ("2x 100 GbE RoCE per node", 2, 100.0),
        ("8x200Gb/s HDR IB per node", 8, 200.0),
        ("400Gb/s RDMA per GPU", 8, 400.0),
        ("1600 Gbps node-node interconnect (RoCE)", 1, 1600.0),
        ("100Gb/s EDR IB", 1, 100.0),
    ],
)
def test_network_text(text: str, links: int, gbps: float) -> None:
    read = rules.read_network(text, gpus_per_node=8)
    assert read is not None and read[:2] == (links, gbps)


def test_network_not_stated_and_dgx_systems() -> None:
    assert rules.read_network("A100-SXM4-80GB", 8) is None
    assert rules.read_dgx("Selene DGX A100") == "A100"
    assert rules.read_dgx("HGX H100 8-GPU") == "H100"


@pytest.mark.parametrize(
    ("text", "recompute"),
    [
        ("full (every layer)", "full"),
        ("full (checkpoint_activations=True in OneFlow log)", "full"),
        ("selective (per-op SAC)", "selective"),
        ("none", "none"),
        ("no", "none"),
        ("off", "none"),
        ("false", "none"),
        ("disabled", "none"),
        ("true", "full"),
    ],
)
def test_recompute(text: str, recompute: str) -> None:
    read = rules.read_recompute(text)
    assert read is not None and read[0] == recompute


@pytest.mark.parametrize(
    ("text", "kernel"),
    [
        ("kernel=flash_attention2 + RMS kernel; trial 1", "flash"),
        ("kernel=flash_attentionv1.0.8; trial 2", "flash1"),
        ("kernel=fused; trial 3", "fused"),
        ("kernel=torch; trial 4", "math"),
        ("FlashAttention (triton/flash); arch from mpt-7b.yaml", "flash"),
    ],
)
def test_attention_kernels(text: str, kernel: str) -> None:
    read = rules.read_attention(text)
    assert read is not None and read[0] == kernel


def test_attention_not_stated_or_negated() -> None:
    assert rules.read_attention("torch.compile; peak mem 80 GiB") is None
    assert rules.read_attention("without FlashAttention") is None


@pytest.mark.parametrize(
    ("text", "stack"),
    [
        ("Megatron-Bridge 0.2", "megatron-core-te"),  # Megatron-Core with Transformer Engine
        ("MCore r0.12", "megatron-core-te"),
        ("Megatron-LM PTD-P", "megatron-lm-2021"),  # the 2021 paper's name for its method
        ("Megatron-LM core_r0.9.0", None),  # a Megatron-LM of unstated era: no profile
    ],
)
def test_framework_names_read_into_stack_profiles(text: str, stack: str | None) -> None:
    assert rules.read_stack(text) == stack
