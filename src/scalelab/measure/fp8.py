"""FP8 training through torchao's float8 linears, as torchtitan's `Float8Converter` does it.

- `convert`: before parallelisation, every `nn.Linear` of the transformer blocks (q, k, v, o and
  the three feed-forward projections) becomes a torchao `Float8Linear`; the output head stays in
  the training dtype (torchtitan's default `filter_fqns = ["output"]`), and so does any linear
  whose dimensions are not multiples of 16 (what the FP8 GEMM requires). The attention core
  (scaled_dot_product_attention) and the embedding are not linears and stay as they are. This is
  what the predictor assumes for `precision fp8`: block GEMMs at the fp8 peak, attention and the
  LM head at bf16 (`scalelab.perf.compute.layer_compute`).
- Recipes: `tensorwise` (one dynamic scale per tensor) or `rowwise` (one per row, fp32 scales
  as torchao's recipe sets them), `BenchOptions.fp8_recipe`.
- With FSDP and the tensorwise recipe, `fp8_all_gather` gathers the converted weights in fp8
  (`enable_fsdp_float8_all_gather`) and precomputes their scales after each optimizer step in one
  all-reduce (`precompute_float8_dynamic_scale_for_fsdp`). Off by default, as in torchtitan;
  the predictor prices parameter gathers in bf16, so the default run is the one it describes.
- Under TP, the tensorwise recipe uses torchao's `Float8ColwiseParallel` /
  `Float8RowwiseParallel` / `PrepareFloat8ModuleInput` (the activations travel in fp8); the
  rowwise recipe uses the plain styles (torchtitan does the same).
- Hardware: float8 matmuls (`torch._scaled_mm`) need CUDA compute capability 8.9 (Ada, Hopper)
  or newer; on CPU, PyTorch 2.13 runs `_scaled_mm` too (measured), so the CPU path is real and
  tested, only not fast.

torchao is the optional extra `scalelab[fp8]`, imported only when a layout asks for fp8.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from typing import Any

from scalelab.errors import InputError

RECIPES: tuple[str, ...] = ("tensorwise", "rowwise")
MIN_CAPABILITY = (8, 9)
SKIPPED_FQNS = ("output",)  # torchtitan's Float8 filter_fqns default: the LM head stays bf16
EXTRA_LINE = "fp8 training needs torchao: pip install 'scalelab[fp8]' (torchao>=0.18)"


def require_torchao() -> None:
    """One line naming the extra when torchao is not installed (no import of torch here)."""
    if importlib.util.find_spec("torchao") is None:
        raise InputError("precision", EXTRA_LINE)


def check_device(device_type: str, capability: tuple[int, int] | None, name: str = "") -> None:
    """Refuse a CUDA device without FP8 tensor cores (compute capability < 8.9)."""
    if device_type == "cuda" and capability is not None and tuple(capability) < MIN_CAPABILITY:
        major, minor = capability
        raise InputError(
            "precision",
            f"fp8 needs a GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell); "
            f"{name or 'this GPU'} is {major}.{minor}: use --precision bf16",
        )


def check_local_device() -> None:
    """`check_device` for this process's first CUDA device (nothing to check on CPU)."""
    import torch

    if torch.cuda.is_available():
        check_device("cuda", torch.cuda.get_device_capability(0), torch.cuda.get_device_name(0))


def check_gloo(recipe: str, tp: int, sequence_parallel: bool) -> None:
    """On CPU (gloo): tensorwise TP with sequence parallelism all-gathers fp8 activations, and
    gloo has no float8 dtype ("RuntimeError: Invalid scalar type", measured, torch 2.13)."""
    if recipe == "tensorwise" and tp > 1 and sequence_parallel:
        raise InputError(
            "sp",
            "fp8 tensorwise with TP and sequence parallelism gathers fp8 activations, which gloo "
            "(CPU) cannot carry; on CPU use --no-sp or --fp8-recipe rowwise",
        )


def _fits(module: Any, fqn: str) -> bool:
    """torchtitan's filter: not the output head, and both dimensions multiples of 16."""
    from torch import nn

    if not isinstance(module, nn.Linear):
        return False
    if any(fqn == s or fqn.endswith("." + s) for s in SKIPPED_FQNS):
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def config(recipe: str, fsdp_all_gather: bool) -> Any:
    """torchao's Float8LinearConfig for `recipe`."""
    require_torchao()
    from torchao.float8 import Float8LinearConfig

    if recipe not in RECIPES:
        raise InputError("fp8-recipe", f"'{recipe}' is not a recipe: give {' or '.join(RECIPES)}")
    if recipe == "tensorwise":
        return Float8LinearConfig(enable_fsdp_float8_all_gather=fsdp_all_gather)
    return Float8LinearConfig.from_recipe_name(recipe)


def convert(model: Any, recipe: str, fsdp_all_gather: bool = False) -> list[str]:
    """Swap the model's eligible `nn.Linear`s for `Float8Linear`s in place (call on the meta
    model, before TP, activation checkpointing, compile and FSDP); returns the converted names."""
    from torchao.float8 import convert_to_float8_training

    eligible = [fqn for fqn, mod in model.named_modules() if _fits(mod, fqn)]
    convert_to_float8_training(
        model, config=config(recipe, fsdp_all_gather), module_filter_fn=_fits
    )
    return eligible


def converted(model: Any) -> list[str]:
    """Names of the model's `Float8Linear` modules."""
    from torchao.float8.float8_linear import Float8Linear

    return [fqn for fqn, mod in model.named_modules() if isinstance(mod, Float8Linear)]


def tp_styles(recipe: str | None) -> tuple[Any, Any, Any]:
    """(colwise, rowwise, prepare-module-input) parallel styles for the blocks' linears."""
    if recipe == "tensorwise":
        from torchao.float8.float8_tensor_parallel import (
            Float8ColwiseParallel,
            Float8RowwiseParallel,
            PrepareFloat8ModuleInput,
        )

        return Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
    )

    return ColwiseParallel, RowwiseParallel, PrepareModuleInput


def precompute_scales(modules: Iterable[Any]) -> None:
    """After the optimizer step: the fp8 all-gather's scales of every FSDP module, at once."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    for module in modules:
        precompute_float8_dynamic_scale_for_fsdp(module)


def note(recipe: str, n_converted: int, fsdp_all_gather: bool, tp: bool) -> str:
    """What the record says about the FP8 set-up."""
    text = (
        f"torchao float8 {recipe}: {n_converted} block linears per rank in fp8; output head, "
        "attention core and embedding in the training dtype"
    )
    if fsdp_all_gather:
        text += "; FSDP gathers the fp8 weights (predictor prices gathers in bf16)"
    if tp:
        text += (
            "; TP with fp8 activations (Float8ColwiseParallel/Float8RowwiseParallel)"
            if recipe == "tensorwise"
            else "; TP with the plain parallel styles"
        )
    return text
