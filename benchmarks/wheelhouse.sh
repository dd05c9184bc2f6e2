#!/usr/bin/env bash
# Build a wheelhouse of everything `scalelab bench` (and benchmarks/gpu_check.sh) needs besides
# PyTorch, for ANOTHER machine's Python, so that a GPU machine with only PyTorch and no network
# can run the harness:
#
#   bash benchmarks/wheelhouse.sh [PYVER] [DIR]        # default: 3.12 (the H200 image), .whl
#   WHEELHOUSE=.whl bash benchmarks/gpu_check.sh       # there: installs what is missing from DIR
#
# The bench path imports numpy, pyyaml, pydantic (pydantic-core is compiled: it must be the
# wheel for the target's Python and platform, manylinux x86-64), typer and rich, and nvidia-ml-py
# for GPU energy; msgspec, scipy, pandas and matplotlib are only imported by other verbs
# (trace, report, calibrate) and are not needed. Versions are this machine's (one of each: two
# versions of one package stop a `pip install --no-index`). Needs pip and an index here.
set -euo pipefail
PYVER=${1:-3.12}
DIR=${2:-.whl}
PY=${PYTHON:-python3}
DISTS=(pydantic pydantic-core annotated-types typing-inspection typing-extensions numpy pyyaml
       typer shellingham annotated-doc rich markdown-it-py mdurl pygments nvidia-ml-py
       torchao)  # torchao: the fp8 extra (gpu_check's FP8 case; abi3 wheel, 3.4 MB)
mkdir -p "$DIR"
mapfile -t PINS < <("$PY" - "${DISTS[@]}" <<'PYEOF'
import importlib.metadata as md
import sys

for name in sys.argv[1:]:
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        print(name)
PYEOF
)
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$DIR" "${PINS[@]}"
echo "wheelhouse $DIR for Python $PYVER: $(ls "$DIR"/*.whl | wc -l) wheels, $(du -sh "$DIR" | cut -f1)"
