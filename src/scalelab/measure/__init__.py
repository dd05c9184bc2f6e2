"""The real harness: a Llama decoder trained under any `Layout` with PyTorch distributed.

Nothing here imports torch at package import time, so `import scalelab` and `scalelab predict`
work without the `measure` extra; the submodules that need torch import it themselves.
"""
