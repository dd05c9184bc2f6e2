"""Stragglers: which rank makes the others wait, at which collective, and what it costs them.

A collective cannot finish before its last rank arrives, so every rank that arrives earlier waits
(its communication kernel starts and spins). The **straggler** of a collective is the rank whose
collective *starts* last; every other rank's **arrival lag** is how much earlier it started, and
their sum is the time the straggler cost the others. The rank with the longest step is usually
not the straggler but one that waited for it.

Matching one collective across ranks: by process group and sequence number where the trace
carries them (`Process Group Name`, `Seq` args); else by order: the k-th collective of a kind in a
process group on one rank is the k-th on the others (NCCL runs a communicator's collectives in
order). Clocks: ranks' traces are compared on their own timestamps, which assumes synchronised
host clocks (one host, or NTP/PTP across hosts); a clock offset between hosts shows up as a
constant lag of every collective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from scalelab.trace.classify import COLLECTIVES
from scalelab.trace.collectives import CommOps


@dataclass(eq=False)
class MatchedCollective:
    """One collective seen on several ranks."""

    collective: str
    group: str
    key: int  # its sequence number, or its position among its kind in its group
    step: int | None  # the profiler step on the straggler's timeline
    ranks: list[int]
    start_ns: list[int]
    straggler: int
    lag_ns: list[int]  # per rank in `ranks`: latest start - this rank's start
    wait_ns: int  # the sum of the lags: what the straggler cost the others

    def to_dict(self) -> dict[str, Any]:
        return {
            "collective": self.collective,
            "group": self.group,
            "key": self.key,
            "step": self.step,
            "straggler": self.straggler,
            "wait_ns": self.wait_ns,
            "lag_ns": dict(zip(map(str, self.ranks), self.lag_ns, strict=True)),
        }


@dataclass(eq=False)
class RankLag:
    rank: int
    collectives: int  # matched collectives it took part in
    times_last: int  # how often it was the straggler
    mean_lag_ns: float  # its mean arrival lag (0 where it was last)
    max_lag_ns: int
    waited_ns: int  # the time it spent waiting for others
    caused_ns: int  # the time others spent waiting for it

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "collectives": self.collectives,
            "times_last": self.times_last,
            "mean_lag_ns": round(self.mean_lag_ns, 1),
            "max_lag_ns": self.max_lag_ns,
            "waited_ns": self.waited_ns,
            "caused_ns": self.caused_ns,
        }


@dataclass(eq=False)
class StepStraggler:
    step: int
    straggler: int  # the rank that caused the most waiting in the step
    caused_ns: int
    wait_ns: int  # all waiting in the step
    collectives: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "straggler": self.straggler,
            "caused_ns": self.caused_ns,
            "wait_ns": self.wait_ns,
            "collectives": self.collectives,
        }


@dataclass(eq=False)
class StragglerReport:
    match: str  # "sequence number" or "order"
    straggler: int  # the rank that caused the most waiting overall
    ranks: list[RankLag]
    steps: list[StepStraggler]
    collectives: list[MatchedCollective]

    def to_dict(self) -> dict[str, Any]:
        return {
            "match": self.match,
            "straggler": self.straggler,
            "ranks": [r.to_dict() for r in self.ranks],
            "steps": [s.to_dict() for s in self.steps],
            "collectives": [c.to_dict() for c in self.collectives],
        }


def find_stragglers(
    ops_by_rank: dict[int, CommOps], steps_by_rank: dict[int, tuple[np.ndarray, np.ndarray]]
) -> StragglerReport | None:
    """Match collectives across ranks and attribute the waiting; None with fewer than 2 ranks
    or no collective seen on two of them. `steps_by_rank`: (step numbers, window starts).

    Sets each rank's `CommOps.effective_ns` (time after the last arrival) as a side effect.
    """
    ranks = sorted(r for r, ops in ops_by_rank.items() if len(ops))
    if len(ranks) < 2:
        return None
    by_seq = all((ops_by_rank[r].seq >= 0).all() for r in ranks)
    table: dict[tuple[str, int, int], dict[int, int]] = {}  # key -> rank -> row
    for r in ranks:
        ops = ops_by_rank[r]
        counter: dict[tuple[str, int], int] = {}
        for i, (c, g, s) in enumerate(
            zip(ops.collective.tolist(), ops.group, ops.seq.tolist(), strict=True)
        ):
            if by_seq:
                key = (g, -1, s)
            else:
                k = counter.get((g, c), 0)
                counter[(g, c)] = k + 1
                key = (g, c, k)
            table.setdefault(key, {}).setdefault(r, i)  # first kernel of a (coalesced) seq
    matched: list[MatchedCollective] = []
    waited = dict.fromkeys(ranks, 0)
    caused = dict.fromkeys(ranks, 0)
    last_count = dict.fromkeys(ranks, 0)
    lags: dict[int, list[int]] = {r: [] for r in ranks}
    step_wait: dict[int, dict[int, int]] = {}
    step_count: dict[int, int] = {}
    for (group, code, k), rows in table.items():
        if len(rows) < 2:
            continue
        rs = sorted(rows)
        starts = [int(ops_by_rank[r].start_ns[rows[r]]) for r in rs]
        latest = max(starts)
        last = rs[starts.index(latest)]
        lag = [latest - s for s in starts]
        wait = sum(lag)
        for r, lg in zip(rs, lag, strict=True):
            lags[r].append(lg)
            waited[r] += lg
            ops = ops_by_rank[r]
            i = rows[r]
            ops.effective_ns[i] = max(int(ops.end_ns[i]) - max(latest, int(ops.start_ns[i])), 0)
            if ops.matched.size and len(rs) >= int(ops.group_size[i]):
                ops.matched[i] = True  # every rank of its group is here: no wait left in it
        caused[last] += wait
        last_count[last] += 1
        step = _step_of(steps_by_rank.get(last), latest)
        if step is not None:
            step_wait.setdefault(step, {}).setdefault(last, 0)
            step_wait[step][last] += wait
            step_count[step] = step_count.get(step, 0) + 1
        ops_last = ops_by_rank[last]
        name = COLLECTIVES[int(ops_last.collective[rows[last]])] if code < 0 else COLLECTIVES[code]
        matched.append(MatchedCollective(name, group, k, step, rs, starts, last, lag, wait))
    if not matched:
        return None
    matched.sort(key=lambda m: min(m.start_ns))
    rank_lags = [
        RankLag(
            rank=r,
            collectives=len(lags[r]),
            times_last=last_count[r],
            mean_lag_ns=float(np.mean(lags[r])) if lags[r] else 0.0,
            max_lag_ns=max(lags[r], default=0),
            waited_ns=waited[r],
            caused_ns=caused[r],
        )
        for r in ranks
    ]
    steps = []
    for step in sorted(step_wait):
        per = step_wait[step]
        who = max(per, key=lambda r: (per[r], -r))
        steps.append(StepStraggler(step, who, per[who], sum(per.values()), step_count[step]))
    worst = max(rank_lags, key=lambda x: (x.caused_ns, x.times_last, -x.rank))
    return StragglerReport(
        match="sequence number" if by_seq else "order",
        straggler=worst.rank,
        ranks=rank_lags,
        steps=steps,
        collectives=matched,
    )


def _step_of(steps: tuple[np.ndarray, np.ndarray] | None, t: int) -> int | None:
    if steps is None or steps[0].size == 0:
        return None
    numbers, starts = steps
    k = int(np.searchsorted(starts, t, side="right")) - 1
    return int(numbers[k]) if k >= 0 else None
