"""Facts that follow from what a row names, held as data with sources (data/run_reading_rules.yaml).

A named public model family and size implies its architecture and shape, a named system or GPU
part its GPUs per node and network links, a named framework its documented defaults. The importer
(`scalelab.runs.importer`) fills such a value only where the row leaves it empty, and records each
in the run's `assumed` field with the entry's basis. No rule here looks at who published a row.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

RULES_DATA = "data/run_reading_rules.yaml"

_SIZE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*([bm])\b", re.I)


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(min_length=1, description="where the entry's facts come from")
    example: str = Field(min_length=1, description="a text this entry must read (tested)")


class Architecture(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ffn: Literal["swiglu", "gelu"]
    norm: Literal["rmsnorm", "layernorm"]
    position: Literal["rope", "learned"]
    bias: bool
    tied_embeddings: bool


class FamilyShape(BaseModel):
    """Shape facts shared by every size of a family."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int | None = Field(None, gt=0)
    d_ff_per_d_model: int | None = Field(None, gt=0, description="FFN width = this x d_model")
    mha: bool = Field(False, description="multi-head attention: kv heads = heads")


class ModelSize(BaseModel):
    """One size of a family, as its paper or released config gives it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    size: str = Field(pattern=r"^\d+(\.\d+)?[BM]$")
    n_layers: int = Field(gt=0)
    d_model: int = Field(gt=0)
    n_heads: int = Field(gt=0)
    n_kv_heads: int | None = Field(None, gt=0)
    d_ff: int | None = Field(None, gt=0)
    vocab_size: int | None = Field(None, gt=0)
    tied_embeddings: bool | None = None

    @property
    def parameters(self) -> float:
        scale = 1e9 if self.size.endswith("B") else 1e6
        return float(self.size[:-1]) * scale


class ModelFamily(_Entry):
    family: str
    names: str = Field(description="regex matched on the model cell")
    moe: bool = False
    not_modelled: str | None = Field(None, description="why the predictor cannot read this family")
    architecture: Architecture | None = None
    shape: FamilyShape = FamilyShape()
    sizes: tuple[ModelSize, ...] = ()

    def size_named(self, model_name: str) -> ModelSize | None:
        """The size the name states (8B, 350m), if this family lists it."""
        for number, unit in _SIZE.findall(model_name):
            stated = float(number) * (1e9 if unit.lower() == "b" else 1e6)
            for size in self.sizes:
                if abs(size.parameters - stated) <= 1e-6 * stated:
                    return size
        return None


class SystemFacts(_Entry):
    """A named system (`system`, matched on the row's text) or a GPU part (`part`, on the GPU)."""

    system: str | None = None
    part: str | None = None
    names: str | None = Field(None, description="regex on the GPU, network and source text")
    gpu: str | None = Field(None, description="regex on the catalog GPU name (parts)")
    gpus_per_node: int = Field(gt=0)
    nvlink_domain: int | None = Field(None, gt=0)
    nics_per_node: int | None = Field(None, gt=0)
    nic_gbps: float | None = Field(None, gt=0)

    @property
    def label(self) -> str:
        return self.system or f"{self.part} part"


class StackDefaults(_Entry):
    stack: str
    names: str = Field(description="regex on the framework the row names")
    sequence_parallel_with_tp: bool | None = None
    attention: Literal["flash", "flash1", "fused", "math"] | None = None
    attention_without_flash: Literal["fused", "math"] | None = None
    fp8_scaling: Literal["tensorwise", "delayed", "blockwise"] | None = None
    sharding: Literal["ddp", "zero1", "zero2", "fsdp", "hsdp"] | None = None


class NoFlash(_Entry):
    gpus: str


class ReadingRules(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model_families: tuple[ModelFamily, ...]
    systems: tuple[SystemFacts, ...]
    stacks: tuple[StackDefaults, ...]
    no_flash_attention: NoFlash

    def family(self, model_name: str) -> ModelFamily | None:
        for fam in self.model_families:
            if re.search(fam.names, model_name, re.I):
                return fam
        return None

    def system(self, text: str, gpu: str) -> SystemFacts | None:
        """The named system in `text`, else the entry of the GPU part."""
        for sys in self.systems:
            if sys.names and re.search(sys.names, text, re.I):
                return sys
        for sys in self.systems:
            if sys.gpu and re.search(sys.gpu, gpu):
                return sys
        return None

    def stack(self, framework_text: str) -> StackDefaults | None:
        for st in self.stacks:
            if re.search(st.names, framework_text, re.I):
                return st
        return None

    def framework_named(self, texts: list[str]) -> tuple[str, int] | None:
        """The first framework any stack entry names in `texts` (in order): (the words, index)."""
        for i, text in enumerate(texts):
            for st in self.stacks:
                m = re.search(st.names, text, re.I)
                if m:
                    return _phrase(text, m), i
        return None

    def has_flash(self, gpu: str) -> bool:
        return not re.search(self.no_flash_attention.gpus, gpu)


def _phrase(text: str, m: re.Match[str]) -> str:
    """The bracketed phrase holding a match ('(Aleph Alpha Megatron-based codebase)'), else the
    match itself."""
    open_at = text.rfind("(", 0, m.start())
    close_at = text.find(")", m.end())
    if open_at != -1 and close_at != -1 and ")" not in text[open_at : m.start()]:
        return text[open_at + 1 : close_at].strip()
    return m.group(0)


@cache
def reading_rules() -> ReadingRules:
    """The shipped rules (validated once)."""
    text = resources.files("scalelab").joinpath(RULES_DATA).read_text(encoding="utf-8")
    return ReadingRules.model_validate(yaml.safe_load(text))
