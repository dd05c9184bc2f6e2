#!/usr/bin/env bash
# The harness's GPU check: one command on one GPU (H100 or H200, any catalog GPU), at most
# BUDGET_S seconds (default 540: a 10-minute command with a minute of margin for start-up).
#
# A llama2-7b-shaped model (d_model 4096, 32 heads, d_ff 11008, vocab 32000) with a few layers
# (default 8), sequence 4096, bf16 autocast, one process: eager, then torch.compile per block.
# For each it prints tokens/s, MFU and HFU (against the cluster's dense bf16 peak), step time,
# peak memory, GPU power and energy per token (NVML, GPU only), and, when the predictor is
# installed, its numbers for the same layout. Target: MFU >= 45 % (compiled).
# Then FP8 (torchao float8, compiled; FP8_RECIPES, default "tensorwise"): MFU against the
# dense fp8 peak and the predictor's fp8 numbers (block linears fp8, attention and head bf16, as
# the harness converts them); skipped with one line when torchao is not importable.
#
#   bash benchmarks/gpu_check.sh              # from the repository root or anywhere
#   LAYERS=4 STEPS=10 bash benchmarks/gpu_check.sh
#
# Uses the machine's own PyTorch (2.11 on the H200 image; never installed here) and needs no
# network: what else the bench path imports (numpy, pyyaml, pydantic, typer, rich; nvidia-ml-py
# for energy) and the machine lacks is installed from a wheelhouse built elsewhere for this
# machine's Python (`bash benchmarks/wheelhouse.sh 3.12 .whl`, then carry .whl; WHEELHOUSE says
# where it is) into $OUT/site. Anything still missing stops the check with one line and exit 2.
# Energy fields stay null (with the reason) without nvidia-ml-py. Records go to $OUT (default:
# a temporary folder).
#
#   SMOKE=1 bash benchmarks/gpu_check.sh     # no GPU: llama-tiny, 2 steps, eager only (tests the
#                                            # start-up and install path on a CPU machine; the FP8
#                                            # case too when torchao is there)
#   INSTALL_ONLY=1 bash benchmarks/gpu_check.sh   # install the wheelhouse and import the bench
#                                            # command, nothing else (no torch needed: the rehearsal
#                                            # in gpu_check_install.sh runs it on Python 3.12)
#
# The cluster (GPU peak for MFU, the predictor's hardware) is the catalog cluster of the GPU
# PyTorch reports (`cluster_for_device`: an H100 runs as h100-ib, an H200 as h200-ib); CLUSTER
# overrides it. Each bench gets at most RUN_S seconds (default 240) and none starts with less
# than MIN_RUN_S (default 90) of the budget left: it is reported as skipped.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
LAYERS=${LAYERS:-8}
SEQ=${SEQ:-4096}
MICRO=${MICRO:-2}
BATCH=${BATCH:-4}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-5}
REPEATS=${REPEATS:-3}
FP8_RECIPES=${FP8_RECIPES:-tensorwise}  # "tensorwise rowwise" for both (about 2 min more)
CLUSTER=${CLUSTER:-}
BUDGET_S=${BUDGET_S:-540}
RUN_S=${RUN_S:-240}
MIN_RUN_S=${MIN_RUN_S:-90}
INSTALL_ONLY=${INSTALL_ONLY:-0}
BEGIN=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - BEGIN) )); }
OUT=${OUT:-$(mktemp -d /tmp/scalelab-gpu-check.XXXXXX)}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$OUT/inductor-cache}
export PYTHONWARNINGS=ignore

say() { printf '\n== %s\n' "$*"; }
have() { "$PY" -c "import $1" >/dev/null 2>&1; }

WHEELHOUSE=${WHEELHOUSE:-.whl}
SMOKE=${SMOKE:-0}
REQUIRED=(torch numpy yaml pydantic typer rich)
missing() { local m; for m in "${REQUIRED[@]}"; do have "$m" || printf '%s ' "$m"; done; }
stop() { echo "gpu_check: cannot start: $*" >&2; exit 2; }

say "dependencies"
if [ "$INSTALL_ONLY" = 1 ]; then
    REQUIRED=(numpy yaml pydantic typer rich)  # the rehearsal's interpreter may lack torch
else
    have torch || stop "PyTorch is not installed for $PY (the check uses the machine's own PyTorch)"
fi
PYVER=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
if [ -n "$(missing)" ] || ! have pynvml || ! have torchao; then
    if compgen -G "$WHEELHOUSE/*.whl" >/dev/null; then
        # The wheels of the missing modules (all of pydantic's group when pydantic is missing:
        # an older typing-extensions here would break it), one version each, into $OUT/site.
        mapfile -t WHEELS < <("$PY" - "$WHEELHOUSE" <<'PYEOF'
import importlib.util
import sys
from pathlib import Path

MODULE = {"pyyaml": "yaml", "markdown_it_py": "markdown_it", "nvidia_ml_py": "pynvml"}  # torchao: itself
PYDANTIC = {"pydantic", "pydantic_core", "annotated_types", "typing_inspection", "typing_extensions"}
need_pydantic = importlib.util.find_spec("pydantic") is None
for wheel in sorted(Path(sys.argv[1]).glob("*.whl")):
    dist = wheel.name.split("-")[0].lower()
    module = MODULE.get(dist, dist)
    if (need_pydantic and dist in PYDANTIC) or importlib.util.find_spec(module) is None:
        print(wheel)
PYEOF
)
        if [ "${#WHEELS[@]}" -gt 0 ]; then
            echo "installing ${#WHEELS[@]} wheels from $WHEELHOUSE into $OUT/site"
            "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                --target "$OUT/site" "${WHEELS[@]}" \
                || stop "installing the wheels of $WHEELHOUSE failed (built for Python $PYVER, x86-64?)"
            export PYTHONPATH="$OUT/site:$PYTHONPATH"
        fi
    fi
fi
MISSING=$(missing)
[ -z "$MISSING" ] || stop "missing Python modules: ${MISSING}(no network: build a wheelhouse for Python $PYVER with 'bash benchmarks/wheelhouse.sh $PYVER .whl' where pip has an index, carry it here, set WHEELHOUSE)"
"$PY" -c "import scalelab.cli.bench" 2>/dev/null \
    || stop "scalelab's bench command does not import: $("$PY" -c 'import scalelab.cli.bench' 2>&1 | tail -1)"
have pynvml || echo "nvidia-ml-py unavailable: energy will be null"
if [ "$INSTALL_ONLY" = 1 ]; then
    "$PY" -c "import sys, pydantic_core, scalelab.cli.bench, scalelab.measure.config; print('installed for Python', sys.version.split()[0])" \
        || stop "the installed wheels do not import on Python $PYVER"
    exit 0
fi
if [ "$SMOKE" = 1 ]; then
    "$PY" -c "import torch; print('torch', torch.__version__, '(smoke run, no GPU)')"
else
    "$PY" - <<'EOF' || stop "no CUDA device visible to PyTorch"
import sys

import torch

if not torch.cuda.is_available():
    sys.exit(1)
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0))
try:
    import pynvml
    pynvml.nvmlInit()
    print("driver", pynvml.nvmlSystemGetDriverVersion())
except Exception as exc:
    print("NVML:", exc)
EOF
    nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm --format=csv 2>/dev/null || true
    if [ -z "$CLUSTER" ]; then  # the cluster of the GPU found: an H100 is never priced as an H200
        GPU_NAME=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0))")
        CLUSTER=$("$PY" -c "import sys; from scalelab.config.catalog import cluster_for_device as c; print(c(sys.argv[1]) or '')" "$GPU_NAME")
        [ -n "$CLUSTER" ] || stop "no catalog cluster has the GPU '$GPU_NAME': set CLUSTER to a catalog cluster or a YAML file"
    fi
fi
[ -n "$CLUSTER" ] || CLUSTER=cpu-gloo  # SMOKE=1: this machine's CPU ranks
echo "cluster: $CLUSTER (budget $BUDGET_S s, $(left) s left)"

MODEL="$OUT/llama2-7b-${LAYERS}l.yaml"
if [ "$SMOKE" = 1 ]; then
    MODEL=llama-tiny SEQ=32 MICRO=1 BATCH=2 STEPS=2 WARMUP=0 REPEATS=1
else
cat >"$MODEL" <<EOF
name: llama2-7b-${LAYERS}l
n_layers: ${LAYERS}
d_model: 4096
n_heads: 32
n_kv_heads: 32
d_ff: 11008
vocab_size: 32000
seq_len: ${SEQ}
source: llama2-7b shape (Touvron et al. 2023) with ${LAYERS} layers, for the harness GPU check
EOF
fi

PREDICT=()
if "$PY" -c "from scalelab.perf.predict import predict_layout" >/dev/null 2>&1; then
    PREDICT=(--predict)
else
    echo "predictor (scalelab.perf.predict) not installed in this checkout: no predicted numbers"
fi

run() {  # run NAME EXTRA_FLAGS...
    local name=$1; shift
    local remaining limit
    remaining=$(left)
    say "bench $name"
    if [ "$remaining" -lt "$MIN_RUN_S" ]; then
        echo "bench $name: skipped ($remaining s of the $BUDGET_S s budget left, need $MIN_RUN_S)"
        return
    fi
    limit=$(( remaining - 20 < RUN_S ? remaining - 20 : RUN_S ))  # 20 s for the summary
    timeout "$limit" "$PY" -m scalelab bench "$MODEL" --seq-len "$SEQ" --micro-batch "$MICRO" \
        --global-batch "$BATCH" --steps "$STEPS" --warmup "$WARMUP" --repeats "$REPEATS" \
        --cluster "$CLUSTER" --out "$OUT/$name" "${PREDICT[@]}" "$@" \
        || echo "bench $name exited with $? (124: stopped at its $limit s limit)"
}
START=$(date +%s)
run eager --no-compile
[ "$SMOKE" = 1 ] || run compiled --compile
if have torchao; then
    for recipe in $FP8_RECIPES; do
        if [ "$SMOKE" = 1 ]; then  # CPU: torch._scaled_mm runs there; eager, to test the path
            run "fp8-$recipe" --no-compile --precision fp8 --fp8-recipe "$recipe"
        else
            run "fp8-$recipe" --compile --precision fp8 --fp8-recipe "$recipe"
        fi
    done
else
    echo "torchao not importable: FP8 cases skipped (carry its wheel: benchmarks/wheelhouse.sh)"
fi
echo "wall: $(( $(date +%s) - START )) s"

say "summary (GPU energy only, not the node; MFU against the dense peak of the run's precision)"
"$PY" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
from scalelab.results import load_record

def m(summary, key, scale=1.0):
    s = summary.get(key) or {}
    if s.get("mean") is None:
        return "n/a"
    std = f" ± {s['std'] * scale:.3g}" if s.get("std") is not None else ""
    return f"{s['mean'] * scale:.4g}{std}"

rows = []
names = ["eager", "compiled"] + sorted(p.name for p in Path(sys.argv[1]).glob("fp8-*") if p.is_dir())
for name in names:
    if not Path(sys.argv[1], name).exists():
        continue  # not run (SMOKE=1 runs eager only)
    paths = sorted(Path(sys.argv[1], name).glob("*.json"))
    if not paths:
        print(f"{name}: no record")
        continue
    r = load_record(paths[-1])
    s, p = r.summary, r.prediction or {}
    print(f"{name}: status {r.status}" + (f" ({r.error})" if r.error else ""))
    if r.status != "ok":
        continue
    env = r.environment or {}
    print(f"  device {(env.get('devices') or ['?'])[0]}, torch {env.get('torch')}, cuda {env.get('cuda')}")
    print(f"  tokens/s {m(s, 'tokens_per_s')}   step {m(s, 'step_time_s', 1e3)} ms")
    print(f"  MFU {m(s, 'mfu', 100)} %   HFU {m(s, 'hfu', 100)} %")
    print(f"  peak allocated {m(s, 'memory_peak_allocated_bytes', 2**-30)} GiB   reserved {m(s, 'memory_peak_reserved_bytes', 2**-30)} GiB")
    print(f"  GPU power per GPU {m(s, 'power_w_per_gpu')} W   energy (job) {m(s, 'energy_j')} J   energy/token {m(s, 'energy_per_token_j', 1e3)} mJ   tokens/J {m(s, 'tokens_per_j')}")
    for k, v in r.notes.items():
        print(f"  note {k}: {v}")
    if p:
        print(f"  predicted: tokens/s {p.get('tokens_per_s')}  MFU {p.get('mfu')}  step {p.get('step_time_s')} s  power per GPU {p.get('power_w_per_gpu')} W  HFU {p.get('hfu')}")
        mem = p.get("memory_total_bytes")
        if mem is not None:
            print(f"  predicted peak memory {mem / 2**30:.3g} GiB (measured: reserved above)")
    mfu = (s.get("mfu") or {}).get("mean")
    rows.append({"run": name, "precision": (r.layout or {}).get("precision"), "tokens_per_s": (s.get("tokens_per_s") or {}).get("mean"), "mfu": mfu,
                 "energy_per_token_j": (s.get("energy_per_token_j") or {}).get("mean"),
                 "power_w_per_gpu": (s.get("power_w_per_gpu") or {}).get("mean"),
                 "predicted_tokens_per_s": p.get("tokens_per_s"), "predicted_mfu": p.get("mfu"),
                 "predicted_power_w_per_gpu": p.get("power_w_per_gpu"),
                 "memory_peak_reserved_bytes": (s.get("memory_peak_reserved_bytes") or {}).get("mean"),
                 "predicted_memory_total_bytes": p.get("memory_total_bytes"),
                 "record": str(paths[-1])})
print("JSON " + json.dumps(rows))
if not rows:
    print("\nno run finished: see the bench output above (MFU target not judged)")
    sys.exit(1)
mfus = [r["mfu"] for r in rows if r["mfu"] is not None and r["precision"] != "fp8"]
if not mfus:
    print("\nMFU target 45 %: not judged (no GPU peak: a CPU run)")
else:
    best = max(mfus)
    print(f"\nMFU target 45 %: {'met' if best >= 0.45 else 'NOT met'} (best {best * 100:.1f} %)")
EOF
