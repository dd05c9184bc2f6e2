"""Search: enumerate every layout of a job, drop the invalid and the ones that do not fit, rank.

The space (for G GPUs): every TP, PP and CP degree that divides G; DDP, ZeRO-1, ZeRO-2, FSDP and
HSDP with every shard-group size that divides the data-parallel degree; pipeline schedules with
their virtual stages; power-of-two micro-batches; recompute none/selective/full; FSDP
reshard-after-forward on/off; TP with and without sequence parallelism; for a MoE model, every
expert-parallel degree the rules allow (a divisor of n_experts and of the dp x cp x tp/expert_tp
ranks it borrows) with expert_tp 1 or tp. Options that mean nothing
for a layout (a schedule without PP, SP without TP) are not enumerated twice. The whole space is
built, checked and predicted with numpy arrays, so it takes about a second for thousands of GPUs.
"""

from __future__ import annotations

import itertools
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scalelab.config.catalog import load_stack
from scalelab.config.hardware import ClusterSpec
from scalelab.config.layout import (
    MAX_GLOBAL_BATCH,
    MAX_GPUS,
    MAX_SEQ_LEN,
    Layout,
    LayoutTable,
    violation_masks,
)
from scalelab.config.model import ModelSpec
from scalelab.config.options import (
    AttentionKernel,
    PipelineSchedule,
    Precision,
    Recompute,
    Sharding,
)
from scalelab.config.stack import StackSpec
from scalelab.errors import InputError
from scalelab.perf.predict import Prediction, predict

OBJECTIVES = ("throughput", "tokens-per-joule", "mfu")
_OBJECTIVE_FIELD = {
    "throughput": "tokens_per_s",
    "tokens-per-joule": "tokens_per_j",
    "mfu": "mfu",
}
# How many of an answer's equivalent layouts each top row lists (their count is always given).
MAX_EQUIVALENT_LISTED = 8
_SCHEDULE_OPTIONS = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 4), ("zbv", 2))


@dataclass
class Constraints:
    """Allowed values per knob; None means every value the space offers."""

    tp: list[int] | None = None
    pp: list[int] | None = None
    cp: list[int] | None = None
    sharding: list[str] | None = None
    hsdp_shard_size: list[int] | None = None
    pp_schedule: list[str] | None = None
    micro_batch: list[int] | None = None
    recompute: list[str] | None = None
    precision: str = "bf16"
    attention: str = "flash"
    sequence_parallel: list[bool] | None = None
    reshard_after_forward: list[bool] | None = None
    ep: list[int] | None = None
    expert_tp: list[int] | None = None


@dataclass
class SearchResult:
    model: str
    cluster: str
    stack: str
    gpus: int
    global_batch: int
    seq_len: int
    objective: str
    considered: int
    invalid: int
    invalid_by_reason: dict[str, int]
    not_fitting: int
    ranked: int
    distinct_answers: int
    tie_breaks: list[str]
    top: list[dict[str, Any]]
    baseline: dict[str, Any] | None
    explanation: list[str]
    pareto: list[dict[str, Any]]
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "extra"} | self.extra


def _divisors(n: int) -> list[int]:
    """The divisors of n, sorted, from its prime factorisation (fast for any n up to MAX_GPUS)."""
    primes: dict[int, int] = {}
    rest, p = n, 2
    while p * p <= rest:
        while rest % p == 0:
            primes[p] = primes.get(p, 0) + 1
            rest //= p
        p += 1
    if rest > 1:
        primes[rest] = primes.get(rest, 0) + 1
    divisors = [1]
    for prime, power in primes.items():
        divisors = [d * prime**k for d in divisors for k in range(power + 1)]
    return sorted(divisors)


def _product(*values: Any) -> np.ndarray:
    """`itertools.product` of integer sequences as one int64 array (rows in the same order)."""
    arrays = [np.asarray(list(v), dtype=np.int64) for v in values]
    out = np.empty((int(np.prod([len(a) for a in arrays])), len(arrays)), dtype=np.int64)
    repeat = 1
    for j in range(len(arrays) - 1, -1, -1):  # the last column varies fastest
        a = arrays[j]
        out[:, j] = np.tile(np.repeat(a, repeat), len(out) // (repeat * len(a)) if len(a) else 0)
        repeat *= len(a)
    return out


def _allowed(values: list[Any], allowed: list[Any] | None) -> list[Any]:
    return values if allowed is None else [v for v in values if v in allowed]


def enumerate_space(
    model: ModelSpec,
    cluster: ClusterSpec,
    gpus: int,
    global_batch: int,
    seq_len: int,
    constraints: Constraints | None = None,
    only: dict[tuple[int, int, int], set[tuple[int, int]]] | None = None,
    divisible_only: bool = False,
) -> LayoutTable:
    """Every candidate layout (valid or not) as one table; with `only`, only the (tp, pp, cp)
    it names with their (ep, expert_tp) pairs; with `divisible_only`, only degrees whose product
    divides the GPUs (the others are invalid anyway: the MoE search skips them)."""
    c = constraints or Constraints()
    precision = Precision.parse("precision", c.precision)
    attention = AttentionKernel.parse("attention", c.attention)
    degrees = [d for d in _divisors(gpus) if d <= 256]
    tps = _allowed([d for d in degrees if d <= max(model.n_heads, 1)], c.tp)
    pps = _allowed([d for d in degrees if d <= model.n_layers], c.pp)
    cps = _allowed([d for d in degrees if d <= 64], c.cp)
    shardings = _allowed(list(Sharding.names()), c.sharding)
    recomputes = _allowed(list(Recompute.names()), c.recompute)
    schedules = [s for s in _SCHEDULE_OPTIONS if c.pp_schedule is None or s[0] in c.pp_schedule]
    sps = c.sequence_parallel if c.sequence_parallel is not None else [True, False]
    reshards = c.reshard_after_forward if c.reshard_after_forward is not None else [True, False]
    for name, values in (
        ("tp", tps),
        ("pp", pps),
        ("cp", cps),
        ("sharding", shardings),
        ("recompute", recomputes),
        ("pp-schedule", schedules),
    ):
        if not values:
            raise InputError(name, "the constraints leave no value to search")

    columns: dict[str, list[np.ndarray]] = {
        k: []
        for k in (
            "tp",
            "pp",
            "cp",
            "sharding",
            "hsdp_shard_size",
            "pp_schedule",
            "virtual_stages",
            "micro_batch",
            "recompute",
            "reshard_after_forward",
            "sequence_parallel",
            "ep",
            "expert_tp",
        )
    }
    expert_divisors = _divisors(model.n_experts) if model.is_moe else [1]
    for tp, pp, cp in itertools.product(tps, pps, cps):
        if only is not None and (tp, pp, cp) not in only:
            continue
        mp = tp * pp * cp
        if divisible_only and gpus % mp:
            continue
        dp = max(1, gpus // mp)
        options: list[tuple[int, int]] = []
        for s in shardings:
            code = Sharding(s).code
            if s == Sharding.HSDP:
                groups = [g for g in _divisors(dp) if 1 < g < dp]
                if c.hsdp_shard_size is not None:
                    groups = [g for g in groups if g in c.hsdp_shard_size]
                options.extend((code, g) for g in groups)
            else:
                options.append((code, 0))
        if not options:
            continue
        sched = (
            [(PipelineSchedule.ONE_F_ONE_B.code, 1)]
            if pp == 1
            else [(PipelineSchedule(s).code, v) for s, v in schedules]
        )
        if not sched:
            continue
        per_rank = max(1, global_batch // dp)
        micro = [2**k for k in range(0, 16) if 2**k <= per_rank] or [1]
        if c.micro_batch is not None:
            micro = [m for m in micro if m in c.micro_batch] or list(c.micro_batch)
        sp_vals = sps if tp > 1 else [True]
        # Expert parallelism (MoE only): EP borrows dp x cp x tp/expert_tp ranks (config.layout).
        experts = [
            (e, et)
            for et in _allowed(sorted({1, tp}), c.expert_tp)
            for e in _allowed(expert_divisors, c.ep)
            if (dp * cp * (tp // et)) % e == 0 and (model.is_moe or et == 1)
            if only is None or (e, et) in only[(tp, pp, cp)]
        ]
        if not experts:
            continue
        grid = _product(
            range(len(options)),
            range(len(sched)),
            micro,
            [Recompute(r).code for r in recomputes],
            reshards,
            sp_vals,
            range(len(experts)),
        )
        opt = np.array(options, dtype=np.int64)[grid[:, 0]]
        sch = np.array(sched, dtype=np.int64)[grid[:, 1]]
        reshard = grid[:, 4].astype(bool)
        shards_params = (opt[:, 0] == Sharding.FSDP.code) | (opt[:, 0] == Sharding.HSDP.code)
        keep = shards_params | reshard  # reshard only means something for FSDP/HSDP
        n = int(keep.sum())
        columns["tp"].append(np.full(n, tp))
        columns["pp"].append(np.full(n, pp))
        columns["cp"].append(np.full(n, cp))
        columns["sharding"].append(opt[keep, 0])
        columns["hsdp_shard_size"].append(opt[keep, 1])
        columns["pp_schedule"].append(sch[keep, 0])
        columns["virtual_stages"].append(sch[keep, 1])
        columns["micro_batch"].append(grid[keep, 2])
        columns["recompute"].append(grid[keep, 3])
        columns["reshard_after_forward"].append(reshard[keep])
        columns["sequence_parallel"].append(grid[keep, 5].astype(bool))
        ep_et = np.array(experts, dtype=np.int64)[grid[keep, 6]]
        columns["ep"].append(ep_et[:, 0])
        columns["expert_tp"].append(ep_et[:, 1])
    if not columns["tp"]:
        raise InputError("constraints", "no layout matches the constraints")
    merged = {k: np.concatenate(v) for k, v in columns.items()}
    n = len(merged["tp"])
    fixed = {
        "gpus": gpus,
        "global_batch": global_batch,
        "seq_len": seq_len,
        "precision": precision.code,
        "attention": attention.code,
    }
    # A layout field search does not enumerate (yet) takes its default in every candidate.
    for name in LayoutTable.column_names():
        if name not in merged and name not in fixed:
            fixed[name] = LayoutTable.default_code(name)
    return LayoutTable(
        **{k: np.full(n, v, dtype=np.asarray(v).dtype) for k, v in fixed.items()}, **merged
    )


def _first_reasons(masks: dict[str, np.ndarray]) -> tuple[np.ndarray, list[str]]:
    """Per layout, the index into the returned reasons of its first failing rule (-1: valid)."""
    reasons = list(masks)
    stacked = np.stack([masks[r] for r in reasons])
    first = np.where(stacked.any(axis=0), np.argmax(stacked, axis=0), -1)
    return first, reasons


def _count_reasons(first: np.ndarray, reasons: list[str]) -> dict[str, int]:
    counts = np.bincount(first[first >= 0], minlength=len(reasons))
    return {reason: int(n) for reason, n in zip(reasons, counts, strict=True) if n}


def summarise(layout: Layout, pred: Prediction, i: int) -> dict[str, Any]:
    row = pred.row(i)
    keys = (
        "step_time_s",
        "tokens_per_s",
        "tokens_per_s_per_gpu",
        "mfu",
        "hfu",
        "model_tflops_per_gpu",
        "exposed_comm_s",
        "exposed_comm_fraction",
        "dp_all_gather_exposed_s",
        "dp_grad_reduce_exposed_s",
        "tp_comm_s",
        "cp_comm_exposed_s",
        "pp_bubble_s",
        "pp_p2p_s",
        "moe_all_to_all_s",
        "recompute_s",
        "compute_s",
        "memory_total_bytes",
        "memory_capacity_bytes",
        "power_w_per_gpu",
        "energy_per_token_j",
        "tokens_per_j",
        "data_parallel",
        "dp_shard",
        "n_microbatches",
    )
    out: dict[str, Any] = {"layout": layout.model_dump(), **{k: row[k] for k in keys}}
    out["memory_headroom_bytes"] = float(row["memory_capacity_bytes"]) - float(
        row["memory_total_bytes"]
    )
    return out


# Two layouts whose objective values differ by less than this fraction of the better one are one
# answer: the predictor's resolution. Its fitted efficiencies and latencies carry two to three
# significant digits (config/catalog/clusters.yaml), so it cannot rank layouts closer than ~0.1 %.
SAME_ANSWER_RTOL = 1e-3
# How one answer's equivalent layouts are ordered, the first shown as the answer (search prints
# this with its table): each preference breaks the ties the ones before it leave.
TIE_BREAKS: tuple[str, ...] = (
    "less memory per GPU",
    "fewer parallel groups spanning nodes (mesh order pp, dp_replicate, dp_shard, cp, tp; tp "
    "innermost)",
    "smaller cp",
    "smaller pp",
    "reshard after forward on",
)


def cross_node_groups(table: LayoutTable, gpus_per_node: int) -> np.ndarray:
    """Per layout, how many of its parallel groups (tp, cp, the FSDP shard group, the replica
    group, pp) span more than one node, with ranks laid out as the harness's and torchtitan's
    mesh (pp, dp_replicate, dp_shard, cp, tp), tp innermost: a group of `size` ranks `stride`
    apart spans nodes when stride x size exceeds the node."""
    shard = table.dp_shard_for(gpus_per_node)
    replicate = np.maximum(1, table.dp // np.maximum(shard, 1))
    count = np.zeros(len(table), dtype=np.int64)
    stride = np.ones(len(table), dtype=np.int64)
    for size in (table.tp, table.cp, shard, replicate, table.pp):
        count += (size > 1) & (stride * size > gpus_per_node)
        stride = stride * size
    return count


def distinct_answers(
    score: np.ndarray,
    candidates: np.ndarray,
    table: LayoutTable,
    memory_bytes: np.ndarray,
    gpus_per_node: int,
    limit: int,
) -> tuple[list[np.ndarray], int]:
    """The `candidates` (indices) grouped into answers, best first, and how many answers there
    are: sorted by `score` (descending), each answer takes the layouts within SAME_ANSWER_RTOL
    of its best score; the first `limit` answers are returned, each ordered by TIE_BREAKS (its
    first layout is the answer shown)."""
    if len(candidates) == 0:
        return [], 0
    order = candidates[np.argsort(-score[candidates], kind="stable")]
    ranked = score[order]
    negated = -ranked  # ascending
    bounds = [0]
    while bounds[-1] < len(order):
        head = ranked[bounds[-1]]
        floor = head - abs(head) * SAME_ANSWER_RTOL
        bounds.append(max(int(np.searchsorted(negated, -floor, side="right")), bounds[-1] + 1))
    groups = []
    for start, end in itertools.pairwise(bounds[: limit + 1]):
        members = order[start:end]
        keys = (
            ~table.reshard_after_forward[members],
            table.pp[members],
            table.cp[members],
            cross_node_groups(table.take(members), gpus_per_node),
            memory_bytes[members],
        )
        groups.append(members[np.lexsort(keys)])
    return groups, len(bounds) - 1


def describe(layout: dict[str, Any]) -> str:
    """A short human name for a layout given as a dict (`Layout.description`)."""
    return Layout(**layout).description


def explain(winner: dict[str, Any], baseline: dict[str, Any] | None) -> list[str]:
    """Why the winner beats the plain-FSDP baseline, from their breakdowns."""
    if baseline is None:
        return [
            "no pure-FSDP layout fits, so model parallelism or a smaller micro-batch is required"
        ]
    speedup = winner["tokens_per_s"] / baseline["tokens_per_s"]
    lines = [
        f"{describe(winner['layout'])} reaches {speedup:.2f}x the throughput of {describe(baseline['layout'])}"
    ]
    ms = 1e3
    d_exposed = (baseline["dp_all_gather_exposed_s"] + baseline["dp_grad_reduce_exposed_s"]) - (
        winner["dp_all_gather_exposed_s"] + winner["dp_grad_reduce_exposed_s"]
    )
    if abs(d_exposed) * ms > 0.05:
        lines.append(
            f"exposed data-parallel communication {'falls' if d_exposed > 0 else 'rises'} by "
            f"{abs(d_exposed) * ms:,.1f} ms per step (data-parallel group {int(baseline['dp_shard'])} -> "
            f"{int(winner['dp_shard'])} ranks)"
        )
    costs = [
        ("tensor-parallel collectives", winner["tp_comm_s"] - baseline["tp_comm_s"]),
        ("pipeline bubble", winner["pp_bubble_s"] - baseline["pp_bubble_s"]),
        ("pipeline send/recv", winner["pp_p2p_s"] - baseline["pp_p2p_s"]),
        (
            "MoE dispatch/combine AllToAll",
            winner["moe_all_to_all_s"] - baseline["moe_all_to_all_s"],
        ),
        ("recomputation", winner["recompute_s"] - baseline["recompute_s"]),
        (
            "context-parallel K/V exchange",
            winner["cp_comm_exposed_s"] - baseline["cp_comm_exposed_s"],
        ),
        ("compute", winner["compute_s"] - baseline["compute_s"]),
    ]
    for name, delta in costs:
        if abs(delta) * ms > 0.05:
            lines.append(f"{name}: {'+' if delta > 0 else '-'}{abs(delta) * ms:,.1f} ms per step")
    return lines


# A MoE model's space is the dense one times every (ep, expert_tp) pair: about 14x for
# DeepSeek-V3 on 2048 GPUs (9 million layouts). Its search runs in two stages: every degree
# combination (tp, pp, cp, ep, expert_tp) x micro-batch x recompute with one value of the knobs
# that mostly trade memory for a little time (FSDP with reshard-after-forward, SP, 1F1B: the
# leanest in memory, so a combination that does not fit so fits no other way), then every knob
# for the MOE_REFINE best combinations.
MOE_REFINE = 16


def _stage_one(c: Constraints, stack: StackSpec) -> Constraints:
    """One value of each secondary knob (the leanest in memory the constraints and the stack
    allow)."""
    from dataclasses import replace

    def pick(allowed: list[Any] | None, prefer: Any) -> list[Any] | None:
        if allowed is None or prefer in allowed:
            return [prefer]
        return allowed[:1]

    offered = [str(x) for x in stack.shardings]
    shardings = [x for x in (c.sharding or list(Sharding.names())) if x in offered]
    schedules = [str(x) for x in stack.schedules]
    schedules = [x for x in (c.pp_schedule or schedules) if x in schedules]
    return replace(
        c,
        sharding=pick(shardings or c.sharding, Sharding.FSDP.value),
        reshard_after_forward=pick(c.reshard_after_forward, True),
        sequence_parallel=pick(c.sequence_parallel, True),
        pp_schedule=pick(schedules or c.pp_schedule, PipelineSchedule.ONE_F_ONE_B.value),
    )


@dataclass
class _Evaluated:
    space: LayoutTable
    first_reason: np.ndarray  # per layout, index into reasons of its first failing rule; -1 valid
    reasons: list[str]
    valid: LayoutTable
    pred: Prediction | None

    @property
    def invalid(self) -> np.ndarray:
        return np.asarray(self.first_reason >= 0)

    @property
    def by_reason(self) -> dict[str, int]:
        """Invalid layouts counted by their first failing rule."""
        return _count_reasons(self.first_reason, self.reasons)


def _masks(
    space: LayoutTable, model: ModelSpec, cluster: ClusterSpec, stack: StackSpec
) -> dict[str, np.ndarray]:
    """Every reason a layout is invalid: the layout rules, then what the stack does not offer."""
    return violation_masks(space, model, cluster) | stack.violation_masks(
        space, model, cluster.gpus_per_node
    )


def _evaluate(
    model: ModelSpec, cluster: ClusterSpec, space: LayoutTable, stack: StackSpec
) -> _Evaluated:
    first, reasons = _first_reasons(_masks(space, model, cluster, stack))
    valid = space.take(first < 0)
    pred = predict(model, cluster, valid, stack) if len(valid) else None
    return _Evaluated(space, first, reasons, valid, pred)


def _degree_keys(t: LayoutTable) -> np.ndarray:
    """One integer per (tp, pp, cp, ep, expert_tp): 12 bits each but ep's 17 (MAX bounds)."""
    key = ((t.tp.astype(np.int64) << 12 | t.pp) << 12 | t.cp) << 17 | t.ep
    return np.asarray(key << 12 | t.expert_tp)


def _degrees_of(key: int) -> tuple[int, int, int, int, int]:
    et, key = key & 0xFFF, key >> 12
    ep, key = key & 0x1FFFF, key >> 17
    cp, key = key & 0xFFF, key >> 12
    return key >> 12, key & 0xFFF, cp, ep, et


def _moe_space(
    model: ModelSpec,
    cluster: ClusterSpec,
    gpus: int,
    global_batch: int,
    seq_len: int,
    constraints: Constraints | None,
    objective: str,
    stack: StackSpec,
) -> tuple[_Evaluated, dict[str, Any]]:
    """The two-stage MoE space (see MOE_REFINE): the layouts priced, each one's first failing
    rule, the valid ones and their prediction."""
    c = constraints or Constraints()
    one = _evaluate(
        model,
        cluster,
        enumerate_space(
            model, cluster, gpus, global_batch, seq_len, _stage_one(c, stack), divisible_only=True
        ),
        stack,
    )
    if one.pred is None:
        return one, {}
    keys, combo = np.unique(_degree_keys(one.valid), return_inverse=True)
    combo = combo.reshape(-1)
    fits = one.pred["fits"]
    score = np.full(len(keys), -np.inf)
    np.maximum.at(score, combo[fits], one.pred[_OBJECTIVE_FIELD[objective]][fits])
    if not fits.any():  # nothing fits: refine the combinations closest to fitting
        score = np.full(len(keys), -np.inf)
        np.maximum.at(score, combo, -one.pred["memory_total_bytes"])
    chosen = np.argsort(-score, kind="stable")[:MOE_REFINE]
    degrees: dict[tuple[int, int, int], set[tuple[int, int]]] = {}
    for tp, pp, cp, ep, et in map(_degrees_of, keys[chosen].tolist()):
        degrees.setdefault((tp, pp, cp), set()).add((ep, et))
    two = _evaluate(
        model,
        cluster,
        enumerate_space(model, cluster, gpus, global_batch, seq_len, c, degrees, True),
        stack,
    )
    # Stage one's layouts of the refined combinations are in stage two: drop them there.
    refined = np.zeros(len(keys), dtype=bool)
    refined[chosen] = True
    in_refined = np.isin(_degree_keys(one.space), keys[chosen])
    keep_valid = ~refined[combo]
    space = _concat_tables(one.space.take(~in_refined), two.space)
    reasons = one.reasons + [r for r in two.reasons if r not in one.reasons]
    two_first = np.array([reasons.index(r) for r in two.reasons] + [-1])[two.first_reason]
    first_reason = np.concatenate([one.first_reason[~in_refined], two_first])
    valid = _concat_tables(one.valid.take(keep_valid), two.valid)
    kept = Prediction(**{k: one.pred[k][keep_valid] for k in one.pred.keys()})  # noqa: SIM118
    pred = kept if two.pred is None else _concat_predictions(kept, two.pred)
    lean = _stage_one(c, stack)
    first = (
        ", ".join(str(v[0]) if v else "any" for v in (lean.sharding, lean.pp_schedule))
        + ", reshard after forward, SP"
    )
    info = {
        "moe_stages": f"{len(one.space):,} layouts with {first} over every "
        f"(tp, pp, cp, ep, expert_tp) x micro-batch x recompute, then every knob for the "
        f"{len(chosen)} best of {len(keys)} combinations ({len(two.space):,} layouts)"
    }
    return _Evaluated(space, first_reason, reasons, valid, pred), info


def priced_space(
    model: ModelSpec,
    cluster: ClusterSpec,
    *,
    gpus: int,
    global_batch: int,
    seq_len: int,
    constraints: Constraints | None = None,
    objective: str = "throughput",
    stack: StackSpec | None = None,
) -> tuple[LayoutTable, Prediction | None]:
    """The valid layouts search prices (both stages for a MoE model) and their prediction, for
    studies that need more than the top (e.g. the best layout per EP degree)."""
    stack = stack or load_stack()
    if model.is_moe:
        moe, _ = _moe_space(
            model, cluster, gpus, global_batch, seq_len, constraints, objective, stack
        )
        return moe.valid, moe.pred
    ev = _evaluate(
        model,
        cluster,
        enumerate_space(model, cluster, gpus, global_batch, seq_len, constraints),
        stack,
    )
    return ev.valid, ev.pred


def _concat_tables(a: LayoutTable, b: LayoutTable) -> LayoutTable:
    return LayoutTable(
        **{n: np.concatenate([getattr(a, n), getattr(b, n)]) for n in LayoutTable.column_names()}
    )


def _concat_predictions(a: Prediction, b: Prediction) -> Prediction:
    return Prediction(**{k: np.concatenate([a[k], b[k]]) for k in a.keys()})  # noqa: SIM118


def search(
    model: ModelSpec,
    cluster: ClusterSpec,
    *,
    gpus: int,
    global_batch: int,
    seq_len: int,
    objective: str = "throughput",
    constraints: Constraints | None = None,
    top_k: int = 5,
    stack: StackSpec | None = None,
) -> SearchResult:
    """Rank every valid, fitting layout of the job by the objective, among the options `stack`
    (default `generic`: all) offers, predicted as that stack runs them."""
    stack = stack or load_stack()
    import time

    if objective not in OBJECTIVES:
        raise InputError("objective", f"'{objective}' is not one of {', '.join(OBJECTIVES)}")
    for name, value in (
        ("gpus", gpus),
        ("global-batch", global_batch),
        ("seq-len", seq_len),
        ("top", top_k),
    ):
        if value < 1:
            raise InputError(name, f"must be a positive integer, not {value}")
    for name, value, limit in (
        ("gpus", gpus, MAX_GPUS),
        ("global-batch", global_batch, MAX_GLOBAL_BATCH),
        ("seq-len", seq_len, MAX_SEQ_LEN),
    ):
        if value > limit:
            raise InputError(name, f"must be at most {limit:,}, not {value:,}")
    c = constraints or Constraints()
    for name, values in (("ep", c.ep), ("expert-tp", c.expert_tp)):
        if not model.is_moe and values is not None and set(values) != {1}:
            raise InputError(
                name, f"applies to mixture-of-experts models only; {model.name} has no experts"
            )
    start = time.perf_counter()
    extra: dict[str, Any] = {}
    if model.is_moe:
        ev, extra = _moe_space(
            model, cluster, gpus, global_batch, seq_len, constraints, objective, stack
        )
    else:
        ev = _evaluate(
            model,
            cluster,
            enumerate_space(model, cluster, gpus, global_batch, seq_len, constraints),
            stack,
        )
    space, invalid, valid, pred, by_reason = ev.space, ev.invalid, ev.valid, ev.pred, ev.by_reason
    fits = pred["fits"] if pred is not None else np.zeros(0, dtype=bool)
    score = pred[_OBJECTIVE_FIELD[objective]] if pred is not None else np.zeros(0)
    fit_idx = np.flatnonzero(fits)
    top: list[dict[str, Any]] = []
    answers = 0
    if pred is not None:
        gpn = cluster.gpus_per_node
        groups, answers = distinct_answers(
            score, fit_idx, valid, pred["memory_total_bytes"], gpn, top_k
        )
        for members in groups:
            row = summarise(valid.layout(int(members[0])), pred, int(members[0]))
            row["cross_node_groups"] = int(cross_node_groups(valid.take(members[:1]), gpn)[0])
            row["equivalent"] = [
                valid.layout(int(i)).label for i in members[1 : 1 + MAX_EQUIVALENT_LISTED]
            ]
            row["equivalent_count"] = len(members) - 1
            top.append(row)

    baseline = None
    if pred is not None:
        plain = (
            fits
            & (valid.sharding == Sharding.FSDP.code)
            & (valid.tp == 1)
            & (valid.pp == 1)
            & (valid.cp == 1)
        )
        if plain.any():
            idx = np.flatnonzero(plain)
            best = int(idx[np.argmax(pred["tokens_per_s"][idx])])
            baseline = summarise(valid.layout(best), pred, best)

    pareto: list[dict[str, Any]] = []
    if pred is not None and len(fit_idx):
        # The front over every fitting layout, taken from arrays, then materialised.
        tps = pred["tokens_per_s"][fit_idx]
        energy = pred["energy_per_token_j"][fit_idx]
        ordered = fit_idx[np.lexsort((energy, -tps))]
        running = np.minimum.accumulate(pred["energy_per_token_j"][ordered])
        is_front = np.r_[True, running[1:] < running[:-1]]
        pareto = [summarise(valid.layout(int(i)), pred, int(i)) for i in ordered[is_front][:20]]

    explanation = explain(top[0], baseline) if top else ["no layout is valid and fits in memory"]
    return SearchResult(
        model=model.name,
        cluster=cluster.name,
        stack=stack.name,
        gpus=gpus,
        global_batch=global_batch,
        seq_len=seq_len,
        objective=objective,
        considered=len(space),
        invalid=int(invalid.sum()),
        invalid_by_reason=by_reason,
        not_fitting=int((~fits).sum()),
        ranked=len(fit_idx),
        distinct_answers=answers,
        tie_breaks=list(TIE_BREAKS),
        top=top,
        baseline=baseline,
        explanation=explanation,
        pareto=pareto,
        seconds=time.perf_counter() - start,
        extra=extra,
    )


class _CallableModule(types.ModuleType):
    """This module, callable: `scalelab.search(...)` is `scalelab.api.search(...)`.

    `scalelab.search` is both this module (the ranking's code, imported by the CLI and the
    studies) and the documented Python API call; an attribute of the package cannot be both
    unless the module itself can be called."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from scalelab.api import search as api_search

        return api_search(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
