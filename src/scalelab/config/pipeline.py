"""How a pipeline splits the model into stages: one pure function both engines use.

The module list [embedding, layer 0 .. layer L-1, norm + output] is cut into pp x v contiguous
chunks (stages) the way torchtitan does (`generate_llm_fqn_per_model_part` in
torchtitan/distributed/pipeline_parallel.py): the embedding counts as `input_weight` layers and
norm + output as `output_weight` layers (torchtitan's defaults: 1 and 1), the L + weights
"effective layers" are divided evenly, and the first (L + weights) % stages stages take one
more. Larger weights leave fewer transformer layers on the first and last stage. Explicit split
points (the first layer of stages 1 .. S-1, torchtitan's `pipeline_parallel_split_points`)
replace the even division. Every layer is in exactly one stage.

Stage s runs on pipeline rank s % pp for looped schedules (GPipe, 1F1B, interleaved: stages
r, r + pp, ...) and on ranks 0..pp-1..0 for the V-shaped ZB-V (stages r and 2 pp - 1 - r).
No torch and no numpy here: the harness builds its stage modules from these stages, and the
predictor can price the same ones.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from scalelab.config.layout import Layout
from scalelab.config.model import ModelSpec
from scalelab.config.options import PipelineSchedule


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: transformer layers [first_layer, end_layer), plus the embedding on
    the first stage and the final norm and output on the last."""

    index: int
    first_layer: int
    end_layer: int
    embedding: bool
    head: bool

    @property
    def layers(self) -> range:
        return range(self.first_layer, self.end_layer)

    @property
    def n_layers(self) -> int:
        return self.end_layer - self.first_layer

    def modules(self) -> list[str]:
        """Module names as torchtitan lists them (`tok_embeddings`, `layers.3`, `norm`, `output`)."""
        names = ["tok_embeddings"] if self.embedding else []
        names += [f"layers.{i}" for i in self.layers]
        return names + (["norm", "output"] if self.head else [])


def split_stages(
    n_layers: int,
    n_stages: int,
    input_weight: int = 1,
    output_weight: int = 1,
    split_points: Sequence[int] | None = None,
) -> list[Stage]:
    """The stages of a model with `n_layers` layers cut into `n_stages` chunks (see the module
    docstring). Raises ValueError for a split that leaves a stage empty or drops a layer."""
    if n_layers < 1 or n_stages < 1:
        raise ValueError(f"need at least one layer and one stage, not {n_layers} and {n_stages}")
    if input_weight < 0 or output_weight < 0:
        raise ValueError("input_weight and output_weight must be 0 or more")
    if split_points is not None:
        points = list(split_points)
        if len(points) != n_stages - 1:
            raise ValueError(
                f"{n_stages} stages need {n_stages - 1} split points, not {len(points)}"
            )
        bounds = [0, *points, n_layers]
        if any(not 0 < p < n_layers for p in points) or any(
            a >= b for a, b in itertools.pairwise(bounds)
        ):
            raise ValueError(
                f"split points {points} must increase strictly within 1..{n_layers - 1}"
            )
    else:
        effective = n_layers + input_weight + output_weight
        if n_stages > effective:
            raise ValueError(
                f"{n_stages} stages but only {effective} effective layers "
                f"({n_layers} layers + embedding {input_weight} + norm/output {output_weight})"
            )
        per_stage, extra = divmod(effective, n_stages)
        if n_stages > 1 and max(input_weight, output_weight) > per_stage:
            raise ValueError(
                f"embedding weight {input_weight} or norm/output weight {output_weight} is more "
                f"than the {per_stage} effective layers of a stage"
            )
        bounds = [0]
        for s in range(n_stages):
            size = per_stage + (1 if s < extra else 0)
            if n_stages > 1 and s == 0:
                size -= input_weight
            if n_stages > 1 and s == n_stages - 1:
                size -= output_weight
            bounds.append(min(n_layers, bounds[-1] + max(0, size)))
        bounds[-1] = n_layers
    stages = [
        Stage(s, bounds[s], bounds[s + 1], embedding=s == 0, head=s == n_stages - 1)
        for s in range(n_stages)
    ]
    built = [i for st in stages for i in st.layers]
    if built != list(range(n_layers)):  # a guard: every layer exactly once, in order
        raise ValueError(f"split of {n_layers} layers into {n_stages} stages lost layers")
    return stages


def stage_count(layout: Layout) -> int:
    """pp x chunks per rank: 2 for ZB-V, `virtual_stages` otherwise."""
    chunks = 2 if layout.pp_schedule == PipelineSchedule.ZBV else layout.virtual_stages
    return layout.pp * chunks if layout.pp > 1 else 1


def rank_stage_ids(layout: Layout, pp_rank: int) -> list[int]:
    """The stage indices a pipeline rank runs: looped (r, r + pp, ...) or V-shaped (ZB-V)."""
    if layout.pp == 1:
        return [0]
    if layout.pp_schedule == PipelineSchedule.ZBV:
        return [pp_rank, 2 * layout.pp - 1 - pp_rank]
    return [pp_rank + k * layout.pp for k in range(layout.virtual_stages)]


def layout_stages(model: ModelSpec, layout: Layout) -> list[Stage]:
    """The stages `layout` cuts `model` into (torchtitan's default weights)."""
    return split_stages(model.n_layers, stage_count(layout))


def _ranges(layers: range) -> str:
    if not layers:
        return "no layers"
    if len(layers) == 1:
        return f"layer {layers.start}"
    return f"layers {layers.start}-{layers.stop - 1}"


def describe_stages(model: ModelSpec, layout: Layout) -> str:
    """One line per pipeline rank: its stages and what each holds, for `bench --dry-run`."""
    stages = layout_stages(model, layout)
    lines = []
    for rank in range(layout.pp):
        parts = []
        for s in rank_stage_ids(layout, rank):
            st = stages[s]
            extra = (["embedding"] if st.embedding else []) + (["norm+output"] if st.head else [])
            held = ", ".join([_ranges(st.layers), *extra])
            parts.append(
                f"stage {s}: {held} ({st.n_layers} layer{'' if st.n_layers == 1 else 's'})"
            )
        lines.append(f"pp rank {rank}: " + "; ".join(parts))
    return "\n".join(lines)
