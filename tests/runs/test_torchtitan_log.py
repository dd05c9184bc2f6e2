"""`scalelab runs import --from torchtitan LOG --config TOML`: a torchtitan training log and its
job config become a typed run that validate reads.

The log below is written in torchtitan's own formats (not copied from a run): the metric line of
torchtitan/components/metrics.py (pytorch/torchtitan at 00fbaafa, MetricsProcessor.log: "step: {step:2}  loss: {loss:7.4f}
grad_norm: ...  memory: {max_reserved_gib:5.2f}GiB({pct:.2f}%)  tps: {round(tps):,}  tflops:
{tflops:,.2f}  mfu: {mfu:.2f}%", with ANSI colours), build_device_memory_monitor's "CUDA
capacity: ... with ...GiB memory", ParallelDims' "Building N-D device mesh with [names], [dims]"
and train.py's "Training starts at step ..., with local batch size ..., global batch size ...,
sequence length ..." lines.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalelab.errors import InputError
from scalelab.runs.importer import read_row
from scalelab.runs.schema import MeasuredQuantity
from scalelab.runs.torchtitan_log import log_to_row, parse_log

R, G, Y, T, B, C, M, X = (f"\x1b[{n}m" for n in (31, 32, 33, 36, 34, 96, 35, 39))
LOG = f"""\
[rank0]:[titan] 2025-06-12 10:02:11,101 - root - INFO - Starting job: Llama 3 8B training
[rank0]:[titan] 2025-06-12 10:02:12,551 - root - INFO - Building 2-D device mesh with ['dp_shard', 'tp'], [4, 2]
[rank0]:[titan] 2025-06-12 10:02:12,552 - root - INFO - [GC] Initial GC collection. 0.00 seconds.
[rank0]:[titan] 2025-06-12 10:02:15,870 - root - INFO - CUDA capacity: NVIDIA H100 80GB HBM3 with 79.11GiB memory
[rank0]:[titan] 2025-06-12 10:02:16,020 - root - INFO - Building llama3 8B with TransformerModelArgs(_enforced='This field is used to enforce all fields have defaults.', dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256, multiple_of=1024, ffn_dim_multiplier=1.3, norm_eps=1e-05, rope_theta=500000, max_seq_len=8192)
[rank0]:[titan] 2025-06-12 10:02:16,544 - root - INFO - {B}Model llama3 8B {R}size: 8,030,261,248 total parameters{X}
[rank0]:[titan] 2025-06-12 10:02:17,102 - root - INFO - Applied selective activation checkpointing to the model
[rank0]:[titan] 2025-06-12 10:02:17,230 - root - INFO - Applied Tensor Parallelism to the model
[rank0]:[titan] 2025-06-12 10:02:17,901 - root - INFO - Applied FSDP to the model
[rank0]:[titan] 2025-06-12 10:02:20,377 - root - INFO - Training starts at step 1, with local batch size 2, global batch size 8, gradient accumulation steps 1, sequence length 8192, total steps 100 (warmup 10)
[rank0]:[titan] 2025-06-12 10:02:41,845 - root - INFO - {R}step:  1  {G}loss: 12.2546  {Y}grad_norm:  4.0625  {T}memory: 41.23GiB(52.12%)  {B}tps: 763  {C}tflops: 44.21  {M}mfu: 4.47%{X}
[rank0]:[titan] 2025-06-12 10:03:10,212 - root - INFO - {R}step: 10  {G}loss:  9.8812  {Y}grad_norm:  2.1875  {T}memory: 55.87GiB(70.62%)  {B}tps: 5,402  {C}tflops: 312.98  {M}mfu: 31.65%{X}
[rank0]:[titan] 2025-06-12 10:03:39,402 - root - INFO - {R}step: 20  {G}loss:  8.1234  {Y}grad_norm:  1.5000  {T}memory: 55.87GiB(70.62%)  {B}tps: 5,611  {C}tflops: 325.09  {M}mfu: 32.87%{X}
[rank0]:[titan] 2025-06-12 10:04:08,620 - root - INFO - {R}step: 30  {G}loss:  7.5512  {Y}grad_norm:  1.1250  {T}memory: 55.87GiB(70.62%)  {B}tps: 5,598  {C}tflops: 324.33  {M}mfu: 32.79%{X}
[rank0]:[titan] 2025-06-12 10:04:12,001 - root - INFO - Training completed
"""
CONFIG = """\
[job]
dump_folder = "./outputs"
description = "Llama 3 8B training"

[model]
name = "llama3"
flavor = "8B"

[optimizer]
name = "AdamW"
lr = 3e-4

[training]
local_batch_size = 2
seq_len = 8192
steps = 100
compile = false
mixed_precision_param = "bfloat16"

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 2
pipeline_parallel_degree = 1
context_parallel_degree = 1

[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
"""


def test_the_log_states_its_metric_lines_gpu_mesh_and_batch() -> None:
    log = parse_log(LOG)
    assert [s["step"] for s in log["steps"]] == [1, 10, 20, 30]
    assert log["steps"][1]["tps"] == 5402 and log["steps"][1]["memory_gib"] == 55.87
    assert log["gpu"] == "NVIDIA H100 80GB HBM3"
    assert log["mesh"] == {"dp_shard": 4, "tp": 2}
    assert (log["local_batch"], log["global_batch"], log["seq_len"]) == (2, 8, 8192)
    assert log["model"] == "llama3 8B"


def test_a_log_and_its_config_become_a_typed_run() -> None:
    row = log_to_row(LOG, CONFIG)
    reading = read_row(0, row)
    run = reading.run
    assert run is not None, reading.reasons
    assert (run.model, run.n_layers, run.n_kv_heads, run.d_ff) == ("llama3 8B", 32, 8, 14336)
    assert (run.gpu, run.gpus, run.tp, run.pp, run.cp, run.dp) == ("H100-SXM5", 8, 2, 1, 1, 4)
    assert (run.sharding, run.global_batch, run.micro_batch, run.recompute) == (
        "fsdp",
        8,
        2,
        "selective",
    )
    assert run.precision == "bf16" and run.stack == "torchtitan"
    # torchtitan's TP plan always shards norms along the sequence: its default, marked assumed
    assert run.sequence_parallel is True and "sequence_parallel" in run.assumed_fields
    # steady state: the median of the steps after the first (step 1 compiles and warms up)
    assert run.measured_quantity == MeasuredQuantity.TOKENS_PER_S_PER_GPU
    assert run.tokens_per_s_per_gpu == 5598
    assert run.measured_peak_memory_gib == pytest.approx(55.87)


def test_fp8_and_a_missing_metric_line() -> None:
    fp8 = CONFIG.replace('name = "llama3"', 'name = "llama3"\nconverters = ["float8"]')
    run = read_row(0, log_to_row(LOG, fp8)).run
    assert run is not None and run.precision == "fp8-tensorwise"
    with pytest.raises(InputError, match="no torchtitan metric line"):
        log_to_row("nothing here\n", CONFIG)
    with pytest.raises(InputError, match="not a valid TOML"):
        log_to_row(LOG, "[training\n")


def test_a_2024_config_without_a_logged_mesh_needs_the_gpu_count() -> None:
    """torchtitan of 2024 kept the degrees in [training] and Float8 in [float8]."""
    log = "\n".join(
        line
        for line in LOG.splitlines()
        if "device mesh" not in line and "Training starts" not in line
    )
    config = (
        '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nbatch_size = 1\nseq_len = 8192\n'
        "data_parallel_degree = -1\ntensor_parallel_degree = 1\n"
        '[activation_checkpoint]\nmode = "full"\n[float8]\nenable_float8_linear = true\n'
    )
    with pytest.raises(InputError, match="give --gpus"):
        log_to_row(log, config)
    row = log_to_row(log, config, gpus=8)
    assert (row["num_gpus"], row["dp"], row["global_batch_seqs"], row["micro_batch"]) == (
        "8",
        "8",
        "8",
        "1",
    )
    assert row["precision"] == "bf16 + fp8 linears" and row["activation_checkpointing"] == "full"
    with pytest.raises(InputError, match="tensor_parallel_degree = 'two'"):
        log_to_row(
            log,
            config.replace("tensor_parallel_degree = 1", 'tensor_parallel_degree = "two"'),
            gpus=8,
        )


def test_runs_import_from_torchtitan_then_validate(cli, tmp_path: Path) -> None:
    log, config, out = tmp_path / "train.log", tmp_path / "llama3_8b.toml", tmp_path / "runs.csv"
    log.write_text(LOG)
    config.write_text(CONFIG)
    r = cli("runs", "import", str(log), "--from", "torchtitan", "--config", str(config),
            "--out", str(out), "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["imported"] == 1
    v = cli("validate", "--data", str(out), "--json")
    assert v.returncode == 0, v.stderr
    assert json.loads(v.stdout)["rows_used"] == 1
    missing = cli("runs", "import", str(log), "--from", "torchtitan", "--out", str(out))
    assert missing.returncode == 2 and "--config" in missing.stderr
