"""Progress on stderr for work that takes more than a couple of seconds (study, report, search,
validate): a rich spinner with the current step and the elapsed time, gone when the work ends.

When it shows (one rule for every verb):
- stderr is a terminal and the verb was not asked for `--json`: shown;
- `SCALELAB_PROGRESS=1` asks for it anyway: on a terminal as above, elsewhere (a log file, CI) as
  one plain line per step, `scalelab study: weak scaling: 128 GPUs (3.2 s)`;
- `SCALELAB_PROGRESS=0` silences it everywhere.
stdout never carries progress, so `--json` output and piped tables stay clean.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

ENV = "SCALELAB_PROGRESS"
_YES = ("1", "true", "yes", "on", "always")
_NO = ("0", "false", "no", "off", "never")


def mode(*, json_out: bool) -> str:
    """'live' (a rich spinner), 'lines' (plain lines) or 'off', for this process's stderr."""
    asked = os.environ.get(ENV, "").strip().lower()
    if asked in _NO:
        return "off"
    terminal = sys.stderr.isatty()
    if asked in _YES:
        return "live" if terminal else "lines"
    return "live" if terminal and not json_out else "off"


@contextmanager
def progress(title: str, *, json_out: bool) -> Iterator[Callable[[str], None]]:
    """A callback that shows `text` as the current step of `title` (see the module for when)."""
    how = mode(json_out=json_out)
    if how == "off":
        yield lambda text: None
        return
    if how == "lines":
        start = time.perf_counter()

        def line(text: str) -> None:
            elapsed = time.perf_counter() - start
            print(f"{title}: {text} ({elapsed:.1f} s)", file=sys.stderr, flush=True)

        yield line
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    bar = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    with bar:
        task = bar.add_task(escape(title), total=None)
        yield lambda text: bar.update(task, description=escape(f"{title}: {text}"))
