"""The `scalelab` command: a thin layer that parses flags, calls the API and renders the answer.

Each verb lives in its own module with a `register(app)` function. User mistakes raise
`InputError`, which `main` prints as one line on stderr with exit code 2.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from scalelab.errors import InputError

if TYPE_CHECKING:
    import typer

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

# Verbs run from an app of their own module alone: the other verbs' imports (pydantic models,
# catalogs, sweeps: ~1 s of CPU on the 2-core build machine) would cost more than a trace's
# analysis. The verb, its flags, help and errors are typer's as in the full app.
_ONE_VERB_APPS = ("trace",)

_APP: Any = None


def _new_app() -> typer.Typer:
    import typer

    return typer.Typer(
        name="scalelab",
        help="Measure, explain and predict how LLM training scales across GPUs, layouts and "
        "hardware.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )


def _build_app() -> typer.Typer:
    global _APP
    if _APP is None:
        from importlib import import_module

        app = _new_app()
        for name in _VERB_MODULES:
            import_module(f"scalelab.cli.{name}").register(app)
        import_module("scalelab.cli.style").apply(app)  # one help style for every verb
        _APP = app  # only a complete app is kept: a failed import leaves none half-registered
    return _APP


def _one_verb_app(verb: str) -> typer.Typer:
    """An app with one verb (and a callback, so that typer keeps it a subcommand)."""
    from importlib import import_module

    app = _new_app()
    app.callback()(_no_options)
    import_module(f"scalelab.cli.{verb}").register(app)
    return app


def _no_options() -> None:
    """Measure, explain and predict how LLM training scales across GPUs, layouts and hardware."""


def __getattr__(name: str) -> Any:  # `scalelab.cli.app`, built on first use
    if name == "app":
        return _build_app()
    raise AttributeError(name)


def _user_error(message: str) -> None:
    print(f"scalelab: error: {message}", file=sys.stderr)
    raise SystemExit(2) from None


# Exceptions that only bad input raises while a file or a number is parsed. Every reader turns them
# into an InputError naming its file and field; this is the net under a reader that does not yet.
_PARSE_ERRORS: tuple[type[BaseException], ...] = (
    UnicodeDecodeError,
    RecursionError,
    OverflowError,
)


def _parse_error(exc: BaseException) -> None:
    text = " ".join(str(exc).split())[:200] or type(exc).__name__
    filename = getattr(exc, "filename", None)
    where = f"{filename}: " if filename else ""
    _user_error(f"input: {where}{type(exc).__name__}: {text} (a file or value that cannot be read)")


def _more_parse_errors() -> tuple[type[BaseException], ...]:
    """yaml's and csv's errors, when those modules are already imported (never imported here)."""
    extra: list[type[BaseException]] = []
    if "yaml" in sys.modules:
        extra.append(sys.modules["yaml"].YAMLError)
    if "csv" in sys.modules:
        extra.append(sys.modules["csv"].Error)
    return tuple(extra)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the app, turning user mistakes into one line and exit code 2."""
    args = sys.argv[1:] if argv is None else list(argv)
    _typer_main(args)


def _typer_main(args: list[str]) -> None:
    import typer

    app = _one_verb_app(args[0]) if args and args[0] in _ONE_VERB_APPS else _build_app()
    try:
        app(args=args, standalone_mode=False)
    except InputError as exc:
        _user_error(str(exc))
    except OSError as exc:
        # An output folder that cannot be created, a file that cannot be written or read.
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        _user_error(f"{where}{exc.strerror or exc}")
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        print("scalelab: aborted", file=sys.stderr)
        raise SystemExit(130) from None
    except _PARSE_ERRORS as exc:
        _parse_error(exc)
    except Exception as exc:
        if isinstance(exc, _more_parse_errors()):
            _parse_error(exc)
        # click's (or typer's vendored click's) usage errors: bad flags, missing arguments.
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            message = exc.format_message().strip().splitlines() or [type(exc).__name__]
            print(f"scalelab: error: {message[-1]}", file=sys.stderr)
            raise SystemExit(2 if exc.exit_code == 2 else exc.exit_code) from None
        raise
