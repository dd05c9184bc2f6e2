"""scalelab: measure, explain and predict how LLM training scales across GPUs and layouts.

The Python API (`scalelab.api`, loaded on first use so that `import scalelab` stays cheap):

- `scalelab.predict(model, cluster, gpus=..., **layout)` -> `scalelab.api.LayoutPrediction`
- `scalelab.search(model, cluster, gpus=..., **constraints)` -> `scalelab.api.LayoutSearch`

Both results have `.to_pandas()`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from scalelab.api import LayoutPrediction, LayoutSearch, predict

__all__ = ["LayoutPrediction", "LayoutSearch", "__version__", "predict", "search"]


def __getattr__(name: str) -> Any:
    """The API's names, imported when first asked for (`scalelab.search` is the module
    `scalelab.search`, made callable there: calling it is `scalelab.api.search`)."""
    if name == "search":
        import scalelab.search as search_module

        return search_module
    if name in ("predict", "LayoutPrediction", "LayoutSearch"):
        import scalelab.api

        return getattr(scalelab.api, name)
    raise AttributeError(f"module 'scalelab' has no attribute {name!r}")
