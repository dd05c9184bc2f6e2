"""A layout out as the config of the framework that runs it, and back in (torch-free).

Out (`emit`): the torchtitan launch (its argument list, with torchtitan 0.3's own keys and values
as its ConfigManager parses them, or the TOML job file of earlier releases), the Megatron-LM
argument list, or the `scalelab bench` command line. Where the framework cannot express the
layout, `InputError` names the field and why.

In (`read_config`): any of those texts, told apart by content, into a `Layout`, the model and
the batch; what the text leaves unstated takes the framework's own default, named in
`Ingested.defaults`; what scalelab cannot model is refused with the field named.

The spellings and defaults live in catalog/frameworks.yaml with their sources.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import tomllib

from scalelab.config.layout import Layout
from scalelab.config.model import ModelSpec
from scalelab.config.options import (
    AttentionKernel,
    PipelineSchedule,
    Precision,
    Recompute,
    Sharding,
)
from scalelab.errors import InputError

TARGETS = ("torchtitan", "torchtitan-toml", "megatron", "bench")


@cache
def _data() -> dict[str, Any]:
    from scalelab.config.catalog import _catalog

    return _catalog("frameworks")


@dataclass
class Ingested:
    """What a framework config says: the layout, the model, and which values were defaults."""

    framework: str
    model: ModelSpec
    layout: Layout
    defaults: dict[str, str] = field(default_factory=dict)
    gpus_per_node: int | None = None  # the launcher's processes per node, where it says


# Spelling of schedules and recompute values ---------------------------------------------------
# The layout flags accept these besides scalelab's names (case-insensitive): torchtitan's
# schedule class names (torch.distributed.pipelining) and AC modes, Megatron's words.
SCHEDULE_SPELLINGS: dict[str, str] = {
    "gpipe": "gpipe",
    "1f1b": "1f1b",
    "interleaved": "interleaved",
    "interleaved1f1b": "interleaved",
    "interleaved-1f1b": "interleaved",
    "zbv": "zbv",
    "zbvzerobubble": "zbv",
    "zero-bubble-v": "zbv",
}
RECOMPUTE_SPELLINGS: dict[str, str] = {
    "none": "none",
    "no": "none",
    "off": "none",
    "selective": "selective",
    "op": "selective",
    "full": "full",
    "uniform": "full",
}


def canonical_option(field_name: str, value: str) -> str:
    """scalelab's name for a schedule or recompute value spelled as torchtitan or Megatron spell
    it (case-insensitive); other values come back unchanged (the option's parser judges them)."""
    table = {"pp_schedule": SCHEDULE_SPELLINGS, "recompute": RECOMPUTE_SPELLINGS}.get(field_name)
    if table is None:
        return value
    return table.get(value.strip().lower(), value)


# Common helpers --------------------------------------------------------------------------------
def _nodes(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(nnodes, nproc_per_node) for torchrun."""
    if gpus <= gpus_per_node:
        return 1, gpus
    if gpus % gpus_per_node:
        raise InputError("gpus", f"{gpus} GPUs are not whole nodes of {gpus_per_node}")
    return gpus // gpus_per_node, gpus_per_node


def _command(parts: list[str]) -> str:
    """One argument per line, joined with shell continuations."""
    lines, i = [], 0
    while i < len(parts):
        token = parts[i]
        nxt = parts[i + 1] if i + 1 < len(parts) else None
        if token.startswith("-") and nxt is not None and not nxt.startswith("-"):
            lines.append(f"{shlex.quote(token)} {shlex.quote(nxt)}")
            i += 2
        else:
            lines.append(shlex.quote(token))
            i += 1
    return " \\\n  ".join(lines) + "\n"


def _tokens(text: str) -> list[str]:
    try:
        return shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise InputError("from", f"cannot split the file into arguments: {exc}") from None


def _options(tokens: list[str]) -> tuple[dict[str, str | bool], list[str]]:
    """`--key value`, `--key=value` and bare `--flag` (True), and the positional tokens."""
    options: dict[str, str | bool] = {}
    positional: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.startswith("-") and len(token) > 1:
            key, eq, value = token.lstrip("-").partition("=")
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            if eq:
                options[key] = value
            elif nxt is not None and not nxt.startswith("-") and ":" not in nxt:
                options[key] = nxt
                i += 1
            else:
                options[key] = True
        else:
            positional.append(token)
        i += 1
    return options, positional


def _int(key: str, value: str | bool | int) -> int:
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InputError(key, f"'{value}' is not an integer") from None


def _per_node(options: dict[str, str | bool]) -> int | None:
    nproc = options.get("nproc_per_node", options.get("nproc-per-node"))
    return None if nproc is None or nproc is True else _int("nproc_per_node", nproc)


def _gpus_from_launcher(options: dict[str, str | bool]) -> int | None:
    nproc = options.get("nproc_per_node", options.get("nproc-per-node"))
    if nproc is None or nproc is True:
        return None
    nnodes = options.get("nnodes", 1)
    return _int("nnodes", nnodes) * _int("nproc_per_node", nproc)


def _catalog_model(name: str) -> ModelSpec:
    from scalelab.config.catalog import load_model

    return load_model(name)


# torchtitan --------------------------------------------------------------------------------------
def _titan_model(model: ModelSpec) -> dict[str, Any]:
    entry = _data()["torchtitan"]["models"].get(model.name)
    if entry is None:
        known = ", ".join(_data()["torchtitan"]["models"])
        raise InputError(
            "model",
            f"torchtitan {_data()['torchtitan']['release']} has no config for {model.name}: its "
            f"model comes from --module/--config (scalelab knows {known})",
        )
    return dict(entry)


def _stage_split(layout: Layout, model: ModelSpec) -> dict[str, int]:
    """The pipeline keys giving `virtual_stages` stages per rank: none where torchtitan's default
    (1 for single-stage schedules, 2 for multi-stage ones) gives it, else
    pipeline_parallel_layers_per_stage with the first/last stage's lighter weights (torchtitan
    makes ceil((L + first_less + last_less) / layers_per_stage) stages)."""
    single = layout.pp_schedule in (PipelineSchedule.GPIPE, PipelineSchedule.ONE_F_ONE_B)
    default = 1 if single else 2
    if layout.pp == 1 or layout.virtual_stages == default:
        return {}
    stages = layout.pp * layout.virtual_stages
    for first, last in ((1, 1), (0, 0), (1, 0), (0, 1)):
        for lps in range(model.n_layers, 0, -1):
            if math.ceil((model.n_layers + first + last) / lps) == stages:
                return {
                    "pipeline_parallel_layers_per_stage": lps,
                    "pipeline_parallel_first_stage_less_layers": first,
                    "pipeline_parallel_last_stage_less_layers": last,
                }
    raise InputError(
        "virtual_stages",
        f"torchtitan sets stages through pipeline_parallel_layers_per_stage: no value gives "
        f"{stages} stages for {model.n_layers} layers",
    )


def _titan_values(layout: Layout, model: ModelSpec, gpus_per_node: int) -> dict[str, Any]:
    """torchtitan's keys and values for `layout` (every one stated), or InputError."""
    if layout.precision != Precision.BF16:
        raise InputError(
            "precision",
            "torchtitan 0.3 turns on Float8 through its config registry's model converters "
            "(model_spec, not a command-line key): pick a *_float8 config by hand",
        )
    if layout.attention != AttentionKernel.FLASH:
        raise InputError(
            "attention", f"torchtitan runs SDPA/flex attention, not {layout.attention}"
        )
    if layout.sharding in (Sharding.ZERO1, Sharding.ZERO2):
        raise InputError(
            "sharding",
            f"torchtitan offers FSDP, HSDP and DDP (data_parallel_*_degree), not {layout.sharding}",
        )
    if layout.expert_tp != 1:
        raise InputError(
            "expert_tp",
            "torchtitan 0.3 has no expert tensor-parallel degree (ParallelismConfig has "
            "expert_parallel_degree only)",
        )
    dp = layout.dp
    if layout.sharding == Sharding.DDP:
        if layout.cp > 1:
            raise InputError(
                "sharding",
                "torchtitan shards parameters over the context-parallel ranks (FSDP over "
                "dp_shard x cp): ddp with cp > 1 cannot be expressed",
            )
        replicate, shard = dp, 1
    elif layout.sharding == Sharding.HSDP:
        shard = layout.dp_shard_on(gpus_per_node)
        replicate = dp // shard
    else:
        if dp * layout.cp == 1:
            raise InputError(
                "sharding",
                "torchtitan applies FSDP only over more than one rank (dp_shard x cp > 1): "
                "with dp 1 and cp 1 it runs unsharded, as sharding ddp",
            )
        replicate, shard = 1, dp
    values: dict[str, Any] = {
        "parallelism.data_parallel_replicate_degree": replicate,
        "parallelism.data_parallel_shard_degree": shard,
        "parallelism.fsdp_reshard_after_forward": "always"
        if layout.reshard_after_forward
        else "never",
        "parallelism.tensor_parallel_degree": layout.tp,
        "parallelism.enable_sequence_parallel": bool(layout.sequence_parallel),
        "parallelism.pipeline_parallel_degree": layout.pp,
        "parallelism.context_parallel_degree": layout.cp,
        "parallelism.expert_parallel_degree": layout.ep,
    }
    if layout.pp > 1:
        values["parallelism.pipeline_parallel_schedule"] = _data()["torchtitan"]["schedules"][
            str(layout.pp_schedule)
        ]
        values["parallelism.pipeline_parallel_microbatch_size"] = layout.micro_batch
        for key, value in _stage_split(layout, model).items():
            values[f"parallelism.{key}"] = value
        local = layout.micro_batch * layout.n_microbatches
    else:
        local = layout.micro_batch
    if layout.pp > 1:
        # torchtitan 0.3's Trainer.Config refuses pipelines with CUDA graphs on (trainer.py:
        # "CUDA graphs do not support pipeline parallelism yet. Set --training.disable_cuda_graphs").
        values["training.disable_cuda_graphs"] = True
    values["training.local_batch_size"] = local
    values["training.global_batch_size"] = layout.global_batch
    values["training.seq_len"] = layout.seq_len
    return values


def emit_torchtitan(layout: Layout, model: ModelSpec, gpus_per_node: int) -> str:
    """The torchrun command line of torchtitan 0.3 for `layout` (ConfigManager's keys)."""
    entry = _titan_model(model)
    values = _titan_values(layout, model, gpus_per_node)
    nnodes, nproc = _nodes(layout.gpus, gpus_per_node)
    parts = ["torchrun", "--nnodes", str(nnodes), "--nproc_per_node", str(nproc)]
    parts += list(_data()["torchtitan"]["entry"])
    parts += ["--module", entry["module"], "--config", entry["config"]]
    for key, value in values.items():
        if isinstance(value, bool):
            section, _, name = key.partition(".")
            parts.append(f"--{key}" if value else f"--{section}.no_{name}")
        else:
            parts += [f"--{key}", str(value)]
    parts.append(f"activation-checkpoint:{layout.recompute}")
    header = (
        f"# scalelab: {model.name}, {layout.gpus} GPUs, {layout.label} "
        f"(torchtitan {_data()['torchtitan']['release']})\n"
    )
    return header + _command(parts)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def emit_torchtitan_toml(layout: Layout, model: ModelSpec, gpus_per_node: int) -> str:
    """The TOML job file with the same keys, for torchtitan releases that read one."""
    entry = _titan_model(model)
    values = _titan_values(layout, model, gpus_per_node)
    sections: dict[str, dict[str, Any]] = {
        "job": {"description": f"scalelab: {model.name} {layout.label} on {layout.gpus} GPUs"},
        "model": {"name": entry["module"], "flavor": entry["flavor"]},
    }
    for key, value in values.items():
        section, _, name = key.partition(".")
        sections.setdefault(section, {})[name] = value
    sections["activation_checkpoint"] = {"mode": str(layout.recompute)}
    if layout.recompute == Recompute.SELECTIVE:
        sections["activation_checkpoint"]["selective_ac_option"] = "op"
    lines = [f"# torchrun with {layout.gpus} GPUs (world size = the degrees' product)"]
    for section, items in sections.items():
        lines.append(f"\n[{section}]")
        lines += [f"{name} = {_toml_value(value)}" for name, value in items.items()]
    return "\n".join(lines) + "\n"


def _titan_layout(
    values: dict[str, Any], model: ModelSpec, gpus: int | None, defaults: dict[str, str]
) -> Layout:
    """A layout from torchtitan's keys (section-less names), defaults recorded."""
    base = dict(_data()["torchtitan"]["defaults"])
    sets = _data()["torchtitan"]["models"].get(model.name, {}).get("sets", {})
    release = _data()["torchtitan"]["release"]

    def get(name: str) -> Any:
        if name in values:
            return values[name]
        if name in sets:
            defaults[name] = f"{sets[name]} (torchtitan config {model.name}'s value)"
            return sets[name]
        defaults[name] = f"{base[name]} (torchtitan {release} default)"
        return base[name]

    tp, pp = _int("tensor_parallel_degree", get("tensor_parallel_degree")), 0
    pp = _int("pipeline_parallel_degree", get("pipeline_parallel_degree"))
    cp = _int("context_parallel_degree", get("context_parallel_degree"))
    ep = _int("expert_parallel_degree", get("expert_parallel_degree"))
    replicate = _int("data_parallel_replicate_degree", get("data_parallel_replicate_degree"))
    shard = _int("data_parallel_shard_degree", get("data_parallel_shard_degree"))
    if shard == -1:
        if gpus is None:
            raise InputError(
                "data_parallel_shard_degree",
                "-1 (the ranks left over) needs the GPU count: torchrun's --nnodes and "
                "--nproc_per_node in the file, or --gpus",
            )
        shard = gpus // (replicate * cp * tp * pp)
    if min(tp, pp, cp, ep, replicate, shard) < 1:
        raise InputError("parallelism", "degrees must be positive (or -1 for the shard degree)")
    world = replicate * shard * cp * tp * pp
    if gpus is not None and gpus != world:
        raise InputError(
            "data_parallel_shard_degree",
            f"the degrees multiply to {world} ranks but the launch has {gpus}",
        )
    if replicate > 1 and shard > 1:
        sharding, group = Sharding.HSDP, shard
    elif replicate > 1 or shard * cp == 1:
        sharding, group = Sharding.DDP, None
    else:
        sharding, group = Sharding.FSDP, None
    policy = str(get("fsdp_reshard_after_forward"))
    if policy not in ("always", "never", "default"):
        raise InputError("fsdp_reshard_after_forward", f"'{policy}' is not always|never|default")
    reshard = policy == "always" or (policy == "default" and pp == 1)
    schedule_name = str(get("pipeline_parallel_schedule"))
    schedule = canonical_option("pp_schedule", schedule_name)
    if schedule not in PipelineSchedule.names():
        raise InputError(
            "pipeline_parallel_schedule",
            f"'{schedule_name}' is not modelled; scalelab models "
            + ", ".join(_data()["torchtitan"]["schedules"].values()),
        )
    single = schedule in ("gpipe", "1f1b")
    virtual = 1
    if pp > 1:
        lps = values.get("pipeline_parallel_layers_per_stage")
        if lps is None:
            virtual = 1 if single else 2
        else:
            first = _int("first", get("pipeline_parallel_first_stage_less_layers"))
            last = _int("last", get("pipeline_parallel_last_stage_less_layers"))
            stages = math.ceil((model.n_layers + first + last) / _int("layers_per_stage", lps))
            if stages % pp:
                raise InputError(
                    "pipeline_parallel_layers_per_stage",
                    f"{stages} stages do not divide over pp {pp} (torchtitan refuses it)",
                )
            virtual = stages // pp
    local = _int("local_batch_size", get("local_batch_size"))
    micro = _int("pipeline_parallel_microbatch_size", get("pipeline_parallel_microbatch_size"))
    micro = micro if pp > 1 else local
    global_batch = _int("global_batch_size", get("global_batch_size"))
    if global_batch == -1:
        global_batch = local * replicate * shard
    ac = str(get("activation_checkpoint"))
    recompute = canonical_option("recompute", ac)
    if recompute not in Recompute.names():
        raise InputError(
            "activation_checkpoint", f"'{ac}' is not modelled; scalelab models none|selective|full"
        )
    sp = values.get("enable_sequence_parallel")
    if sp is None:
        sp = get("enable_sequence_parallel")
    try:
        return Layout(
            gpus=world,
            global_batch=global_batch,
            seq_len=_int("seq_len", get("seq_len")),
            sharding=sharding,
            hsdp_shard_size=group,
            reshard_after_forward=reshard,
            tp=tp,
            sequence_parallel=bool(sp),
            pp=pp,
            pp_schedule=schedule if pp > 1 else PipelineSchedule.ONE_F_ONE_B,
            virtual_stages=virtual,
            cp=cp,
            ep=ep,
            micro_batch=micro,
            recompute=recompute,
        )
    except ValueError as exc:
        raise InputError("from", f"the config gives no valid layout: {exc}") from None


def _titan_model_of(module: str, config: str | None, flavor: str | None) -> ModelSpec:
    for name, entry in _data()["torchtitan"]["models"].items():
        if entry["module"] == module and (entry["config"] == config or entry["flavor"] == flavor):
            return _catalog_model(name)
    raise InputError(
        "config" if config else "model.flavor",
        f"torchtitan {module} {config or flavor} is not a model scalelab knows; known: "
        + ", ".join(
            f"{e['module']} {e['config']}" for e in _data()["torchtitan"]["models"].values()
        ),
    )


# torchtitan keys that change nothing scalelab models (read and left aside).
_NOT_LAYOUT = ("disable_cuda_graphs", "steps", "max_norm", "enable_async_tensor_parallel")


def _read_titan_args(text: str, gpus: int | None, model: ModelSpec | None) -> Ingested:
    options, positional = _options(_tokens(text))
    launched = _gpus_from_launcher(options)
    gpus = gpus if gpus is not None else launched
    module, config = options.get("module"), options.get("config")
    if model is None:
        if not isinstance(module, str) or not isinstance(config, str):
            raise InputError("module", "a torchtitan launch names --module and --config")
        model = _titan_model_of(module, config, None)
    values: dict[str, Any] = {}
    known = set(_data()["torchtitan"]["defaults"]) | {"pipeline_parallel_layers_per_stage"}
    known |= set(_NOT_LAYOUT)
    for key, value in options.items():
        section, _, name = key.replace("-", "_").partition(".")
        if section not in ("parallelism", "training"):
            continue
        if name.startswith("no_") and name[3:] in known and value is True:
            values[name[3:]] = False
        elif name in known:
            values[name] = value
        else:
            raise InputError(f"{section}.{name}", "is not a key scalelab models")
    for token in positional:
        if token.startswith("activation-checkpoint:"):
            values["activation_checkpoint"] = token.split(":", 1)[1]
    defaults: dict[str, str] = {}
    layout = _titan_layout(values, model, gpus, defaults)
    return Ingested("torchtitan", model, layout, defaults, _per_node(options))


def _read_titan_toml(data: dict[str, Any], gpus: int | None, model: ModelSpec | None) -> Ingested:
    if model is None:
        spec = data.get("model", {})
        model = _titan_model_of(str(spec.get("name")), None, str(spec.get("flavor")))
    values: dict[str, Any] = {}
    known = set(_data()["torchtitan"]["defaults"]) | {"pipeline_parallel_layers_per_stage"}
    known |= set(_NOT_LAYOUT)
    for section in ("parallelism", "training"):
        for name, value in data.get(section, {}).items():
            if name in known:
                values[name] = value
            elif section == "parallelism" and name not in ("enable_async_tensor_parallel",):
                raise InputError(f"{section}.{name}", "is not a key scalelab models")
    ac = data.get("activation_checkpoint", {})
    if "mode" in ac:
        values["activation_checkpoint"] = ac["mode"]
    defaults: dict[str, str] = {}
    layout = _titan_layout(values, model, gpus, defaults)
    return Ingested("torchtitan (TOML)", model, layout, defaults)


# Megatron-LM ------------------------------------------------------------------------------------
_MEGATRON_SHAPE = (
    ("num-layers", "n_layers"),
    ("hidden-size", "d_model"),
    ("num-attention-heads", "n_heads"),
    ("ffn-hidden-size", "d_ff"),
)


def emit_megatron(layout: Layout, model: ModelSpec, gpus_per_node: int) -> str:
    """The torchrun command line of Megatron-LM's pretrain_gpt.py for `layout`."""
    args: list[str] = []
    for flag, name in _MEGATRON_SHAPE:
        args += [f"--{flag}", str(getattr(model, name))]
    if model.n_kv_heads != model.n_heads:
        args += ["--group-query-attention", "--num-query-groups", str(model.n_kv_heads)]
    if model.is_moe:
        args += ["--num-experts", str(model.n_experts)]
        args += ["--moe-router-topk", str(model.experts_per_token)]
        args += ["--moe-ffn-hidden-size", str(model.expert_width)]
    args += ["--vocab-size", str(model.vocab_size)]
    args += ["--seq-length", str(layout.seq_len)]
    args += ["--max-position-embeddings", str(max(layout.seq_len, model.seq_len))]
    args += ["--tensor-model-parallel-size", str(layout.tp)]
    if layout.tp > 1 and layout.sequence_parallel:
        args.append("--sequence-parallel")
    args += ["--pipeline-model-parallel-size", str(layout.pp)]
    if layout.pp > 1:
        if layout.pp_schedule not in (PipelineSchedule.ONE_F_ONE_B, PipelineSchedule.INTERLEAVED):
            raise InputError(
                "pp_schedule",
                f"Megatron-LM's schedules are 1F1B and interleaved 1F1B, not {layout.pp_schedule}",
            )
        if layout.pp_schedule == PipelineSchedule.INTERLEAVED:
            stages = layout.pp * layout.virtual_stages
            if model.n_layers % stages:
                raise InputError(
                    "virtual_stages",
                    f"Megatron-LM's interleaved schedule needs n_layers ({model.n_layers}) "
                    f"divisible by pp x virtual_stages ({stages})",
                )
            args += ["--num-layers-per-virtual-pipeline-stage", str(model.n_layers // stages)]
    args += ["--context-parallel-size", str(layout.cp)]
    if model.is_moe:
        args += ["--expert-model-parallel-size", str(layout.ep)]
        args += ["--expert-tensor-parallel-size", str(layout.expert_tp)]
    args += ["--micro-batch-size", str(layout.micro_batch)]
    args += ["--global-batch-size", str(layout.global_batch)]
    if layout.recompute == Recompute.SELECTIVE:
        args += ["--recompute-granularity", "selective"]
    elif layout.recompute == Recompute.FULL:
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform"]
        args += ["--recompute-num-layers", "1"]
    if layout.sharding == Sharding.ZERO1:
        args.append("--use-distributed-optimizer")
    elif layout.sharding in (Sharding.FSDP, Sharding.ZERO2):
        if not layout.reshard_after_forward and layout.sharding == Sharding.FSDP:
            raise InputError(
                "reshard_after_forward",
                "Megatron-FSDP's optim_grads_params strategy reshards after forward; use "
                "sharding zero2 (optim_grads) to keep parameters",
            )
        strategy = "optim_grads_params" if layout.sharding == Sharding.FSDP else "optim_grads"
        args += ["--use-custom-fsdp", "--data-parallel-sharding-strategy", strategy]
    elif layout.sharding == Sharding.HSDP:
        raise InputError(
            "sharding", "Megatron-LM core_v0.13 has no hybrid sharding; use fsdp or zero1"
        )
    args.append("--bf16")
    if layout.precision == Precision.FP8:
        args += ["--fp8-format", "hybrid"]
    attention = {"flash": "flash", "math": "unfused", "fused": "unfused"}.get(str(layout.attention))
    if attention is None:
        raise InputError("attention", f"Megatron-LM has no {layout.attention} attention backend")
    args += ["--attention-backend", attention]
    if layout.attention == AttentionKernel.MATH:
        args.append("--no-masked-softmax-fusion")
    nnodes, nproc = _nodes(layout.gpus, gpus_per_node)
    launch = ["torchrun", "--nnodes", str(nnodes), "--nproc_per_node", str(nproc)]
    header = f"# scalelab: {model.name}, {layout.gpus} GPUs, {layout.label} (Megatron-LM {_data()['megatron']['release']})\n"
    return header + _command(launch + list(_data()["megatron"]["entry"]) + args)


def _megatron_model(options: dict[str, str | bool]) -> ModelSpec:
    """The catalog model whose shape the Megatron arguments give."""
    from scalelab.config.catalog import model_names

    shape = {name: _int(flag, options[flag]) for flag, name in _MEGATRON_SHAPE if flag in options}
    if len(shape) < len(_MEGATRON_SHAPE):
        missing = next(f for f, _ in _MEGATRON_SHAPE if f not in options)
        raise InputError(missing, "the model's shape is needed (or name the model: MODEL)")
    kv = _int("num-query-groups", options.get("num-query-groups", shape["n_heads"]))
    experts = _int("num-experts", options.get("num-experts", 0))
    vocab = options.get("vocab-size")
    for name in model_names():
        spec = _catalog_model(name)
        if all(getattr(spec, k) == v for k, v in shape.items()) and (
            spec.n_kv_heads == kv
            and spec.n_experts == experts
            and (vocab is None or spec.vocab_size == _int("vocab-size", vocab))
        ):
            return spec
    raise InputError(
        "num-layers",
        "the model's shape matches no catalog model; name it (predict MODEL --from FILE)",
    )


def _read_megatron(text: str, gpus: int | None, model: ModelSpec | None) -> Ingested:
    options, _ = _options(_tokens(text))
    options = {k.replace("_", "-"): v for k, v in options.items()}
    launched = _gpus_from_launcher({k.replace("-", "_"): v for k, v in options.items()})
    gpus = gpus if gpus is not None else launched
    if gpus is None:
        raise InputError(
            "nproc-per-node",
            "Megatron-LM takes the GPU count from the launcher: give torchrun's --nnodes and "
            "--nproc-per-node in the file, or --gpus",
        )
    model = model or _megatron_model(options)
    defaults: dict[str, str] = {}
    release = _data()["megatron"]["release"]

    def get(flag: str, default: Any) -> Any:
        if flag in options:
            return options[flag]
        defaults[flag] = f"{default} (Megatron-LM {release} default)"
        return default

    for flag in ("fp16", "use-torch-fsdp2", "moe-layer-freq"):
        if flag in options:
            raise InputError(flag, "is not modelled by scalelab")
    if "bf16" not in options:
        raise InputError("bf16", "scalelab models bf16 (and fp8) training; the file has no --bf16")
    tp = _int("tensor-model-parallel-size", get("tensor-model-parallel-size", 1))
    pp = _int("pipeline-model-parallel-size", get("pipeline-model-parallel-size", 1))
    cp = _int("context-parallel-size", get("context-parallel-size", 1))
    ep = _int("expert-model-parallel-size", get("expert-model-parallel-size", 1))
    etp = _int("expert-tensor-parallel-size", get("expert-tensor-parallel-size", tp))
    if "micro-batch-size" not in options:
        raise InputError("micro-batch-size", "Megatron-LM requires it")
    micro = _int("micro-batch-size", options["micro-batch-size"])
    dp = max(1, gpus // (tp * pp * cp))
    global_batch = _int("global-batch-size", get("global-batch-size", micro * dp))
    seq_len = _int("seq-length", options.get("seq-length", model.seq_len))
    schedule, virtual = PipelineSchedule.ONE_F_ONE_B, 1
    for flag in ("num-layers-per-virtual-pipeline-stage", "num-virtual-stages-per-pipeline-rank"):
        if flag in options and pp > 1:
            value = _int(flag, options[flag])
            stages_per_rank = (
                model.n_layers // (pp * value) if flag.startswith("num-layers") else value
            )
            schedule, virtual = PipelineSchedule.INTERLEAVED, stages_per_rank
    granularity = options.get("recompute-granularity")
    if options.get("recompute-activations") is True:
        granularity = "selective"
    recompute = Recompute.NONE
    if granularity == "selective":
        recompute = Recompute.SELECTIVE
    elif granularity == "full":
        method = options.get("recompute-method", "uniform")
        layers = _int("recompute-num-layers", options.get("recompute-num-layers", 1))
        if method != "uniform" or layers != 1:
            raise InputError(
                "recompute-method",
                "scalelab models full recompute of every layer (uniform, 1 layer per group)",
            )
        recompute = Recompute.FULL
    elif granularity is not None:
        raise InputError("recompute-granularity", f"'{granularity}' is not selective|full")
    sharding = Sharding.DDP
    if options.get("use-custom-fsdp") is True or options.get("use-megatron-fsdp") is True:
        strategy = options.get("data-parallel-sharding-strategy", "optim_grads_params")
        sharding = {
            "optim_grads_params": Sharding.FSDP,
            "optim_grads": Sharding.ZERO2,
            "optim": Sharding.ZERO1,
            "no_shard": Sharding.DDP,
        }.get(str(strategy), Sharding.FSDP)
    elif options.get("use-distributed-optimizer") is True:
        sharding = Sharding.ZERO1
    else:
        defaults["sharding"] = f"ddp (Megatron-LM {release}: no distributed optimizer)"
    backend = str(get("attention-backend", "auto"))
    if backend in ("flash", "auto"):
        attention = AttentionKernel.FLASH
    elif backend in ("unfused", "fused", "local"):
        masked = options.get("no-masked-softmax-fusion") is not True
        attention = AttentionKernel.FUSED if masked else AttentionKernel.MATH
    else:
        raise InputError("attention-backend", f"'{backend}' is not modelled")
    precision = Precision.FP8 if "fp8-format" in options else Precision.BF16
    try:
        layout = Layout(
            gpus=gpus,
            global_batch=global_batch,
            seq_len=seq_len,
            sharding=sharding,
            tp=tp,
            sequence_parallel=options.get("sequence-parallel") is True or tp == 1,
            pp=pp,
            pp_schedule=schedule,
            virtual_stages=virtual,
            cp=cp,
            ep=ep if model.is_moe else 1,
            expert_tp=etp if model.is_moe else 1,
            micro_batch=micro,
            recompute=recompute,
            precision=precision,
            attention=attention,
        )
    except ValueError as exc:
        raise InputError("from", f"the arguments give no valid layout: {exc}") from None
    per_node = _per_node({k.replace("-", "_"): v for k, v in options.items()})
    return Ingested("megatron", model, layout, defaults, per_node)


# scalelab bench ---------------------------------------------------------------------------------
def emit_bench(layout: Layout, model: ModelSpec, gpus_per_node: int) -> str:
    """The `scalelab bench` command line that measures `layout` (torchrun across nodes)."""
    flags: list[str] = []
    for name, value in layout.model_dump().items():
        if name == "gpus" or value is None:
            continue
        flag = "sp" if name == "sequence_parallel" else name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            flags += [f"--{flag}", str(value)]
    nnodes, nproc = _nodes(layout.gpus, gpus_per_node)
    if nnodes == 1:
        parts = ["scalelab", "bench", model.name, "--nproc-per-node", str(nproc), *flags]
    else:
        parts = ["torchrun", "--nnodes", str(nnodes), "--nproc_per_node", str(nproc)]
        parts += ["-m", "scalelab", "bench", model.name, *flags]
    return _command(parts)


def read_bench(text: str, gpus: int | None, model: ModelSpec | None) -> Ingested:
    """A `scalelab bench` line back into its layout (the flags of `Layout`'s fields)."""
    tokens = _tokens(text)
    options, positional = _options(tokens)
    start = positional.index("bench") if "bench" in positional else -1
    if model is None:
        if start < 0 or start + 1 >= len(positional):
            raise InputError("model", "the bench line names no model")
        model = _catalog_model(positional[start + 1])
    launched = _gpus_from_launcher({k.replace("-", "_"): v for k, v in options.items()})
    gpus = gpus if gpus is not None else launched
    if gpus is None:
        raise InputError("nproc-per-node", "the bench line gives no GPU count")
    values: dict[str, Any] = {"gpus": gpus}
    for name, info in Layout.model_fields.items():
        flag = "sp" if name == "sequence_parallel" else name.replace("_", "-")
        if info.annotation is bool:
            if options.get(flag) is True:
                values[name] = True
            elif options.get(f"no-{flag}") is True:
                values[name] = False
        elif flag in options and name != "gpus":
            raw = options[flag]
            values[name] = (
                canonical_option(name, str(raw))
                if name
                in (
                    "pp_schedule",
                    "recompute",
                )
                else raw
            )
    values.setdefault("seq_len", model.seq_len)
    if "global_batch" not in values:
        values["global_batch"] = Layout.default_global_batch(
            gpus, **{k: int(values[k]) for k in ("tp", "pp", "cp", "micro_batch") if k in values}
        )
    try:
        layout = Layout(**values)
    except ValueError as exc:
        raise InputError("from", f"the bench line gives no valid layout: {exc}") from None
    per_node = _per_node({k.replace("-", "_"): v for k, v in options.items()})
    return Ingested("scalelab bench", model, layout, {}, per_node)


# Dispatch ---------------------------------------------------------------------------------------
def emit(target: str, layout: Layout, model: ModelSpec, gpus_per_node: int) -> str:
    """`layout` as `target` spells it (one of TARGETS)."""
    writers = {
        "torchtitan": emit_torchtitan,
        "torchtitan-toml": emit_torchtitan_toml,
        "megatron": emit_megatron,
        "bench": emit_bench,
    }
    if target not in writers:
        raise InputError("emit", f"'{target}' is not one of {', '.join(TARGETS)}")
    return writers[target](layout, model, gpus_per_node)


def detect(text: str) -> str:
    """Which framework a config text is for, from its content."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        data = None
    if isinstance(data, dict) and ("parallelism" in data or "training" in data):
        return "torchtitan-toml"
    if "scalelab bench" in text or ("scalelab" in text and " bench " in f" {text} "):
        return "bench"
    if "--parallelism." in text or "--training." in text or "torchtitan" in text:
        return "torchtitan"
    if "-model-parallel-size" in text or "--micro-batch-size" in text or "pretrain_gpt" in text:
        return "megatron"
    raise InputError(
        "from",
        "not a torchtitan argument list or TOML job file, a Megatron-LM argument list or a "
        "scalelab bench line",
    )


def read_config(text: str, *, gpus: int | None = None, model: ModelSpec | None = None) -> Ingested:
    """A framework config (told apart by content) as a layout, model and batch. `gpus` and
    `model`, when given, take the place of what the file says (or does not say)."""
    kind = detect(text)
    if kind == "torchtitan-toml":
        return _read_titan_toml(tomllib.loads(text), gpus, model)
    if kind == "torchtitan":
        return _read_titan_args(text, gpus, model)
    if kind == "megatron":
        return _read_megatron(text, gpus, model)
    return read_bench(text, gpus, model)
