#!/usr/bin/env bash
# The GPU check's start-up on a machine with only PyTorch and no index, rehearsed on this CPU
# machine (about 30-60 s; not part of the test suite):
#
#   1. a fresh venv that sees PyTorch and its own dependencies only (linked from $TORCH_SITE,
#      default: the site-packages of the `python3` that imports torch), nothing else;
#   2. without a wheelhouse, gpu_check.sh must stop with one line and exit 2;
#   3. with a wheelhouse built by wheelhouse.sh for this Python, it must install from it with
#      pip --no-index (PIP_NO_INDEX=1, no find-links) and run to its summary (SMOKE=1: no GPU);
#   4. the GPU machine's Python and wheel tags (TARGET_PYTHON, default the first python3.12
#      found, as on the H100/H200 images): a wheelhouse built for that version must install
#      into a fresh venv of that interpreter with --no-index and import the bench command
#      (INSTALL_ONLY=1; no torch there, so the bench itself is rehearsed in 3 on this Python).
#
#   bash benchmarks/gpu_check_install.sh      # prints PASS or FAIL with the reason; exit 0 or 1
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WORK=$(mktemp -d /tmp/scalelab-install.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

TORCH_SITE=${TORCH_SITE:-$("$PY" -c 'import pathlib, torch; print(pathlib.Path(torch.__file__).parents[1])')}
PYVER=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
"$PY" -m venv "$WORK/venv" || fail "cannot make a venv"
VPY="$WORK/venv/bin/python"
# Only torch and what torch itself requires (its Requires-Dist, recursively).
mkdir -p "$WORK/torch-only"
"$PY" - "$TORCH_SITE" "$WORK/torch-only" <<'PYEOF' || fail "cannot link torch"
import importlib.metadata as md
import re
import sys
from pathlib import Path

site, dest = Path(sys.argv[1]), Path(sys.argv[2])
todo, seen = ["torch"], set()
while todo:
    name = todo.pop()
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        continue
    seen.add(key)
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    for req in dist.requires or []:
        if "extra ==" not in req:
            todo.append(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0])
    tops = {Path(str(f)).parts[0] for f in dist.files or []}
    for top in tops:
        src = site / top
        if src.exists() and not (dest / top).exists() and top != "..":
            (dest / top).symlink_to(src)
print("linked:", " ".join(sorted(seen)))
PYEOF
VSITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$WORK/torch-only" > "$VSITE/torch-only.pth"
"$VPY" -c "import torch" 2>/dev/null || fail "the fresh venv cannot import torch"
"$VPY" -c "import pydantic" 2>/dev/null && fail "the fresh venv already has pydantic: not a torch-only machine"

export PIP_NO_INDEX=1 PIP_FIND_LINKS= PIP_CONFIG_FILE=/dev/null
OUT="$WORK/no-wheels" PYTHON="$VPY" WHEELHOUSE="$WORK/none" SMOKE=1 \
    bash benchmarks/gpu_check.sh >"$WORK/a.out" 2>"$WORK/a.err"
rc=$?
[ "$rc" = 2 ] || fail "without wheels: exit $rc, not 2: $(tail -3 "$WORK/a.err")"
[ "$(wc -l <"$WORK/a.err")" = 1 ] || fail "without wheels: not one line on stderr: $(cat "$WORK/a.err")"
echo "without wheels: exit 2, $(cat "$WORK/a.err")"

unset PIP_NO_INDEX PIP_FIND_LINKS PIP_CONFIG_FILE
START=$(date +%s)
PYTHON="$PY" bash benchmarks/wheelhouse.sh "$PYVER" "$WORK/whl" || fail "cannot build the wheelhouse"
export PIP_NO_INDEX=1 PIP_FIND_LINKS= PIP_CONFIG_FILE=/dev/null
OUT="$WORK/with-wheels" PYTHON="$VPY" WHEELHOUSE="$WORK/whl" SMOKE=1 OMP_NUM_THREADS=1 \
    bash benchmarks/gpu_check.sh >"$WORK/b.out" 2>"$WORK/b.err"
rc=$?
grep -q "^eager: status ok" "$WORK/b.out" || fail "with wheels: exit $rc, no ok record: $(tail -5 "$WORK/b.err")"
grep -q "MFU target 45 %: not judged" "$WORK/b.out" || fail "with wheels: no summary line"
grep "installing\|^eager\|tokens/s\|MFU target" "$WORK/b.out"

if [ -z "${TARGET_PYTHON:-}" ]; then  # the first python3.12 that runs (a pyenv shim may not)
    for candidate in $(command -v python3.12) "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
        if "$candidate" -c pass 2>/dev/null; then TARGET_PYTHON=$candidate; break; fi
    done
fi
[ -x "$TARGET_PYTHON" ] || fail "no Python 3.12 to rehearse the GPU machine's wheel tags (set TARGET_PYTHON)"
TPYVER=$("$TARGET_PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
unset PIP_NO_INDEX PIP_FIND_LINKS PIP_CONFIG_FILE
PYTHON="$PY" bash benchmarks/wheelhouse.sh "$TPYVER" "$WORK/whl-$TPYVER" >/dev/null \
    || fail "cannot build the wheelhouse for Python $TPYVER"
"$TARGET_PYTHON" -m venv "$WORK/venv-$TPYVER" || fail "cannot make a Python $TPYVER venv"
export PIP_NO_INDEX=1 PIP_FIND_LINKS= PIP_CONFIG_FILE=/dev/null
OUT="$WORK/target" PYTHON="$WORK/venv-$TPYVER/bin/python" WHEELHOUSE="$WORK/whl-$TPYVER" \
    INSTALL_ONLY=1 bash benchmarks/gpu_check.sh >"$WORK/c.out" 2>"$WORK/c.err" \
    || fail "Python $TPYVER: $(tail -2 "$WORK/c.err")"
grep -q "installed for Python $TPYVER" "$WORK/c.out" || fail "Python $TPYVER: no import line"
grep "installing\|installed for" "$WORK/c.out"
echo "PASS: gpu_check.sh starts with only torch + the wheelhouse, and its wheels install for Python $TPYVER ($(( $(date +%s) - START )) s)"
