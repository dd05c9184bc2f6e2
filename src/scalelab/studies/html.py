"""A study's report as one self-contained HTML page (`report.html` beside `report.md`).

The page is made from the same sections as report.md (a small subset of markdown: headings, images,
tables, bullets, bold, code), with every figure embedded as a data: URI, so it opens offline and can
be mailed as one file. A small script marks, once the page has loaded, how many figures loaded
(`data-figures-loaded` / `data-figures-broken` on <body>), so a test can check it in a browser.
"""

from __future__ import annotations

import base64
import re
from html import escape
from pathlib import Path

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

_IMAGE = re.compile(r"^!\[([^\]]*)\]\(([^)]+)\)$")


def _inline(text: str) -> str:
    """Escape, then **bold**, *italic* and `code`."""
    out = escape(text)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    out = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)
    return re.sub(r"(?<![*\w])\*([^*]+)\*(?![*\w])", r"<em>\1</em>", out)


def _image(folder: Path, alt: str, name: str) -> str:
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


def _table(lines: list[str]) -> str:
    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.strip().strip("|").split("|")]

    head = "".join(f"<th>{_inline(c)}</th>" for c in cells(lines[0]))
    body = "".join(
        "<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in cells(line)) + "</tr>"
        for line in lines[2:]
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def markdown_to_html(text: str, folder: Path) -> str:
    """The markdown this package writes (not general markdown) as HTML."""
    html: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        if not line:
            i += 1
        elif line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")), 4)
            html.append(f"<h{level}>{_inline(line.lstrip('#').strip())}</h{level}>")
            i += 1
        elif m := _IMAGE.match(line):
            html.append(_image(folder, m.group(1), m.group(2)))
            i += 1
        elif line.startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append(lines[i])
                i += 1
            html.append(_table(block))
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            html.append("<ul>" + "".join(items) + "</ul>")
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not lines[i].startswith(("#", "|", "- ")):
                if _IMAGE.match(lines[i].strip()):
                    break
                para.append(lines[i].strip())
                i += 1
            html.append(f"<p>{_inline(' '.join(para))}</p>")
    return "\n".join(html)


def write_html(out: Path, title: str, sections: list[str]) -> Path:
    """report.html in `out`: the sections, figures embedded; returns its path."""
    body = "\n".join(markdown_to_html(s, out) for s in sections)
    page = (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_STYLE}</style><script>{_SCRIPT}</script></head>"
        f"<body><h1>{escape(title)}</h1>\n{body}\n</body></html>\n"
    )
    return atomic_write_text(out / "report.html", page)
