"""scalelab: measure, explain and predict how LLM training scales across GPUs and layouts."""

__version__ = "0.1.0"
