"""The result record: one JSON file per run, written atomically, loaded into pandas.

A record is generic over what produced it (`kind`: `bench` runs of the harness, later `comm`
collective sweeps and `sweep` jobs): the workload, the layout, the cluster name, the environment,
the raw measurements (per-step arrays), summary statistics, the status and error, and optionally
the predictor's numbers for the same layout. Fields that could not be measured are null, and
`notes` says why.

Metric names are the shared output vocabulary (`step_time_s`, `tokens_per_s`,
`tokens_per_s_per_gpu`, `mfu`, `hfu`, `exposed_comm_s`, `power_w_per_gpu`, `energy_j`,
`energy_per_token_j`, `tokens_per_j`, `memory_*_bytes`): the unit and the scope (per GPU or the
whole job) are in the name, and a prediction uses the same names.

Schema versions. Version 2 (this one) stores `power_w_per_gpu`, one GPU's average power over the
measured window (the job's GPU energy / window / GPUs), and `energy_j`, the GPU energy of one
optimizer step, all GPUs (the window's / measured steps), and names peak memory `memory_peak_allocated_bytes`, `memory_peak_reserved_bytes` and
`memory_peak_rss_bytes`. Version 1 stored `avg_power_w`, the whole job's power (energy summed over
ranks / window) under a name that read as one GPU's, `energy_j` over the whole window, and
`peak_*_bytes`. Reading a version-1 record upgrades it (`upgrade_v1`): `avg_power_w` becomes
`power_w_per_gpu` divided by the job's GPUs, `energy_j` is divided by the measured steps
(statistics over repeats scale the same way), the memory figures are renamed, and
`exposed_comm_s` is added from the stored trace report. Files are never rewritten in place.

Files are written to a hidden temporary name in the target folder, flushed to disk and renamed
(or hard-linked, when a run's record must not be overwritten), so a crash or a kill never leaves
a half-written `*.json`; thousands of jobs can write to one shared folder without a database.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scalelab.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

SCHEMA_VERSION = 2
RECORD_SUFFIX = ".json"
Status = Literal["ok", "oom", "failed", "cancelled"]


class Record(BaseModel):
    """One run of any scalelab engine."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    kind: str = Field(description="what produced it: bench, comm, sweep, ...")
    run_id: str
    name: str = Field(description="file stem, unique per run")
    created_utc: str
    status: Status
    error: str | None = None
    workload: dict[str, Any] = Field(default_factory=dict)
    layout: dict[str, Any] | None = None
    cluster: str | None = None
    environment: dict[str, Any] = Field(default_factory=dict)
    measurements: dict[str, Any] = Field(default_factory=dict)
    summary: dict[str, Any] = Field(default_factory=dict)
    prediction: dict[str, Any] | None = None
    notes: dict[str, str] = Field(default_factory=dict, description="why a field is null")


def new_run_id() -> str:
    return secrets.token_hex(8)


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def record_name(kind: str, label: str, created_utc: str, run_id: str) -> str:
    """A sortable, unique file stem: time, kind, a short label, run id."""
    stamp = created_utc.replace("-", "").replace(":", "").rstrip("Z")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
    return f"{stamp}-{kind}-{safe}-{run_id[:8]}"


def stats(values: Sequence[float | None], *, nonnegative: bool = False) -> dict[str, Any]:
    """Mean, sample standard deviation and 95 % confidence interval (Student t, from scipy) of the
    mean.

    Missing values are dropped; with one value the spread and interval are null. `nonnegative`:
    the quantity cannot be below 0 (a time, a throughput), so an interval reaching below 0 (two
    repeats: t = 12.7) is clipped to 0 and flagged `ci95_clipped`.
    """
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(xs)
    if n == 0:
        return {"mean": None, "std": None, "ci95_low": None, "ci95_high": None, "n": 0}
    mean = sum(xs) / n
    if n == 1:
        return {"mean": mean, "std": None, "ci95_low": None, "ci95_high": None, "n": 1}
    from scipy.stats import t as student_t

    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = float(student_t.ppf(0.975, n - 1)) * std / math.sqrt(n)
    out: dict[str, Any] = {
        "mean": mean,
        "std": std,
        "ci95_low": mean - half,
        "ci95_high": mean + half,
        "n": n,
    }
    if nonnegative and out["ci95_low"] < 0:
        out.update(ci95_low=0.0, ci95_clipped=True)
    return out


def _clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities become null, tuples lists, numpy scalars Python numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        return _clean(value.item())
    return value


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_record(record: Record, out_dir: str | Path, *, overwrite: bool = True) -> Path:
    """Write `record` as `<out_dir>/<record.name>.json` atomically; returns the path.

    The text goes to a hidden temporary file (`.<name>.json.tmp-<random>`, which no loader reads)
    and is fsynced, then renamed over the final name. With `overwrite=False` it is hard-linked
    instead, so the first writer of a run wins and `FileExistsError` tells later ones.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    final = out / f"{record.name}{RECORD_SUFFIX}"
    tmp = out / f".{record.name}{RECORD_SUFFIX}.tmp-{secrets.token_hex(4)}"
    text = json.dumps(_clean(record.model_dump()), indent=1, allow_nan=False) + "\n"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if overwrite:
            os.replace(tmp, final)
        else:
            os.link(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    _fsync_dir(out)
    return final


def load_record(path: str | Path) -> Record:
    """Read one record; a corrupt file or a newer schema is an `InputError` naming the file."""
    from scalelab.io import read_user_text

    p = Path(path)
    text = read_user_text("record", p)  # bounded; a device or FIFO is refused
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InputError(
            "record", f"{p} is not a valid JSON record ({exc.__class__.__name__})"
        ) from None
    if not isinstance(data, dict) or "schema_version" not in data:
        raise InputError("record", f"{p} is not a scalelab record (no schema_version)")
    version = data["schema_version"]
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise InputError(
            "record",
            f"{p} has schema_version {version}, newer than this scalelab reads ({SCHEMA_VERSION}); "
            "upgrade scalelab",
        )
    if version < 2:
        data = upgrade_v1(data)
    try:
        return Record(**data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "record"
        raise InputError("record", f"{p}: {where}: {err['msg']}") from None


def trace_metric_s(report: Any, name: str) -> float | None:
    """A time metric (mean over ranks) of a stored trace report, in seconds.

    Reads the trace report's schema 2 (`<name>_ns`) and schema 1 (`<name>_us`, also what records
    of schema 1 stored), e.g. `trace_metric_s(report, "exposed_comm")`.
    """
    if not isinstance(report, dict):
        return None
    metrics = (report.get("summary") or {}).get("metrics") or {}
    for suffix, scale in (("_ns", 1e-9), ("_us", 1e-6)):
        value = (metrics.get(name + suffix) or {}).get("mean")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value) * scale
    return None


_V1_RENAMES = {
    "peak_memory_allocated_bytes": "memory_peak_allocated_bytes",
    "peak_memory_reserved_bytes": "memory_peak_reserved_bytes",
    "peak_rss_bytes": "memory_peak_rss_bytes",
}


def _scaled_stats(st: Any, by: float) -> Any:
    """Statistics of x as statistics of x / by (mean, std and interval bounds scale; n does not)."""
    if not isinstance(st, dict):
        return st
    return {
        k: (v / by if k != "n" and isinstance(v, (int, float)) and v is not None else v)
        for k, v in st.items()
    }


def upgrade_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A version-1 record's fields as version 2 has them (see the module's docstring)."""
    out = dict(data)
    out["schema_version"] = SCHEMA_VERSION
    if out.get("kind") != "bench":
        return out
    layout = out.get("layout") or {}
    gpus = layout.get("gpus") or (out.get("environment") or {}).get("world_size") or 1
    summary = dict(out.get("summary") or {})
    for old, new in _V1_RENAMES.items():
        if old in summary:
            summary[new] = summary.pop(old)
    steps = float((out.get("workload") or {}).get("steps") or 1)
    if "avg_power_w" in summary:
        summary["power_w_per_gpu"] = _scaled_stats(summary.pop("avg_power_w"), float(gpus))
    if "energy_j" in summary:
        summary["energy_j"] = _scaled_stats(summary["energy_j"], steps)
    measurements = dict(out.get("measurements") or {})
    repeats = measurements.get("repeats")
    if isinstance(repeats, list):
        upgraded = []
        for rep in repeats:
            if isinstance(rep, dict):
                rep = dict(rep)
                for old, new in _V1_RENAMES.items():
                    if old in rep:
                        rep[new] = rep.pop(old)
                if "avg_power_w" in rep:
                    power = rep.pop("avg_power_w")
                    rep["power_w_per_gpu"] = power / gpus if power is not None else None
                if isinstance(rep.get("energy_j"), (int, float)):
                    rep["energy_j"] = rep["energy_j"] / steps
            upgraded.append(rep)
        measurements["repeats"] = upgraded
    exposed = trace_metric_s(measurements.get("exposed_comm"), "exposed_comm")
    if exposed is not None and "exposed_comm_s" not in summary:
        summary["exposed_comm_s"] = stats([exposed])
    out["summary"] = summary
    out["measurements"] = measurements
    notes = dict(out.get("notes") or {})
    if "energy_j" in notes and "power_w_per_gpu" not in notes:
        notes["power_w_per_gpu"] = notes["energy_j"]
    out["notes"] = notes
    return out


def record_paths(directory: str | Path, recursive: bool = True) -> list[Path]:
    """The record files under `directory` (hidden and temporary files excluded), sorted."""
    d = Path(directory)
    if not d.is_dir():
        raise InputError("records", f"no such folder: {d}")
    pattern = f"**/*{RECORD_SUFFIX}" if recursive else f"*{RECORD_SUFFIX}"
    return sorted(
        p
        for p in d.glob(pattern)
        if not any(part.startswith(".") for part in p.relative_to(d).parts)
    )


def _flatten(prefix: str, value: Any, row: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, row)
    elif isinstance(value, list):
        row[prefix] = json.dumps(value)
    else:
        row[prefix] = value


def record_row(record: Record, include_measurements: bool = False) -> dict[str, Any]:
    """One flat row: nested fields become dotted columns (`summary.tokens_per_s.mean`)."""
    data = record.model_dump()
    if not include_measurements:
        data.pop("measurements")
    row: dict[str, Any] = {"path": None}
    _flatten("", data, row)
    return row


def load_records(
    directory: str | Path, *, recursive: bool = True, include_measurements: bool = False
) -> pd.DataFrame:
    """All records under `directory` as one DataFrame, one row per record.

    Per-step arrays stay out unless `include_measurements` (then they are JSON strings).
    """
    import pandas as pd

    rows = []
    for path in record_paths(directory, recursive=recursive):
        row = record_row(load_record(path), include_measurements=include_measurements)
        row["path"] = str(path)
        rows.append(row)
    return pd.DataFrame(rows)


def export(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a records DataFrame to `.parquet` or `.csv` (atomically, like the records)."""
    p = Path(path)
    if p.suffix not in (".parquet", ".csv"):
        raise InputError("export", f"export to .parquet or .csv, not '{p.suffix or p.name}'")
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp-{secrets.token_hex(4)}")
    try:
        if p.suffix == ".parquet":
            try:
                df.to_parquet(tmp, index=False)
            except ImportError:
                raise InputError(
                    "export", "Parquet needs pyarrow: pip install 'scalelab[report]'"
                ) from None
        else:
            from scalelab.io import csv_safe_cell

            # Text a spreadsheet would run as a formula (a model name, a tag) is escaped.
            # (every column: text may be of dtype object or string; numbers pass unchanged)
            safe = df.rename(columns=csv_safe_cell).apply(lambda column: column.map(csv_safe_cell))
            safe.to_csv(tmp, index=False)
        os.replace(tmp, p)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return p


def summarise(per_repeat: Iterable[dict[str, Any]], metrics: Sequence[str]) -> dict[str, Any]:
    """Statistics across repeats for each metric (each repeat gives one value per metric). Every
    metric a bench repeat measures (times, throughputs, MFU, memory, energy, loss) is
    non-negative: an interval is clipped at 0 (`stats(nonnegative=True)`)."""
    repeats = list(per_repeat)
    return {m: stats([r.get(m) for r in repeats], nonnegative=True) for m in metrics}
