"""Helpers for the sweep and report tests: tiny models, sweep files, subprocess environment."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"

EXAMPLES = ROOT / "examples" / "sweeps"
# docs/sweep.md's local sweep is the one the tests run, so the two cannot drift apart.
TINY2 = (EXAMPLES / "llama-tiny2.yaml").read_text()
TINY_SWEEP = (EXAMPLES / "tiny-local.yaml").read_text()


def child_env(**extra: str) -> dict[str, str]:
    """This checkout first on PYTHONPATH (for bench and its torchrun workers), 1 thread, gloo on lo."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONWARNINGS="ignore")
    env.pop("SCALELAB_FAULT", None)
    env.update(extra)
    return env


def scalelab(
    *args: str, cwd: Path | None = None, timeout: float = 240, **extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scalelab", *args],
        cwd=cwd or ROOT,
        env=child_env(COLUMNS="160", **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write_sweep(folder: Path, text: str, name: str = "tiny.yaml") -> Path:
    """A sweep file beside the second tiny model (`llama-tiny2.yaml`, referred to relatively)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "llama-tiny2.yaml").write_text(TINY2)
    path = folder / name
    path.write_text(text)
    return path


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def dump_dom(html: Path) -> str:
    """The page's DOM after load in headless Chromium (its scripts have run)."""
    exe = chromium()
    if exe is None:
        if os.environ.get("CI"):
            raise AssertionError("chromium is not installed (.ci/run installs it)")
        pytest.skip("chromium is not installed")
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [
                exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
                "--virtual-time-budget=5000", "--dump-dom", html.resolve().as_uri(),
            ],
            capture_output=True, text=True, timeout=90,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout
