"""Pure data: model, GPU, cluster and layout specs, their catalogs and validation."""

from scalelab.spec.catalog import load_cluster, load_gpu, load_model
from scalelab.spec.hardware import ClusterParams, ClusterSpec, GPUSpec
from scalelab.spec.layout import Layout, LayoutTable, validate
from scalelab.spec.model import ModelSpec

__all__ = [
    "ClusterParams",
    "ClusterSpec",
    "GPUSpec",
    "Layout",
    "LayoutTable",
    "ModelSpec",
    "load_cluster",
    "load_gpu",
    "load_model",
    "validate",
]
