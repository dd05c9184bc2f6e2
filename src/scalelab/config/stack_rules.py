"""Combination rules of a software stack, as data: what a framework refuses or runs wrongly.

A stack profile (catalog/stacks.yaml) lists its refusals under `refuses`; each is a `StackRule`:
the layout field it names, a condition over named terms (`when`, all must hold), the message
(`reason`, with `{placeholders}` of the layout's and model's values) and the upstream issue or
document (`source`). The terms are the `Layout` fields plus a few derived quantities (`TERMS`),
evaluated over numpy arrays of layouts so that search drops refused layouts without a Python
loop. Code never branches on a stack's name: a stack refuses what its data says.

torchtitan's refusals are scalelab's own harness's (`scalelab bench` checks a layout against the
`torchtitan` profile: measure/config.py), so a layout search ranks for `torchtitan` is one bench
runs. Torch-free.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from scalelab.config.layout import Layout, LayoutTable
from scalelab.config.model import ModelSpec
from scalelab.config.options import OPTIONS, Sharding

Term = Callable[[LayoutTable, ModelSpec, int | None], np.ndarray]


def data_parallel_degrees(layout: Layout, gpus_per_node: int) -> tuple[int, int]:
    """(dp_replicate, dp_shard) of the harness's (and torchtitan's) mesh: DDP and ZeRO-1
    replicate over dp, FSDP and ZeRO-2 shard over dp, HSDP shards over `hsdp_shard_size` ranks
    (default: a node's ranks not taken by TP and CP) and replicates over the rest."""
    dp = layout.dp
    if layout.sharding in (Sharding.DDP, Sharding.ZERO1):
        return dp, 1
    if layout.sharding == Sharding.HSDP:
        shard = layout.dp_shard_on(gpus_per_node)
        return dp // shard, shard
    return 1, dp


def ep_problem(dp_replicate: int, dp_shard: int, cp: int, tp: int, ep: int, etp: int) -> str | None:
    """Why an expert-parallel mesh cannot be built as torchtitan builds it
    (ParallelDims._build_mesh_with_ep), or None. EP takes cp whole (and tp whole when
    expert_tp is 1), then dp_shard_in_ep = ep / (cp [x tp]) ranks of the FSDP shard group; the
    rest of that group (dp_shard_mod_ep) holds the same experts."""
    if ep == 1:
        return None
    if dp_replicate > 1 and dp_shard == 1:
        return (
            f"ep ({ep}) with replicated data parallelism (ddp, zero1, or hsdp sharding over 1 "
            "rank): the experts' gradients would be averaged over ranks holding different "
            "experts; use fsdp, zero2, or hsdp with a shard group"
        )
    inner = cp * (tp if etp == 1 else 1)
    extra = f" x tp ({tp})" if etp == 1 else ""
    if ep % inner:
        return (
            f"ep ({ep}) must be a multiple of cp ({cp}){extra}: EP takes those ranks whole and "
            "then part of the FSDP shard group (torchtitan's rule)"
        )
    if dp_shard % (ep // inner):
        return (
            f"ep ({ep}) must divide the FSDP shard group ({dp_shard}) x cp ({cp}){extra}: EP "
            "borrows those ranks (torchtitan's rule)"
        )
    return None


def _mesh_degrees(t: LayoutTable, gpn: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dp_replicate, dp_shard, known) per layout, as `data_parallel_degrees`; `known` is False
    for HSDP with the default group when the node size is unknown."""
    dp = t.dp
    replicated = t.is_ddp | (t.sharding == Sharding.ZERO1.code)
    group = t.dp_shard_for(gpn or 1)
    shard = np.where(replicated, 1, np.where(t.is_hsdp, np.maximum(group, 1), dp))
    replicate = np.maximum(1, dp // np.maximum(shard, 1))
    known = ~(t.is_hsdp & (t.hsdp_shard_size == 0)) | (gpn is not None)
    return replicate, shard, np.asarray(known)


def _ep_mesh_unbuildable(t: LayoutTable, model: ModelSpec, gpn: int | None) -> np.ndarray:
    """`ep_problem` over arrays (False where the HSDP group is unknown: the trainer checks it)."""
    replicate, shard, known = _mesh_degrees(t, gpn)
    inner = t.cp * np.where(t.expert_tp == 1, t.tp, 1)
    in_ep = np.maximum(1, t.ep // np.maximum(inner, 1))
    bad = ((replicate > 1) & (shard == 1)) | (t.ep % inner != 0) | (shard % in_ep != 0)
    return np.asarray((t.ep > 1) & bad & known)


def _column(name: str) -> Term:
    return lambda t, m, g: np.asarray(getattr(t, name))


# The terms a rule's `when` may test: every `Layout` field, and these derived quantities.
TERMS: dict[str, Term] = {
    **{name: _column(name) for name in LayoutTable.column_names()},
    "dp": lambda t, m, g: t.dp,
    "dp_x_cp": lambda t, m, g: t.dp * t.cp,
    "n_microbatches": lambda t, m, g: t.n_microbatches,
    "model_is_moe": lambda t, m, g: np.full(len(t), m.is_moe),
    "vocab_mod_tp": lambda t, m, g: m.vocab_size % t.tp,
    "tp_minus_kv_heads": lambda t, m, g: t.tp - m.n_kv_heads,
    "layers_mod_stages": lambda t, m, g: m.n_layers % (t.pp * t.virtual_stages),
    "ep_mesh_unbuildable": _ep_mesh_unbuildable,
}

_COMPARISON = re.compile(r"^(==|!=|>=|<=|>|<)\s*(-?\d+)$")
_OPERATORS = {
    "==": operator.eq,
    "!=": operator.ne,
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}


class StackRule(BaseModel):
    """One combination a framework refuses: all conditions of `when` hold -> refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    field: str = Field(description="the layout field (flag) the refusal names")
    summary: str = Field(description="a few words for search's count of refused layouts")
    when: dict[str, list[str] | str | bool] = Field(
        description="term -> condition: a list of option names (sharding: [ddp, zero1]), a "
        "comparison ('>1', '!=2', '==0') or true/false; every condition must hold"
    )
    reason: str = Field(
        description="the message; {name} placeholders take the layout's fields, dp, and the "
        "model's name, vocab_size and n_layers ({ep_problem}: the expert mesh's problem)"
    )
    source: str = Field(description="the upstream issue, document or measurement")

    @field_validator("when")
    @classmethod
    def _known_terms(cls, when: dict[str, Any]) -> dict[str, Any]:
        for term, condition in when.items():
            if term not in TERMS:
                raise ValueError(f"unknown term '{term}'; terms: {', '.join(TERMS)}")
            if isinstance(condition, list):
                option = OPTIONS.get(term)
                if option is None:
                    raise ValueError(f"'{term}' is not an option: give a comparison")
                unknown = [c for c in condition if c not in option.names()]
                if unknown:
                    raise ValueError(f"{term}: '{unknown[0]}' is not one of {option.names()}")
            elif isinstance(condition, str) and not _COMPARISON.match(condition):
                raise ValueError(f"{term}: '{condition}' is not a comparison like '>1'")
        return when


def _holds(term: str, condition: list[str] | str | bool, values: np.ndarray) -> np.ndarray:
    if isinstance(condition, bool):
        return np.asarray(values.astype(bool) == condition)
    if isinstance(condition, list):
        option = OPTIONS[term]
        return np.isin(values, [option(name).code for name in condition])
    match = _COMPARISON.match(condition)
    assert match is not None  # validated
    return np.asarray(_OPERATORS[match.group(1)](values, int(match.group(2))))


def rule_masks(
    rules: Sequence[StackRule], table: LayoutTable, model: ModelSpec, gpus_per_node: int | None
) -> list[np.ndarray]:
    """For each rule, the layouts of `table` it refuses."""
    cache: dict[str, np.ndarray] = {}
    masks = []
    for rule in rules:
        bad = np.ones(len(table), dtype=bool)
        for term, condition in rule.when.items():
            if term not in cache:
                cache[term] = np.asarray(TERMS[term](table, model, gpus_per_node))
            bad &= _holds(term, condition, cache[term])
        masks.append(bad)
    return masks


def rule_message(
    rule: StackRule, layout: Layout, model: ModelSpec, gpus_per_node: int | None
) -> str:
    """The rule's reason for one layout, its placeholders filled, and its source."""
    values: dict[str, Any] = dict(layout.model_dump())
    values |= {"dp": layout.dp, "model": model.name, "vocab_size": model.vocab_size}
    values |= {"n_layers": model.n_layers, "n_kv_heads": model.n_kv_heads}
    if "{ep_problem}" in rule.reason:
        replicate, shard = data_parallel_degrees(layout, gpus_per_node or layout.gpus)
        problem = ep_problem(replicate, shard, layout.cp, layout.tp, layout.ep, layout.expert_tp)
        values["ep_problem"] = problem or ""
    return f"{rule.reason.format_map(values)} ({rule.source})"
