"""The study's HTML: report.md rendered by markdown-it-py into a jinja2 page."""

from __future__ import annotations

from pathlib import Path

from scalelab.plotting import markdown_table
from scalelab.studies.html import markdown_to_html, write_html


def test_links_work_and_a_pipe_stays_in_its_cell(tmp_path: Path) -> None:
    table = markdown_table([("tp 2 | pp 4", "[nccl-tests](comm.md)")], ["layout", "see"])
    html = markdown_to_html(table, tmp_path)
    assert "<td>tp 2 | pp 4</td>" in html  # one cell, not two
    assert html.count("<td>") == 2
    assert '<a href="comm.md">nccl-tests</a>' in html


def test_raw_html_is_text_and_a_lone_image_is_an_embedded_figure(tmp_path: Path) -> None:
    (tmp_path / "f.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    html = markdown_to_html("a <script>x</script> b\n\n![the alt](f.png)\n", tmp_path)
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert '<figure><img class="figure" data-name="f.png" alt="the alt" ' in html
    assert 'src="data:image/png;base64,' in html
    assert "<p><figure>" not in html  # no figure inside a paragraph


def test_the_page_escapes_its_title(tmp_path: Path) -> None:
    page = write_html(tmp_path, "a <b> & c", ["# Section\n\ntext"]).read_text()
    assert "<title>a &lt;b&gt; &amp; c</title>" in page and "<h1>Section</h1>" in page
