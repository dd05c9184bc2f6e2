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
    """Call `write(tmp)` on a temporary file beside `path`, then rename it into place. An existing
    `path` that is not a regular file (a device such as /dev/null, a FIFO, a folder) is refused:
    the rename would replace it."""
    import errno
    import stat

    try:
        mode = path.stat().st_mode
    except OSError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, "not a regular file: give a file to write", str(path))
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

# The most bytes scalelab reads from one input file (a model, cluster, sweep, record, CSV), and
# from a gzipped one once inflated. The largest real inputs are records and run CSVs of a few MB;
# the bound stops a file that never ends (a link to /dev/zero, a gzip bomb) long before memory
# does. `SCALELAB_MAX_INPUT_MIB` raises (or lowers) it.
DEFAULT_MAX_INPUT_MIB = 256
MAX_INPUT_ENV = "SCALELAB_MAX_INPUT_MIB"


def max_input_bytes() -> int:
    """The bound on one input file, bytes: `SCALELAB_MAX_INPUT_MIB` MiB, default 256 MiB."""
    from scalelab.errors import InputError

    text = os.environ.get(MAX_INPUT_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_INPUT_MIB * 2**20
    try:
        mib = int(text)
    except ValueError:
        mib = 0
    if not 1 <= mib <= 2**20:
        raise InputError(MAX_INPUT_ENV, f"{text!r} must be a whole number of MiB, 1 to 1048576")
    return mib * 2**20


def _too_large(field: str, p: Path, limit: int, what: str = "") -> Exception:
    from scalelab.errors import InputError

    size = f"{limit / 2**20:g} MiB" if limit >= 2**20 else f"{limit:,} bytes"
    return InputError(
        field,
        f"{p}{what} is larger than the {size} scalelab reads from one input file "
        f"(set {MAX_INPUT_ENV} to raise the bound)",
    )


def read_user_bytes(
    field: str, path: str | Path, *, limit: int | None = None, gunzip: bool = False
) -> bytes:
    """A user's file as bytes, at most `limit` (default `max_input_bytes()`) of them.

    Only a regular file is read: a device (a link to /dev/zero), a FIFO, a socket or a folder is
    refused before a byte is read, and a FIFO is opened without waiting for a writer. A file over
    the bound is refused, never read to its end. With `gunzip`, a gzipped file (found by its
    magic bytes) is inflated up to the same bound: a gzip bomb stops there.
    """
    import stat

    from scalelab.errors import InputError

    p = Path(path)
    bound = max_input_bytes() if limit is None else limit
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise InputError(field, f"no such file: {p}") from None
    except IsADirectoryError:
        raise InputError(field, f"{p} is a folder, not a file") from None
    except OSError as exc:
        raise InputError(field, f"{p}: cannot read it ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise InputError(field, f"{p} is a folder, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise InputError(
                field, f"{p} is not a regular file (a device, FIFO or socket): give a file"
            )
        if info.st_size > bound:
            raise _too_large(field, p, bound)
        chunks: list[bytes] = []
        got = 0
        try:
            while got <= bound:
                chunk = os.read(fd, min(1 << 20, bound + 1 - got))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
        except OSError as exc:
            raise InputError(field, f"{p}: cannot read it ({exc.strerror or exc})") from None
        if got > bound:  # a file that grew, or one whose size the system does not report
            raise _too_large(field, p, bound)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if gunzip and data[:2] == b"\x1f\x8b":
        data = gunzip_bounded(field, p, data, bound)
    return data


def gunzip_bounded(field: str, p: Path, data: bytes, limit: int) -> bytes:
    """Inflate gzip `data` (every member) to at most `limit` bytes; more is refused, so a small
    file that inflates to gigabytes (a gzip bomb) costs at most `limit`. Corrupt or cut short:
    an InputError naming `p`."""
    import gzip
    import io as _io
    import zlib

    from scalelab.errors import InputError

    try:
        with gzip.GzipFile(fileobj=_io.BytesIO(data)) as fh:
            out = fh.read(limit + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(field, f"{p} is not a valid gzip file ({exc})") from None
    if len(out) > limit:
        raise _too_large(field, p, limit, " once inflated")
    return out


def read_user_text(field: str, path: str | Path, *, limit: int | None = None) -> str:
    """A user's text file as UTF-8 (a leading byte-order mark dropped, as spreadsheets write
    one); missing, unreadable, special, over the size bound or binary: an InputError naming it."""
    from scalelab.errors import InputError

    p = Path(path)
    data = read_user_bytes(field, p, limit=limit)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(field, f"{p} is not a text file (not UTF-8 at byte {exc.start})") from None


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


def csv_records(
    text: str, where: str, *, delimiters: str = ","
) -> tuple[list[str], list[dict[str, str]]]:
    """CSV text as its header and one dict per row. A row with more or fewer fields than the header
    (a line cut short, a stray comma) or a malformed one (an open quote, a NUL byte) is an
    InputError naming its line, rather than a row read with fields missing or shifted. A UTF-8
    byte-order mark (Excel's "CSV UTF-8" writes one) is not part of the first column's name, and
    blank lines (or lines of empty cells) are skipped. With several `delimiters` (",;\t": what
    people export), the header line tells which one the file uses."""
    import contextlib
    import csv
    import io

    from scalelab.errors import InputError

    text = text.removeprefix("\ufeff")
    delimiter = delimiters[0]
    if len(delimiters) > 1:
        first_line = text.split("\n", 1)[0]
        with contextlib.suppress(csv.Error):  # one column: nothing to sniff, the first one
            delimiter = csv.Sniffer().sniff(first_line, delimiters=delimiters).delimiter
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        header = next(reader, [])
        repeated = sorted({h for h in header if header.count(h) > 1})
        if repeated:
            raise InputError(where, f"column {repeated[0]!r} appears more than once in the header")
        rows = []
        for fields in reader:
            if not any(f.strip() for f in fields):
                continue
            if len(fields) != len(header):
                raise InputError(
                    where,
                    f"line {reader.line_num}: {len(fields)} fields where the header has "
                    f"{len(header)} (a line cut short or a stray {delimiter!r}?)",
                )
            rows.append(dict(zip(header, fields, strict=True)))
    except csv.Error as exc:
        raise InputError(where, f"line {reader.line_num}: not valid CSV ({exc})") from None
    return header, rows


def read_user_csv(field: str, path: str | Path) -> tuple[list[str], list[dict[str, str]]]:
    """A user's CSV file (bounded read, BOM dropped) as its header and one dict per row."""
    return csv_records(read_user_text(field, path), field)


# Writing CSV that others open -----------------------------------------------------------------

# OWASP's CSV-injection rule: a cell that starts with one of these is read by spreadsheets as a
# formula (`=cmd|' /C calc'!A0`), so a text cell that does is written with a leading apostrophe.
# https://owasp.org/www-community/attacks/CSV_Injection
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n")


def csv_safe_cell(value: object) -> object:
    """`value` as a CSV cell a spreadsheet will not run: text that starts like a formula gets a
    leading `'` (OWASP); numbers (a negative one too) and everything else are left alone."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


# Outputs that would destroy inputs -------------------------------------------------------------


def _identity(path: Path) -> tuple[str, object]:
    """(kind, key) naming the file `path` is: its device and inode where it exists, else its
    absolute path with the existing folders above it resolved (two names of one future file)."""
    try:
        info = path.stat()
    except OSError:
        return ("path", str(path.parent.resolve() / path.name))
    return ("inode", (info.st_dev, info.st_ino))


def refuse_clobber(outputs: dict[str, Path | None], inputs: dict[str, Path | None]) -> None:
    """Refuse (an InputError naming both flags) an output that is one of the inputs or another
    output: compared as files (device and inode, so a hard link, a symlink or `./x` is caught),
    not as names. Call it before anything is written."""
    from scalelab.errors import InputError

    seen: dict[tuple[str, object], str] = {}
    for flag, path in inputs.items():
        if path is not None:
            seen.setdefault(_identity(Path(path)), flag)
    inputs_seen = dict(seen)
    for flag, path in outputs.items():
        if path is None:
            continue
        if Path(path).exists() and not Path(path).is_file():
            raise InputError(flag, f"{path} is not a regular file (a device, FIFO or folder)")
        key = _identity(Path(path))
        if key in inputs_seen:
            raise InputError(
                flag,
                f"{path} is also the input {inputs_seen[key]}: writing it would destroy what is "
                "read; give another file",
            )
        if key in seen:
            raise InputError(flag, f"{path} is also the output {seen[key]}: give another file")
        seen[key] = flag
