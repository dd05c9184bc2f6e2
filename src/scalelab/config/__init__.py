"""Pure data: model, GPU, cluster and layout definitions, their catalogs and the layout rules."""

from scalelab.config.catalog import load_cluster, load_gpu, load_model
from scalelab.config.hardware import ClusterParams, ClusterSpec, GPUSpec
from scalelab.config.layout import Layout, LayoutTable, check, rule_violations
from scalelab.config.model import ModelSpec

__all__ = [
    "ClusterParams",
    "ClusterSpec",
    "GPUSpec",
    "Layout",
    "LayoutTable",
    "ModelSpec",
    "check",
    "load_cluster",
    "load_gpu",
    "load_model",
    "rule_violations",
]
