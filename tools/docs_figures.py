"""Write the figures of docs/figures.yaml into README.md and docs/*.md, and docs/index.md from
README.md (or, with --check, say where a page disagrees and exit 1). A figure sits in a page as
`<!-- fig:NAME -->TEXT<!-- /fig -->`; the site's home page is the README with its links made
relative to docs/, so the two cannot differ."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
MARK = re.compile(r"<!-- fig:([a-z0-9_]+) -->(.*?)<!-- /fig -->", re.DOTALL)


INDEX_NOTE = "<!-- generated from README.md by tools/docs_figures.py: edit README.md -->\n"


def index_page(root: Path = ROOT) -> str:
    """docs/index.md: the README, its `docs/` links relative to the site."""
    return INDEX_NOTE + (root / "README.md").read_text().replace("](docs/", "](")


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def figures(root: Path = ROOT) -> dict[str, str]:
    data = yaml.safe_load((root / "docs" / "figures.yaml").read_text())
    return {name: str(entry["text"]) for name, entry in data.items()}


def problems(root: Path = ROOT) -> list[str]:
    """Every marker whose text differs from figures.yaml, or names no figure there."""
    known = figures(root)
    found = []
    index = root / "docs" / "index.md"
    if not index.is_file() or index.read_text() != index_page(root):
        found.append("docs/index.md: differs from README.md (run tools/docs_figures.py)")
    for page in pages(root):
        for match in MARK.finditer(page.read_text()):
            name, text = match.groups()
            if name not in known:
                found.append(f"{page.name}: fig:{name} is not in docs/figures.yaml")
            elif text != known[name]:
                found.append(f"{page.name}: fig:{name} says {text!r}, figures.yaml {known[name]!r}")
    return found


def write(root: Path = ROOT) -> None:
    known = figures(root)
    for page in pages(root):
        text = page.read_text()
        new = MARK.sub(lambda m: f"<!-- fig:{m[1]} -->{known.get(m[1], m[2])}<!-- /fig -->", text)
        if new != text:
            page.write_text(new)
    (root / "docs" / "index.md").write_text(index_page(root))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="only report disagreements")
    args = parser.parse_args()
    if not args.check:
        write()
    found = problems()
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
