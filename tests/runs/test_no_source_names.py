"""No module under src/ names a source of the shipped runs: code reads what rows say, never who
wrote them (docs/runs.md). Framework names (the stack that ran a job) are not source names."""

from __future__ import annotations

import csv
import re
from importlib import resources
from pathlib import Path

import scalelab

SRC = Path(scalelab.__file__).resolve().parent
# Owners whose names are also products the code must name (the PyTorch library, NVIDIA GPUs);
# their owner/repo forms are still checked. Short generic document names (README.md,
# performance.md) are not names of a source either.
PRODUCT_OWNERS = {"pytorch", "nvidia"}


def source_names() -> set[str]:
    """Every name the data's source column gives a source by: GitHub owner/repo and owner, arXiv
    ids, the cited documents' file names, and the review sheet's source group labels."""
    data = resources.files("scalelab").joinpath("data")
    rows = csv.DictReader(data.joinpath("published_runs.csv").read_text().splitlines())
    names: set[str] = set()
    for source in {row["source"] for row in rows}:
        for owner, repo in re.findall(r"github ([\w.-]+)/([\w.-]+)", source):
            names.add(f"{owner}/{repo}")
            if owner.lower() not in PRODUCT_OWNERS:
                names.add(owner)
        names |= set(re.findall(r"arXiv (\d{4}\.\d{4,5})", source))
        documents = re.findall(r"[\w./*-]+\.(?:md|png|csv|xlsx)", source)
        names |= {Path(p).name for p in documents if len(Path(p).name) >= 16}
        names.add(source)
    review = list(
        csv.DictReader(data.joinpath("published_runs_review.csv").read_text().splitlines())
    )
    labels = {r["value"] for r in review if r["column"] == "source_group"}
    stacks = " ".join(r["value"] for r in review if r["column"] == "framework").lower()
    names |= labels
    # A label's first word (an author, a company) unless it also names a stack (a framework).
    names |= {w for w in (label.split()[0] for label in labels) if w.lower() not in stacks}
    return {n for n in names if len(n) >= 4}


def test_the_name_list_is_not_empty() -> None:
    names = source_names()
    assert {"JohannesHa", "mosaicml/llm-foundry", "2104.04473", "Oneflow-Inc"} <= names
    assert {"Hagemann", "MosaicML"} <= names


def test_no_module_under_src_contains_a_source_name() -> None:
    names = sorted(source_names())
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text().lower()
        offenders += [f"{path.relative_to(SRC)}: {n}" for n in names if n.lower() in text]
    assert offenders == []
