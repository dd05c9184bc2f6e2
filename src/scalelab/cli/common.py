"""Flags and helpers shared by the verbs: the one set of layout flags, JSON output, consoles."""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic import ValidationError

# Re-exported: every verb imports them from here; `trace` imports the light module directly.
from scalelab.cli.safe import SafeConsole, only_with, safe_print, terminal_safe  # noqa: F401
from scalelab.config.layout import Layout
from scalelab.config.options import OPTIONS
from scalelab.errors import InputError
from scalelab.search import Constraints

console = SafeConsole(width=None if sys.stdout.isatty() else 160)
err_console = SafeConsole(stderr=True)

ModelArg = Annotated[
    str, typer.Argument(help="catalog model name (see `scalelab models`) or a YAML file")
]
OptionalModelArg = Annotated[
    str | None,
    typer.Argument(
        help="catalog model name (see `scalelab models`) or a YAML file; with --from, taken "
        "from the file unless given"
    ),
]
StackOpt = Annotated[
    str,
    typer.Option(
        "--stack",
        help="software stack: the framework that runs the job, what it offers and refuses "
        "(schedules, shardings, combinations), gradient sync, overlaps; default torchtitan, "
        "whose refusals are `scalelab bench`'s; `generic` allows any combination (what-if); "
        "see `scalelab stacks`, or a YAML file",
    ),
]
EmitOpt = Annotated[
    str | None,
    typer.Option(
        "--emit",
        help="print the layout as torchtitan (its launch arguments) | torchtitan-toml (job "
        "file) | megatron (Megatron-LM arguments) | bench (the scalelab bench line)",
    ),
]
FromOpt = Annotated[
    Path | None,
    typer.Option(
        "--from",
        help="read layout, model and batch from a torchtitan argument list or TOML job file, a "
        "Megatron-LM argument list or a scalelab bench line (told apart by content)",
    ),
]
ClusterOpt = Annotated[
    str,
    typer.Option(
        "--cluster", "-c", help="catalog cluster (see `scalelab hardware`) or a YAML file"
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document and nothing else")]
SeqLenOpt = Annotated[
    int | None, typer.Option("--seq-len", help="sequence length (default: the model's)")
]

# Layout flags: generated from `Layout`'s fields (name, type, default, description, enum choices),
# the same for predict, search (as constraints) and bench. A new layout field is a new flag here
# without an edit. CLI parameter names that differ from the field's (kept for compatibility):
PARAM_NAMES: dict[str, str] = {"sequence_parallel": "sp"}
# Fields whose default the verb computes (None on the command line means "the documented default").
_COMPUTED_DEFAULTS: dict[str, str] = {
    "seq_len": "sequence length (default: the model's)",
    "global_batch": "sequences per step (default: 1 per data-parallel rank x micro-batch, "
    "x pp when pipelined)",
}


def param_name(field: str) -> str:
    """The Python parameter (and, with dashes, the flag) name of a `Layout` field."""
    return PARAM_NAMES.get(field, field)


def flag_name(field: str) -> str:
    """`pp_schedule` -> `pp-schedule`, `sequence_parallel` -> `sp`: the name errors report."""
    return param_name(field).replace("_", "-")


def _field_help(field: str) -> str:
    info = Layout.model_fields[field]
    text = info.description or field
    option = OPTIONS.get(field)
    return f"{'|'.join(option.names())}: {text}" if option else text


def layout_option(field: str) -> tuple[Any, Any]:
    """(annotation, default) of the CLI option for one `Layout` field."""
    info = Layout.model_fields[field]
    flag = flag_name(field)
    if field in OPTIONS:
        return Annotated[str, typer.Option(f"--{flag}", help=_field_help(field))], str(info.default)
    if info.annotation is bool:
        option = typer.Option(f"--{flag}/--no-{flag}", help=_field_help(field))
        return Annotated[bool, option], info.default
    if field in _COMPUTED_DEFAULTS:
        option = typer.Option(f"--{flag}", help=_COMPUTED_DEFAULTS[field])
        return Annotated[int | None, option], None
    if info.default is None:
        return Annotated[int | None, typer.Option(f"--{flag}", help=_field_help(field))], None
    return Annotated[int, typer.Option(f"--{flag}", help=_field_help(field))], info.default


def constraint_option(field: str) -> tuple[Any, Any]:
    """(annotation, default) of `search`'s option for one constrainable `Layout` field: a
    comma-separated list of allowed values, or one value for the fields search fixes."""
    flag = flag_name(field)
    if dataclass_fields_of(Constraints).get(field) is str:
        info = Layout.model_fields[field]
        return Annotated[str, typer.Option(f"--{flag}", help=_field_help(field))], str(info.default)
    allowed = "|".join(OPTIONS[field].names()) + " " if field in OPTIONS else ""
    if Layout.model_fields[field].annotation is bool:
        allowed = "true|false "
    option = typer.Option(f"--{flag}", help=f"comma-separated allowed values {allowed}".strip())
    return Annotated[str | None, option], None


def dataclass_fields_of(cls: Any) -> dict[str, Any]:
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


F = TypeVar("F", bound=Callable[..., Any])


def _expand(func: F, parameters: list[inspect.Parameter]) -> F:
    """`func` with its `**kwargs` replaced by `parameters` in the signature typer reads."""
    sig = inspect.signature(func, eval_str=True)
    params: list[inspect.Parameter] = []
    for p in sig.parameters.values():
        params.extend(parameters if p.kind is p.VAR_KEYWORD else [p])

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def _keyword(field: str, annotation: Any, default: Any) -> inspect.Parameter:
    kind = inspect.Parameter.KEYWORD_ONLY
    return inspect.Parameter(param_name(field), kind, default=default, annotation=annotation)


def layout_options(*, exclude: tuple[str, ...] = ("gpus",)) -> Callable[[F], F]:
    """Give a verb one option per `Layout` field (but `exclude`) in place of its `**layout`
    parameter; the verb receives them by parameter name and passes them to `build_layout`."""

    def wrap(func: F) -> F:
        parameters = []
        for field in Layout.model_fields:
            if field in exclude:
                continue
            annotation, default = layout_option(field)
            parameters.append(_keyword(field, annotation, default))
        return _expand(func, parameters)

    return wrap


def constraint_options(func: F) -> F:
    """Give `search` one option per constrainable `Layout` field (the fields of `Constraints`)."""
    parameters = []
    for field in Layout.model_fields:
        if field not in dataclass_fields_of(Constraints):
            continue
        annotation, default = constraint_option(field)
        parameters.append(_keyword(field, annotation, default))
    return _expand(func, parameters)


def _int_list(flag: str, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(flag, f"'{text}' is not a comma-separated list of integers") from None
    if not values or any(v < 1 for v in values):
        raise InputError(flag, f"'{text}' must list positive integers")
    return values


def _word_list(flag: str, text: str, allowed: tuple[str, ...]) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values or any(v not in allowed for v in values):
        raise InputError(flag, f"'{text}' must list values from {', '.join(allowed)}")
    return values


def build_constraints(**values: Any) -> Constraints:
    """`Constraints` from `constraint_options` flags, each checked with a message naming its flag."""
    types = dataclass_fields_of(Constraints)
    kwargs: dict[str, Any] = {}
    for field in types:
        text = values.get(param_name(field))
        flag = flag_name(field)
        if text is None:
            continue
        if types[field] is str:
            kwargs[field] = parse_option(field, text).value if field in OPTIONS else text
        elif field in OPTIONS:
            from scalelab.config.frameworks import canonical_option

            words = [canonical_option(field, w).lower() for w in text.split(",") if w.strip()]
            kwargs[field] = _word_list(flag, ",".join(words) or text, OPTIONS[field].names())
        elif Layout.model_fields[field].annotation is bool:
            words = _word_list(flag, text.lower(), ("true", "false"))
            kwargs[field] = [w == "true" for w in words]
        else:
            kwargs[field] = _int_list(flag, text)
    return Constraints(**kwargs)


# The options one by one, for verbs that spell their signature out (bench).
ShardingOpt = layout_option("sharding")[0]
HsdpGroupOpt = layout_option("hsdp_shard_size")[0]
ReshardOpt = layout_option("reshard_after_forward")[0]
TpOpt = layout_option("tp")[0]
SpOpt = layout_option("sequence_parallel")[0]
PpOpt = layout_option("pp")[0]
ScheduleOpt = layout_option("pp_schedule")[0]
VstagesOpt = layout_option("virtual_stages")[0]
CpOpt = layout_option("cp")[0]
MicroBatchOpt = layout_option("micro_batch")[0]
GlobalBatchOpt = layout_option("global_batch")[0]
RecomputeOpt = layout_option("recompute")[0]
PrecisionOpt = layout_option("precision")[0]
AttentionOpt = layout_option("attention")[0]


def choice(field: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise InputError(field, f"'{value}' is not one of {', '.join(allowed)}")
    return value


def positive(field: str, value: int) -> int:
    if value < 1:
        raise InputError(field, f"must be a positive integer, not {value}")
    return value


# The most steps, repeats or iterations one run may ask for: more is a typo, and would run for ever.
MAX_COUNT = 1_000_000


def at_most(field: str, value: int, limit: int) -> int:
    if value > limit:
        raise InputError(field, f"must be at most {limit:,}, not {value:,}")
    return value


def writable_folder(flag: str, folder: Path) -> Path:
    """Check that `folder` can take files (creating it if needed) before a run measures anything:
    a run whose record cannot be written is lost."""
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".scalelab-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InputError(flag, f"cannot write to {str(folder)!r}: {reason}") from None
    return folder


def parse_option(field: str, value: str) -> Any:
    """A categorical layout value, case-insensitively, in scalelab's spelling or (schedules and
    recompute) torchtitan's and Megatron's (`1F1B`, `Interleaved1F1B`, `ZBVZeroBubble`, `op`)."""
    from scalelab.config.frameworks import canonical_option

    text = canonical_option(field, str(value)).lower()
    return OPTIONS[field].parse(flag_name(field), text)


def read_from(path: Path, *, gpus: int | None = None, model: str | None = None) -> Any:
    """`--from FILE`: a framework config as `config.frameworks.Ingested` (model and GPU count
    from the file unless given)."""
    from scalelab.config.catalog import load_model
    from scalelab.config.frameworks import read_config
    from scalelab.io import read_user_text

    text = read_user_text("from", path)
    spec = load_model(model) if model is not None else None
    return read_config(text, gpus=gpus, model=spec)


def build_layout(**values: Any) -> Layout:
    """A `Layout` from CLI values keyed by parameter name (`layout_options`), each checked with a
    message naming its flag; `global_batch` None takes `Layout.default_global_batch`."""
    fields: dict[str, Any] = {}
    for field in Layout.model_fields:
        name = param_name(field)
        if name not in values:
            continue
        value = values[name]
        flag = flag_name(field)
        if field in OPTIONS:
            value = parse_option(field, value)
        elif isinstance(value, int) and not isinstance(value, bool):
            positive(flag, value)
        fields[field] = value
    unknown = set(values) - {param_name(f) for f in Layout.model_fields}
    if unknown:
        raise TypeError(f"build_layout: unknown layout parameters {sorted(unknown)}")
    if fields.get("global_batch") is None:
        fields["global_batch"] = Layout.default_global_batch(
            fields["gpus"],
            **{k: fields[k] for k in ("tp", "pp", "cp", "micro_batch") if k in fields},
        )
    try:
        return Layout(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "layout"
        raise InputError(flag_name(field), err["msg"]) from None


def print_json(document: Any) -> None:
    """One JSON document on stdout (NaN and infinity become null)."""
    sys.stdout.write(json.dumps(_clean(document), indent=2) + "\n")


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        return _clean(value.item())
    return value


def record_for_display(path: Any, json_out: bool, verb: str) -> Any:
    """Load a run's record; print it as JSON (and return None) with --json. Missing: say so on stderr."""
    from scalelab.results import load_record

    if path is None:
        err_console.print(f"scalelab {verb}: no record was written")
        return None
    record = load_record(path)
    if json_out:
        print_json(record.model_dump())
        return None
    return record
