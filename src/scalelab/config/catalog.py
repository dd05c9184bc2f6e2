"""Load models, GPUs and clusters by catalog name or from a YAML file."""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from scalelab.config.hardware import ClusterParams, ClusterSpec, GPUSpec
from scalelab.config.model import ModelSpec
from scalelab.config.stack import NEUTRAL_STACK, StackSpec
from scalelab.errors import InputError
from scalelab.io import load_user_yaml
from scalelab.suggest import same_name, unknown_name


@cache
def _catalog(kind: str) -> dict[str, dict[str, Any]]:
    text = resources.files("scalelab.config").joinpath(f"catalog/{kind}.yaml").read_text()
    data: dict[str, dict[str, Any]] = yaml.safe_load(text)
    return data


def model_names() -> list[str]:
    return list(_catalog("models"))


def gpu_names() -> list[str]:
    return list(_catalog("gpus"))


def cluster_names() -> list[str]:
    return list(_catalog("clusters"))


def stack_names() -> list[str]:
    return list(_catalog("stacks"))


def _looks_like_file(name: str) -> bool:
    return name.endswith((".yaml", ".yml")) or "/" in name or Path(name).is_file()


def _read_yaml(field: str, path_text: str) -> dict[str, Any]:
    path = Path(path_text)
    data = load_user_yaml(field, path)  # missing, a folder, a device, too large: one line
    if not isinstance(data, dict):
        raise InputError(field, f"{path_text} must hold a YAML mapping of fields")
    return data


def _pydantic_message(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    message = str(err["msg"]).removeprefix("Value error, ")  # a check over several fields
    return f"{where}: {message}" if where else message


def _catalog_name(kind: str, name: str) -> str:
    """`name`, or the catalog name it spells another way (`Llama3_8B` -> `llama3-8b`)."""
    if name in _catalog(kind):
        return name
    return same_name(name, list(_catalog(kind))) or name


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog model by name (any spelling of it: case, `-`, `_` and `.` do not matter), or any
    decoder described in a YAML file."""
    if not _looks_like_file(name_or_path):
        name_or_path = _catalog_name("models", name_or_path)
    if name_or_path in _catalog("models"):
        data = dict(_catalog("models")[name_or_path])
        data.setdefault("name", name_or_path)
    elif _looks_like_file(name_or_path):
        data = _read_yaml("model", name_or_path)
        data.setdefault("name", Path(name_or_path).stem)
    else:
        raise InputError(
            "model",
            unknown_name(
                "model", name_or_path, model_names(), listed_by="scalelab models", or_file=True
            ),
        )
    try:
        return ModelSpec(**data)
    except ValidationError as exc:
        raise InputError("model", f"{name_or_path}: {_pydantic_message(exc)}") from None


def load_gpu(name: str) -> GPUSpec:
    name = _catalog_name("gpus", name)
    if name not in _catalog("gpus"):
        raise InputError(
            "gpu", unknown_name("GPU", name, gpu_names(), listed_by="scalelab hardware")
        )
    return GPUSpec(name=name, **_catalog("gpus")[name])


def cluster_from_dict(data: dict[str, Any], default_name: str) -> ClusterSpec:
    """Build a cluster from its YAML mapping; `gpu` is a catalog name or an inline GPU mapping."""
    data = dict(data)
    data.setdefault("name", default_name)
    gpu = data.get("gpu")
    if isinstance(gpu, str):
        data["gpu"] = load_gpu(gpu)
    elif isinstance(gpu, dict):
        try:
            data["gpu"] = GPUSpec(**{"name": "custom", **gpu})
        except ValidationError as exc:
            raise InputError("cluster", f"gpu: {_pydantic_message(exc)}") from None
    else:
        raise InputError("cluster", "field 'gpu' must be a GPU name or a mapping of GPU fields")
    data.setdefault("nvlink_domain", data.get("gpus_per_node", 8))
    params = data.get("params") or {}
    if not isinstance(params, dict):
        raise InputError(
            "cluster", f"{default_name}: params: must be a mapping of ClusterParams fields"
        )
    try:
        data["params"] = ClusterParams(**params)
        return ClusterSpec(**data)
    except ValidationError as exc:
        raise InputError("cluster", f"{default_name}: {_pydantic_message(exc)}") from None


def load_cluster(name_or_path: str) -> ClusterSpec:
    """A catalog cluster by name (any spelling of it), or a cluster YAML file (such as one
    `calibrate` wrote)."""
    if not _looks_like_file(name_or_path):
        name_or_path = _catalog_name("clusters", name_or_path)
    if name_or_path in _catalog("clusters"):
        return cluster_from_dict(_catalog("clusters")[name_or_path], name_or_path)
    if _looks_like_file(name_or_path):
        return cluster_from_dict(_read_yaml("cluster", name_or_path), Path(name_or_path).stem)
    raise InputError(
        "cluster",
        unknown_name(
            "cluster", name_or_path, cluster_names(), listed_by="scalelab hardware", or_file=True
        ),
    )


def gpu_for_device(device_name: str) -> str | None:
    """The catalog GPU whose `cuda_names` include a CUDA device name (case and spacing ignored);
    failing that, the one whose CUDA name is contained in the device's (a longer marketing
    string). None when no GPU matches."""
    wanted = " ".join(device_name.split()).lower()
    known = [
        (" ".join(cuda.split()).lower(), gpu)
        for gpu, entry in _catalog("gpus").items()
        for cuda in entry.get("cuda_names") or ()
    ]
    for cuda, gpu in known:
        if cuda == wanted:
            return gpu
    contained = [(len(cuda), gpu) for cuda, gpu in known if cuda and cuda in wanted]
    return max(contained)[1] if contained else None


def cluster_for_device(device_name: str) -> str | None:
    """The first catalog cluster built from the GPU a CUDA device name belongs to
    (torch.cuda.get_device_name()), or None: a new GPU needs only its YAML entries."""
    gpu = gpu_for_device(device_name)
    if gpu is None:
        return None
    for cluster, entry in _catalog("clusters").items():
        if entry.get("gpu") == gpu:
            return cluster
    return None


@cache
def _catalog_stack(name: str) -> StackSpec:
    return StackSpec(**{"name": name, **_catalog("stacks")[name]})


def load_stack(name_or_path: str | None = None) -> StackSpec:
    """A catalog stack by name (None: `generic`, which changes nothing), or a stack described in
    a YAML file. Catalog stacks are built once (the predictor asks for the default on every call)."""
    name_or_path = name_or_path or NEUTRAL_STACK
    if not _looks_like_file(name_or_path):
        name_or_path = _catalog_name("stacks", name_or_path)
    if name_or_path in _catalog("stacks"):
        return _catalog_stack(name_or_path)
    if not _looks_like_file(name_or_path):
        raise InputError(
            "stack",
            unknown_name(
                "stack", name_or_path, stack_names(), listed_by="scalelab stacks", or_file=True
            ),
        )
    data = _read_yaml("stack", name_or_path)
    data.setdefault("name", Path(name_or_path).stem)
    try:
        return StackSpec(**data)
    except ValidationError as exc:
        raise InputError("stack", f"{name_or_path}: {_pydantic_message(exc)}") from None
