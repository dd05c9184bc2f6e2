"""The generic importer: rows in the raw `published_runs.csv` column layout -> typed `Run`s.

Each row is read as a person would read it, with the written rules of `scalelab.runs.rules` and the
facts of `scalelab.runs.knowledge` (what a named model family, system or framework implies; data
with sources). No rule looks at which source wrote the row. A value the row does not state is
either derived by a stated rule from what the row does say, filled from what the row names (a
model family and size, a system, a framework's documented default), taken from a review sheet (a
CSV of reviewed facts and assumptions, each with its reason, matched on the row's own text), or the
row is skipped with EVERY reason (so that one pass of fixes is enough). Every value that the row
itself does not state is listed in the run's `assumed` field with its basis. What the run chose
(layout degrees, micro-batch, global batch, recompute, precision) is never filled in.

Raw columns read (others are ignored; headers are matched without case, spaces or dashes): source,
model, params, layers, hidden_size, heads, kv_heads, ffn_size, vocab, seq_len, global_batch_seqs,
micro_batch, gpu_type, num_gpus, gpus_per_node, tp, pp, dp, cp, sharding,
activation_checkpointing, precision, virtual_pipeline_stages, tokens_per_sec_global,
tokens_per_sec_per_gpu, tflops_per_gpu, mfu_pct, step_time_s, notes; and, when present (a review
sheet may supply them), framework, source_group, network, attention, sequence_parallel,
pp_schedule, fp8_scaling, norm_kernel, cross_entropy, peak_tflops, flop_formula and the
architecture columns ffn, norm, position, bias, tied_embeddings.
"""

from __future__ import annotations

import contextlib
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
from scalelab.runs.knowledge import StackDefaults, reading_rules
from scalelab.runs.schema import NAMED_TAG, FlopFormula, MeasuredQuantity, Run

# A table must name at least these (its other columns may be missing: each unstated value is then
# a reason its rows are skipped, or a value filled from what the row names).
REQUIRED_COLUMNS = ("model", "gpu_type", "num_gpus")

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
    "layers": "n_layers",
    "hidden_size": "d_model",
    "heads": "n_heads",
}

_ARCH_COLUMNS = ("ffn", "norm", "position", "bias", "tied_embeddings")


# Reading a table -------------------------------------------------------------------------------


def _column_name(header: str) -> str:
    """'Num GPUs ' -> 'num_gpus': headers as a person would export them."""
    return re.sub(r"[\s\-/]+", "_", header.strip().lower()).strip("_")


def read_table(text: str, where: str = "data") -> tuple[list[str], list[dict[str, str]]]:
    """A CSV as a person would export it: a UTF-8 BOM (Excel's "CSV UTF-8"), CRLF line ends,
    commas, semicolons or tabs (sniffed from the header line), quoted cells with line breaks
    (`scalelab.io.csv_records`, the project's one CSV reader), with headers normalised as a
    person writes them ('Num GPUs ' -> 'num_gpus'). A row with more or fewer cells than the
    header is an InputError naming its line."""
    header, records = csv_records(text, where, delimiters=",;\t")
    names = [_column_name(h) for h in header]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InputError(
            where, f"two columns read as {repeated[0]!r} (names differ only in case or spacing)"
        )
    rows = [dict(zip(names, record.values(), strict=True)) for record in records]
    return names, rows


# Review sheet ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReviewEntry:
    """Set raw `column` to `value` on rows matching every condition, where the row leaves it empty
    (or, with `replace`, in place of an unreadable cell)."""

    conditions: tuple[tuple[str, bool, str], ...]  # (column, wanted, regex)
    column: str
    value: str
    kind: str  # "stated" (the source says it elsewhere) or "assumed" (a reviewer's inference)
    reason: str
    replace: bool = False

    def matches(self, raw: dict[str, str]) -> bool:
        return all(
            bool(re.search(regex, raw.get(col, "") or "", re.I)) == wanted
            for col, wanted, regex in self.conditions
        )


def read_review(text: str, where: str = "review") -> list[ReviewEntry]:
    """A review sheet: columns where (`col~regex & col!~regex`), column, value, kind, reason, and
    an optional `replace` (true: the value replaces the row's cell, e.g. an unreadable one)."""
    fieldnames, records = read_table(text, where)
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
        replace = rules.truth(rec.get("replace", "") or "no")
        if replace is None:
            raise InputError(where, f"line {line}: replace must be true or false")
        entries.append(
            ReviewEntry(
                tuple(conds),
                _column_name(rec["column"]),
                rec["value"],
                rec["kind"],
                rec["reason"],
                replace,
            )
        )
    return entries


# One reading -----------------------------------------------------------------------------------


class _BlockedError(Exception):
    """A step needs a value an earlier step could not read (its reason is already recorded)."""


@dataclass
class Reading:
    """How one raw row was read: the run (or every reason it was skipped) and, per field, the rule."""

    row: int
    raw: dict[str, str]
    run: Run | None = None
    reasons: list[str] = field(default_factory=list)
    how: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def skipped(self) -> str | None:
        """All the reasons the row was skipped, joined by '; ' (None when it was read)."""
        return "; ".join(self.reasons) if self.reasons else None

    def explain(self) -> list[str]:
        lines = [f"row {self.row}: {self.raw.get('model', '')} | {self.raw.get('source', '')}"]
        lines += [f"  raw {k} = {v!r}" for k, v in self.raw.items() if v]
        lines += [f"  -> {f} = {v}   [{h}]" for f, v, h in self.how]
        if self.reasons:
            lines.append(f"  SKIPPED ({len(self.reasons)} reasons):")
            lines += [f"    - {reason}" for reason in self.reasons]
        else:
            lines.append("  used")
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
            if entry.column in self.reviewed or not entry.matches(self.raw):
                continue
            if not self.row.get(entry.column) or entry.replace:
                self.row[entry.column] = entry.value
                self.reviewed[entry.column] = entry
        self.how: list[tuple[str, str, str]] = []
        self.assumed: list[str] = []
        self.reasons: list[str] = []
        self.stack: StackDefaults | None = None

    def text(self, col: str) -> str:
        return self.row.get(col, "") or ""

    def source_of(self, col: str) -> str:
        entry = self.reviewed.get(col)
        if entry is None:
            return f"raw {col}"
        was = self.raw.get(col, "")
        replaced = f" in place of {was!r}" if entry.replace and was else ""
        if entry.kind == "assumed":
            text = f"{_FIELD_OF.get(col, col)}: {entry.reason} (review sheet)"
            if text not in self.assumed:
                self.assumed.append(text)
            return f"ASSUMED by the review sheet{replaced}: {entry.reason}"
        return f"stated by the source (review sheet{replaced}): {entry.reason}"

    def note(self, name: str, value: object, how: str) -> None:
        self.how.append((name, str(value), how))

    def assume(self, name: str, value: object, reason: str, named: bool = False) -> None:
        """Record a value the row does not state. `named`: it follows from what the row names
        (a model family and size, a system or part, a framework's default: the reading rules'
        data), tagged so that validate can count those apart from other assumptions."""
        if named:
            reason += f" {NAMED_TAG}"
        self.assumed.append(f"{name}: {reason}")
        self.how.append((name, str(value), f"ASSUMED: {reason}"))

    def problem(self, reason: str) -> None:
        """A reason the row cannot be used; reading goes on to find the others."""
        if reason not in self.reasons:
            self.reasons.append(reason)

    def number(self, col: str, binary: bool = False) -> float | None:
        """The cell as a number; None when empty. An unreadable cell is a problem (and None)."""
        text = self.text(col)
        value = rules.parse_number(text, binary=binary)
        if text and value is None:
            self.problem(f"unreadable {col} ({text[:40]!r})")
            return None
        if value is not None and not math.isfinite(value):
            self.problem(f"{col} is not a finite number ({text[:40]!r})")
            return None
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

    def stated(self, col: str, name: str, what: str, binary: bool = False) -> int | None:
        """A value the row must state: None (and a problem) when it does not."""
        value = self.integer(col, name, binary)
        if value is None or value <= 0:
            if not self.text(col):
                self.problem(f"{what} not stated ({col})")
            elif value is not None:
                self.problem(f"{what} must be positive ({col} = {self.text(col)!r})")
            return None
        return value


def _need(f: dict[str, Any], *names: str) -> None:
    if any(f.get(n) is None for n in names):
        raise _BlockedError


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
    """Source, its group label, the framework that ran the job, the model's name."""
    f["source"] = r.text("source")
    if not f["source"]:
        # Provenance, not a predictor input: a user's own table need not cite itself.
        f["source"] = "(source not stated)"
        r.note("source", f["source"], "no source cell: the table itself")
    group = r.text("source_group")
    f["source_group"] = group or f["source"]
    if f["source_group"]:
        how = r.source_of("source_group") if group else "the source text"
        r.note("source_group", f["source_group"], how)
    f["notes"] = r.text("notes")
    f["model"] = r.text("model") or None
    if f["model"] is None:
        r.problem("model not stated (model)")
    f["stack"] = r.text("framework")
    if f["stack"]:
        r.note("stack", f["stack"], r.source_of("framework"))
    else:
        # The model and source cells name frameworks; notes also name formulas after them
        # ("the Megatron formula"), which says nothing about what ran the job.
        cols = ("model", "source")
        named = reading_rules().framework_named([r.text(c) for c in cols])
        if named is not None:
            f["stack"] = named[0]
            r.note("stack", f["stack"], f"the framework named in the row's {cols[named[1]]} cell")
        else:
            r.note("stack", "(not stated)", "no framework named")
    r.stack = reading_rules().stack(f["stack"]) if f["stack"] else None
    if r.stack is not None:
        r.note("stack defaults", r.stack.stack, r.stack.source)


def _arch_cell(col: str, text: str) -> object | None:
    """An architecture cell ('SwiGLU', 'RMSNorm', 'ALiBi', 'yes'); None when unreadable."""
    t = text.strip().lower()
    if col == "ffn":
        if "swiglu" in t or "geglu" in t or "gated" in t:
            return "swiglu"
        return "gelu" if re.search(r"gelu|relu|mlp", t) else None
    if col == "norm":
        if "rms" in t:
            return "rmsnorm"
        return "layernorm" if re.search(r"layer[\s_-]?norm|\bln\b", t) else None
    if col == "position":
        if re.search(r"rope|rotary|alibi|none", t):
            return "rope"
        return "learned" if re.search(r"learn|absolute", t) else None
    return rules.truth(t)


def _read_architecture(r: _Reader, f: dict[str, Any], family: Any) -> dict[str, object] | None:
    """FFN type, norm, position encoding, biases, tied embeddings: from the row's architecture
    cells (or the review sheet's), else from the model family its name states."""
    arch: dict[str, object] = {}
    for col in _ARCH_COLUMNS:
        cell = r.text(col)
        if not cell:
            continue
        value = _arch_cell(col, cell)
        if value is None:
            r.problem(f"unreadable {col} ({cell[:40]!r})")
            continue
        arch[col] = value
        r.note(col, value, r.source_of(col))
    missing = [c for c in _ARCH_COLUMNS if c not in arch]
    if missing and family is not None and family.architecture is not None:
        given = family.architecture.model_dump()
        for col in missing:
            arch[col] = given[col]
        r.assume(
            ", ".join(missing),
            ", ".join(f"{c}={given[c]}" for c in missing),
            f"the {family.family} family's architecture",
            named=True,
        )
    if missing and (family is None or family.architecture is None):
        if family is None:
            known = ", ".join(fam.family for fam in reading_rules().model_families)
            r.problem(
                f"model family not recognised from the name {f['model']!r} (state "
                f"{', '.join(missing)}, or name a known family: {known})"
            )
        return None
    return arch


def _read_model(r: _Reader, f: dict[str, Any]) -> None:
    """The model's shape and architecture (from its cells, else its named family and size)."""
    _need(f, "model")
    name = f["model"]
    family = reading_rules().family(name)
    if family is not None and family.moe:
        r.problem(
            f"mixture-of-experts model ({family.family}): the dense run reader does not read it"
        )
        return
    if family is not None and family.not_modelled:
        r.problem(f"{family.family}: {family.not_modelled}")
        return
    if family is not None:
        r.note("model family", family.family, family.source)
    arch = _read_architecture(r, f, family)
    size = family.size_named(name) if family is not None else None
    stated_shape = {
        "n_layers": rules.parse_number(r.text("layers")),
        "d_model": rules.parse_number(r.text("hidden_size")),
    }
    if size is not None and any(
        v is not None and (not math.isfinite(v) or round(v) != getattr(size, k))
        for k, v in stated_shape.items()
    ):
        r.note("model size", size.size, "the stated shape is not this size's: size facts unused")
        size = None
    family_label = f"the {family.family} {size.size if size else ''}".rstrip() if family else ""

    def shape(col: str, name_: str, what: str) -> int | None:
        value = r.integer(col, name_)
        if value is not None:
            return value
        if size is not None and not r.text(col):
            value = getattr(size, name_)
            r.assume(name_, value, f"{family_label}'s published shape", named=True)
            return value
        return r.stated(col, name_, what)

    f["n_layers"] = shape("layers", "n_layers", "layers")
    f["d_model"] = shape("hidden_size", "d_model", "hidden size")
    f["n_heads"] = shape("heads", "n_heads", "attention heads")
    kv = r.integer("kv_heads", "n_kv_heads")
    if kv is None and not r.text("kv_heads") and f["n_heads"] is not None:
        if size is not None and size.n_kv_heads is not None:
            kv = size.n_kv_heads
            r.assume("n_kv_heads", kv, f"{family_label}'s published shape", named=True)
        elif family is not None and family.shape.mha:
            kv = f["n_heads"]
            r.assume(
                "n_kv_heads",
                kv,
                f"the {family.family} family uses multi-head attention",
                named=True,
            )
        else:
            kv = f["n_heads"]
            r.assume(
                "n_kv_heads", kv, "no grouped-query attention stated: multi-head (kv heads = heads)"
            )
    f["n_kv_heads"] = kv
    d_ff = r.integer("ffn_size", "d_ff")
    if d_ff is None and not r.text("ffn_size"):
        if size is not None and size.d_ff is not None:
            d_ff = size.d_ff
            r.assume("d_ff", d_ff, f"{family_label}'s published shape", named=True)
        elif family is not None and family.shape.d_ff_per_d_model and f["d_model"]:
            d_ff = family.shape.d_ff_per_d_model * f["d_model"]
            ratio = family.shape.d_ff_per_d_model
            r.assume(
                "d_ff",
                d_ff,
                f"the {family.family} family's FFN width {ratio} x d_model",
                named=True,
            )
        elif arch is not None and arch["ffn"] == "gelu" and f["d_model"]:
            d_ff = 4 * f["d_model"]
            r.assume("d_ff", d_ff, "FFN width not stated: the GPT convention 4 x d_model")
        elif arch is not None:
            r.problem("FFN width not stated (ffn_size; SwiGLU widths vary)")
    f["d_ff"] = d_ff
    vocab = r.integer("vocab", "vocab_size")
    if vocab is None and not r.text("vocab"):
        given = (size.vocab_size if size else None) or (family.shape.vocab_size if family else None)
        if given is not None and family is not None:
            vocab = given
            r.assume("vocab_size", vocab, f"the {family.family} family's vocabulary", named=True)
        else:
            r.problem("vocabulary not stated (vocab)")
    f["vocab_size"] = vocab
    if (
        arch is not None
        and size is not None
        and size.tied_embeddings is not None
        and not r.text("tied_embeddings")
    ):
        arch["tied_embeddings"] = size.tied_embeddings
    f["seq_len"] = r.stated("seq_len", "seq_len", "sequence length", binary=True)
    if arch is None:
        return
    f |= arch
    names = ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "seq_len")
    if any(f.get(n) is None for n in names):
        return
    try:
        _model_of(f)
    except ValidationError:
        r.problem("model shape not consistent (heads, kv heads, hidden size)")


def _model_of(f: dict[str, Any]) -> ModelSpec:
    names = ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "seq_len")
    return ModelSpec(
        name=f["model"],
        **{n: f[n] for n in names},
        **{c: f[c] for c in _ARCH_COLUMNS},
    )


def _read_hardware(r: _Reader, f: dict[str, Any]) -> None:
    """GPU, catalog cluster, node, NVLink domain and network (stated, or the named system's)."""
    f["gpus"] = r.stated("num_gpus", "gpus", "GPU count")
    gpu_text = r.text("gpu_type")
    gpu_read = rules.read_gpu(gpu_text)
    if isinstance(gpu_read, str):
        r.problem(gpu_read + " (gpu_type)")
        return
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
        r.problem(f"no catalog cluster for GPU {gpu} (gpu_type)")
        return
    r.note("cluster", cluster_name, "the catalog cluster of this GPU (family)")
    f["cluster"] = cluster_name
    catalog = load_cluster(cluster_name)
    stated_text = f"{gpu_text}; {r.text('network')}"
    system_text = f"{stated_text}; {r.text('source')}"
    facts = reading_rules().system(system_text, gpu)
    gpn = r.integer("gpus_per_node", "gpus_per_node")
    if gpn is None and not r.text("gpus_per_node"):
        if facts is not None:
            gpn = facts.gpus_per_node
            r.assume("gpus_per_node", gpn, f"{facts.label}: {gpn} GPUs per node", named=True)
        elif f["gpus"] is not None and f["gpus"] == 1:
            gpn = 1
            r.note("gpus_per_node", gpn, "a one-GPU run")
        else:
            r.problem("GPUs per node not stated (gpus_per_node; or name the system or GPU part)")
            return
    if gpn is None:
        return
    f["gpus_per_node"] = gpn
    domain_stated = rules.read_nvlink_domain(system_text)
    if domain_stated:
        f["nvlink_domain"] = domain_stated
        r.note("nvlink_domain", domain_stated, "NVL-N system named")
    elif facts is not None and facts.nvlink_domain:
        f["nvlink_domain"] = facts.nvlink_domain
        r.assume("nvlink_domain", facts.nvlink_domain, f"{facts.label}'s NVLink domain", named=True)
    else:
        f["nvlink_domain"] = gpn
        r.note("nvlink_domain", gpn, "NVSwitch joins the node's GPUs")
    net = rules.read_network(stated_text, gpn) or rules.read_network(r.text("source"), gpn)
    where = r.source_of("network") if r.text("network") else "the row's GPU or source text"
    if (
        net is not None
        and facts is not None
        and facts.system
        and facts.nics_per_node
        and net[2].startswith("one B Gb/s")
    ):
        net = (facts.nics_per_node, net[1], f"{facts.label}: its link count at the stated speed")
    if net is not None:
        nics, gbps, net_rule = net
        r.note("network", f"{nics} x {gbps:g} Gb/s", f"{net_rule}; {where}")
    elif facts is not None and facts.nics_per_node and facts.nic_gbps:
        nics, gbps = facts.nics_per_node, facts.nic_gbps
        r.assume(
            "nics_per_node, nic_gbps",
            f"{nics} x {gbps:g} Gb/s",
            f"{facts.label}'s network links",
            named=True,
        )
    elif f["gpus"] is not None and f["gpus"] <= gpn:
        nics, gbps = catalog.nics_per_node, catalog.nic_gbps
        r.note("network", f"{nics} x {gbps:g} Gb/s", "not stated; single node, so unused")
    else:
        r.problem("network not stated (network; a multi-node run)")
        return
    f["nics_per_node"], f["nic_gbps"] = nics, gbps


def _read_degrees(r: _Reader, f: dict[str, Any]) -> None:
    """Parallel degrees and the micro-batch."""
    f["micro_batch"] = r.stated("micro_batch", "micro_batch", "micro-batch")
    tp = r.stated("tp", "tp", "tensor-parallel degree")
    pp = r.stated("pp", "pp", "pipeline-parallel degree")
    gpus = f.get("gpus")
    if tp is None or pp is None or gpus is None:
        return
    dp = r.integer("dp", "dp")
    cp = r.integer("cp", "cp")
    for name, value in (("dp", dp), ("cp", cp)):
        if value is not None and value <= 0:
            r.problem(f"{name} must be positive ({name} = {r.text(name)!r})")
            return
    if cp is None:
        if dp is not None and tp * pp * dp == gpus:
            cp = 1
            r.note("cp", 1, "derived: tp x pp x dp already equals the GPU count")
        else:
            r.problem("context-parallel degree not stated (cp; or a dp with tp x pp x dp = GPUs)")
            return
    if dp is None:
        dp = gpus // (tp * pp * cp)
        r.note("dp", dp, "derived: GPUs / (tp x pp x cp)")
    if tp * pp * cp * dp != gpus:
        r.problem(f"degrees do not multiply to the GPU count ({tp}x{pp}x{cp}x{dp} != {gpus})")
        return
    f |= {"tp": tp, "pp": pp, "cp": cp, "dp": dp}


def _read_sharding_and_sp(r: _Reader, f: dict[str, Any]) -> None:
    """Data-parallel sharding and sequence parallelism (stated, else the framework's default)."""
    sharding_text = r.text("sharding")
    read = rules.read_sharding(sharding_text)
    stack = r.stack
    if read is not None:
        f["sharding"] = read[0]
        r.note("sharding", read[0], f"{read[1]} ({r.source_of('sharding')} {sharding_text!r})")
    elif sharding_text:
        r.problem(f"unreadable sharding ({sharding_text[:40]!r})")
    elif stack is not None and stack.sharding is not None:
        f["sharding"] = stack.sharding
        r.assume(
            "sharding", stack.sharding, f"no sharding stated: {stack.stack}'s default", named=True
        )
    else:
        r.problem("sharding not stated (sharding)")
    if f.get("sharding") is not None:
        f["reshard_after_forward"] = f["sharding"] != "zero2"
    if f.get("sharding") == "hsdp":
        f["hsdp_shard_size"] = r.integer("hsdp_shard_size", "hsdp_shard_size")
        if f["hsdp_shard_size"] is None:
            r.note("hsdp_shard_size", "node", "not stated: HSDP shards within a node")
    _need(f, "tp")
    tp = f["tp"]
    sp_cell = r.text("sequence_parallel")
    sp: bool | None = rules.truth(sp_cell) if sp_cell else None
    if sp_cell and sp is None:
        r.problem(f"unreadable sequence_parallel ({sp_cell[:40]!r})")
        return
    if sp is not None:
        r.note("sequence_parallel", sp, r.source_of("sequence_parallel"))
    else:
        sp = rules.mention(f["notes"], r"sequence[\s_-]?parallel(?:ism)?\b|\bSP\b")
        if sp is not None:
            r.note("sequence_parallel", sp, "notes (negations honoured; paths ignored)")
        elif tp == 1:
            sp = False
            r.note("sequence_parallel", sp, "tp = 1: sequence parallelism does not apply")
        elif stack is not None and stack.sequence_parallel_with_tp is not None:
            sp = stack.sequence_parallel_with_tp
            r.assume(
                "sequence_parallel", sp, f"not stated: {stack.stack}'s default with TP", named=True
            )
        else:
            r.problem("sequence parallelism not stated (sequence_parallel; tp > 1)")
            return
    if sp and tp == 1:
        sp = False
        r.note("sequence_parallel", sp, "tp = 1: sequence parallelism does not apply")
    f["sequence_parallel"] = sp


def _read_pipeline(r: _Reader, f: dict[str, Any]) -> None:
    """Virtual stages and the pipeline schedule."""
    _need(f, "pp")
    pp = f["pp"]
    vstages = r.integer("virtual_pipeline_stages", "virtual_stages")
    schedule_text = f"{r.text('pp_schedule')} {f['notes']}"
    interleaved = rules.mention(schedule_text, r"interleaved")
    if vstages is None:
        if pp == 1:
            vstages = 1
            r.note("virtual_stages", 1, "pp = 1")
        elif interleaved:
            r.problem(
                "interleaved pipeline without its virtual stage count (virtual_pipeline_stages)"
            )
            return
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
        r.problem("zero-bubble schedule without its virtual stages (virtual_pipeline_stages)")
        return
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
    stack = r.stack
    rec_text = r.text("activation_checkpointing")
    rec = rules.read_recompute(rec_text)
    if rec is None:
        if rec_text:
            r.problem(f"unreadable activation_checkpointing ({rec_text[:40]!r})")
        else:
            r.problem("activation checkpointing not stated (activation_checkpointing)")
    else:
        r.note("recompute", rec[0], f"{rec[1]}; {r.source_of('activation_checkpointing')}")
        f["recompute"] = rec[0]
    precision = rules.read_precision(r.text("precision"), r.text("fp8_scaling"))
    if (
        isinstance(precision, str)
        and precision.startswith("fp8 scaling")
        and stack is not None
        and stack.fp8_scaling is not None
    ):
        precision = rules.read_precision(r.text("precision"), stack.fp8_scaling)
        if not isinstance(precision, str):
            r.assume(
                "precision",
                precision[0],
                f"fp8 scaling not stated: {stack.stack}'s default",
                named=True,
            )
    if isinstance(precision, str):
        cell = r.text("precision")
        r.problem(f"{precision} (precision{' = ' + repr(cell[:40]) if cell else ''})")
    else:
        how = f"{precision[1]}; {r.source_of('precision')}"
        if r.text("fp8_scaling") and precision[0].startswith("fp8"):
            how += "; " + r.source_of("fp8_scaling")
        r.note("precision", precision[0], how)
        f["precision"] = precision[0]
    attention = rules.read_attention(r.text("attention")) if r.text("attention") else None
    gpu = f.get("gpu") or ""
    if attention is not None:
        r.note("attention", attention[0], f"{attention[1]}; {r.source_of('attention')}")
        f["attention"] = attention[0]
    elif (attention := rules.read_attention(notes)) is not None:
        r.note("attention", attention[0], f"{attention[1]} (notes)")
        f["attention"] = attention[0]
    elif (
        stack is not None
        and gpu
        and not reading_rules().has_flash(gpu)
        and (stack.attention_without_flash or stack.attention in ("fused", "math"))
    ):
        kernel = stack.attention_without_flash or stack.attention
        r.assume(
            "attention",
            kernel,
            f"not stated; no FlashAttention kernel on {gpu}: {stack.stack}'s kernel",
            named=True,
        )
        f["attention"] = kernel
    elif stack is not None and stack.attention is not None:
        r.assume(
            "attention", stack.attention, f"not stated: {stack.stack}'s default kernel", named=True
        )
        f["attention"] = stack.attention
    else:
        r.problem("attention kernel not stated (attention, or kernel= in the notes)")
    async_tp = rules.mention(notes, r"async[\s_-]?tp")
    if async_tp is None and rules.mention(notes, r"vanilla tp"):
        async_tp = False
    compiled = rules.mention(notes, r"torch\.compile")
    r.note("async_tp", async_tp, "notes" if async_tp is not None else "not stated")
    r.note("torch_compile", compiled, "notes" if compiled is not None else "not stated")
    f["async_tp"], f["torch_compile"] = async_tp, compiled
    norm = r.text("norm_kernel").lower() or None
    if norm is not None and norm not in ("fused", "eager"):
        r.problem(f"unreadable norm_kernel ({norm!r})")
        norm = None
    elif norm is not None:
        r.note("norm_kernel", norm, r.source_of("norm_kernel"))
    elif rules.mention(notes, r"\brms(?:[\s_-]?norm)?[\s_-]kernel\b|fused[\s_-]rms[\s_-]?norm"):
        norm = "fused"
        r.note("norm_kernel", norm, "notes name a fused RMSNorm kernel")
    elif compiled:
        norm = "fused"
        r.note("norm_kernel", norm, "torch.compile (Inductor) fuses the norm's element-wise ops")
    else:
        r.note("norm_kernel", None, "not stated: the stack's norm kernel")
    f["norm_kernel"] = norm
    loss = r.text("cross_entropy").lower() or None
    if loss is not None and loss not in ("fp32-upcast", "vocab-parallel-fp32", "fused"):
        r.problem(f"unreadable cross_entropy ({loss!r})")
        loss = None
    how = r.source_of("cross_entropy") if loss else "not stated: the stack's cross_entropy"
    r.note("cross_entropy", loss, how)
    f["cross_entropy"] = loss


def _measured_per_gpu(f: dict[str, Any]) -> float | None:
    """Tokens/s per GPU from a measurement that needs no global batch (None otherwise)."""
    q, value, gpus = f.get("measured_quantity"), f.get("measured_value"), f.get("gpus")
    if q is None or value is None or gpus is None:
        return None
    if q == MeasuredQuantity.TOKENS_PER_S_PER_GPU:
        return float(value)
    if q == MeasuredQuantity.TOKENS_PER_S:
        return float(value) / gpus
    if q in (MeasuredQuantity.MFU, MeasuredQuantity.TFLOPS_PER_GPU):
        try:
            model = _model_of(f)
        except (KeyError, ValidationError):
            return None
        per_token = flops_per_token(str(f["flop_formula"]), model, f.get("flop_params"))
        if per_token is None:
            return None
        if q == MeasuredQuantity.MFU:
            return float(value) / 100.0 * float(f["peak_tflops"]) * 1e12 / per_token
        return float(value) * 1e12 / per_token
    return None


def _read_measurement(r: _Reader, f: dict[str, Any]) -> None:
    """What was measured and how it becomes tokens/s per GPU; measured peak memory."""
    notes = f["notes"]
    formula, formula_how = _flop_formula(f"{r.text('flop_formula')} {notes}")
    peak_cell = r.number("peak_tflops")
    peak = peak_cell if peak_cell else _peak_tflops(notes)
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
        if mfu and formula == FlopFormula.NONE:
            r.problem("MFU without its FLOP formula (flop_formula, e.g. 6N+12LHQT)")
        elif mfu:
            r.problem("MFU without the peak it is taken against (peak_tflops)")
        elif tflops:
            r.problem("TFLOP/s without its FLOP formula (flop_formula, e.g. 6N+12LHQT)")
        elif step_time:
            r.problem("step time without the global batch (global_batch_seqs)")
        else:
            r.problem(
                "no throughput to compare (tokens/s per GPU or of the job, step time x global "
                "batch, MFU with its peak or TFLOP/s, each with its FLOP formula)"
            )
        return
    uses_formula = quantity in (MeasuredQuantity.MFU, MeasuredQuantity.TFLOPS_PER_GPU)
    if quantity == MeasuredQuantity.STEP_TIME_S:
        r.note(
            "measured", f"step time {value:g} s", "tokens/s = global batch x sequence / step time"
        )
    elif uses_formula:
        peak_how = f"; peak {peak:g} TFLOP/s" if quantity == MeasuredQuantity.MFU and peak else ""
        r.note("measured", f"{quantity} {value:g}", f"{formula_how}{peak_how}")
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


def _read_global_batch(r: _Reader, f: dict[str, Any]) -> None:
    """The global batch: stated; a stated local batch x dp; or tokens/s x step time / sequence."""
    global_batch = r.integer("global_batch_seqs", "global_batch")
    if global_batch is not None or r.text("global_batch_seqs"):
        f["global_batch"] = global_batch
        return
    local = re.search(r"\blocal batch (\d+)", f["notes"], re.I)
    if local and f.get("dp"):
        global_batch = int(local.group(1)) * f["dp"]
        r.note(
            "global_batch", global_batch, "notes state a local batch per data-parallel rank x dp"
        )
    step_time = rules.parse_number(r.text("step_time_s"))
    per_gpu = _measured_per_gpu(f)
    if global_batch is None and step_time and per_gpu and f.get("seq_len"):
        sequences = per_gpu * f["gpus"] * step_time / f["seq_len"]
        # A step is a whole number of micro-batches on each data-parallel rank.
        per_step = (f.get("micro_batch") or 1) * (f.get("dp") or 1)
        global_batch = max(1, round(sequences / per_step)) * per_step
        basis = (
            "tokens/s"
            if not str(f["measured_quantity"]).startswith(("mfu", "tflops"))
            else (f"tokens/s from the {f['measured_quantity']} and its FLOP formula")
        )
        r.note(
            "global_batch",
            global_batch,
            f"derived: {basis} x step time / sequence length = {sequences:.1f} sequences, to "
            f"whole micro-batches of {per_step} (micro-batch x dp)",
        )
    if global_batch is None:
        r.problem("global batch not stated (global_batch_seqs; or a step time with a throughput)")
    f["global_batch"] = global_batch


_STEPS = (
    _read_identity,
    _read_model,
    _read_hardware,
    _read_degrees,
    _read_sharding_and_sp,
    _read_pipeline,
    _read_kernels,
    _read_measurement,
    _read_global_batch,
)


def _read(r: _Reader) -> Run | None:
    fields: dict[str, Any] = {"row": r.index}
    for step in _STEPS:
        with contextlib.suppress(_BlockedError):  # its reason is already recorded
            step(r, fields)
    if r.reasons:
        return None
    fields.pop("dp", None)
    fields |= {"tokens_per_s_per_gpu": 1.0, "assumed": " | ".join(r.assumed)}
    try:
        draft = Run(**fields)
        target = target_tokens_per_s_per_gpu(draft)
        run = draft.model_copy(update={"tokens_per_s_per_gpu": float(f"{target:.8g}")})
    except (ValidationError, ValueError) as exc:
        r.problem(f"fields out of range ({str(exc).splitlines()[0]})")
        return None
    r.note("tokens_per_s_per_gpu", f"{run.tokens_per_s_per_gpu:g}", "comparison target")
    return run


def read_row(index: int, raw: dict[str, str], review: list[ReviewEntry] | None = None) -> Reading:
    """One raw row read with the rules (and the review sheet): the run, or every reason not."""
    r = _Reader(index, {_column_name(k): v for k, v in raw.items() if k is not None}, review or [])
    reading = Reading(index, r.raw)
    reading.run = _read(r)
    reading.reasons = list(r.reasons)
    reading.how = r.how
    return reading


def read_raw_csv(text: str, where: str = "data") -> list[dict[str, str]]:
    """The rows of a raw run table (any export dialect: see `read_table`)."""
    fieldnames, records = read_table(text, where)
    missing = [c for c in REQUIRED_COLUMNS if c not in fieldnames]
    if missing:
        raise InputError(
            where,
            f"CSV lacks the columns {', '.join(missing)} (the layout of published_runs.csv; "
            f"its header reads {', '.join(fieldnames[:8]) or 'nothing'})",
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


def reason_field(reason: str) -> str:
    """The column a skip reason names ('micro-batch not stated (micro_batch)' -> micro_batch)."""
    m = re.search(r"\(([a-z_]+)[;,)\s]", reason) or re.match(r"unreadable ([a-z_]+)", reason)
    return m.group(1) if m else ""


def skip_counts(readings: list[Reading]) -> dict[str, int]:
    """How many skipped rows give each reason (a row with several reasons counts for each)."""
    counts: dict[str, int] = {}
    for reading in readings:
        for reason in reading.reasons:
            counts[reason] = counts.get(reason, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def write_skipped(readings: list[Reading], path: Path | None = None) -> str:
    """Every reason each skipped row was not read, one line per reason (CSV text): row, model,
    the column to fix, the reason."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["row", "model", "column", "reason"])
    for r in readings:
        for reason in r.reasons:
            writer.writerow([r.row, r.raw.get("model", ""), reason_field(reason), reason])
    text = out.getvalue()
    if path is not None:
        from scalelab.io import atomic_write_text

        atomic_write_text(path, text)
    return text
