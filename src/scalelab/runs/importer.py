"""The generic importer: rows in the raw `published_runs.csv` column layout -> typed `Run`s.

Each row is read with the written rules of `scalelab.runs.rules` (no rule looks at which source
wrote the row). A value the row does not state is either derived by a stated rule from what the row
does say, taken from a review sheet (a CSV of reviewed facts and assumptions, each with its reason,
matched on the row's own text), or the row is skipped with the reason. Every value that the row
itself does not state is listed in the run's `assumed` field.

Raw columns read (others are ignored): source, model, params, layers, hidden_size, heads, kv_heads,
ffn_size, vocab, seq_len, global_batch_seqs, micro_batch, gpu_type, num_gpus, gpus_per_node, tp,
pp, dp, cp, sharding, activation_checkpointing, precision, virtual_pipeline_stages,
tokens_per_sec_global, tokens_per_sec_per_gpu, tflops_per_gpu, mfu_pct, step_time_s, notes; and,
when present (a review sheet may supply them), framework, source_group, network, attention,
sequence_parallel, pp_schedule, fp8_scaling.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from scalelab.config.catalog import cluster_names, load_cluster, load_gpu
from scalelab.config.model import ModelSpec
from scalelab.errors import InputError
from scalelab.io import csv_records, read_user_text
from scalelab.runs import rules
from scalelab.runs.schema import FlopFormula, MeasuredQuantity, Run

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

# Raw column -> the typed field it sets (for naming assumptions).
_FIELD_OF = {
    "framework": "stack",
    "vocab": "vocab_size",
    "global_batch_seqs": "global_batch",
    "gpus_per_node": "gpus_per_node",
    "network": "nics_per_node",
    "activation_checkpointing": "recompute",
    "fp8_scaling": "precision",
    "kv_heads": "n_kv_heads",
    "ffn_size": "d_ff",
}


# Review sheet ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReviewEntry:
    """Set raw `column` to `value` on rows matching every condition, where the row leaves it empty."""

    conditions: tuple[tuple[str, bool, str], ...]  # (column, wanted, regex)
    column: str
    value: str
    kind: str  # "stated" (the source says it elsewhere) or "assumed" (a reviewer's inference)
    reason: str

    def matches(self, raw: dict[str, str]) -> bool:
        return all(
            bool(re.search(regex, raw.get(col, "") or "", re.I)) == wanted
            for col, wanted, regex in self.conditions
        )


def read_review(text: str, where: str = "review") -> list[ReviewEntry]:
    """A review sheet: columns where (`col~regex & col!~regex`), column, value, kind, reason."""
    fieldnames, records = csv_records(text, where)
    need = {"where", "column", "value", "kind", "reason"}
    if not need <= set(fieldnames):
        raise InputError(where, f"review sheet needs the columns {', '.join(sorted(need))}")
    entries = []
    for line, rec in enumerate(records, start=2):
        conds = []
        for part in (rec["where"] or "").split(" & "):
            m = re.match(r"^\s*([a-z_]+)\s*(!?~)\s*(.*?)\s*$", part)
            if not m:
                raise InputError(where, f"line {line}: condition {part!r} is not col~regex")
            conds.append((m.group(1), m.group(2) == "~", m.group(3)))
        if rec["kind"] not in ("stated", "assumed"):
            raise InputError(where, f"line {line}: kind must be stated or assumed")
        entries.append(
            ReviewEntry(tuple(conds), rec["column"], rec["value"], rec["kind"], rec["reason"])
        )
    return entries


# One reading -----------------------------------------------------------------------------------


class _SkipError(Exception):
    """The row cannot be read; the message is the reason counted."""


@dataclass
class Reading:
    """How one raw row was read: the run (or the reason it was skipped) and, per field, the rule."""

    row: int
    raw: dict[str, str]
    run: Run | None = None
    skipped: str | None = None
    how: list[tuple[str, str, str]] = field(default_factory=list)

    def explain(self) -> list[str]:
        lines = [f"row {self.row}: {self.raw.get('model', '')} | {self.raw.get('source', '')}"]
        lines += [f"  raw {k} = {v!r}" for k, v in self.raw.items() if v]
        lines += [f"  -> {f} = {v}   [{h}]" for f, v, h in self.how]
        lines.append(f"  SKIPPED: {self.skipped}" if self.skipped else "  used")
        return lines


@cache
def _cluster_for_gpu() -> dict[str, str]:
    """Catalog GPU -> the catalog cluster built on it (first listed wins)."""
    out: dict[str, str] = {}
    for name in cluster_names():
        out.setdefault(load_cluster(name).gpu.name, name)
    return out


def _family_cluster(gpu: str) -> str | None:
    exact = _cluster_for_gpu().get(gpu)
    if exact:
        return exact
    family = gpu.split("-")[0]
    for g, cluster in _cluster_for_gpu().items():
        if g.split("-")[0] == family:
            return cluster
    return None


class _Reader:
    def __init__(self, index: int, raw: dict[str, str], review: list[ReviewEntry]) -> None:
        self.index = index
        self.raw = {k: (v or "").strip() for k, v in raw.items() if k is not None}
        self.row = dict(self.raw)
        self.reviewed: dict[str, ReviewEntry] = {}
        for entry in review:
            if not self.row.get(entry.column) and entry.matches(self.raw):
                self.row[entry.column] = entry.value
                self.reviewed[entry.column] = entry
        self.how: list[tuple[str, str, str]] = []
        self.assumed: list[str] = []

    def text(self, col: str) -> str:
        return self.row.get(col, "") or ""

    def source_of(self, col: str) -> str:
        entry = self.reviewed.get(col)
        if entry is None:
            return f"raw {col}"
        if entry.kind == "assumed":
            text = f"{_FIELD_OF.get(col, col)}: {entry.reason} (review sheet)"
            if text not in self.assumed:
                self.assumed.append(text)
            return f"ASSUMED by the review sheet: {entry.reason}"
        return f"stated by the source (review sheet): {entry.reason}"

    def note(self, name: str, value: object, how: str) -> None:
        self.how.append((name, str(value), how))

    def assume(self, name: str, value: object, reason: str) -> None:
        self.assumed.append(f"{name}: {reason}")
        self.how.append((name, str(value), f"ASSUMED: {reason}"))

    def number(self, col: str, binary: bool = False) -> float | None:
        text = self.text(col)
        value = rules.parse_number(text, binary=binary)
        if text and value is None:
            raise _SkipError(f"unreadable {col} ({text!r})")
        if value is not None and not math.isfinite(value):
            raise _SkipError(f"{col} is not a finite number ({text[:40]!r})")
        return value

    def integer(self, col: str, name: str, binary: bool = False) -> int | None:
        value = self.number(col, binary)
        if value is None:
            return None
        how = self.source_of(col)
        if rules.is_approximate(self.text(col)):
            how += " (approximate as written)"
        self.note(name, round(value), how)
        return round(value)

    def required(self, col: str, name: str, what: str, binary: bool = False) -> int:
        value = self.integer(col, name, binary)
        if value is None or value <= 0:
            raise _SkipError(f"{what} not stated ({col})")
        return value


def _architecture(r: _Reader, name: str) -> dict[str, object]:
    """Architecture by the model family the name states (LLaMA, MPT, GPT/Nemotron)."""
    if re.search(r"llama", name, re.I):
        arch = dict(
            ffn="swiglu", norm="rmsnorm", position="rope", bias=False, tied_embeddings=False
        )
        rule = "LLaMA family: SwiGLU, RMSNorm, RoPE, no biases, untied embeddings"
    elif re.search(r"\bmpt\b", name, re.I):
        arch = dict(ffn="gelu", norm="layernorm", position="rope", bias=False, tied_embeddings=True)
        rule = "MPT family: GELU MLP, LayerNorm, ALiBi (no position parameters), no biases, tied"
    elif re.search(r"\bgpt|nemotron", name, re.I):
        arch = dict(
            ffn="gelu", norm="layernorm", position="learned", bias=True, tied_embeddings=True
        )
        rule = "GPT family: GELU MLP, LayerNorm, learned positions, biases, tied embeddings"
    else:
        raise _SkipError("model family not recognised from the name (LLaMA, MPT, GPT, Nemotron)")
    r.note("architecture", ", ".join(f"{k}={v}" for k, v in arch.items()), rule)
    return arch


def _flop_formula(notes: str) -> tuple[FlopFormula, str]:
    n = notes.replace(" ", "")
    if re.search(r"96\*?B\*?s\*?l\*?h\^?2", n, re.I):
        return FlopFormula.MEGATRON, "notes name 96·B·s·l·h²·(1+s/6h+V/16lh)"
    if re.search(r"6\*?N_?non[-_]?emb", n, re.I):
        return FlopFormula.PALM_NON_EMBEDDING, "notes name 6·N_non-embedding + 12·l·h·q·t"
    if re.search(r"6\*?N\+12|3\*\(2N\*?s\+4\*?l\*?d\*?s\^?2\)", n, re.I):
        return FlopFormula.PALM, "notes name 6·N + 12·L·H·Q·T"
    return FlopFormula.NONE, ""


def _peak_tflops(notes: str) -> float | None:
    m = re.search(r"/\s*(\d+(?:\.\d+)?)e12", notes, re.I) or re.search(
        r"\bvs\.?\s*(\d+(?:\.\d+)?)\s*TFLOP/?s", notes, re.I
    )
    return float(m.group(1)) if m else None


def flops_per_token(formula: str, model: ModelSpec, flop_params: float | None) -> float | None:
    """FLOPs per token under a source's formula (None for no formula)."""
    s, h, layers, v = model.seq_len, model.d_model, model.n_layers, model.vocab_size
    if formula == FlopFormula.MEGATRON:
        return 96.0 * layers * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * layers * h))
    if formula == FlopFormula.PALM:
        n = flop_params if flop_params else float(model.n_params)
        return 6.0 * n + 12.0 * layers * h * s
    if formula == FlopFormula.PALM_NON_EMBEDDING:
        n = flop_params if flop_params else float(model.n_params - model.input_embedding_params)
        return 6.0 * n + 12.0 * layers * h * s
    return None


def target_tokens_per_s_per_gpu(run: Run) -> float:
    """Tokens/s per GPU from the run's measured quantity (the rule the importer applied)."""
    q, value = run.measured_quantity, run.measured_value
    if q == MeasuredQuantity.TOKENS_PER_S_PER_GPU:
        return value
    if q == MeasuredQuantity.TOKENS_PER_S:
        return value / run.gpus
    if q == MeasuredQuantity.STEP_TIME_S:
        return run.global_batch * run.seq_len / value / run.gpus
    per_token = flops_per_token(str(run.flop_formula), run.model_spec(), run.flop_params)
    if per_token is None:
        raise ValueError("MFU or TFLOP/s without a FLOP formula")
    if q == MeasuredQuantity.MFU:
        if run.peak_tflops is None:
            raise ValueError("MFU without the peak it is taken against")
        return value / 100.0 * run.peak_tflops * 1e12 / per_token
    return value * 1e12 / per_token


def _read_identity(r: _Reader, f: dict[str, Any]) -> None:
    """Source, its group label, the stack that ran the job, the model's name."""
    f["source"] = r.text("source")
    if not f["source"]:
        raise _SkipError("source not stated")
    group = r.text("source_group")
    f["source_group"] = group or f["source"]
    r.note(
        "source_group",
        f["source_group"],
        r.source_of("source_group") if group else "the source text",
    )
    f["stack"] = r.text("framework")
    r.note(
        "stack",
        f["stack"] or "(not stated)",
        r.source_of("framework") if f["stack"] else "no framework stated",
    )
    f["notes"] = r.text("notes")
    f["model"] = r.text("model")
    if not f["model"]:
        raise _SkipError("model not stated")


def _read_model(r: _Reader, f: dict[str, Any]) -> None:
    """The model's shape and architecture (family from its name)."""
    f["n_layers"] = r.required("layers", "n_layers", "model shape")
    f["d_model"] = r.required("hidden_size", "d_model", "model shape")
    f["n_heads"] = r.required("heads", "n_heads", "model shape")
    arch = _architecture(r, f["model"])
    f |= arch
    kv = r.integer("kv_heads", "n_kv_heads")
    if kv is None:
        kv = f["n_heads"]
        r.assume(
            "n_kv_heads", kv, "no grouped-query attention stated: multi-head (kv heads = heads)"
        )
    f["n_kv_heads"] = kv
    d_ff = r.integer("ffn_size", "d_ff")
    if d_ff is None:
        if arch["ffn"] == "swiglu":
            raise _SkipError("FFN width not stated (SwiGLU widths vary)")
        d_ff = 4 * f["d_model"]
        r.assume("d_ff", d_ff, "FFN width not stated: the GPT convention 4 x d_model")
    f["d_ff"] = d_ff
    f["vocab_size"] = r.integer("vocab", "vocab_size")
    if f["vocab_size"] is None:
        raise _SkipError("vocabulary not stated")
    f["seq_len"] = r.required("seq_len", "seq_len", "sequence length", binary=True)
    names = (
        "model",
        "n_layers",
        "d_model",
        "n_heads",
        "n_kv_heads",
        "d_ff",
        "vocab_size",
        "seq_len",
    )
    try:
        ModelSpec(**{("name" if n == "model" else n): f[n] for n in names}, **arch)  # type: ignore[arg-type]
    except ValidationError:
        raise _SkipError("model shape not consistent (heads, kv heads, hidden size)") from None


def _read_hardware(r: _Reader, f: dict[str, Any]) -> None:
    """GPU, catalog cluster, node, NVLink domain and network."""
    gpu_text = r.text("gpu_type")
    gpu_read = rules.read_gpu(gpu_text)
    if isinstance(gpu_read, str):
        raise _SkipError(gpu_read)
    gpu, gib, gpu_rule = gpu_read
    r.note("gpu", gpu, gpu_rule)
    f["gpu"] = gpu
    f["gpu_memory_gib"] = gib if gib is not None else load_gpu(gpu).hbm_gib
    r.note(
        "gpu_memory_gib",
        f["gpu_memory_gib"],
        "stated in the GPU name" if gib else "catalog (not stated)",
    )
    cluster_name = _family_cluster(gpu)
    if cluster_name is None:
        raise _SkipError(f"no catalog cluster for GPU {gpu}")
    r.note("cluster", cluster_name, "the catalog cluster of this GPU (family)")
    f["cluster"] = cluster_name
    catalog = load_cluster(cluster_name)
    gpus = f["gpus"] = r.required("num_gpus", "gpus", "GPU count")
    system_text = f"{gpu_text}; {r.text('network')}"
    dgx = rules.read_dgx(system_text)
    domain_stated = rules.read_nvlink_domain(system_text)
    gpn = r.integer("gpus_per_node", "gpus_per_node")
    if gpn is None:
        if dgx or domain_stated:
            gpn = catalog.gpus_per_node
            r.note("gpus_per_node", gpn, "a named DGX/HGX/NVL system: its catalog node")
        else:
            raise _SkipError("GPUs per node not stated")
    f["gpus_per_node"] = gpn
    f["nvlink_domain"] = domain_stated or gpn
    r.note(
        "nvlink_domain",
        f["nvlink_domain"],
        "NVL-N system named" if domain_stated else "NVSwitch joins the node's GPUs",
    )
    net = rules.read_network(system_text, gpn)
    if net is not None and dgx and net[2].startswith("one B Gb/s"):
        net = (
            catalog.nics_per_node,
            net[1],
            f"DGX {dgx} node: catalog link count at the stated speed",
        )
    if net is None and dgx:
        net = (catalog.nics_per_node, catalog.nic_gbps, f"DGX {dgx} node (catalog cluster)")
    if net is None:
        if gpus <= gpn:
            net = (catalog.nics_per_node, catalog.nic_gbps, "not stated; single node, so unused")
        else:
            raise _SkipError("network not stated (multi-node run)")
    nics, gbps, net_rule = net
    if r.text("network"):
        net_rule += "; " + r.source_of("network")
    r.note("network", f"{nics} x {gbps:g} Gb/s", net_rule)
    f["nics_per_node"], f["nic_gbps"] = nics, gbps


def _read_degrees_and_batch(r: _Reader, f: dict[str, Any]) -> None:
    """Parallel degrees, micro-batch and global batch."""
    gpus, notes = f["gpus"], f["notes"]
    tp = r.integer("tp", "tp")
    pp = r.integer("pp", "pp")
    if tp is None or pp is None:
        raise _SkipError("layout not stated (tp and pp)")
    dp = r.integer("dp", "dp")
    cp = r.integer("cp", "cp")
    if cp is None:
        if dp is not None and tp * pp * dp == gpus:
            cp = 1
            r.note("cp", 1, "derived: tp x pp x dp already equals the GPU count")
        else:
            raise _SkipError("layout not stated (cp)")
    if dp is None:
        dp = gpus // (tp * pp * cp)
        r.note("dp", dp, "derived: GPUs / (tp x pp x cp)")
    if tp * pp * cp * dp != gpus:
        raise _SkipError(
            f"degrees do not multiply to the GPU count ({tp}x{pp}x{cp}x{dp} != {gpus})"
        )
    f |= {"tp": tp, "pp": pp, "cp": cp}
    f["micro_batch"] = r.integer("micro_batch", "micro_batch")
    if f["micro_batch"] is None:
        raise _SkipError("micro-batch not stated")
    global_batch = r.integer("global_batch_seqs", "global_batch")
    local = re.search(r"\blocal batch (\d+)", notes, re.I)
    step_time = r.number("step_time_s")
    per_gpu = r.number("tokens_per_sec_per_gpu")
    total = r.number("tokens_per_sec_global")
    if global_batch is None and local:
        global_batch = int(local.group(1)) * dp
        r.note(
            "global_batch", global_batch, "notes state a local batch per data-parallel rank x dp"
        )
    if global_batch is None and step_time and (per_gpu or total):
        tokens_per_s = total or (per_gpu or 0.0) * gpus
        global_batch = max(1, round(tokens_per_s * step_time / f["seq_len"]))
        r.note("global_batch", global_batch, "derived: tokens/s x step time / sequence length")
    if global_batch is None:
        raise _SkipError("global batch not stated")
    f["global_batch"] = global_batch


def _read_sharding_and_sp(r: _Reader, f: dict[str, Any]) -> None:
    """Data-parallel sharding (with the Megatron stack rule) and sequence parallelism."""
    sharding_text = r.text("sharding")
    read = rules.read_sharding(sharding_text)
    if read is None and rules.mention(f["stack"], r"megatron"):
        sharding = "zero1"
        r.assume(
            "sharding",
            sharding,
            "no sharding stated; the stack is Megatron-based: distributed optimizer",
        )
    elif read is None:
        raise _SkipError("sharding not stated")
    else:
        sharding = read[0]
        r.note("sharding", sharding, f"{read[1]} (raw {sharding_text!r})")
    f["sharding"] = sharding
    f["reshard_after_forward"] = sharding != "zero2"
    tp = f["tp"]
    sp_cell = r.text("sequence_parallel")
    sp: bool | None = rules.truth(sp_cell) if sp_cell else None
    if sp is not None:
        r.note("sequence_parallel", sp, r.source_of("sequence_parallel"))
    else:
        sp = rules.mention(f["notes"], r"sequence[\s_-]?parallel(?:ism)?\b|\bSP\b")
        if sp is not None:
            r.note("sequence_parallel", sp, "notes (negations honoured; paths ignored)")
        elif tp == 1:
            sp = False
            r.note("sequence_parallel", sp, "tp = 1: sequence parallelism does not apply")
        else:
            raise _SkipError("sequence parallelism not stated (tp > 1)")
    if sp and tp == 1:
        sp = False
        r.note("sequence_parallel", sp, "tp = 1: sequence parallelism does not apply")
    f["sequence_parallel"] = sp


def _read_pipeline(r: _Reader, f: dict[str, Any]) -> None:
    """Virtual stages and the pipeline schedule."""
    pp = f["pp"]
    vstages = r.integer("virtual_pipeline_stages", "virtual_stages")
    schedule_text = f"{r.text('pp_schedule')} {f['notes']}"
    interleaved = rules.mention(schedule_text, r"interleaved")
    if vstages is None:
        if pp == 1:
            vstages = 1
            r.note("virtual_stages", 1, "pp = 1")
        elif interleaved:
            raise _SkipError("interleaved pipeline without its virtual stage count")
        else:
            vstages = 1
            r.assume("virtual_stages", 1, "not stated: one stage per rank (non-interleaved)")
    if vstages > 1 or interleaved:
        schedule = "interleaved"
        r.note("pp_schedule", schedule, "virtual stages > 1 or 'interleaved' stated")
    elif rules.mention(schedule_text, r"\bgpipe\b"):
        schedule = "gpipe"
        r.note("pp_schedule", schedule, "GPipe stated")
    elif rules.mention(schedule_text, r"\bzbv\b|zero[\s_-]bubble"):
        raise _SkipError("zero-bubble schedule without its virtual stages")
    elif pp == 1 or rules.mention(schedule_text, r"\b1f1b\b"):
        schedule = "1f1b"
        r.note("pp_schedule", schedule, "pp = 1" if pp == 1 else "1F1B stated")
    else:
        schedule = "1f1b"
        r.assume("pp_schedule", schedule, "pipeline schedule not stated: 1F1B (PipeDream-flush)")
    f["virtual_stages"], f["pp_schedule"] = vstages, schedule


def _read_kernels(r: _Reader, f: dict[str, Any]) -> None:
    """Recompute, precision recipe, attention kernel, and overlap/compiler options."""
    notes = f["notes"]
    rec = rules.read_recompute(r.text("activation_checkpointing"))
    if rec is None:
        raise _SkipError("activation checkpointing not stated")
    r.note("recompute", rec[0], f"{rec[1]}; {r.source_of('activation_checkpointing')}")
    f["recompute"] = rec[0]
    precision = rules.read_precision(r.text("precision"), r.text("fp8_scaling"))
    if isinstance(precision, str):
        raise _SkipError(precision)
    how = precision[1]
    if r.text("fp8_scaling") and precision[0].startswith("fp8"):
        how += "; " + r.source_of("fp8_scaling")
    r.note("precision", precision[0], how)
    f["precision"] = precision[0]
    attention = rules.read_attention(r.text("attention")) if r.text("attention") else None
    if attention is not None:
        r.note("attention", attention[0], f"{attention[1]}; {r.source_of('attention')}")
    else:
        attention = rules.read_attention(notes)
        if attention is None:
            raise _SkipError("attention kernel not stated")
        r.note("attention", attention[0], f"{attention[1]} (notes)")
    f["attention"] = attention[0]
    async_tp = rules.mention(notes, r"async[\s_-]?tp")
    if async_tp is None and rules.mention(notes, r"vanilla tp"):
        async_tp = False
    compiled = rules.mention(notes, r"torch\.compile")
    r.note("async_tp", async_tp, "notes" if async_tp is not None else "not stated")
    r.note("torch_compile", compiled, "notes" if compiled is not None else "not stated")
    f["async_tp"], f["torch_compile"] = async_tp, compiled
    norm = r.text("norm_kernel").lower() or None
    if norm is not None and norm not in ("fused", "eager"):
        raise _SkipError(f"unreadable norm_kernel ({norm!r})")
    if norm is not None:
        r.note("norm_kernel", norm, r.source_of("norm_kernel"))
    elif compiled:
        norm = "fused"
        r.note("norm_kernel", norm, "torch.compile (Inductor) fuses the norm's element-wise ops")
    else:
        r.note("norm_kernel", None, "not stated: the stack's norm kernel")
    f["norm_kernel"] = norm
    loss = r.text("cross_entropy").lower() or None
    if loss is not None and loss not in ("fp32-upcast", "vocab-parallel-fp32", "fused"):
        raise _SkipError(f"unreadable cross_entropy ({loss!r})")
    how = r.source_of("cross_entropy") if loss else "not stated: the stack's cross_entropy"
    r.note("cross_entropy", loss, how)
    f["cross_entropy"] = loss


def _read_measurement(r: _Reader, f: dict[str, Any]) -> None:
    """What was measured and how it becomes tokens/s per GPU; measured peak memory."""
    notes = f["notes"]
    formula, formula_how = _flop_formula(notes)
    peak = _peak_tflops(notes)
    per_gpu = r.number("tokens_per_sec_per_gpu")
    total = r.number("tokens_per_sec_global")
    step_time = r.number("step_time_s")
    mfu = r.number("mfu_pct")
    tflops = r.number("tflops_per_gpu")
    quantity: MeasuredQuantity
    if per_gpu:
        quantity, value = MeasuredQuantity.TOKENS_PER_S_PER_GPU, per_gpu
    elif total:
        quantity, value = MeasuredQuantity.TOKENS_PER_S, total
    elif step_time and r.text("global_batch_seqs"):
        quantity, value = MeasuredQuantity.STEP_TIME_S, step_time
    elif mfu and formula != FlopFormula.NONE and peak:
        quantity, value = MeasuredQuantity.MFU, mfu
    elif tflops and formula != FlopFormula.NONE:
        quantity, value = MeasuredQuantity.TFLOPS_PER_GPU, tflops
    else:
        raise _SkipError(
            "no throughput to compare (tokens/s, step time x global batch, MFU or TFLOP/s with its formula)"
        )
    uses_formula = quantity in (MeasuredQuantity.MFU, MeasuredQuantity.TFLOPS_PER_GPU)
    if quantity == MeasuredQuantity.STEP_TIME_S:
        r.note(
            "measured", f"step time {value:g} s", "tokens/s = global batch x sequence / step time"
        )
    elif uses_formula:
        r.note("measured", f"{quantity} {value:g}", f"{formula_how}; peak {peak} TFLOP/s")
    else:
        r.note("measured", f"{quantity} {value:g}", "stated")
    f["measured_quantity"], f["measured_value"] = quantity, value
    f["flop_formula"] = formula if uses_formula else FlopFormula.NONE
    stated_params = rules.parse_number(r.text("params"))
    f["flop_params"] = stated_params if uses_formula and formula != FlopFormula.MEGATRON else None
    f["peak_tflops"] = peak if quantity == MeasuredQuantity.MFU else None
    mem = re.search(r"peak mem(?:ory)?\s*([\d.]+)\s*(GiB|GB)", notes, re.I)
    f["measured_peak_memory_gib"] = None
    if mem:
        gib = float(mem.group(1)) * (1.0 if mem.group(2) == "GiB" else 1e9 / 2**30)
        f["measured_peak_memory_gib"] = round(gib, 3)
        r.note("measured_peak_memory_gib", round(gib, 3), "notes: 'peak mem'")


def _read(r: _Reader) -> Run:
    fields: dict[str, Any] = {"row": r.index}
    for step in (
        _read_identity,
        _read_model,
        _read_hardware,
        _read_degrees_and_batch,
        _read_sharding_and_sp,
        _read_pipeline,
        _read_kernels,
        _read_measurement,
    ):
        step(r, fields)
    fields |= {"tokens_per_s_per_gpu": 1.0, "assumed": " | ".join(r.assumed)}
    try:
        draft = Run(**fields)
        target = target_tokens_per_s_per_gpu(draft)
        run = draft.model_copy(update={"tokens_per_s_per_gpu": float(f"{target:.8g}")})
    except (ValidationError, ValueError) as exc:
        raise _SkipError(f"fields out of range ({str(exc).splitlines()[0]})") from None
    r.note("tokens_per_s_per_gpu", f"{run.tokens_per_s_per_gpu:g}", "comparison target")
    return run


def read_row(index: int, raw: dict[str, str], review: list[ReviewEntry] | None = None) -> Reading:
    r = _Reader(index, raw, review or [])
    reading = Reading(index, r.raw)
    try:
        reading.run = _read(r)
    except _SkipError as exc:
        reading.skipped = str(exc)
    reading.how = r.how
    return reading


def read_raw_csv(text: str, where: str = "data") -> list[dict[str, str]]:
    fieldnames, records = csv_records(text, where)
    missing = [c for c in REQUIRED_COLUMNS if c not in fieldnames]
    if missing:
        raise InputError(
            where, f"CSV lacks the columns {', '.join(missing)} (schema of published_runs.csv)"
        )
    return records


def import_rows(
    rows: list[dict[str, str]], review: list[ReviewEntry] | None = None
) -> list[Reading]:
    return [read_row(i, row, review) for i, row in enumerate(rows)]


def import_file(raw_path: Path, review_path: Path | None = None) -> list[Reading]:
    """Read a raw CSV (and an optional review sheet) into readings, one per row."""
    for path, what in ((raw_path, "data"), (review_path, "review")):
        if path is not None and not path.is_file():
            raise InputError(what, f"no such file: {path}")
    review = read_review(read_user_text("review", review_path)) if review_path else []
    return import_rows(read_raw_csv(read_user_text("data", raw_path)), review)


def write_skipped(readings: list[Reading], path: Path | None = None) -> str:
    """The rows that were not read, with the model and the reason (CSV text)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["row", "model", "reason"])
    for r in readings:
        if r.skipped:
            writer.writerow([r.row, r.raw.get("model", ""), r.skipped])
    text = out.getvalue()
    if path is not None:
        from scalelab.io import atomic_write_text

        atomic_write_text(path, text)
    return text
