"""The `scalelab` command: a thin layer that parses flags, calls the API and renders the answer.

Each verb lives in its own module with a `register(app)` function. User mistakes raise
`InputError`, which `main` prints as one line on stderr with exit code 2.

Verbs in `_OWN_PARSER` (today: `trace`) are parsed with argparse by their own module *before*
typer, pydantic and the other verbs are imported: a trace analysis of a small file is over in
less time than those imports take. They still appear in `scalelab --help`.
"""

from __future__ import annotations

import sys

from scalelab.errors import InputError

TYPE_CHECKING = False  # (no `typing` import: `scalelab trace` imports it later, beside its read)
if TYPE_CHECKING:
    from typing import Any

    import typer

# verb -> module with `run(args: list[str]) -> int` (argparse; imports only what the verb needs)
_OWN_PARSER = {"trace": "scalelab.cli.trace"}

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

_APP: Any = None


def _build_app() -> typer.Typer:
    global _APP
    if _APP is None:
        from importlib import import_module

        import typer

        app = typer.Typer(
            name="scalelab",
            help="Measure, explain and predict how LLM training scales across GPUs, layouts and "
            "hardware.",
            no_args_is_help=True,
            add_completion=False,
            pretty_exceptions_enable=False,
        )
        for name in _VERB_MODULES:
            import_module(f"scalelab.cli.{name}").register(app)
        import_module("scalelab.cli.style").apply(app)  # one help style for every verb
        _APP = app  # only a complete app is kept: a failed import leaves none half-registered
    return _APP


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
    if args and args[0] in _OWN_PARSER:
        from importlib import import_module

        # The console entry point (argv None) is a process of its own that ends here: it leaves
        # with os._exit once its output is flushed, skipping the interpreter's teardown (freeing
        # every module and object, ~10 % of a small trace's command). A call with argv (tests,
        # scripts) returns as usual. The cyclic collector has nothing to find in a short run.
        exits = argv is None
        if exits:
            import gc

            gc.disable()
        try:
            code = import_module(_OWN_PARSER[args[0]]).run(args[1:], exits=exits)
        except InputError as exc:
            _user_error(str(exc))
        except OSError as exc:
            where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
            _user_error(f"{where}{exc.strerror or exc}")
        except _PARSE_ERRORS as exc:
            _parse_error(exc)
        except Exception as exc:
            if isinstance(exc, _more_parse_errors()):
                _parse_error(exc)
            raise
        if exits:
            _exit_now(code)
        if code:
            raise SystemExit(code)
        return
    _typer_main(args)


def _exit_now(code: int) -> None:
    """Flush the output and end the process without the interpreter's teardown."""
    import os

    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed pipe or stream: leave the usual way, which reports it
        return
    os._exit(code)


def _typer_main(args: list[str]) -> None:
    import typer

    app = _build_app()
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
