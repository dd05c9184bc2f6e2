"""The catalog lists a peak only for a precision the GPU has tensor cores for (issue 36 item 3), and
`scalelab hardware --sources` shows where every entry's numbers come from."""

from __future__ import annotations

import json

import pytest

from scalelab.cli import main
from scalelab.config.catalog import gpu_names, load_cluster, load_gpu

# gpu: the precisions of the training set (fp16, bf16, fp8) its datasheet gives a tensor-core rate
# for. Volta (V100) has fp16 only; Ampere (A100) adds bf16 and TF32 but no fp8 (fp8 arrived with
# Hopper and CDNA 3): NVIDIA V100 and A100 datasheets, the Hopper architecture whitepaper.
HAS_UNITS = {
    "V100-SXM2": {"fp16"},
    "A100-SXM4-40GB": {"fp16", "bf16"},
    "A100-SXM4-80GB": {"fp16", "bf16"},
    "H100-SXM5": {"fp16", "bf16", "fp8"},
    "MI300X": {"fp16", "bf16", "fp8"},
}


@pytest.mark.parametrize("name", list(HAS_UNITS))
def test_a_peak_only_where_the_gpu_has_units(name: str) -> None:
    listed = set(load_gpu(name).peak_tflops) & {"fp16", "bf16", "fp8"}
    assert listed == HAS_UNITS[name]


def test_a_precision_without_units_is_priced_at_the_16_bit_rate() -> None:
    v100, a100 = load_gpu("V100-SXM2"), load_gpu("A100-SXM4-80GB")
    assert v100.peak_flops("bf16") == v100.peak_flops("fp8") == 125e12
    assert a100.peak_flops("fp8") == a100.peak_flops("bf16") == 312e12


def test_the_table_shows_no_fp8_peak_for_a100(capsys: pytest.CaptureFixture[str]) -> None:
    main(["hardware"])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "A100-SXM4-80GB" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[1:4] == ["312", "312", "-"]  # fp16, bf16, fp8


def test_sources_names_every_gpu_and_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    main(["hardware", "--sources"])
    out = " ".join(capsys.readouterr().out.split())
    assert "datasheet" in out and "TF/s" not in out
    for name in gpu_names():
        assert name in out
    assert load_cluster("a100-ib").params.source.split()[0] in out


def test_json_carries_the_sources(capsys: pytest.CaptureFixture[str]) -> None:
    main(["hardware", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert all(g["source"] for g in doc["gpus"])
    assert "fp8" not in next(g for g in doc["gpus"] if g["name"] == "A100-SXM4-80GB")["peak_tflops"]
