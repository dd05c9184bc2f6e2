"""Every parallel layout trains exactly like one process: the same losses over five steps at 2
and at 4 ranks (issue 13; among them every pipeline schedule x every data-parallel mode at 4
ranks): the first checks the forward, the second one update, the later ones the optimizer's state
carried between updates.

llama-tiny (4 layers, d_model 64, GQA 4/2 heads, vocab 256), sequence 32, global batch 8, AdamW
lr 3e-3, gradient clipping at 1.0, seed 0, fp32. Tolerance: 1e-5 absolute on each loss (the
observed differences are about 1e-6, reduction-order noise). bf16 (FSDP mixed precision, fp32
reduction) is compared with a looser 5e-3 (observed about 5e-4).

All cases of one world size run in one torchrun launch, which is where most of the time goes (the
2-rank launch, conftest's `world2`, also runs test_fp8.py's cases).

Mixture of experts (moe-tiny: examples/moe-tiny.yaml, 4 layers, the first dense, 8 experts, top-2,
one shared expert) runs in the same launches and is compared with its own single-process run:
EP x FSDP and EP borrowing the TP ranks (no FSDP) at 2 ranks; EP with the experts FSDP-sharded
over the ranks that hold the same experts, and EP x expert-TP x FSDP at 4 ranks. Observed loss
differences are about 1e-6. Checked by hand the same way (not run here, to keep the suite short):
ep 4, ep 4 x tp 2 (expert_tp 1), ep 2 under HSDP 2x2, pp 2 x ep 2, cp 2 x ep 2, ep 2 with full
recompute, ZeRO-2 with per-micro-batch reduction, expert_tp 2 without EP, tp 2 with ep 1, DDP
with ep 1, and bf16 (within 1e-3).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from scalelab.errors import InputError
from tests.measure.conftest import FP8_WORLD2, MOE_TINY, PARITY_STEPS

pytestmark = pytest.mark.distributed

FP32_ATOL = 1e-5
BF16_ATOL = 5e-3
TINY_PARAMS = 180_800  # ModelSpec("llama-tiny").n_params

WORLD2: list[dict[str, Any]] = [
    {"name": "fsdp2", "count_collectives": True},
    # 2 micro-batches of 2 a step where the collectives are not counted (4 of 1 where they are).
    {
        "name": "fsdp2_no_reshard_bf16",
        "reshard_after_forward": False,
        "compute_dtype": "bf16",
        "micro_batch": 2,
    },
    {"name": "zero2", "sharding": "zero2", "count_collectives": True},
    {"name": "ddp2", "sharding": "ddp", "count_collectives": True},
    {"name": "zero1", "sharding": "zero1", "count_collectives": True},
    {
        "name": "ddp2_sync_microbatch",
        "sharding": "ddp",
        "grad_sync": "microbatch",
        "count_collectives": True,
    },
    # dp 1: the whole batch of 8 on each rank, in 2 micro-batches of 4 (still accumulating; 8 of
    # 1 cost 4x the time of TP's per-op dispatch for nothing more).
    {"name": "tp2_sp", "tp": 2, "micro_batch": 4},
    {"name": "tp2_no_sp", "tp": 2, "sp": False, "micro_batch": 4},
    {"name": "pp2_1f1b", "pp": 2, "pp_schedule": "1f1b"},
    {"name": "pp2_interleaved", "pp": 2, "pp_schedule": "interleaved", "virtual_stages": 2},
    {"name": "pp2_zbv", "pp": 2, "pp_schedule": "zbv", "virtual_stages": 2},
    {"name": "cp2", "cp": 2, "micro_batch": 4},
    {"name": "fsdp2_selective_ac", "recompute": "selective", "micro_batch": 2},
    {"name": "fsdp2_full_ac", "recompute": "full", "micro_batch": 2},
    # What else the CLI accepts at 2 ranks (test_every_layout_value_is_run_at_two_ranks):
    # FSDP2's per-micro-batch reduction (set_requires_gradient_sync; DDP's no_sync is above),
    # HSDP replicating over 2 groups of 1, and GPipe (dp 1, so 2 micro-batches of 4).
    {"name": "fsdp2_sync_microbatch", "grad_sync": "microbatch", "micro_batch": 2},
    {"name": "hsdp2_replicate", "sharding": "hsdp", "hsdp_shard_size": 1, "micro_batch": 2},
    {"name": "pp2_gpipe", "pp": 2, "pp_schedule": "gpipe", "micro_batch": 4},
]
# Every pipeline schedule x every data-parallel mode the harness runs with pp 2 at 4 ranks (dp 2).
# ZBV with data parallelism and ZeRO-1 with pp are refused (test_refused_pipeline_layouts).
PP_SCHEDULES = {"gpipe": 1, "1f1b": 1, "interleaved": 2}
PP_DP_MODES: dict[str, dict[str, Any]] = {
    "fsdp": {},
    "zero2": {"sharding": "zero2"},
    "ddp": {"sharding": "ddp"},
    "hsdp": {"sharding": "hsdp", "hsdp_shard_size": 1},
}
REFUSED_PP: list[tuple[str, str]] = [
    *(("zbv", mode) for mode in ("fsdp", "zero2", "ddp", "hsdp", "zero1")),
    *((schedule, "zero1") for schedule in PP_SCHEDULES),
    ("gpipe", "ddp"),  # DDP's reducer asserts when a stage runs several forwards first
    ("interleaved", "ddp"),
]
WORLD4: list[dict[str, Any]] = [
    {"name": "hsdp_2x2", "sharding": "hsdp", "hsdp_shard_size": 2},
    {"name": "tp2_fsdp2", "tp": 2, "micro_batch": 2},  # 2 micro-batches a step
    *(
        {
            "name": f"pp2_{schedule}_{mode}2",
            "pp": 2,
            "pp_schedule": schedule,
            "virtual_stages": virtual,
            **extra,
        }
        for schedule, virtual in PP_SCHEDULES.items()
        for mode, extra in PP_DP_MODES.items()
        if (schedule, mode) not in REFUSED_PP
    ),
]
# Context parallelism under a pipeline (FSDP over the cp ranks): 1F1B, 4 micro-batches of 2.
WORLD4.append({"name": "pp2_1f1b_cp2", "pp": 2, "cp": 2, "micro_batch": 2})
for _case in WORLD4:
    if _case["name"] == "pp2_1f1b_fsdp2":
        _case["count_collectives"] = True

# Collectives per optimizer step on one rank as the predictor models them (perf.schedule,
# perf.predict) for llama-tiny (4 blocks; FSDP units: 4 blocks + the root), global batch 8 over
# dp 2 in micro-batches of 1, so 4 micro-batches, gradients reduced once per step:
#   DDP: one bucketed AllReduce of the gradients per step (the model's 0.7 MB fits one bucket).
#   ZeRO-1: that AllReduce, then the updated shards gathered once (one broadcast per rank).
#   ZeRO-2: ReduceScatter per unit once per step; parameters gathered once per step.
#   FSDP: ReduceScatter per unit once per step; AllGather per unit in each micro-batch's
#     forward and again per block in its backward (resharded after forward; the root is not).
#   PP + FSDP (pp 2, dp 2): each stage's units (2 blocks + its root) gathered and reduced once
#     per step (FSDP's collectives "happen once per step" under a pipeline).
# Scalar collectives (the gradient norm's AllReduce) are not counted.
N_MICRO, UNITS, BLOCKS = 4, 5, 4
EXPECTED_COLLECTIVES: dict[str, dict[str, int]] = {
    "ddp2": {"all_reduce": 1},
    "zero1": {"all_reduce": 1, "broadcast": 2},
    "zero2": {"reduce_scatter": UNITS, "all_gather": UNITS},
    "fsdp2": {"reduce_scatter": UNITS, "all_gather": N_MICRO * (UNITS + BLOCKS)},
    "pp2_1f1b_fsdp2": {"reduce_scatter": 3, "all_gather": 3},
    # --grad-sync microbatch: DDP reduces on every micro-batch, as it did before grad_sync.
    "ddp2_sync_microbatch": {"all_reduce": N_MICRO},
}


MOE_TOTAL = 440_384  # ModelSpec of moe-tiny: n_params
# (name, layout, experts a rank holds, their hidden width (64, halved by expert TP)).
MOE_WORLD2: list[dict[str, Any]] = [
    {"name": "moe_ep2_fsdp2", "ep": 2, "micro_batch": 2, "local_experts": [4, 64]},  # EP x FSDP
    # EP borrows TP; dp 1, so 2 micro-batches of 4 (as tp2_sp).
    {"name": "moe_ep2_tp2", "tp": 2, "ep": 2, "micro_batch": 4, "local_experts": [4, 64]},
]
MOE_WORLD4: list[dict[str, Any]] = [
    # dp 4, ep 2: each expert on 2 ranks, FSDP-sharded over them (dp_shard_mod_ep 2).
    {"name": "moe_ep2_fsdp4", "ep": 2, "local_experts": [4, 64]},
    # dp 2 x tp 2, ep 2 over dp, each expert split over TP like the dense MLP.
    {
        "name": "moe_ep2_etp2_tp2",
        "tp": 2,
        "ep": 2,
        "expert_tp": 2,
        "micro_batch": 2,
        "local_experts": [4, 32],
    },
]


def _moe_cases(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in c.items() if k != "local_experts"} | {"model": MOE_TINY} for c in cases
    ]


def world2_cases() -> list[dict[str, Any]]:
    """The cases of the 2-rank launch (conftest's `world2`, which adds test_fp8.py's)."""
    return [dict(c) for c in WORLD2] + _moe_cases(MOE_WORLD2)


@pytest.fixture(scope="module")
def world4(parity: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    return parity(4, [dict(c) for c in WORLD4] + _moe_cases(MOE_WORLD4), PARITY_STEPS)


def _check(result: dict[str, Any], reference: dict[str, Any], atol: float) -> None:
    losses, expected = result["loss"], reference["loss"]
    assert len(losses) == len(expected) == PARITY_STEPS
    diffs = [abs(a - b) for a, b in zip(losses, expected, strict=True)]
    assert max(diffs) <= atol, f"losses {losses} vs single process {expected}"


def test_reference_learns(reference: dict[str, Any]) -> None:
    losses = reference["loss"]
    assert len(losses) == PARITY_STEPS
    assert losses[0] > losses[1] > losses[2], losses
    assert reference["local_numel"] == TINY_PARAMS


@pytest.mark.parametrize("case", [c["name"] for c in WORLD2])
def test_world2_matches_single_process(
    case: str, world2: dict[str, Any], reference: dict[str, Any]
) -> None:
    result = world2[case]
    _check(result, reference, BF16_ATOL if "bf16" in case else FP32_ATOL)
    if case.startswith(("fsdp2", "zero2", "tp2", "pp2")):
        assert result["local_numel"] < 0.6 * TINY_PARAMS, "parameters were not sharded or split"
    if case in ("ddp2", "hsdp2_replicate"):  # replicated (HSDP: shard groups of 1)
        assert result["local_numel"] == TINY_PARAMS
    if case == "cp2":
        assert result["local_seq_len"] == 16, "context parallelism did not split the sequence"


# What a case runs, for test_every_layout_value_is_run_at_two_ranks: the parity worker's defaults
# (tests/measure/parity_worker.py DEFAULTS) for the fields that tell layouts apart.
_BASE: dict[str, Any] = {
    "sharding": "fsdp", "hsdp_shard_size": None, "reshard_after_forward": True, "tp": 1,
    "sp": True, "pp": 1, "pp_schedule": "1f1b", "virtual_stages": 1, "cp": 1, "micro_batch": 1,
    "recompute": "none", "precision": "bf16", "compute_dtype": "fp32", "grad_sync": "step",
    "fp8_recipe": "tensorwise", "fp8_all_gather": False,
}  # fmt: skip
_OPTIONS = ("compute_dtype", "grad_sync", "fp8_recipe", "fp8_all_gather")


def _features(case: dict[str, Any]) -> set[tuple[Any, ...]]:
    """The values a 2-rank llama-tiny case exercises, each where the harness runs it differently:
    the data-parallel mode (with dp 2), its gradient reduction (DDP's no_sync or FSDP2's
    set_requires_gradient_sync) and resharding, TP with or without SP, the pipeline schedule, CP,
    recompute, the compute dtype, and fp8 (recipe, on TP's styles or not, the fp8 all-gather)."""
    c = _BASE | case
    dp = 2 // (c["tp"] * c["pp"] * c["cp"])
    out: set[tuple[Any, ...]] = {("recompute", c["recompute"]), ("dtype", c["compute_dtype"])}
    if dp > 1:
        family = "ddp" if c["sharding"] in ("ddp", "zero1") else "fsdp"
        out |= {("sharding", c["sharding"]), ("grad_sync", family, c["grad_sync"])}
        if family == "fsdp" and not c["reshard_after_forward"]:
            out.add(("reshard_after_forward", False))
    if c["tp"] > 1:
        out.add(("tp", "sp" if c["sp"] else "no sp"))
    if c["pp"] > 1:
        out.add(("pp_schedule", c["pp_schedule"]))
    if c["cp"] > 1:
        out.add(("cp",))
    if c["precision"] == "fp8":
        out.add(("fp8", c["fp8_recipe"], "tp" if c["tp"] > 1 else "no tp"))
        if c["fp8_all_gather"]:
            out.add(("fp8_all_gather",))
    return out


def _cli_accepts(case: dict[str, Any]) -> bool:
    """Whether `scalelab bench llama-tiny --nproc-per-node 2` on CPU runs `case` (its checks, in
    its order: the layout rules, the harness's, the options', gloo's fp8 limits)."""
    from scalelab.cli.common import build_layout
    from scalelab.config.catalog import load_cluster, load_model
    from scalelab.config.layout import check
    from scalelab.measure import fp8
    from scalelab.measure.config import BenchOptions, check_layout, check_layout_options

    c = _BASE | case
    spec = load_model("llama-tiny")
    local = load_cluster("h100-ib").model_copy(update={"gpus_per_node": 2, "nvlink_domain": 2})
    try:
        layout = build_layout(
            gpus=2, seq_len=32, global_batch=8, **{k: v for k, v in c.items() if k not in _OPTIONS}
        )
        options = BenchOptions(**{k: c[k] for k in _OPTIONS})
        check(layout, spec, local)
        check_layout(layout, spec, 2)
        check_layout_options(options, layout, spec)
        if layout.precision == "fp8":
            fp8.check_gloo(options.fp8_recipe, layout.tp, layout.sequence_parallel)
    except InputError:
        return False
    return True


def test_every_layout_value_is_run_at_two_ranks() -> None:
    """Every value the CLI accepts on 2 CPU ranks for llama-tiny (each axis where the harness runs
    it differently: `_features`) is trained by a 2-rank parity case (here or test_fp8.py's) or
    refused with one line. The grid: each way to use the 2 ranks (dp, tp, pp, cp) x every
    sharding x every schedule x SP x resharding x fp8 (none, tensorwise with and without the fp8
    all-gather, rowwise) x gradient reduction, and each recompute mode and compute dtype."""
    import itertools

    accepted: set[tuple[Any, ...]] = set()
    schedules = {"gpipe": 1, "1f1b": 1, "interleaved": 2, "zbv": 2}
    fp8s: list[dict[str, Any]] = [
        {},
        {"precision": "fp8"},
        {"precision": "fp8", "fp8_all_gather": True},
        {"precision": "fp8", "fp8_recipe": "rowwise"},
    ]
    for dim, sharding, schedule, sp, reshard, fp8, sync in itertools.product(
        ("dp", "tp", "pp", "cp"), ("fsdp", "zero2", "ddp", "zero1", "hsdp"), schedules,
        (True, False), (True, False), fp8s, ("step", "microbatch"),
    ):  # fmt: skip
        if (dim != "pp" and schedule != "1f1b") or (dim != "tp" and not sp):
            continue
        case: dict[str, Any] = {"sharding": sharding, "reshard_after_forward": reshard}
        case |= {"grad_sync": sync, **fp8}
        if sharding == "hsdp":
            case["hsdp_shard_size"] = 1
        if dim != "dp":
            case |= {dim: 2, "sp": sp, "pp_schedule": schedule}
            case |= {"virtual_stages": schedules[schedule], "micro_batch": 4}
        if _cli_accepts(case):
            accepted |= _features(case)
    for extra in ({"recompute": "selective"}, {"recompute": "full"}, {"compute_dtype": "bf16"}):
        assert _cli_accepts(extra)
        accepted |= _features(extra)
    run: set[tuple[Any, ...]] = set()
    for c in WORLD2 + FP8_WORLD2:
        assert _cli_accepts({k: v for k, v in c.items() if k in _BASE}), c["name"]
        run |= _features({k: v for k, v in c.items() if k in _BASE})
    assert accepted - run == set(), "accepted at 2 ranks but not run"
    # Refused, each with one line: ZeRO-1 and DDP with TP, ZeRO-1 with a pipeline, DDP with
    # GPipe/interleaved only with dp > 1 (not here), tensorwise fp8 with TP + SP on gloo.
    assert not _cli_accepts({"tp": 2, "sharding": "ddp", "micro_batch": 4})
    assert not _cli_accepts({"tp": 2, "precision": "fp8", "micro_batch": 4})
    assert ("fp8", "tensorwise", "tp") in accepted  # with --no-sp


@pytest.mark.parametrize("case", [c["name"] for c in WORLD4])
def test_world4_matches_single_process(
    case: str, world4: dict[str, Any], reference: dict[str, Any]
) -> None:
    result = world4[case]
    _check(result, reference, FP32_ATOL)
    if case == "hsdp_2x2":  # sharded 2 ways, replicated 2 ways
        assert 0.45 * TINY_PARAMS < result["local_numel"] < 0.55 * TINY_PARAMS
    elif case.endswith("_cp2"):
        assert result["local_seq_len"] == 16 and result["local_numel"] < 0.3 * TINY_PARAMS
    elif case.endswith(("_ddp2", "_hsdp2")):  # a pipeline stage, replicated
        assert 0.3 * TINY_PARAMS < result["local_numel"] < 0.7 * TINY_PARAMS
    else:
        assert result["local_numel"] < 0.3 * TINY_PARAMS


@pytest.mark.parametrize(("schedule", "mode"), REFUSED_PP)
def test_refused_pipeline_layouts(schedule: str, mode: str) -> None:
    """ZBV with data parallelism trains wrongly in PyTorch (pytorch/pytorch#144530: the last
    stage gets no gradient under FSDP, most gradients are wrong under DDP), so bench refuses it
    with one line naming the field, as it does ZeRO-1 with a pipeline."""
    from scalelab.cli.common import build_layout
    from scalelab.config.catalog import load_model
    from scalelab.errors import InputError
    from scalelab.measure.config import check_layout

    sharding = {"zero1": "zero1", "ddp": "ddp", "zero2": "zero2", "hsdp": "hsdp"}.get(mode, "fsdp")
    layout = build_layout(
        gpus=4, seq_len=32, global_batch=8, pp=2, pp_schedule=schedule,
        virtual_stages=2 if schedule in ("zbv", "interleaved") else 1, sharding=sharding,
        hsdp_shard_size=1 if mode == "hsdp" else None,
    )  # fmt: skip
    with pytest.raises(InputError) as info:
        check_layout(layout, load_model("llama-tiny"))
    assert info.value.field == (
        "pp_schedule" if schedule == "zbv" and mode != "zero1" else "sharding"
    )
    assert "\n" not in str(info.value)


def test_zbv_without_data_parallelism_is_accepted() -> None:
    from scalelab.cli.common import build_layout
    from scalelab.config.catalog import load_model
    from scalelab.measure.config import check_layout

    layout = build_layout(
        gpus=2, seq_len=32, global_batch=8, pp=2, pp_schedule="zbv", virtual_stages=2
    )
    check_layout(layout, load_model("llama-tiny"))


@pytest.mark.parametrize("case", sorted(EXPECTED_COLLECTIVES))
def test_collectives_per_step_are_the_predictors(
    case: str, world2: dict[str, Any], world4: dict[str, Any]
) -> None:
    """A profiled step's collectives (torch.profiler, rank 0) are the ones the predictor costs."""
    result = world4[case] if case in world4 else world2[case]
    assert result["collectives"] == EXPECTED_COLLECTIVES[case]


def test_zbv_with_context_parallelism_is_refused() -> None:
    from scalelab.cli.common import build_layout
    from scalelab.config.catalog import load_model
    from scalelab.errors import InputError
    from scalelab.measure.config import check_layout

    layout = build_layout(
        gpus=4, seq_len=32, global_batch=8, pp=2, cp=2, pp_schedule="zbv", virtual_stages=2
    )
    with pytest.raises(InputError) as info:
        check_layout(layout, load_model("llama-tiny"))
    assert info.value.field == "pp_schedule"


@pytest.mark.parametrize("case", [c["name"] for c in MOE_WORLD2 + MOE_WORLD4])
def test_moe_matches_single_process(
    case: str, world2: dict[str, Any], world4: dict[str, Any], moe_reference: dict[str, Any]
) -> None:
    """Expert parallelism (AllToAll dispatch and combine) trains exactly like one process: the
    same losses and gradient norms (the experts' gradients summed over the EP group and scaled
    for the ranks that hold the same experts), the same measured load imbalance (counts summed
    over ranks), and each rank holds only its experts."""
    wanted = next(c for c in MOE_WORLD2 + MOE_WORLD4 if c["name"] == case)
    in_world2 = any(c["name"] == case for c in MOE_WORLD2)
    result = world2[case] if in_world2 else world4[case]
    steps = PARITY_STEPS
    _check(result, moe_reference, FP32_ATOL)
    norms, expected = result["grad_norm"], moe_reference["grad_norm"][:steps]
    assert norms == pytest.approx(expected, rel=1e-5), (norms, expected)
    imbalance = result["expert_load_imbalance"]
    assert imbalance == pytest.approx(moe_reference["expert_load_imbalance"][:steps])
    assert all(v >= 1.0 for v in imbalance)
    assert result["local_experts"] == wanted["local_experts"]
    assert result["local_numel"] < 0.55 * MOE_TOTAL
    # The EP ranks' load imbalance: where one EP group sees the whole global batch (all but
    # moe_ep2_fsdp4, whose two EP groups see half each), it is the single-process run's counts
    # split into the EP ranks' halves of the experts.
    ep_imbalance = result["ep_load_imbalance"]
    assert len(ep_imbalance) == steps and all(v >= 1.0 for v in ep_imbalance)
    if case != "moe_ep2_fsdp4":
        expected_ep = _ep_imbalance(moe_reference["expert_counts"][:steps], 2)
        assert ep_imbalance == pytest.approx(expected_ep), (ep_imbalance, expected_ep)


def _ep_imbalance(counts: list[list[list[float]]], ep: int) -> list[float]:
    """Per step, the MoE layers' mean of max / mean over EP ranks of the routed slots of each
    rank's contiguous block of experts (counts: step x layer x expert, 0 for dense layers)."""
    out = []
    for step in counts:
        ratios = []
        for layer in step:
            if sum(layer):
                block = len(layer) // ep
                loads = [sum(layer[r * block : (r + 1) * block]) for r in range(ep)]
                ratios.append(max(loads) / (sum(loads) / ep))
        out.append(sum(ratios) / len(ratios))
    return out


def test_moe_reference_holds_the_whole_model(moe_reference: dict[str, Any]) -> None:
    assert moe_reference["local_numel"] == MOE_TOTAL
    assert moe_reference["local_experts"] == [8, 64]
    assert moe_reference["ep_load_imbalance"] == [1.0] * PARITY_STEPS  # no EP: one rank
    # The definition of expert_load_imbalance, from the routed slots per expert.
    by_expert = []
    for step in moe_reference["expert_counts"]:
        ratios = [max(layer) / (sum(layer) / len(layer)) for layer in step if sum(layer)]
        by_expert.append(sum(ratios) / len(ratios))
    assert moe_reference["expert_load_imbalance"] == pytest.approx(by_expert)
    assert max(by_expert) > 1.1  # the tiny router is unbalanced: the metric sees it


@pytest.mark.parametrize(
    ("layout", "field"),
    [
        ({"gpus": 2, "ep": 2, "sharding": "ddp"}, "sharding"),
        ({"gpus": 2, "ep": 2, "sharding": "zero1"}, "sharding"),
        ({"gpus": 2, "tp": 2, "sequence_parallel": False}, "sp"),
        # EP takes cp x tp whole (expert_tp 1): ep 2 cannot span cp 2 x tp 2.
        ({"gpus": 8, "tp": 2, "cp": 2, "ep": 2}, "ep"),
        # HSDP replicating over 2 groups of 1: experts would be averaged across different experts.
        ({"gpus": 2, "ep": 2, "sharding": "hsdp", "hsdp_shard_size": 1}, "ep"),
        # EP inside the shard group only: ep 4 > dp_shard 2 of HSDP 2 x 2.
        ({"gpus": 4, "ep": 4, "sharding": "hsdp", "hsdp_shard_size": 2}, "ep"),
    ],
)
def test_moe_layouts_the_harness_cannot_build_are_refused(
    layout: dict[str, Any], field: str
) -> None:
    """Expert-parallel layouts the layout rules accept but torchtitan's mesh (and so the harness)
    cannot build: one line naming the field, before anything runs."""
    from scalelab.config.catalog import load_model
    from scalelab.config.layout import Layout
    from scalelab.errors import InputError
    from scalelab.measure.config import check_layout

    spec = load_model(MOE_TINY)
    with pytest.raises(InputError) as info:
        check_layout(Layout(seq_len=32, global_batch=8, **layout), spec, gpus_per_node=8)
    assert info.value.field == field
    assert "\n" not in str(info.value)


def test_moe_layouts_the_harness_builds_are_accepted() -> None:
    from scalelab.config.catalog import load_model
    from scalelab.config.layout import Layout
    from scalelab.measure.config import check_layout

    spec = load_model(MOE_TINY)
    for layout in (
        {"gpus": 4, "ep": 4},
        {"gpus": 4, "tp": 2, "ep": 4},
        {"gpus": 4, "tp": 2, "ep": 2, "expert_tp": 2},
        {"gpus": 4, "ep": 2, "sharding": "hsdp", "hsdp_shard_size": 2},
        {"gpus": 8, "tp": 2, "cp": 2, "ep": 4},
    ):
        check_layout(Layout(seq_len=32, global_batch=8, **layout), spec, gpus_per_node=8)
