"""The report's HTML page: the figures (relative paths, beside the page) and the tables.

The page is a jinja2 template (autoescaped: a record's name, series or error is text, never
markup); this module turns the rows into the template's cells. It is static and self-contained
but for its PNGs. A small script marks, once the page has
loaded, how many figures loaded (`data-figures-loaded` / `data-figures-broken` on <body>) and
flags a broken one in red, so a missing figure is visible to a reader and checkable by a test.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
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


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>{{ title }}</title><style>{{ style }}</style>
<script>{{ script }}</script></head><body>
<h1>{{ title }}</h1>
<p>{{ records }} records from <code>{{ source }}</code>: {{ ok }} ok, {{ records - ok }} failed or \
OOM. Each point is the mean over every repeat of every record of a configuration (model, series, \
GPUs); error bars and brackets are its 95 % confidence interval (Student t), absent with a single \
repeat and clipped at 0 (every metric is non-negative; with 2 repeats t = 12.7, so such intervals \
are wide).{% if predicted %} Dashed lines are the predictor's numbers for the same layouts.\
{% endif %}</p>
{% if predicted %}{% if prediction_clusters %}<p class="prediction-cluster">Predicted for cluster \
{% for name, devices in prediction_clusters.items() %}<b>{{ name }}</b> (records measured on: \
{{ devices | join(', ') }}){% if not loop.last %}; {% endif %}{% endfor %}.</p>
{% else %}<p class="prediction-cluster">No record was predicted (see the notes).</p>
{% endif %}{% endif %}<h2>Figures</h2>
{% for fig in figures %}<figure><img class="figure" src="{{ fig.src }}" alt="{{ fig.caption }}">\
<figcaption>{{ fig.caption }}</figcaption></figure>
{% endfor %}{% if unmeasured %}<p class="note">Not measured in these records:</p><ul class="note">\
{% for label, why in unmeasured %}<li>{{ label }}: {{ why }}</li>{% endfor %}</ul>
{% endif %}<h2>Summary</h2>
<table><tr>{% for h in summary.head %}<th class="text">{{ h }}</th>{% endfor %}\
{% for h in summary.metric_head %}<th>{{ h.label }}<br>{{ h.second }}</th>{% endfor %}</tr>\
{% for row in summary.rows %}<tr>{% for c in row %}\
<td{% if c.text %} class="text"{% endif %}>{{ c.value }}</td>{% endfor %}</tr>{% endfor %}</table>
<h2>Failed and OOM runs</h2>
{% if failures %}<table><tr>{% for h in ("record", "model", "series", "GPUs", "status", "error") %}\
<th class="text">{{ h }}</th>{% endfor %}</tr>{% for f in failures %}<tr>\
<td class="text">{{ f.record }}</td><td class="text">{{ f.model }}</td>\
<td class="text">{{ f.series }}</td><td>{{ f.gpus }}</td>\
<td class="text"><span class="failed">{{ f.status }}</span></td>\
<td class="text">{{ f.error }}</td></tr>{% endfor %}</table>
{% else %}<p>Every record has status ok.</p>
{% endif %}{% if notes %}<h2>Notes</h2><ul class="note">\
{% for n in notes %}<li>{{ n }}</li>{% endfor %}</ul>
{% endif %}<h2>Data</h2><p>{% for link in exports %}<a href="{{ link.href }}">{{ link.name }}</a>\
{% if not loop.last %} · {% endif %}{% endfor %}</p>
</body></html>
"""

_CAPTIONS = {
    "loss": "training loss per record and repeat",
    "breakdown": "step-time breakdown (profiled steps)",
}


@cache
def _template() -> Any:
    from jinja2 import Environment, StrictUndefined

    return Environment(autoescape=True, undefined=StrictUndefined).from_string(_PAGE)


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
    return str(value)


def summary_table(rows: Sequence[Row], predicted: bool) -> dict[str, Any]:
    """The summary table's headings and cells (text; the template escapes them)."""
    metrics = [m for m in METRICS if any(r.measured[m.key].get("mean") is not None for r in rows)]
    metric_head = []
    for m in metrics:
        metric_head.append({"label": f"{m.label} ({m.unit})", "second": "mean [95 % CI] (n)"})
        if predicted:
            metric_head.append({"label": m.label, "second": "predicted"})
    body = []
    for r in rows:
        cells = [
            {"value": r.model, "text": True},
            {"value": r.series, "text": True},
            {"value": str(r.gpus), "text": False},
            {"value": _fmt(r.nodes), "text": False},
            {"value": " ".join(r.layouts), "text": True},
            {"value": str(r.records), "text": False},
        ]
        for m in metrics:
            st = r.measured[m.key]
            ci = (
                f" [{_fmt(st['ci95_low'], m)}, {_fmt(st['ci95_high'], m)}]"
                if st.get("ci95_low") is not None
                else ""
            )
            cells.append(
                {"value": f"{_fmt(st.get('mean'), m)}{ci} ({st.get('n', 0)})", "text": False}
            )
            if predicted:
                cells.append({"value": _fmt(r.predicted.get(m.key), m), "text": False})
        body.append(cells)
    return {
        "head": ["model", "series", "GPUs", "nodes", "layouts", "records"],
        "metric_head": metric_head,
        "rows": body,
    }


def failures(obs: Sequence[Observation]) -> list[dict[str, Any]]:
    """The records that did not end ok, with their error (first 300 characters)."""
    return [
        {
            "record": o.path.name,
            "model": o.model,
            "series": " ".join(o.series),
            "gpus": o.gpus,
            "status": o.status,
            "error": (o.record.error or "")[:300],
        }
        for o in obs
        if o.status != "ok"
    ]


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
    """The page: the figures, the summary, the failed runs, notes and the data files; a note says
    which cluster predictions are for (CPU records predicted for a GPU cluster compare in shape
    only)."""
    from markupsafe import Markup

    labels = {m.key: m.label for m in METRICS}
    return str(
        _template().render(
            title=title,
            style=Markup(_STYLE),
            script=Markup(_SCRIPT),
            records=len(obs),
            ok=sum(1 for o in obs if o.status == "ok"),
            source=source,
            predicted=predicted,
            prediction_clusters=prediction_clusters or {},
            figures=[
                {
                    "src": path.relative_to(out).as_posix(),
                    "caption": labels.get(key) or _CAPTIONS.get(key, "measured vs predicted"),
                }
                for key, path in figures.items()
            ],
            unmeasured=[(labels[k], v) for k, v in unmeasured.items()],
            summary=summary_table(rows, predicted),
            failures=failures(obs),
            notes=list(notes),
            exports=[{"href": p.relative_to(out).as_posix(), "name": p.name} for p in exports],
        )
    )
