"""The `scalelab` command: a thin layer that parses flags, calls the API and renders the answer.

Each verb lives in its own module with a `register(app)` function. User mistakes raise
`InputError`, which `main` prints as one line on stderr with exit code 2.
"""

from __future__ import annotations

import sys

import typer

from scalelab.errors import InputError

app = typer.Typer(
    name="scalelab",
    help="Measure, explain and predict how LLM training scales across GPUs, layouts and hardware.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_VERB_MODULES = (
    "catalogs",
    "predict",
    "search",
    "study",
    "validate",
    "bench",
    "trace",
    "comm",
    "calibrate",
    "sweep",
    "report",
    "runs",
)


def _register_all() -> None:
    from importlib import import_module

    for name in _VERB_MODULES:
        import_module(f"scalelab.cli.{name}").register(app)


_register_all()


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the app, turning user mistakes into one line and exit code 2."""
    try:
        app(args=argv, standalone_mode=False)
    except InputError as exc:
        print(f"scalelab: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as exc:
        # An output folder that cannot be created, a file that cannot be written or read.
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        print(f"scalelab: error: {where}{exc.strerror or exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        print("scalelab: aborted", file=sys.stderr)
        raise SystemExit(130) from None
    except Exception as exc:
        # click's (or typer's vendored click's) usage errors: bad flags, missing arguments.
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            message = exc.format_message().strip().splitlines() or [type(exc).__name__]
            print(f"scalelab: error: {message[-1]}", file=sys.stderr)
            raise SystemExit(2 if exc.exit_code == 2 else exc.exit_code) from None
        raise
