"""The report's HTML page: the figures (relative paths, beside the page) and the tables.

The page is static and self-contained but for its PNGs. A small script marks, once the page has
loaded, how many figures loaded (`data-figures-loaded` / `data-figures-broken` on <body>) and
flags a broken one in red, so a missing figure is visible to a reader and checkable by a test.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from scalelab.report.data import METRICS, Metric, Observation, Row

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; }
th { background: #f3f3f3; }
td.text, th.text { text-align: left; }
figure { display: inline-block; margin: 0.5em; vertical-align: top; }
figure img { max-width: 560px; border: 1px solid #ddd; }
.broken { outline: 3px solid #c00; }
.note { color: #666; font-size: 0.9em; }
.failed { color: #b00; }
"""

_SCRIPT = """
window.addEventListener('load', function () {
  var imgs = document.querySelectorAll('img.figure');
  var ok = 0, broken = [];
  imgs.forEach(function (img) {
    if (img.complete && img.naturalWidth > 0) { ok += 1; }
    else { broken.push(img.getAttribute('src')); img.classList.add('broken');
           img.alt = 'figure did not load: ' + img.getAttribute('src'); }
  });
  document.body.setAttribute('data-figures-total', String(imgs.length));
  document.body.setAttribute('data-figures-loaded', String(ok));
  document.body.setAttribute('data-figures-broken', broken.join(' '));
});
"""


def _fmt(value: Any, metric: Metric | None = None) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        v = value * (metric.scale if metric else 1.0)
        if abs(v) >= 100:
            return f"{v:,.0f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.3g}"
    return escape(str(value))


def _cell(text: str, cls: str = "") -> str:
    return f'<td class="{cls}">{text}</td>' if cls else f"<td>{text}</td>"


def summary_table(rows: Sequence[Row], predicted: bool) -> str:
    head = ["model", "series", "GPUs", "nodes", "layouts", "records"]
    metrics = [m for m in METRICS if any(r.measured[m.key].get("mean") is not None for r in rows)]
    cols = "".join(f'<th class="text">{h}</th>' for h in head)
    for m in metrics:
        cols += f"<th>{escape(m.label)} ({escape(m.unit)})<br>mean [95 % CI] (n)</th>"
        if predicted:
            cols += f"<th>{escape(m.label)}<br>predicted</th>"
    body = []
    for r in rows:
        cells = [
            _cell(escape(r.model), "text"),
            _cell(escape(r.series), "text"),
            _cell(str(r.gpus)),
            _cell(_fmt(r.nodes)),
            _cell(escape(" ".join(r.layouts)), "text"),
            _cell(str(r.records)),
        ]
        for m in metrics:
            st = r.measured[m.key]
            ci = (
                f" [{_fmt(st['ci95_low'], m)}, {_fmt(st['ci95_high'], m)}]"
                if st.get("ci95_low") is not None
                else ""
            )
            cells.append(_cell(f"{_fmt(st.get('mean'), m)}{ci} ({st.get('n', 0)})"))
            if predicted:
                cells.append(_cell(_fmt(r.predicted.get(m.key), m)))
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{cols}</tr>{''.join(body)}</table>"


def failures_table(obs: Sequence[Observation]) -> str:
    bad = [o for o in obs if o.status != "ok"]
    if not bad:
        return "<p>Every record has status ok.</p>"
    rows = "".join(
        "<tr>"
        + _cell(escape(o.path.name), "text")
        + _cell(escape(o.model), "text")
        + _cell(escape(" ".join(o.series)), "text")
        + _cell(str(o.gpus))
        + _cell(f'<span class="failed">{escape(o.status)}</span>', "text")
        + _cell(escape((o.record.error or "")[:300]), "text")
        + "</tr>"
        for o in bad
    )
    head = "".join(
        f'<th class="text">{h}</th>'
        for h in ("record", "model", "series", "GPUs", "status", "error")
    )
    return f"<table><tr>{head}</tr>{rows}</table>"


def _prediction_line(clusters: dict[str, list[str]]) -> list[str]:
    """Which cluster the predictions are for, and what the records ran on (CPU records predicted
    for a GPU cluster compare in shape only)."""
    if not clusters:
        return ['<p class="prediction-cluster">No record was predicted (see the notes).</p>']
    items = "; ".join(
        f"<b>{escape(name)}</b> (records measured on: {escape(', '.join(devices))})"
        for name, devices in clusters.items()
    )
    return [f'<p class="prediction-cluster">Predicted for cluster {items}.</p>']


def page(
    *,
    title: str,
    source: str,
    rows: Sequence[Row],
    obs: Sequence[Observation],
    figures: dict[str, Path],
    out: Path,
    predicted: bool,
    unmeasured: dict[str, str],
    notes: Sequence[str],
    exports: Sequence[Path],
    prediction_clusters: dict[str, list[str]] | None = None,
) -> str:
    ok = sum(1 for o in obs if o.status == "ok")
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title><style>{_STYLE}</style>",
        f"<script>{_SCRIPT}</script></head><body>",
        f"<h1>{escape(title)}</h1>",
        f"<p>{len(obs)} records from <code>{escape(source)}</code>: {ok} ok, "
        f"{len(obs) - ok} failed or OOM. Each point is the mean over every repeat of every "
        "record of a configuration (model, series, GPUs); error bars and brackets are its 95 % "
        "confidence interval (Student t), absent with a single repeat and clipped at 0 (every "
        "metric is non-negative; with 2 repeats t = 12.7, so such intervals are wide)."
        + (" Dashed lines are the predictor's numbers for the same layouts." if predicted else "")
        + "</p>",
        *(_prediction_line(prediction_clusters or {}) if predicted else []),
        "<h2>Figures</h2>",
    ]
    for key, path in figures.items():
        rel = path.relative_to(out).as_posix()
        caption = next(
            (m.label for m in METRICS if m.key == key),
            {
                "loss": "training loss per record and repeat",
                "breakdown": "step-time breakdown (profiled steps)",
            }.get(key, "measured vs predicted"),
        )
        parts.append(
            f'<figure><img class="figure" src="{escape(rel)}" alt="{escape(caption)}">'
            f"<figcaption>{escape(caption)}</figcaption></figure>"
        )
    if unmeasured:
        items = "".join(
            f"<li>{escape(next(m.label for m in METRICS if m.key == k))}: {escape(v)}</li>"
            for k, v in unmeasured.items()
        )
        parts.append(
            f'<p class="note">Not measured in these records:</p><ul class="note">{items}</ul>'
        )
    parts += ["<h2>Summary</h2>", summary_table(rows, predicted)]
    parts += ["<h2>Failed and OOM runs</h2>", failures_table(obs)]
    if notes:
        items = "".join(f"<li>{escape(n)}</li>" for n in notes)
        parts.append(f'<h2>Notes</h2><ul class="note">{items}</ul>')
    links = " · ".join(
        f'<a href="{escape(p.relative_to(out).as_posix())}">{escape(p.name)}</a>' for p in exports
    )
    parts.append(f"<h2>Data</h2><p>{links}</p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
