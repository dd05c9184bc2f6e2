"""Names as people type them: another spelling of a catalog name is accepted (`same_name`), and a
mistyped one gets 'did you mean' (`close_names`, difflib).

'Did you mean' for a mistyped name: the catalog names closest to what was typed (difflib).

A name is compared with case, dashes, underscores, dots and spaces ignored, so `Llama-3-70B` and
`llama3_70b` find `llama3-70b`; then by difflib's similarity ratio (at least `CUTOFF`)."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

# difflib's ratio from which a name counts as close: 0.8 finds a dropped, doubled or swapped
# character in a catalog name (`llama3-70` -> `llama3-70b`, `h100` -> `h100-ib`) without offering
# names that share only a family (`llama3-405b` for `llama3-70`: 0.78).
CUTOFF = 0.8
MAX_SUGGESTIONS = 3


def _key(name: str) -> str:
    return "".join(c for c in name.lower() if c not in "-_. ")


def same_name(name: str, names: Sequence[str]) -> str | None:
    """The one name in `names` that `name` spells differently (`Llama-3-8B`, torchtitan's
    `llama3_8b` for `llama3-8b`: case, dashes, underscores, dots and spaces ignored); None when
    there is none, or more than one."""
    typed = _key(name)
    matches = [candidate for candidate in names if _key(candidate) == typed]
    return matches[0] if len(matches) == 1 else None


def close_names(name: str, names: Sequence[str]) -> list[str]:
    """The names in `names` closest to `name`, best first (at most `MAX_SUGGESTIONS`; [] if none)."""
    keys: dict[str, list[str]] = {}
    for candidate in names:
        keys.setdefault(_key(candidate), []).append(candidate)
    typed = _key(name)
    if typed in keys:
        return keys[typed][:MAX_SUGGESTIONS]
    close = difflib.get_close_matches(typed, list(keys), n=MAX_SUGGESTIONS, cutoff=CUTOFF)
    return [candidate for key in close for candidate in keys[key]][:MAX_SUGGESTIONS]


def unknown_name(
    kind: str, name: str, names: Sequence[str], *, listed_by: str = "", or_file: bool = False
) -> str:
    """`unknown model 'x'; did you mean y?` when a name is close, else the whole list to choose
    from. `listed_by` is the command that lists the names; `or_file` adds 'or a YAML file'."""
    close = close_names(name, names)
    file_hint = " or a YAML file" if or_file else ""
    if close:
        notes = [f"`{listed_by}` lists all {len(names)}"] if listed_by else []
        notes += ["or a YAML file"] if or_file else []
        tail = f" ({'; '.join(notes)})" if notes else ""
        return f"unknown {kind} '{name}'; did you mean {' or '.join(close)}?{tail}"
    return f"unknown {kind} '{name}'; choose one of {', '.join(names)}{file_hint}"
