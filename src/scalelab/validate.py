"""Compare the predictor with measured training runs (the schema of published_runs.csv).

Each row is mapped to a model, a cluster and a layout; rows that cannot be expressed are skipped
and counted by reason. The measured target is tokens/s per GPU: given directly, or derived from the
source's own FLOP formula (Hagemann et al.: PaLM-style MFU against 312 TFLOP/s; Megatron: its
recompute-inclusive formula). One set of cluster parameters per cluster; nothing is tuned per row.
"""

from __future__ import annotations

import csv
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from scalelab.config.catalog import load_cluster, load_gpu
from scalelab.config.hardware import ClusterSpec
from scalelab.config.layout import Layout, LayoutTable, validate
from scalelab.config.model import ModelSpec
from scalelab.errors import InputError
from scalelab.perf.predict import predict

REQUIRED_COLUMNS = (
    "source",
    "model",
    "layers",
    "hidden_size",
    "heads",
    "seq_len",
    "gpu_type",
    "num_gpus",
)
HAGEMANN_TOKENS_PER_STEP = 4 * 1024 * 1024
HAGEMANN_VOCAB = 128_000


@dataclass
class RunCase:
    """One interpretable row: what to predict and the measured tokens/s per GPU."""

    index: int
    source: str
    sweep: str
    model: ModelSpec
    cluster: ClusterSpec
    layout: Layout
    measured_tokens_per_s_per_gpu: float


@dataclass
class ValidationReport:
    rows_used: int
    rows_skipped: int
    skipped_by_reason: dict[str, int]
    rows_predicted_not_to_fit: int
    mape_tokens_per_gpu: float
    within_20_pct: float
    median_spearman: float | None
    by_source: dict[str, dict[str, Any]]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self, with_rows: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rows_used": self.rows_used,
            "rows_skipped": self.rows_skipped,
            "skipped_by_reason": self.skipped_by_reason,
            "rows_predicted_not_to_fit": self.rows_predicted_not_to_fit,
            "mape_tokens_per_gpu": self.mape_tokens_per_gpu,
            "within_20_pct": self.within_20_pct,
            "median_spearman_within_sweeps": self.median_spearman,
            "by_source": self.by_source,
        }
        if with_rows:
            out["rows"] = self.rows
        return out


class SkipRowError(Exception):
    """A row the predictor cannot express; the message is the reason counted."""


def short_source(source: str) -> str:
    s = source.lower()
    for key, name in (
        ("johannesha", "Hagemann et al. 2023 (A100)"),
        ("mosaicml", "MosaicML llm-foundry (A100)"),
        ("torchtitan", "torchtitan (H100/H200)"),
        ("nemo", "NeMo 24.07 (H100 FP8)"),
        ("dlperf", "OneFlow DLPerf (V100)"),
        ("2104.04473", "Megatron-LM 2021 (A100)"),
    ):
        if key in s:
            return name
    return source[:40]


def _int(row: dict[str, str], key: str, default: int | None = None) -> int:
    text = (row.get(key) or "").strip()
    if not text:
        if default is None:
            raise SkipRowError(f"missing {key}")
        return default
    try:
        return int(float(text))
    except ValueError:
        raise SkipRowError(f"unreadable {key}") from None


def _float(row: dict[str, str], key: str) -> float | None:
    text = (row.get(key) or "").strip()
    try:
        return float(text) if text else None
    except ValueError:
        return None


def map_cluster(gpu_type: str, gpus_per_node: int) -> ClusterSpec:
    """The catalog cluster a published GPU description ran on."""
    g = gpu_type.lower()
    if "h200" in g:
        base = load_cluster("h200-ib")
    elif "h100" in g and ("hbm2e" in g or "500w" in g or "lower-tdp" in g):
        base = load_cluster("h100-hbm2e-500w")
    elif "h100" in g:
        base = load_cluster("h100-ib")
    elif "a100" in g and "40gb" in g:
        base = load_cluster("a100-ib").model_copy(update={"gpu": load_gpu("A100-SXM4-40GB")})
    elif "a100" in g:
        base = load_cluster("a100-ib")
    elif "v100" in g:
        gpu = load_gpu("V100-SXM2")
        if "16gb" in g:
            gpu = gpu.model_copy(update={"hbm_gib": 16})
        base = load_cluster("v100-ib").model_copy(update={"gpu": gpu})
    else:
        raise SkipRowError("GPU type not in the catalog")
    nic = re.search(r"(?:(\d+)\s*x\s*)?(\d+)\s*gb/s", g)
    if nic and "v100" in g:
        # "100Gb/s EDR IB" without a count: one NIC per node, as on DLPerf's cluster.
        base = base.model_copy(
            update={"nics_per_node": int(nic.group(1) or 1), "nic_gbps": float(nic.group(2))}
        )
    if gpus_per_node != base.gpus_per_node and gpus_per_node < base.gpus_per_node:
        base = base.model_copy(
            update={"gpus_per_node": gpus_per_node, "nvlink_domain": gpus_per_node}
        )
    return base


def map_model(row: dict[str, str]) -> ModelSpec:
    name = row["model"]
    lower = name.lower()
    llama = "llama" in lower
    hidden = _int(row, "hidden_size")
    heads = _int(row, "heads")
    source = row["source"].lower()
    if "johannesha" in source:
        vocab = HAGEMANN_VOCAB
    else:
        vocab = _int(
            row,
            "vocab",
            128_256 if "llama 3" in lower or "llama3" in lower else (32_000 if llama else 51_200),
        )
    try:
        return ModelSpec(
            name=name,
            n_layers=_int(row, "layers"),
            d_model=hidden,
            n_heads=heads,
            n_kv_heads=_int(row, "kv_heads", heads),
            d_ff=_int(row, "ffn_size", 4 * hidden),
            vocab_size=vocab,
            ffn="swiglu" if llama else "gelu",
            tied_embeddings=not llama,
            seq_len=_int(row, "seq_len"),
            norm="rmsnorm" if llama else "layernorm",
            bias=not llama and "mpt" not in lower,
            position="rope" if llama else "learned",
        )
    except ValidationError:
        raise SkipRowError("model shape not divisible (heads/kv heads)") from None


def _attention(row: dict[str, str]) -> str:
    notes = row.get("notes", "")
    match = re.search(r"kernel=([^;]*)", notes)
    source = row["source"].lower()
    if not match:
        # Megatron-LM and OneFlow in 2021 used fused scale-mask-softmax, before FlashAttention.
        return "fused" if ("dlperf" in source or "2104.04473" in source) else "flash"
    kernel = match.group(1)
    if "flash_attentionv1" in kernel:
        return "flash1"
    if "flash" in kernel:
        return "flash"
    if "fused" in kernel:
        return "fused"
    return "math"


def _sequence_parallel(row: dict[str, str], notes: str, tp: int) -> bool:
    """torchtitan and NeMo always pair TP with sequence parallelism; Hagemann et al. say per sheet."""
    source = row["source"].lower()
    if tp > 1 and ("torchtitan" in source or "nemo" in source):
        return True
    return "seqpara" in notes or "sequence parallel" in notes


def _recompute(text: str) -> str:
    t = text.lower()
    if t.startswith("full"):
        return "full"
    if t.startswith("selective"):
        return "selective"
    return "none"


def _sharding(text: str, source: str) -> str:
    t = text.lower()
    src = source.lower()
    if not t and ("johannesha" in src or "nemo" in src):
        # Megatron-based stacks: the distributed optimizer (ZeRO-1). Hagemann et al. do not state
        # it, but a 13B model at TP=PP=1 cannot fit on their 80 GB A100s without it; NeMo enables it.
        return "zero1"
    if "fsdp" in t or "full_shard" in t or "zero-3" in t or "zero3" in t:
        return "fsdp"
    if "hybrid" in t or "hsdp" in t:
        return "hsdp"
    return "ddp"


def measured_tokens_per_gpu(row: dict[str, str], model: ModelSpec, gpus: int) -> float:
    per_gpu = _float(row, "tokens_per_sec_per_gpu")
    if per_gpu:
        return per_gpu
    total = _float(row, "tokens_per_sec_global")
    if total:
        return total / gpus
    source = row["source"].lower()
    s = model.seq_len
    mfu = _float(row, "mfu_pct")
    if "johannesha" in source and mfu:
        flops_per_token = 6.0 * model.n_params + 12.0 * model.n_layers * model.d_model * s
        return mfu / 100.0 * 312e12 / flops_per_token
    tflops = _float(row, "tflops_per_gpu")
    if "2104.04473" in source and tflops:
        h, l_, v = model.d_model, model.n_layers, model.vocab_size
        per_token = 96.0 * l_ * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l_ * h))
        return tflops * 1e12 / per_token
    raise SkipRowError("no throughput to compare (no tokens/s, MFU or TFLOP/s usable)")


def row_to_case(index: int, row: dict[str, str]) -> RunCase:
    model = map_model(row)
    gpus = _int(row, "num_gpus")
    gpn = _int(row, "gpus_per_node", 8 if gpus >= 8 else gpus)
    cluster = map_cluster(row["gpu_type"], gpn)
    tp, pp, cp = _int(row, "tp", 1), _int(row, "pp", 1), _int(row, "cp", 1)
    seq = model.seq_len
    micro = _int(row, "micro_batch", 1)
    dp = max(1, gpus // (tp * pp * cp))
    if row.get("global_batch_seqs"):
        global_batch = _int(row, "global_batch_seqs")
    elif "johannesha" in row["source"].lower():
        global_batch = HAGEMANN_TOKENS_PER_STEP // seq
    else:
        global_batch = dp * micro * max(1, pp)
    vstages = _int(row, "virtual_pipeline_stages", 1)
    notes = row.get("notes", "").lower()
    precision = (
        "fp8"
        if "fp8" in row.get("precision", "").lower() or "float8" in row.get("precision", "").lower()
        else "bf16"
    )
    try:
        layout = Layout(
            gpus=gpus,
            global_batch=global_batch,
            seq_len=seq,
            sharding=_sharding(row.get("sharding", ""), row["source"]),  # type: ignore[arg-type]
            tp=tp,
            sequence_parallel=(
                "seqpara" in notes or "sequence parallel" in notes or "sp" in notes.split()
            ),
            pp=pp,
            pp_schedule="interleaved" if vstages > 1 else "1f1b",
            virtual_stages=vstages,
            cp=cp,
            micro_batch=micro,
            recompute=_recompute(row.get("activation_checkpointing", "")),  # type: ignore[arg-type]
            precision=precision,  # type: ignore[arg-type]
            attention=_attention(row),  # type: ignore[arg-type]
        )
    except ValidationError:
        raise SkipRowError("layout fields out of range") from None
    errors = validate(layout, model, cluster)
    errors = [e for e in errors if e.field not in ("micro_batch",)]
    if errors:
        raise SkipRowError(f"layout not expressible ({errors[0].field})")
    measured = measured_tokens_per_gpu(row, model, gpus)
    sweep = f"{short_source(row['source'])}|{row['model']}|{gpus}|{seq}"
    return RunCase(index, short_source(row["source"]), sweep, model, cluster, layout, measured)


def load_rows(path: Path | None) -> list[dict[str, str]]:
    if path is None:
        text = resources.files("scalelab").joinpath("data/published_runs.csv").read_text()
    else:
        if not path.is_file():
            raise InputError("data", f"no such file: {path}")
        text = path.read_text()
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise InputError(
            "data", f"CSV lacks the columns {', '.join(missing)} (schema of published_runs.csv)"
        )
    return list(reader)


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


def predict_cases(cases: list[RunCase]) -> np.ndarray:
    """Predicted tokens/s per GPU for each case (grouped by model and cluster for speed)."""
    return predict_cases_with_fit(cases)[0]


def predict_cases_with_fit(cases: list[RunCase]) -> tuple[np.ndarray, np.ndarray]:
    """Predicted tokens/s per GPU and the memory verdict (fits in HBM) for each case."""
    out = np.zeros(len(cases))
    fits = np.zeros(len(cases), dtype=bool)
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, case in enumerate(cases):
        groups[(case.model.model_dump_json(), case.cluster.model_dump_json())].append(i)
    for idx in groups.values():
        first = cases[idx[0]]
        table = LayoutTable.from_layouts([cases[i].layout for i in idx])
        prediction = predict(first.model, first.cluster, table)
        out[idx] = prediction["tokens_per_s_per_gpu"]
        fits[idx] = prediction["fits"]
    return out, fits


def run_validation(data: Path | None = None) -> ValidationReport:
    rows = load_rows(data)
    cases: list[RunCase] = []
    skipped: Counter[str] = Counter()
    for i, row in enumerate(rows):
        try:
            cases.append(row_to_case(i, row))
        except SkipRowError as exc:
            skipped[str(exc)] += 1
    if not cases:
        raise InputError("data", "no row could be interpreted (see skipped reasons with --json)")
    predicted, fits = predict_cases_with_fit(cases)
    measured = np.array([c.measured_tokens_per_s_per_gpu for c in cases])
    ape = np.abs(predicted - measured) / measured
    by_source: dict[str, dict[str, Any]] = {}
    for src in sorted({c.source for c in cases}):
        mask = np.array([c.source == src for c in cases])
        by_source[src] = {
            "rows": int(mask.sum()),
            "mape": float(ape[mask].mean()),
            "bias": float(np.median(predicted[mask] / measured[mask]) - 1.0),
        }
    sweeps: dict[str, list[int]] = defaultdict(list)
    for i, c in enumerate(cases):
        sweeps[c.sweep].append(i)
    rhos = [_spearman(predicted[idx], measured[idx]) for idx in sweeps.values() if len(idx) >= 3]
    rhos = [r for r in rhos if not math.isnan(r)]
    rows_out = [
        {
            "row": c.index,
            "source": c.source,
            "model": c.model.name,
            "gpus": c.layout.gpus,
            "layout": c.layout.model_dump(),
            "measured_tokens_per_s_per_gpu": float(measured[i]),
            "predicted_tokens_per_s_per_gpu": float(predicted[i]),
            "error": float(predicted[i] / measured[i] - 1.0),
            "predicted_fits": bool(fits[i]),
        }
        for i, c in enumerate(cases)
    ]
    return ValidationReport(
        rows_used=len(cases),
        rows_skipped=int(sum(skipped.values())),
        skipped_by_reason=dict(skipped),
        rows_predicted_not_to_fit=int((~fits).sum()),
        mape_tokens_per_gpu=float(ape.mean()),
        within_20_pct=float((ape <= 0.2).mean()),
        median_spearman=float(np.median(rhos)) if rhos else None,
        by_source=by_source,
        rows=rows_out,
    )
