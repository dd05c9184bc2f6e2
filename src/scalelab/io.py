"""Atomic file writes: a crash or kill never leaves a half-written output behind."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` on a temporary file beside `path`, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a written file gets the usual mode
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    def write(tmp: Path) -> None:
        tmp.write_text(text)

    return atomic_write(path, write)


# Reading user files: every way a file can be unreadable becomes one InputError naming it -------


def read_user_text(field: str, path: str | Path) -> str:
    """A user's text file as UTF-8; missing, unreadable or binary: an InputError naming it."""
    from scalelab.errors import InputError

    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(field, f"no such file: {p}") from None
    except UnicodeDecodeError as exc:
        raise InputError(field, f"{p} is not a text file (not UTF-8 at byte {exc.start})") from None
    except OSError as exc:
        raise InputError(field, f"{p}: cannot read it ({exc.strerror or exc})") from None


def load_user_yaml(field: str, path: str | Path) -> object:
    """A user's YAML file, parsed safely; binary, malformed or absurdly nested: an InputError."""
    import yaml

    from scalelab.errors import InputError

    text = read_user_text(field, path)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError(field, f"{path} is not valid YAML{where} ({type(exc).__name__})") from None
    except RecursionError:
        raise InputError(field, f"{path} is nested too deeply to be read") from None


def load_user_json(field: str, path: str | Path) -> object:
    """A user's JSON file; binary, malformed or absurdly nested: an InputError naming it."""
    import json

    from scalelab.errors import InputError

    text = read_user_text(field, path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            field, f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})"
        ) from None
    except RecursionError:
        raise InputError(field, f"{path} is nested too deeply to be read") from None


def csv_records(text: str, where: str) -> tuple[list[str], list[dict[str, str]]]:
    """CSV text as its header and one dict per row. A row with more or fewer fields than the header
    (a line cut short, a stray comma) or a malformed one (an open quote, a NUL byte) is an
    InputError naming its line, rather than a row read with fields missing or shifted."""
    import csv
    import io

    from scalelab.errors import InputError

    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, [])
        rows = []
        for fields in reader:
            if not fields:
                continue  # a blank line
            if len(fields) != len(header):
                raise InputError(
                    where,
                    f"line {reader.line_num}: {len(fields)} fields where the header has "
                    f"{len(header)} (a line cut short or a stray comma?)",
                )
            rows.append(dict(zip(header, fields, strict=True)))
    except csv.Error as exc:
        raise InputError(where, f"line {reader.line_num}: not valid CSV ({exc})") from None
    return header, rows
