"""Runs from a torchtitan training log and its job config (`scalelab runs import --from torchtitan`).

torchtitan prints, on the rank that logs metrics, one line per logged step
(torchtitan/components/metrics.py, MetricsProcessor.log):

    step: 20  loss:  7.1234  grad_norm:  1.0123  memory: 62.35GiB(78.61%)  tps: 5,762  tflops: 267.34  mfu: 27.03%

(older versions print `wps:` for `tps:` and no grad_norm), where tps is tokens per second per GPU
(the rank's tokens over the interval, divided by the non-data-parallel degree) and memory the peak
reserved GiB. Around them it logs the GPU ("CUDA capacity: NVIDIA H100 80GB HBM3 with 79.11GiB
memory"), the device mesh ("Building 2-D device mesh with ['dp_shard', 'tp'], [4, 2]") and the
batch ("Training starts at step 1, with local batch size 2, global batch size 16, ... sequence
length 8192"). The job config (the TOML the run was launched with) gives the model, the layout,
recompute and precision.

The log and config become one row in the published-runs layout, read by the same importer and
rules as any table (the framework is torchtitan, so its documented defaults apply where the config
is silent). The measured throughput is the median tps of the logged steps after the first (step 1
includes compilation and warm-up).
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path
from typing import Any

from scalelab.errors import InputError
from scalelab.io import read_user_text
from scalelab.runs.importer import Reading, read_row

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_METRIC = re.compile(
    r"step:\s*(?P<step>\d+)\b.*?\b(?:tps|wps):\s*(?P<tps>[\d,]+(?:\.\d+)?)", re.IGNORECASE
)
_MEMORY = re.compile(r"memory:\s*(?P<gib>[\d.]+)\s*GiB", re.IGNORECASE)
_MFU = re.compile(r"\bmfu:\s*(?P<mfu>[\d.]+)%", re.IGNORECASE)
_GPU = re.compile(r"(?:CUDA|GPU|ROCM|XPU) capacity:\s*(?P<name>.+?) with [\d.]+\s*GiB memory", re.I)
_MESH = re.compile(r"Building \d+-D device mesh with \[(?P<names>[^\]]*)\],\s*\[(?P<dims>[^\]]*)\]")
_BATCH = re.compile(r"local batch size (?P<local>\d+)(?:, global batch size (?P<global>\d+))?")
_SEQ = re.compile(r"sequence length (?P<seq>\d+)")
_MODEL = re.compile(r"Building (?P<name>[\w.-]+) (?P<flavor>[\w.-]+) with ")


def _table(config: dict[str, Any], name: str) -> dict[str, Any]:
    value = config.get(name, {})
    return value if isinstance(value, dict) else {}


def parse_log(text: str) -> dict[str, Any]:
    """What a torchtitan log states: metric lines (step, tps, memory, mfu), GPU, mesh, batch."""
    out: dict[str, Any] = {"steps": []}
    for raw_line in text.splitlines():
        line = _ANSI.sub("", raw_line)
        if m := _METRIC.search(line):
            mem = _MEMORY.search(line)
            mfu = _MFU.search(line)
            out["steps"].append(
                {
                    "step": int(m.group("step")),
                    "tps": float(m.group("tps").replace(",", "")),
                    "memory_gib": float(mem.group("gib")) if mem else None,
                    "mfu_pct": float(mfu.group("mfu")) if mfu else None,
                }
            )
            continue
        if (m := _GPU.search(line)) and "gpu" not in out:
            out["gpu"] = m.group("name").strip()
        if (m := _MESH.search(line)) and "mesh" not in out:
            names = [n.strip(" '\"") for n in m.group("names").split(",") if n.strip()]
            dims = [int(d) for d in m.group("dims").split(",") if d.strip()]
            out["mesh"] = dict(zip(names, dims, strict=False))
        if (m := _BATCH.search(line)) and "local_batch" not in out:
            out["local_batch"] = int(m.group("local"))
            if m.group("global"):
                out["global_batch"] = int(m.group("global"))
        if (m := _SEQ.search(line)) and "seq_len" not in out:
            out["seq_len"] = int(m.group("seq"))
        if (m := _MODEL.search(line)) and "model" not in out:
            out["model"] = f"{m.group('name')} {m.group('flavor')}"
    return out


def _setting(config: dict[str, Any], key: str, default: Any, *tables: str) -> Any:
    """A job-config value from the first table that has it (torchtitan moved settings between
    [training], [parallelism] and [experimental] across versions)."""
    for table in tables:
        value = _table(config, table).get(key)
        if value is not None:
            return value
    return default


def _int(value: Any, key: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InputError("config", f"{key} = {value!r} is not a whole number") from None


def _degrees(log: dict[str, Any], config: dict[str, Any]) -> dict[str, int]:
    """Parallel degrees: the logged device mesh, else the config (-1 = the rest of the GPUs)."""
    mesh = log.get("mesh") or {}
    if mesh:
        dp_shard = mesh.get("dp_shard", mesh.get("dp", 1))
        return {
            "tp": mesh.get("tp", 1),
            "pp": mesh.get("pp", 1),
            "cp": mesh.get("cp", 1),
            "dp_replicate": mesh.get("dp_replicate", 1),
            "dp_shard": dp_shard,
        }
    where = ("parallelism", "training", "experimental")

    def get(key: str, default: int) -> int:
        return _int(_setting(config, key, default, *where), key)

    shard = _setting(config, "data_parallel_shard_degree", None, *where)
    if shard is None:  # torchtitan of 2024: data_parallel_degree
        shard = _setting(config, "data_parallel_degree", -1, *where)
    return {
        "tp": get("tensor_parallel_degree", 1),
        "pp": get("pipeline_parallel_degree", 1),
        "cp": get("context_parallel_degree", 1),
        "dp_replicate": get("data_parallel_replicate_degree", 1),
        "dp_shard": _int(shard, "data_parallel_shard_degree"),
    }


def log_to_row(
    log_text: str,
    config_text: str,
    where: str = "torchtitan log",
    gpus: int | None = None,
    gpus_per_node: int | None = None,
    network: str = "",
) -> dict[str, str]:
    """A torchtitan log and its job config as one row of the published-runs layout."""
    try:
        config = tomllib.loads(config_text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError("config", f"not a valid TOML job config ({exc})") from None
    log = parse_log(log_text)
    steps = log["steps"]
    if not steps:
        raise InputError("log", "no torchtitan metric line ('step: N ... tps: T') in the log")
    model_cfg, training = _table(config, "model"), _table(config, "training")
    ac = _table(config, "activation_checkpoint")
    degrees = _degrees(log, config)
    if degrees["dp_shard"] == -1:
        if gpus is None:
            raise InputError(
                "gpus", "the log has no device mesh and the config shards over -1: give --gpus"
            )
        degrees["dp_shard"] = gpus // (
            degrees["tp"] * degrees["pp"] * degrees["cp"] * degrees["dp_replicate"]
        )
    dp = degrees["dp_shard"] * degrees["dp_replicate"]
    world = dp * degrees["tp"] * degrees["pp"] * degrees["cp"]
    if gpus is not None and gpus != world:
        raise InputError("gpus", f"--gpus {gpus} differs from the log's device mesh ({world} GPUs)")
    local = log.get("local_batch") or training.get("local_batch_size") or training.get("batch_size")
    local = _int(local, "local_batch_size") if local is not None else None
    global_batch = log.get("global_batch") or training.get("global_batch_size")
    global_batch = _int(global_batch, "global_batch_size") if global_batch is not None else None
    if not global_batch or global_batch < 0:
        global_batch = local * dp if local else None
    micro = local
    if degrees["pp"] > 1:
        micro = _setting(
            config, "pipeline_parallel_microbatch_size", 1, "parallelism", "experimental"
        )
    if degrees["dp_shard"] > 1 and degrees["dp_replicate"] > 1:
        sharding = "HYBRID_SHARD"
    elif degrees["dp_shard"] > 1:
        sharding = "FSDP2 full shard"
    elif degrees["dp_replicate"] > 1:
        sharding = "DDP"
    else:
        sharding = "none"
    converters = model_cfg.get("converters", []) or _table(config, "float8").get("converters", [])
    fp8 = any("float8" in str(c) for c in converters) or bool(
        _table(config, "float8").get("enable_float8_linear")  # torchtitan of 2024
    )
    precision = str(training.get("mixed_precision_param", "bfloat16"))
    precision = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(precision, precision)
    if fp8:
        precision += " + fp8 linears"
    recipe = _table(config, "float8").get("recipe_name") or _table(
        _table(config, "quantize"), "linear"
    ).get("float8", {}).get("recipe_name", "")
    compiled = bool(training.get("compile")) or bool(_table(config, "compile").get("enable"))
    steady = [s for s in steps if s["step"] > steps[0]["step"]] or steps
    tps = statistics.median(s["tps"] for s in steady)
    memory = max((s["memory_gib"] for s in steady if s["memory_gib"] is not None), default=None)
    notes = [
        f"tps = median of {len(steady)} logged steps "
        f"({steady[0]['step']}-{steady[-1]['step']}; the first logged step left out)"
    ]
    if memory is not None:
        notes.append(f"peak mem {memory:.2f} GiB (reserved)")
    if compiled:
        notes.append("torch.compile")
    if _setting(config, "enable_async_tensor_parallel", False, "parallelism", "experimental"):
        notes.append("AsyncTP")
    model = log.get("model") or f"{model_cfg.get('name', '')} {model_cfg.get('flavor', '')}"
    return {
        "source": where,
        "framework": "torchtitan",
        "model": model.strip(),
        "seq_len": str(log.get("seq_len") or training.get("seq_len") or ""),
        "global_batch_seqs": str(global_batch or ""),
        "micro_batch": str(micro or ""),
        "gpu_type": log.get("gpu", ""),
        "num_gpus": str(world),
        "gpus_per_node": str(gpus_per_node or ""),
        "network": network,
        "tp": str(degrees["tp"]),
        "pp": str(degrees["pp"]),
        "cp": str(degrees["cp"]),
        "dp": str(dp),
        "hsdp_shard_size": str(degrees["dp_shard"]) if sharding == "HYBRID_SHARD" else "",
        "sharding": sharding,
        "activation_checkpointing": str(ac.get("mode", "")),
        "precision": precision,
        "fp8_scaling": str(recipe or ""),
        "pp_schedule": str(
            _setting(config, "pipeline_parallel_schedule", "", "parallelism", "experimental")
        ),
        "tokens_per_sec_per_gpu": f"{tps:.1f}",
        "notes": "; ".join(notes),
    }


def import_torchtitan(
    log_path: Path,
    config_path: Path,
    gpus: int | None = None,
    gpus_per_node: int | None = None,
    network: str = "",
) -> Reading:
    """One torchtitan run (its log and job config) read into a typed run, or every reason not."""
    row = log_to_row(
        read_user_text("log", log_path),
        read_user_text("config", config_path),
        where=f"torchtitan log {log_path.name}",
        gpus=gpus,
        gpus_per_node=gpus_per_node,
        network=network,
    )
    return read_row(0, row)
