"""The SLURM executor: the job scripts submitit writes (every user value quoted), the script run
as SLURM would run it on one node, multi-node rendezvous flags, and a sweep through submitit's
local executor.

There is no SLURM here: a fake `sbatch` keeps the script it is given and answers a job id, and a
fake `srun` runs its command as task 0 of node 0. The `#SBATCH` lines are read back with the
rules of sbatch's own parser (quotes, backslash escapes, `#` comments).
"""

from __future__ import annotations

import json
import os
import pickle
import shlex
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scalelab.errors import InputError
from scalelab.results import load_record, record_paths
from scalelab.sweep.executors import SlurmExecutor, rendezvous
from scalelab.sweep.plan import expand
from scalelab.sweep.run import run_sweep
from scalelab.sweep.schema import SlurmOptions, load_sweep
from tests.sweep.conftest import child_env, write_sweep

pytest.importorskip("submitit")

FAKE_SBATCH = """#!{python}
import os, sys
capture = os.environ["FAKE_SBATCH_DIR"]
n = len(os.listdir(capture))
with open(sys.argv[-1]) as src, open(os.path.join(capture, f"job{{n}}.sh"), "w") as dst:
    dst.write(src.read())
print("Submitted batch job " + os.environ.get("FAKE_JOB_ID", "4242"))
"""

FAKE_SRUN = """#!{python}
import os, sys
args = sys.argv[1:]
while args and args[0].startswith("--"):
    flag = args.pop(0)
    if flag in ("--output", "--error") and args:
        args.pop(0)
for key, value in (("SLURM_PROCID", "0"), ("SLURM_LOCALID", "0"), ("SLURM_NODEID", "0"),
                   ("SLURM_NTASKS", "1")):
    os.environ.setdefault(key, value)
os.execvp(args[0], args)
"""

# Values a user might write, each able to break a script that does not quote it.
NASTY = {
    "partition": "gpu a'100",
    "account": 'lab "x" $(touch /tmp/pwned)',
    "qos": "high;rm -rf ~",
    "constraint": "h100&ib|a100 # not a comment",
}


def sbatch_arguments(line: str) -> list[str]:
    """The arguments of one `#SBATCH` line, as sbatch parses them (src/sbatch/opt.c).

    Outside quotes whitespace separates arguments and an unescaped `#` ends the line; `'` and `"`
    quote (no nesting); a backslash escapes the next character, inside quotes too.
    """
    out: list[str] = []
    rest = line[len("#SBATCH") :]
    i = 0
    while i < len(rest):
        while i < len(rest) and rest[i].isspace():
            i += 1
        if i >= len(rest):
            break
        arg, quote, escape = [], "", False
        while i < len(rest) and (quote or not rest[i].isspace()):
            c = rest[i]
            i += 1
            if escape:
                escape = False
            elif c == "\\":
                escape = True
                continue
            elif quote:
                if c == quote:
                    quote = ""
                    continue
            elif c in "'\"":
                quote = c
                continue
            elif c == "#":
                return out + (["".join(arg)] if arg else [])
            arg.append(c)
        assert not quote, f"unmatched quote in {line!r}"
        out.append("".join(arg))
    return out


def sbatch_flags(script: str) -> dict[str, str | bool]:
    flags: dict[str, str | bool] = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH"):
            for arg in sbatch_arguments(line):
                key, sep, value = arg.partition("=")
                flags[key.lstrip("-")] = value if sep else True
    return flags


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`sbatch` and `srun` on PATH; returns the folder where submitted scripts land."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("srun", FAKE_SRUN)):
        exe = bin_dir / name
        exe.write_text(text.format(python=sys.executable))
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    captured = tmp_path / "captured"
    captured.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SBATCH_DIR", str(captured))
    return captured


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _points(tmp_path: Path, nodes: str = "[1]", gpn: int = 1) -> list:
    sweep = write_sweep(
        tmp_path / "spec",
        f"name: tiny\nmodels: [llama-tiny]\nnodes: {nodes}\ngpus_per_node: {gpn}\n"
        "bench: {steps: 2, warmup: 1, repeats: 2}\n",
    )
    spec, base = load_sweep(sweep)
    return expand(spec, base)


def test_job_script_quotes_every_user_value(fake_slurm: Path, tmp_path: Path) -> None:
    (point,) = _points(tmp_path, nodes="[4]", gpn=8)
    out = tmp_path / "sweep out's $HOME"
    options = SlurmOptions(
        **NASTY,
        time_min=90,
        cpus_per_task=32,
        setup=["export SETUP_RAN=1"],
        additional={"comment": "weak scaling; it's #1", "gres": "gpu:8"},
        gpus="gpus-per-node",
    )
    executor = SlurmExecutor(options, max_parallel=3)
    executor.check([point], out)
    ((submitted, job),) = executor.submit([point], out)
    assert submitted == point and str(job.job_id) == "4242"
    (script_path,) = fake_slurm.iterdir()
    script = script_path.read_text()
    assert script == executor.job_script(point, out)  # what --dry-run would show

    flags = sbatch_flags(script)
    for key, value in NASTY.items():
        assert flags[key] == value, (key, flags.get(key))
    assert flags["nodes"] == "4" and flags["ntasks-per-node"] == "1"
    assert flags["gpus-per-node"] == "8" and flags["cpus-per-task"] == "32"
    assert flags["time"] == "90" and flags["exclusive"] is True
    assert flags["comment"] == "weak scaling; it's #1" and flags["gres"] == "gpu:8"
    assert flags["job-name"] == "scalelab-tiny"
    assert str(out.resolve()) in str(flags["output"])
    # The shell part parses, and the srun line keeps the folder in one piece.
    assert subprocess.run(["bash", "-n", str(script_path)]).returncode == 0
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    words = shlex.split(srun)
    folder = str((out / ".sweep" / "slurm").resolve())
    assert words[-5:] == [sys.executable, "-u", "-m", "submitit.core._submit", folder]
    assert "export SETUP_RAN=1" in script.splitlines()
    # The sweep remembers the job, so a rerun can find it queued instead of submitting again.
    assert json.loads((out / ".sweep" / "jobs.json").read_text()) == {point.id: "4242"}


@pytest.mark.parametrize("bad", ["gpu\n#SBATCH --account=other", "gpu\\a", "a\rb"])
def test_unsafe_slurm_values_are_refused(bad: str) -> None:
    with pytest.raises(InputError) as info:
        SlurmExecutor(SlurmOptions(partition=bad))
    assert info.value.field == "slurm.partition"


def test_multi_node_rendezvous() -> None:
    hosts = ["gpu-a017", "gpu-a018", "gpu-b001", "gpu-b002"]
    args = rendezvous(4, 2, hosts, "123456", None)
    assert args[args.index("--nnodes") + 1] == "4"
    assert args[args.index("--node-rank") + 1] == "2"
    assert args[args.index("--rdzv-backend") + 1] == "c10d"
    assert args[args.index("--rdzv-endpoint") + 1] == f"gpu-a017:{29500 + 123456 % 2000}"
    assert args[args.index("--rdzv-id") + 1] == "scalelab-123456"
    # Every node of a job agrees on the endpoint; a fixed port wins.
    assert rendezvous(4, 0, hosts, "123456", 31000)[7] == "gpu-a017:31000"


@pytest.mark.distributed
def test_generated_script_runs_a_point(fake_slurm: Path, tmp_path: Path) -> None:
    """The script submitit wrote, run as SLURM would (fake srun): torchrun meets over c10d."""
    (point,) = _points(tmp_path)
    out = tmp_path / "out dir's"
    executor = SlurmExecutor(SlurmOptions(port=_free_port(), setup=["export SETUP_RAN=1"]))
    executor.submit([point], out)
    (script,) = fake_slurm.iterdir()
    env = child_env(
        PATH=os.environ["PATH"],
        SLURM_JOB_ID="4242",
        SLURM_JOB_NUM_NODES="1",
        SLURM_NNODES="1",
        SLURM_JOB_NODELIST="localhost",
    )
    done = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = record_paths(out)
    record = load_record(path)
    assert record.status == "ok" and path.name == f"{point.name}.json"
    assert record.workload["tags"]["point"] == point.id
    result = pickle.loads((out / ".sweep" / "slurm" / "4242_0_result.pkl").read_bytes())
    assert result[0] == "success" and result[1]["returncode"] == 0


@pytest.mark.distributed
def test_sweep_through_submitit_local_executor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The orchestration of SLURM jobs (submit, poll, read the record) with submitit's local
    executor standing in for the cluster."""
    (point,) = _points(tmp_path)
    out = tmp_path / "out"
    executor = SlurmExecutor(SlurmOptions(port=_free_port()), backend="local", poll_s=0.3)
    for key in ("PYTHONPATH", "OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME"):
        monkeypatch.setenv(key, child_env()[key])
    result = run_sweep([point], out, executor, sweep_name="tiny")
    assert result.complete, [s.to_dict() for s in result.statuses]
    assert load_record(result.statuses[0].record).status == "ok"  # type: ignore[arg-type]
    again = run_sweep([point], out, executor, sweep_name="tiny")
    assert again.statuses[0].action == "skipped"


def _point_on(tmp_path: Path, cluster: str | None) -> object:
    line = f"cluster: {cluster}\n" if cluster else ""
    sweep = write_sweep(
        tmp_path / "spec",
        f"name: tiny\n{line}models: [llama-tiny]\nnodes: [1]\ngpus_per_node: 2\n"
        "bench: {steps: 2, warmup: 1, repeats: 2}\n",
    )
    spec, base = load_sweep(sweep)
    (point,) = expand(spec, base)
    return point


@pytest.mark.parametrize(
    ("cluster", "gpus", "expected"),
    [
        ("h100-ib", "auto", {"gpus-per-node": "2"}),
        ("cpu-gloo", "auto", {}),
        (None, "auto", {}),
        ("cpu-gloo", "gpus-per-node", {"gpus-per-node": "2"}),
        ("h100-ib", "gres", {"gres": "gpu:h100:2"}),
        ("h100-ib", "none", {}),
    ],
)
def test_gpu_request_follows_the_cluster(
    fake_slurm: Path, tmp_path: Path, cluster: str | None, gpus: str, expected: dict[str, str]
) -> None:
    """GPUs are asked for only where the sweep's cluster has them (a GPU-less SLURM rejects it)."""
    point = _point_on(tmp_path, cluster)
    gres_type = "h100" if gpus == "gres" else None
    executor = SlurmExecutor(SlurmOptions(gpus=gpus, gres_type=gres_type))  # type: ignore[arg-type]
    flags = sbatch_flags(executor.job_script(point, tmp_path / "out"))  # type: ignore[arg-type]
    asked = {k: v for k, v in flags.items() if k in ("gpus-per-node", "gres")}
    assert asked == expected


def test_python_path_is_quoted_in_srun(fake_slurm: Path, tmp_path: Path) -> None:
    point = _point_on(tmp_path, None)
    python = "/opt/my envs/py;touch x/bin/python"
    script = SlurmExecutor(SlurmOptions(python=python)).job_script(point, tmp_path / "o")  # type: ignore[arg-type]
    assert shlex.quote(python) in script


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('name: "a\\nb"\nmodels: [llama-tiny]\n', "name"),
        ("name: 'x y'\nmodels: [llama-tiny]\n", "name"),
        (
            "models: [llama-tiny]\nslurm: {additional: {'comment=x --account': y}}\n",
            "slurm.additional",
        ),
    ],
)
def test_values_that_would_reach_the_script_unquoted_are_refused(
    tmp_path: Path, text: str, field: str
) -> None:
    sweep = write_sweep(tmp_path / "spec", text)
    spec, base = load_sweep(sweep)
    with pytest.raises(InputError) as err:
        expand(spec, base)
    assert err.value.field.startswith(field)


_INJECT = "x\n#SBATCH --account=other"


@pytest.mark.parametrize(
    ("slurm", "field"),
    [
        ({"partition": _INJECT}, "slurm.partition"),
        ({"account": _INJECT}, "slurm.account"),
        ({"qos": _INJECT}, "slurm.qos"),
        ({"constraint": _INJECT}, "slurm.constraint"),
        ({"gres_type": _INJECT}, "slurm.gres_type"),
        ({"python": _INJECT}, "slurm.python"),
        ({"additional": {"comment": _INJECT}}, "slurm.additional.comment"),
        ({"additional": {"comment x": "y"}}, "slurm.additional.comment x"),
    ],
)
def test_every_field_that_reaches_the_job_script_is_checked(
    tmp_path: Path, slurm: dict[str, Any], field: str
) -> None:
    """Each value (and each `additional` key) that reaches a job script: refused with a newline or
    a key that is not an sbatch option, whether from a sweep file or given to the executor."""
    sweep = write_sweep(tmp_path / "spec", json.dumps({"models": ["llama-tiny"], "slurm": slurm}))
    spec, base = load_sweep(sweep)
    with pytest.raises(InputError) as err:
        expand(spec, base)
    assert err.value.field == field
    if " " not in field:
        with pytest.raises(InputError) as err:
            SlurmExecutor(SlurmOptions(**slurm))
        assert err.value.field == field
