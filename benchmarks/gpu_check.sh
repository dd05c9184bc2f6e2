#!/usr/bin/env bash
# The harness's GPU check: one command on one GPU (written for a lent H200), about 5-8 minutes.
#
# A llama2-7b-shaped model (d_model 4096, 32 heads, d_ff 11008, vocab 32000) with a few layers
# (default 8), sequence 4096, bf16 autocast, one process: eager, then torch.compile per block.
# For each it prints tokens/s, MFU and HFU (against the cluster's dense bf16 peak), step time,
# peak memory, GPU power and energy per token (NVML, GPU only), and, when the predictor is
# installed, its numbers for the same layout. Target: MFU >= 45 % (compiled).
#
#   bash benchmarks/gpu_check.sh              # from the repository root or anywhere
#   LAYERS=4 STEPS=10 bash benchmarks/gpu_check.sh
#
# Installs what is missing (torch, scalelab's few runtime deps, nvidia-ml-py) with pip from
# whatever index or wheelhouse the box is configured with; energy fields stay null (with the
# reason) if nvidia-ml-py cannot be installed. Records go to $OUT (default: a temporary folder).
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
CLUSTER=${CLUSTER:-h200-ib}
OUT=${OUT:-$(mktemp -d /tmp/scalelab-gpu-check.XXXXXX)}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$OUT/inductor-cache}
export PYTHONWARNINGS=ignore

say() { printf '\n== %s\n' "$*"; }
have() { "$PY" -c "import $1" >/dev/null 2>&1; }

say "dependencies"
if ! have torch; then
    echo "torch missing: pip install torch"
    "$PY" -m pip install --quiet torch || { echo "cannot install torch; giving up"; exit 1; }
fi
for pair in pydantic:pydantic typer:typer rich:rich yaml:pyyaml numpy:numpy; do
    have "${pair%%:*}" || "$PY" -m pip install --quiet "${pair#*:}"
done
have pynvml || "$PY" -m pip install --quiet nvidia-ml-py || echo "nvidia-ml-py unavailable: energy will be null"
"$PY" - <<'EOF' || exit 1
import torch
assert torch.cuda.is_available(), "no CUDA device visible"
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0))
try:
    import pynvml
    pynvml.nvmlInit()
    print("driver", pynvml.nvmlSystemGetDriverVersion())
except Exception as exc:
    print("NVML:", exc)
EOF
nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm --format=csv 2>/dev/null || true

MODEL="$OUT/llama2-7b-${LAYERS}l.yaml"
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

PREDICT=()
if "$PY" -c "from scalelab.perf.predict import predict_layout" >/dev/null 2>&1; then
    PREDICT=(--predict)
else
    echo "predictor (scalelab.perf.predict) not installed in this checkout: no predicted numbers"
fi

run() {  # run NAME EXTRA_FLAGS...
    local name=$1; shift
    say "bench $name"
    timeout 300 "$PY" -m scalelab bench "$MODEL" --seq-len "$SEQ" --micro-batch "$MICRO" \
        --global-batch "$BATCH" --steps "$STEPS" --warmup "$WARMUP" --repeats "$REPEATS" \
        --cluster "$CLUSTER" --out "$OUT/$name" "${PREDICT[@]}" "$@" \
        || echo "bench $name exited with $?"
}
START=$(date +%s)
run eager --no-compile
run compiled --compile
echo "wall: $(( $(date +%s) - START )) s"

say "summary (GPU energy only, not the node; MFU against the cluster's dense bf16 peak)"
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
for name in ("eager", "compiled"):
    paths = sorted(Path(sys.argv[1], name).glob("*.json"))
    if not paths:
        print(f"{name}: no record")
        continue
    r = load_record(paths[-1])
    s, p = r.summary, r.prediction or {}
    print(f"{name}: status {r.status}" + (f" ({r.error})" if r.error else ""))
    if r.status != "ok":
        continue
    print(f"  device {r.environment['devices'][0]}, torch {r.environment['torch']}, cuda {r.environment['cuda']}")
    print(f"  tokens/s {m(s, 'tokens_per_s')}   step {m(s, 'step_time_s', 1e3)} ms")
    print(f"  MFU {m(s, 'mfu', 100)} %   HFU {m(s, 'hfu', 100)} %")
    print(f"  peak allocated {m(s, 'memory_peak_allocated_bytes', 2**-30)} GiB   reserved {m(s, 'memory_peak_reserved_bytes', 2**-30)} GiB")
    print(f"  GPU power per GPU {m(s, 'power_w_per_gpu')} W   energy (job) {m(s, 'energy_j')} J   energy/token {m(s, 'energy_per_token_j', 1e3)} mJ   tokens/J {m(s, 'tokens_per_j')}")
    for k, v in r.notes.items():
        print(f"  note {k}: {v}")
    if p:
        print(f"  predicted: tokens/s {p.get('tokens_per_s')}  MFU {p.get('mfu')}  step {p.get('step_time_s')} s  power per GPU {p.get('power_w_per_gpu')} W  HFU {p.get('hfu')}")
    mfu = (s.get("mfu") or {}).get("mean")
    rows.append({"run": name, "tokens_per_s": (s.get("tokens_per_s") or {}).get("mean"), "mfu": mfu,
                 "energy_per_token_j": (s.get("energy_per_token_j") or {}).get("mean"),
                 "power_w_per_gpu": (s.get("power_w_per_gpu") or {}).get("mean"),
                 "predicted_tokens_per_s": p.get("tokens_per_s"), "predicted_mfu": p.get("mfu"),
                 "predicted_power_w_per_gpu": p.get("power_w_per_gpu"),
                 "record": str(paths[-1])})
best = max((r["mfu"] or 0.0) for r in rows) if rows else 0.0
print(f"\nMFU target 45 %: {'met' if best >= 0.45 else 'NOT met'} (best {best * 100:.1f} %)")
print("JSON " + json.dumps(rows))
EOF
