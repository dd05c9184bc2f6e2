"""Writes src/scalelab/data/published_runs_moe.csv and published_runs_moe_skipped.csv (the MoE runs,
typed by hand from their sources; run from the repository root with PYTHONPATH=src)."""

import csv
import io
from pathlib import Path

from scalelab.runs.importer import target_tokens_per_s_per_gpu
from scalelab.runs.schema import MoERun, write_runs

SRC = (
    "github yanring/Megatron-MoE-ModelZoo best_practice/Qwen3/readme.md (commit c1ad0b5), "
    "'Performance Results' table: 256 H100, NVLink 4, InfiniBand 8x50 GB/s"
)
GROUP = "Megatron-MoE-ModelZoo (H100)"
shape = dict(
    model="Qwen3-235B-A22B",
    n_layers=94,
    d_model=4096,
    n_heads=64,
    n_kv_heads=4,
    d_ff=12288,
    vocab_size=151936,
    ffn="swiglu",
    norm="rmsnorm",
    position="rope",
    bias=False,
    tied_embeddings=False,
    seq_len=4096,
    catalog_model="qwen3-235b-a22b",
)
hw = dict(
    gpu="H100-SXM5",
    gpu_memory_gib=80,
    cluster="h100-ib",
    gpus_per_node=8,
    nvlink_domain=8,
    nics_per_node=8,
    nic_gbps=400,
    gpus=256,
)
common_assumed = [
    "sequence_parallel: Megatron-Core requires sequence parallelism for MoE with TP (its MoE README)",
    "attention: Transformer Engine's fused (flash) attention, the Megatron-Core default",
]
zero1 = "sharding: not stated for non-FSDP rows; Megatron's distributed optimizer (ZeRO-1) assumed"
selective = (
    "recompute: 'norm, act' (layernorm and activation recompute) read as selective "
    "(cheap recompute of element-wise modules; the predictor's selective recomputes the attention core)"
)
rows = [
    # (row, dispatcher, tp, ep, pp, vpp, etp, mbs, sharding, recompute, step, notes, extra assumed)
    (
        0,
        "DeepEP",
        2,
        32,
        8,
        4,
        1,
        1,
        "zero1",
        "selective",
        19.7,
        "Cross-node EP; 245 TFLOP/s per GPU as reported; code moe_dev(f3e6c5)",
        [zero1, selective],
    ),
    (
        2,
        "DeepEP",
        2,
        8,
        1,
        1,
        1,
        4,
        "fsdp",
        "full",
        17.6,
        "Intra-node EP, FSDP on, EDP 32, GA 4; 276 TFLOP/s per GPU as reported; note 'disable log para norm'; code main(1e057005)",
        ["reshard_after_forward: Megatron FSDP's default (reshard after forward) assumed"],
    ),
    (
        3,
        "A2A",
        2,
        8,
        32,
        3,
        1,
        1,
        "zero1",
        "selective",
        24.2,
        "Intra-node EP with the all-to-all dispatcher; 200 TFLOP/s per GPU as reported; 32 x 3 virtual stages over 94 layers; code main(1e057005)",
        [zero1, selective],
    ),
    (
        4,
        "DeepEP",
        4,
        8,
        8,
        4,
        1,
        1,
        "zero1",
        "none",
        29.0,
        "Intra-node EP, EDP 4; 167 TFLOP/s per GPU as reported; recompute column empty (none); code main(1e057005)",
        [zero1],
    ),
]
runs = []
for row, disp, tp, ep, pp, vpp, etp, mbs, shard, rec, step, notes, extra in rows:
    r = MoERun(
        row=row,
        source=SRC,
        source_group=GROUP,
        stack=f"Megatron-Core ({disp} token dispatcher)",
        **shape,
        **hw,
        global_batch=2048,
        micro_batch=mbs,
        sharding=shard,
        hsdp_shard_size=None,
        reshard_after_forward=True,
        tp=tp,
        sequence_parallel=True,
        pp=pp,
        pp_schedule="interleaved" if vpp > 1 else "1f1b",
        virtual_stages=vpp,
        cp=1,
        recompute=rec,
        precision="bf16",
        attention="flash",
        measured_quantity="step_time_s",
        measured_value=step,
        tokens_per_s_per_gpu=1.0,
        assumed=" | ".join(common_assumed + extra),
        notes=notes,
        ep=ep,
        expert_tp=etp,
    )
    runs.append(r.model_copy(update={"tokens_per_s_per_gpu": target_tokens_per_s_per_gpu(r)}))
out = Path("src/scalelab/data")
write_runs(runs, out / "published_runs_moe.csv")
skipped = [
    (
        1,
        "Qwen3-235B-A22B",
        SRC,
        "EP AllToAll overlapped with 1F1B compute ('+1f1b overlap'): the predictor models no dispatch overlap",
    ),
    (
        5,
        "Qwen3-Next-80B-A3B",
        SRC,
        "model not in the catalog (hybrid linear attention); the source calls its performance not tuned",
    ),
    (
        6,
        "Qwen3-235B-A22B",
        SRC + ", 'Long Context' table",
        "TFLOP/s only (Megatron-Core's MoE FLOP count, not a formula the schema holds); no step time; PP8 VPP4 EP8 from the command, DP not stated",
    ),
    (
        7,
        "DeepSeek-V3",
        "DeepSeek-V3 technical report (arXiv 2412.19437), 180K H800 GPU hours per trillion tokens on 2,048 H800",
        "H800 (NVLink 400 GB/s) not in the GPU catalog; DualPipe overlaps dispatch with compute (not modelled); micro-batch not stated",
    ),
    (
        8,
        "DeepSeek-V3 / Qwen3-235B",
        "Megatron-Core MoE technical report (arXiv 2603.07685): 1,233/1,048 TFLOP/s per GPU on GB300/GB200",
        "TFLOP/s only, GB300 not in the catalog, layouts not stated in the abstract",
    ),
    (
        9,
        "Mixtral 8x22B / Qwen2-57B-A14B",
        "MoE Parallel Folding (arXiv 2504.14960): up to 49.3 % / 39.0 % MFU on H100",
        "layout per figure not read (the abstract states the peak MFU only); Qwen2-57B-A14B not in the catalog",
    ),
]

buf = io.StringIO()
w = csv.writer(buf, lineterminator="\n")
w.writerow(["row", "model", "source", "reason"])
for s in skipped:
    w.writerow(s)
(out / "published_runs_moe_skipped.csv").write_text(buf.getvalue())
for r in runs:
    print(r.row, r.tokens_per_s_per_gpu)
