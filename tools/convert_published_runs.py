"""Convert the shipped raw published_runs.csv into the typed run file, with the generic importer.

Re-run after editing the raw file or the review sheet; it rewrites
src/scalelab/data/published_runs_typed.csv (one typed run per readable row) and
src/scalelab/data/published_runs_skipped.csv (every other row with the reason). The same as
`scalelab runs import src/scalelab/data/published_runs.csv --review
src/scalelab/data/published_runs_review.csv --out src/scalelab/data/published_runs_typed.csv`.

Run: `PYTHONPATH=src python tools/convert_published_runs.py`
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from scalelab.runs.importer import import_file, write_skipped
from scalelab.runs.schema import write_runs

DATA = Path(__file__).resolve().parents[1] / "src" / "scalelab" / "data"


def main() -> None:
    readings = import_file(DATA / "published_runs.csv", DATA / "published_runs_review.csv")
    runs = [r.run for r in readings if r.run is not None]
    write_runs(runs, DATA / "published_runs_typed.csv")
    write_skipped(readings, DATA / "published_runs_skipped.csv")
    skipped = Counter(r.skipped for r in readings if r.skipped)  # every reason of a row, joined
    print(f"{len(runs)} runs written, {sum(skipped.values())} rows skipped: {dict(skipped)}")


if __name__ == "__main__":
    main()
