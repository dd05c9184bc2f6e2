"""Every command in the README and the docs is checked, so the docs cannot drift (issue 36 item 1).

Each page's fenced `bash`/`console` blocks are read line by line. A `scalelab` command is run, in the
page's order, in one scratch folder per page (so the tour's bench writes the records its trace and
report read), and must exit 0. The commands listed in `PARSED_ONLY` need a GPU, SLURM or minutes of
CPU; they are parsed by the real command line instead (every option and argument must exist and take
its value), which catches a renamed flag. Lines of other programs are listed in `OTHER_PROGRAMS` with
where they are checked. docs/index.md is the README itself (tools/docs_figures.py writes it).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "index.md"),
]
FENCE = re.compile(r"^```\s*([\w-]*)")
COMMENT = re.compile(r"\s+#\s.*$")  # a trailing `   # note` (the docs write comments so)
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")

# The checkout's folders a page's command may read (examples/sweeps/..., tests/data/traces/...); the
# commands run in a scratch folder holding links to these, so what they write stays there.
READ_FOLDERS = ("examples", "tests", "benchmarks", "src")

# scalelab commands that are parsed, not run: (page, command as written) -> why.
PARSED_ONLY: dict[tuple[str, str], str] = {
    # GPU nodes
    ("harness.md", "scalelab bench llama3-8b --nproc-per-node 8 --sharding fsdp --global-batch 16 --micro-batch 2 --compile"): "8 GPUs",
    ("harness.md", "scalelab bench llama2-70b --nproc-per-node 8 --tp 8 --global-batch 8 --recompute full --predict"): "8 GPUs",
    # SLURM
    ("sweep.md", "scalelab sweep examples/sweeps/weak-scaling-slurm.yaml --executor slurm --out runs/weak-scaling"): "SLURM with GPUs",
    ("sweep.md", "scalelab report runs/weak-scaling --predict"): "the records of the SLURM sweep above",
    # CPU runs of the harness that take 25-60 s each on 2 cores (7 of them would double the docs
    # test's time); each layout is trained and checked in tests/measure/ (test_parity.py,
    # test_moe_bench.py), and the tour (README) and calibration.md run bench for real.
    ("harness.md", "scalelab bench llama-tiny --nproc-per-node 2 --sharding fsdp"): "CPU minutes; tour runs fsdp",
    ("harness.md", "scalelab bench llama-tiny --nproc-per-node 4 --sharding hsdp --hsdp-shard-size 2 --steps 5 --warmup 1"): "CPU minutes",
    ("harness.md", "scalelab bench llama-tiny --nproc-per-node 2 --tp 2 --global-batch 8 --json"): "CPU minutes",
    ("harness.md", "scalelab bench llama-tiny --nproc-per-node 2 --pp 2 --pp-schedule interleaved --virtual-stages 2 --global-batch 8"): "CPU minutes",
    ("harness.md", "scalelab bench llama-tiny --nproc-per-node 2 --cp 2 --profile"): "CPU minutes",
    ("harness.md", "scalelab bench examples/moe-tiny.yaml --nproc-per-node 2 --ep 2 --global-batch 8 --steps 5 --warmup 2 --repeats 2"): "CPU minutes",
    ("harness.md", "scalelab bench examples/moe-tiny.yaml --nproc-per-node 4 --tp 2 --ep 2 --expert-tp 2 --global-batch 8"): "CPU minutes",
    ("sweep.md", "scalelab sweep examples/sweeps/tiny-local.yaml --out runs/tiny"): "4 bench runs (tests/sweep/test_local_sweep.py runs a local sweep)",
    ("sweep.md", "scalelab report runs/tiny --predict"): "the records of the sweep above",
    # The laptop calibration path: tests/calibrate/test_comm_cli.py runs comm (these sizes and
    # iterations, three of the collectives) and calibrate on its record; bench as above.
    ("calibration.md", "scalelab comm --nproc-per-node 2 --sizes 4K:1M:4 --iters 5 --warmup 1 --out runs/"): "tests/calibrate/test_comm_cli.py",
    ("calibration.md", "scalelab bench llama-tiny --nproc-per-node 2 --sharding fsdp --steps 10 --warmup 2 --repeats 2 --out runs/"): "CPU minutes",
    ("calibration.md", "scalelab calibrate runs/ --base cpu-gloo --out my-cluster.yaml"): "tests/calibrate/test_comm_cli.py",
    ("calibration.md", "scalelab predict llama-tiny --gpus 2 --cluster my-cluster.yaml"): "the cluster file calibrate writes",
    # A user's own files (the README's "validate on your own runs"): tests/validate and tests/runs
    # run these verbs on tables and a torchtitan log they write.
    ("README.md", "scalelab validate --data my_runs.csv"): "a user's own table",
    ("README.md", "scalelab validate --data my_runs.csv --explain 3"): "a user's own table",
    ("README.md", "scalelab validate --data my_runs.csv --json --skipped why.csv"): "a user's own table",
    ("README.md", "scalelab runs import train.log --from torchtitan --config job.toml --out runs.csv"): "a user's torchtitan log (tests/runs)",
    ("report.md", "scalelab report runs/ --out runs/report --tensorboard runs/tb"): "a folder of bench records (tests/sweep/test_report.py reports one with --tensorboard and reads the event files back)",
}  # fmt: skip

# Other programs' lines: the first word(s) -> where they are checked instead.
OTHER_PROGRAMS: dict[str, str] = {
    "python3 -m venv": "the README's install lines: .ci/run runs them on a clean clone",
    "pytest": "the suite itself",
    "sudo .ci/slurm-up.sh": ".ci/run starts SLURM",
    "ruff": "lint: .ci and every commit",
    "mypy": "type check: every commit",
    "python benchmarks/": "benchmarks are not tests (DESIGN.md); docs/benchmarks.md records their figures",
    "bash benchmarks/gpu_check.sh": "needs a GPU",
    "WHEELHOUSE=": "on the GPU machine",
    "bash benchmarks/wheelhouse.sh": "downloads wheels (a package index)",
    "PYTHON=": "builds a fresh venv with torch (about 50 s): run by hand before a GPU check",
    "head=$(scontrol": "a SLURM batch script",
    "srun": "a SLURM batch script",
    "xdg-open": "opens a browser",
    "tensorboard --logdir": "starts TensorBoard's web server (tests/sweep/test_report.py reads the files with its EventAccumulator)",
    "pip install": "installs: .ci/run installs the extras the tests need",
    "SCALELAB_MAX_INPUT_MIB=": "a user's large folder; the bound is tested in tests/hostile/test_classes.py",
}


def shell_lines(page: Path) -> list[str]:
    """The command lines of a page's shell blocks (continuations joined, comments dropped, `&&`
    split, a leading `$ ` removed)."""
    out: list[str] = []
    language: str | None = None
    pending = ""
    for line in page.read_text().splitlines():
        stripped = line.strip()
        if language is None:
            match = FENCE.match(stripped)
            if match:
                language = match.group(1) or "text"
            continue
        if stripped.startswith("```"):
            language = None
            continue
        if language not in SHELL_LANGUAGES:
            continue
        if language == "console" and not stripped.startswith("$ ") and not pending:
            continue  # a console block's output
        text = stripped[2:] if stripped.startswith("$ ") else stripped
        text = (pending + " " + text).strip() if pending else text
        if text.endswith("\\"):
            pending = text[:-1].rstrip()
            continue
        pending = ""
        text = COMMENT.sub("", text).strip()
        if not text or text.startswith("#") or text.startswith("scalelab: error"):
            continue
        if text.startswith(tuple(OTHER_PROGRAMS)):
            out.append(text)  # one line of another program, `&&` and all
        else:
            out.extend(part.strip() for part in text.split(" && "))
    return out


def _kind(page: Path, line: str) -> str:
    if (page.name, line) in PARSED_ONLY:
        return "parse"
    if line.startswith("scalelab "):
        return "run"
    if line.startswith("export "):
        return "env"
    for prefix in OTHER_PROGRAMS:
        if line.startswith(prefix):
            return "other"
    raise AssertionError(f"{page.name}: no rule for {line!r}: run it, or say in this file why not")


def _parse(args: list[str]) -> None:
    """Parse `scalelab ARGS` with the real command line, raising click's error on a bad option."""
    from scalelab.cli import app

    command: Any = typer.main.get_command(app)
    rest = list(args)
    while getattr(command, "commands", None) and rest and rest[0] in command.commands:
        command = command.commands[rest.pop(0)]
    assert not getattr(command, "commands", None), f"no such verb: {args}"
    with command.make_context(" ".join(args[: len(args) - len(rest)]), rest):
        pass


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_command_of_the_page(page: Path, tmp_path: Path) -> None:
    lines = shell_lines(page)
    for folder in READ_FOLDERS:  # what the pages' commands read, as from a clone's root
        (tmp_path / folder).symlink_to(ROOT / folder)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "160", "NO_COLOR": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    bin_dir = tmp_path / "bin"  # `scalelab` on PATH is this checkout's
    bin_dir.mkdir()
    (bin_dir / "scalelab").write_text(f'#!/bin/sh\nexec {sys.executable} -m scalelab "$@"\n')
    (bin_dir / "scalelab").chmod(0o755)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    for line in lines:
        kind = _kind(page, line)
        if kind == "env":
            for assignment in shlex.split(line)[1:]:
                key, _, value = assignment.partition("=")
                env[key] = value
        elif kind == "parse":
            _parse(shlex.split(line)[1:])
        elif kind == "run":
            proc = subprocess.run(
                ["bash", "-c", line],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert proc.returncode == 0, f"{page.name}: {line}\n{proc.stderr[-2000:]}"


def test_no_stale_exceptions() -> None:
    """Every command PARSED_ONLY names is still in its page (a removed one is removed here too)."""
    written = {(p.name, line) for p in PAGES for line in shell_lines(p)}
    assert set(PARSED_ONLY) <= written, set(PARSED_ONLY) - written


def test_the_parser_check_catches_a_renamed_flag() -> None:
    _parse(["predict", "llama2-7b", "--gpus", "8"])
    with pytest.raises(Exception, match="No such option"):
        _parse(["predict", "llama2-7b", "--gpu-count", "8"])
    with pytest.raises(AssertionError, match="no such verb"):
        _parse(["runs"])


def test_console_output_is_not_a_command(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("```console\n$ scalelab models \\\n  --json\nllama2-7b  6.7B\n```\n")
    assert shell_lines(page) == ["scalelab models --json"]
