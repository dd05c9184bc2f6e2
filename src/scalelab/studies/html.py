r"""A study's report as one self-contained HTML page (`report.html` beside `report.md`).

The page is report.md's sections rendered by markdown-it-py (CommonMark with GitHub's tables:
links work, `\|` in a cell stays in the cell; raw HTML in the markdown is escaped, not passed
through) into a jinja2 template (autoescaped), with every figure embedded as a data: URI, so it
opens offline and can be mailed as one file. A small script marks, once the page has loaded, how
many figures loaded (`data-figures-loaded` / `data-figures-broken` on <body>), so a test can
check it in a browser.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from functools import cache
from html import escape
from pathlib import Path
from typing import Any

from scalelab.io import atomic_write_text

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1250px; color: #222;
       line-height: 1.45; padding: 0 1em; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
figure { margin: 1em 0; }
figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { color: #666; font-size: 0.9em; }
code { background: #f4f4f4; padding: 0 3px; }
.broken { outline: 3px solid #c00; }
"""

_SCRIPT = """
window.addEventListener('load', function () {
  var imgs = document.querySelectorAll('img.figure');
  var ok = 0, broken = [];
  imgs.forEach(function (img) {
    if (img.complete && img.naturalWidth > 0) { ok += 1; }
    else { broken.push(img.getAttribute('data-name')); img.classList.add('broken'); }
  });
  document.body.setAttribute('data-figures-total', String(imgs.length));
  document.body.setAttribute('data-figures-loaded', String(ok));
  document.body.setAttribute('data-figures-broken', broken.join(' '));
});
"""

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>{{ title }}</title><style>{{ style }}</style><script>{{ script }}</script></head>
<body><h1>{{ title }}</h1>
{% for section in sections %}{{ section }}
{% endfor %}</body></html>
"""


def _figure(folder: Path, alt: str, name: str) -> str:
    """An image of the report as a figure: the PNG embedded (a data: URI) when it is a file."""
    path = folder / name
    src = (
        "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")
        if path.is_file()
        else escape(name)
    )
    return (
        f'<figure><img class="figure" data-name="{escape(name)}" alt="{escape(alt)}" '
        f'src="{src}"><figcaption>{escape(name)}</figcaption></figure>'
    )


@cache
def _parser() -> Any:
    """CommonMark plus GitHub tables; raw HTML off (the markdown's `<` is text)."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable("table")


def markdown_to_html(text: str, folder: Path) -> str:
    """report.md's markdown as HTML; an image alone in its paragraph becomes a <figure> with the
    file embedded (a paragraph cannot hold a figure, so that paragraph's tags are dropped)."""
    md = _parser()
    tokens = md.parse(text)
    for i, token in enumerate(tokens):
        children = token.children or []
        if token.type == "inline" and len(children) == 1 and children[0].type == "image":
            tokens[i - 1].hidden = tokens[i + 1].hidden = True  # paragraph_open / _close
    # The renderer's own rules, with images drawn as figures from `folder`.
    renderer = md.renderer

    def image(tokens: Sequence[Any], idx: int, options: Any, env: Any) -> str:
        token = tokens[idx]
        alt = renderer.renderInlineAsText(token.children or [], options, env)
        return _figure(folder, alt, str(token.attrGet("src") or ""))

    original = renderer.rules.get("image")
    renderer.rules["image"] = image
    try:
        return str(renderer.render(tokens, md.options, {}))
    finally:
        if original is not None:
            renderer.rules["image"] = original


def write_html(out: Path, title: str, sections: list[str]) -> Path:
    """report.html in `out`: the sections, figures embedded; returns its path."""
    from jinja2 import Environment
    from markupsafe import Markup

    template = Environment(autoescape=True).from_string(_PAGE)
    page = template.render(
        title=title,
        style=Markup(_STYLE),
        script=Markup(_SCRIPT),
        sections=[Markup(markdown_to_html(s, out)) for s in sections],
    )
    return atomic_write_text(out / "report.html", page)
