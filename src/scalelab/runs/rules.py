"""Written rules that read the free text of a published run: numbers, negations, sharding
spellings, precision recipes, GPU names and network descriptions.

Every rule reads what a row says; none looks at which source wrote it. Each function returns the
value and a short name of the rule that produced it (shown by `scalelab validate --explain`), or
None when the text does not say. docs/runs.md lists the rules with examples.
"""

from __future__ import annotations

import re
from functools import lru_cache

# Numbers ---------------------------------------------------------------------------------------

_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_NUMBER = re.compile(
    r"^(?P<approx>~|≈|about\s+|approx\.?\s*|ca\.\s*)?\s*(?P<num>[-+]?\d[\d,_]*(?:\.\d+)?(?:e[-+]?\d+)?)"
    r"\s*(?P<suffix>[kmbgt])?\b",
    re.IGNORECASE,
)


def parse_number(text: str | None, binary: bool = False) -> float | None:
    """'~50k' -> 50000, '1.5M' -> 1.5e6, '32K' -> 32000, '1,024' -> 1024; None if unreadable.

    Suffixes are decimal (k = 1e3, M = 1e6, B/G = 1e9, T = 1e12), as sources write token counts and
    parameter counts; with `binary` (sequence lengths: a '32K' context is 32,768 tokens) k = 1024
    and M = 2**20. A leading '~', '≈', 'about' or 'approx.' marks an approximate value, which is
    kept as written.
    """
    if text is None:
        return None
    t = text.strip()
    if not t:
        return None
    m = _NUMBER.match(t)
    if not m:
        return None
    value = float(m.group("num").replace(",", "").replace("_", ""))
    suffix = (m.group("suffix") or "").lower()
    if binary and suffix in ("k", "m"):
        return value * (1024.0 if suffix == "k" else 1024.0**2)
    return value * _SUFFIX.get(suffix, 1.0)


def is_approximate(text: str | None) -> bool:
    return bool(text) and bool(re.match(r"^\s*(~|≈|about\b|approx|ca\.)", text or "", re.I))


# Negation --------------------------------------------------------------------------------------

# A mention is negated by a word before it ("no", "not", "without", "disable(d)", "w/o") or by a
# value after it ("=0", "=false", ": off", " disabled", " off", " false", " none").
_NEG_BEFORE = re.compile(r"\b(no|not|without|disabled?|w/o|never)\b[\s\w-]{0,20}$", re.I)
_NEG_AFTER = re.compile(
    r"^\s*(?:[=:]\s*(?:0|false|off|no|none|disabled?)\b|(?:is\s+)?(?:off|disabled|false|not used)\b)",
    re.I,
)
_POS_AFTER = re.compile(r"^\s*[=:]\s*(?:1|true|on|yes|enabled?)\b", re.I)
_UNKNOWN_AFTER = re.compile(r"^[^;,.]{0,40}\b(?:not stated|unknown|not given|not reported)\b", re.I)
_FILE_TOKEN = re.compile(
    r"[^\s;,()\[\]]*(?:\.(?:xlsx|csv|json|md|ya?ml|txt|py|log|png|toml)\b|"
    r"\w{2,}/[^\s;,()]*[_.][^\s;,()]*|\w{2,}/(?=[\s;,()]|$))[^\s;,()\[\]]*",
    re.I,
)


@lru_cache(maxsize=8192)  # pure; the importer asks about the same notes many times
def strip_paths(text: str) -> str:
    """Remove file names and paths ('seqpara/llama_13B.xlsx', 'configs/'): words inside them are
    not statements about the run. 'Gb/s' or 'triton/flash' are not paths (no '_', '.' or end '/')."""
    return _FILE_TOKEN.sub(" ", text)


@lru_cache(maxsize=65536)  # pure
def mention(text: str, pattern: str) -> bool | None:
    """True if `text` states `pattern`, False if it states it negated, None if it does not mention it.

    When several mentions disagree, an explicit value after the name (=1 / =0) wins, then the
    last mention.
    """
    t = strip_paths(text)
    verdict: bool | None = None
    for m in re.finditer(pattern, t, re.I):
        before, after = t[: m.start()], t[m.end() :]
        if _UNKNOWN_AFTER.match(after):
            continue  # "X ... not stated": says nothing about X
        if _POS_AFTER.match(after):
            return True
        if _NEG_AFTER.match(after):
            return False
        verdict = not _NEG_BEFORE.search(before)
    return verdict


_FALSY = re.compile(r"^\s*(no|none|off|false|disabled?|0|n)\b", re.I)
_TRUTHY = re.compile(r"^\s*(yes|true|on|enabled?|1|y)\b", re.I)


def truth(text: str) -> bool | None:
    """A yes/no cell: 'true', 'yes', '1', 'on' / 'false', 'no', 'none', '0', 'off', 'disabled'."""
    if _TRUTHY.match(text):
        return True
    if _FALSY.match(text):
        return False
    return None


# Sharding --------------------------------------------------------------------------------------

# (pattern, sharding, rule) in the order they are tried: specific spellings before general ones.
_SHARDING_SPELLINGS: tuple[tuple[str, str, str], ...] = (
    (r"\bNO_SHARD\b", "ddp", "PyTorch FSDP NO_SHARD = DDP"),
    (r"_?HYBRID_SHARD(?:_ZERO2)?\b|\bhsdp\b|hybrid[\s_-]shard", "hsdp", "hybrid sharding = HSDP"),
    (r"\bSHARD_GRAD_OP\b", "zero2", "PyTorch FSDP SHARD_GRAD_OP = ZeRO-2"),
    (r"reshard_after_forward\s*=\s*false", "zero2", "FSDP2 reshard_after_forward=False = ZeRO-2"),
    (r"\bzero[\s_-]?(?:stage)?[\s_=:-]*3\b|\bstage[\s_=:-]*3\b", "fsdp", "ZeRO-3 = full sharding"),
    (r"\bzero[\s_-]?(?:stage)?[\s_=:-]*2\b|\bstage[\s_=:-]*2\b", "zero2", "ZeRO-2"),
    (r"\bzero[\s_-]?(?:stage)?[\s_=:-]*1\b|\bstage[\s_=:-]*1\b", "zero1", "ZeRO-1"),
    (r"\bzero[\s_-]?(?:stage)?[\s_=:-]*0\b|\bstage[\s_=:-]*0\b", "ddp", "ZeRO-0 = DDP"),
    (
        r"distributed[\s_-]optimi[sz]er|use[_-]distributed[_-]optimizer|distributed_fused_adam",
        "zero1",
        "Megatron/NeMo distributed optimizer = ZeRO-1",
    ),
    (r"\bFULL_SHARD\b|full[\s_-]?shard|fully_shard", "fsdp", "FSDP full sharding"),
    (r"\bfsdp2?\b", "fsdp", "FSDP (FULL_SHARD is its default)"),
    (r"\bddp\b|distributed data[\s-]parallel|\bnone\b|no sharding", "ddp", "DDP (no sharding)"),
)


def read_sharding(text: str) -> tuple[str, str] | None:
    """The sharding a text states, negations honoured; None if it says nothing about it."""
    t = text.strip()
    if not t:
        return None
    negated_any = False
    for pattern, value, rule in _SHARDING_SPELLINGS:
        if pattern.startswith(r"\bNO_SHARD") and re.search(pattern, t):
            return value, rule
        if value == "ddp" and r"\bnone\b" in pattern:
            if re.search(pattern, t, re.I):
                return value, rule
            continue
        said = mention(t, pattern)
        if said is True:
            return value, rule
        if said is False:
            negated_any = True
    if negated_any or mention(t, r"\bzero\b|\bfsdp2?\b|\bsharding\b") is False:
        return "ddp", "sharding named only to say it is off = DDP"
    return None


# Precision -------------------------------------------------------------------------------------


def read_precision(text: str, fp8_scaling: str = "") -> tuple[str, str] | str:
    """(recipe, rule), or the reason it cannot be read."""
    t = text.strip()
    if not t:
        return "precision not stated"
    if mention(t, r"nvfp4|\bfp4\b"):
        return "nvfp4", "NVFP4"
    if mention(t, r"\bmxfp8\b|\bmx[\s_-]?fp8\b|\bfp8[\s_-]mx\b"):
        return "mxfp8", "MXFP8 (32-element block scales)"
    if mention(t, r"\bfp8\b|\bfloat8\b|\bfp8_|\bamp_fp8\b"):
        scaling = f"{t} {fp8_scaling}"
        if mention(scaling, r"\bdelayed\b|\bfp8[\s_-]ds\b"):
            return "fp8-delayed", "fp8 with delayed scaling"
        if mention(
            scaling, r"tensor[\s_-]?wise|per[\s_-]tensor|current[\s_-]scaling|\bfp8[\s_-]cs\b"
        ):
            return "fp8-tensorwise", "fp8 with per-tensor (dynamic) scaling"
        if mention(scaling, r"block[\s_-]?wise|row[\s_-]?wise|per[\s_-]row|1x128|128x128"):
            return "fp8-blockwise", "fp8 with block scales (a row is a block of one row)"
        if mention(t, r"transformer[\s_-]engine|\bTE\b"):
            return (
                "fp8-delayed",
                "Transformer Engine fp8 without a stated recipe = its default, delayed scaling",
            )
        return "fp8 scaling recipe not stated"
    if mention(t, r"\bbf16\b|bfloat16|amp_bf16"):
        return "bf16", "bf16"
    if mention(t, r"\bfp16\b|float16|\bhalf\b|amp_fp16"):
        return "fp16", "fp16 (mixed)"
    if mention(t, r"\bfp32\b|\btf32\b|float32"):
        return "precision fp32/tf32 not modelled by the predictor"
    return "precision not readable"


# Recompute -------------------------------------------------------------------------------------


def read_recompute(text: str) -> tuple[str, str] | None:
    t = text.strip()
    if not t:
        return None
    if re.match(r"^\s*selective", t, re.I) or mention(t, r"\bselective\b|\bsac\b"):
        return "selective", "selective activation checkpointing"
    if truth(t) is False:
        return "none", "no activation checkpointing"
    if re.match(r"^\s*full", t, re.I) or mention(
        t, r"every layer|per block|checkpoint_activations|\bfull\b"
    ):
        return "full", "full activation checkpointing"
    if truth(t) is True:
        return "full", "activation checkpointing on (full)"
    return None


# Attention kernel ------------------------------------------------------------------------------


def read_attention(text: str) -> tuple[str, str] | None:
    """The attention kernel a text names ('kernel=...', 'FlashAttention', 'fused softmax')."""
    m = re.search(r"kernel\s*=\s*([^;]*)", text, re.I)
    t = m.group(1) if m else strip_paths(text)
    if re.search(
        r"flash[\s_-]?attention[\s_-]?v?1\b|flash[\s_-]?attentionv1|\bflash1\b|\bfa1\b", t, re.I
    ):
        return "flash1", "FlashAttention 1"
    if mention(t, r"flash[\s_-]?attention|\bflash\b|\bfa2\b|\bfa3\b|\bsdpa[\s_-]flash"):
        return "flash", "FlashAttention-class kernel"
    if mention(t, r"\bfused\b|fused[\s_-]softmax"):
        return "fused", "fused scale-mask-softmax (scores materialised)"
    if m and re.search(r"\btorch\b|\bmath\b|\beager\b|\bnaive\b", t, re.I):
        return "math", "unfused PyTorch attention"
    if not m and mention(t, r"\bmath attention\b|\beager attention\b"):
        return "math", "unfused PyTorch attention"
    return None


# GPUs and networks -----------------------------------------------------------------------------

# (pattern, catalog GPU): Grace-Blackwell before Blackwell, the HBM2e H100 before the H100.
_GPU_NAMES: tuple[tuple[str, str], ...] = (
    (r"\bgb300\b", "GB300"),
    (r"\bb300\b", "B300"),
    (r"\bgb200\b", "GB200"),
    (r"\bb200\b", "B200"),
    (r"\bh200\b", "H200"),
    (r"\bh100\b.*\bhbm2e\b|\bhbm2e\b.*\bh100\b", "H100-SXM5-HBM2e-500W"),
    (r"\bh100\b", "H100-SXM5"),
    (r"\ba100\b.*\b40\s?gb\b", "A100-SXM4-40GB"),
    (r"\ba100\b", "A100-SXM4-80GB"),
    (r"\bv100\b", "V100-SXM2"),
    (r"\bmi300x\b", "MI300X"),
    (r"\bmi325x\b", "MI325X"),
    (r"\bmi355x\b", "MI355X"),
)


def read_gpu(text: str) -> tuple[str, float | None, str] | str:
    """(catalog GPU, memory in GiB if stated, rule) or the reason it cannot be read."""
    t = text.replace("-", " ").replace("_", " ")
    if re.search(r"\bpcie\b", t, re.I):
        return f"GPU not in the catalog ({text.strip()}: PCIe parts are not catalogued)"
    for pattern, name in _GPU_NAMES:
        if re.search(pattern, t, re.I):
            mem = re.search(r"(\d+)(?:/\d+)?\s?GB(?!/s|ps)", text)
            gib = float(mem.group(1)) if mem else None
            return name, gib, f"GPU name -> {name}"
    return f"GPU not in the catalog ({text.strip() or 'empty'})"


def read_nvlink_domain(text: str) -> int | None:
    m = re.search(r"\bNVL\s?(\d+)\b", text, re.I)
    return int(m.group(1)) if m else None


def read_network(text: str, gpus_per_node: int) -> tuple[int, float, str] | None:
    """(links per node, Gb/s per link, rule) from text like '8x400Gb/s NDR', '2x 100 GbE RoCE per
    node', '400Gb/s RDMA per GPU', '1600 Gbps node-node interconnect'; None if not stated."""
    t = strip_paths(text)
    unit = r"\s*(?:gb/s|gbps|gbit/s|gbe|g\b)"
    m = re.search(rf"(\d+)\s*[x×]\s*(\d+(?:\.\d+)?){unit}", t, re.I)
    if m:
        return int(m.group(1)), float(m.group(2)), "N x B Gb/s links per node"
    m = re.search(rf"(\d+(?:\.\d+)?){unit}[^;,)]*\bper\s+gpu\b", t, re.I)
    if m:
        return gpus_per_node, float(m.group(1)), "B Gb/s per GPU = one link per GPU"
    m = re.search(rf"(\d+(?:\.\d+)?){unit}", t, re.I)
    if m:
        return 1, float(m.group(1)), "one B Gb/s figure per node = one link per node"
    return None


def read_dgx(text: str) -> str | None:
    """The DGX/HGX system a text names (its nodes are the catalog cluster of that GPU)."""
    m = re.search(r"\b(?:DGX|HGX)\s?-?\s?(A100|H100|H200|B200|GB200|B300|GB300)\b", text, re.I)
    return m.group(1).upper() if m else None


# Stacks: the framework a source states, read into a stack profile (config/stack.py). Only what the
# text names is read; a stack no rule matches is predicted with `generic` (the default).
_STACKS: tuple[tuple[str, str], ...] = (
    (r"\btorchtitan\b", "torchtitan"),
    (r"\bnemo\b|\bmegatron[- ]core\b|\bmegatron[- ]bridge\b|\bmcore\b", "megatron-core-te"),
    (r"\bmegatron[- ]lm\b.*\b(?:2021|ptd-p)\b", "megatron-lm-2021"),
    (r"\bcomposer\b|\bllm[- ]foundry\b", "composer"),
    (r"\bdeepspeed\b", "deepspeed-zero"),
    (r"\baleph alpha\b", "aleph-alpha-scaling"),
    (r"\boneflow[- ]gpt\b", "oneflow-gpt"),
)


def read_stack(text: str) -> str | None:
    """The stack profile a framework description names, or None when none is named."""
    for pattern, name in _STACKS:
        if re.search(pattern, text, re.I):
            return name
    return None
