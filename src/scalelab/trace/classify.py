"""What each trace event is: device compute, communication or memory copy; which collective.

The rules are simple string tests so that they agree with the reference definitions (and with
Holistic Trace Analysis) and stay fast on millions of events; results are cached per distinct name.
"""

from __future__ import annotations

import functools
import re
from bisect import bisect_right
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any, Final

# Kinds of device (GPU) activity. Integers so that they fit a numpy array.
COMPUTE: Final = 0
COMM: Final = 1
COPY: Final = 2  # memcpy / memset: neither compute nor communication

# Chrome-trace categories of device events, as written by Kineto since PyTorch 1.8 (upper-case ones
# are the 1.8/1.9 spellings). Kernels are classified by name; copies and sets are always COPY.
KERNEL_CATEGORIES: Final = frozenset({"kernel", "Kernel"})
COPY_CATEGORIES: Final = frozenset({"gpu_memcpy", "Memcpy", "gpu_memset", "Memset"})
# Host-side launch calls whose `correlation` arg links them to the device event they launched.
RUNTIME_CATEGORIES: Final = frozenset({"cuda_runtime", "Runtime", "cuda_driver"})
# Host operators (the CPU-trace notion of compute).
CPU_OP_CATEGORIES: Final = frozenset({"cpu_op", "Operator"})
# Device-side copies of host annotations: never the host's profiler steps.
GPU_ANNOTATION_CATEGORY: Final = "gpu_user_annotation"

PROFILER_STEP_PREFIX: Final = "ProfilerStep#"
# Host annotations that wrap a collective on the process group's side: `nccl:all_to_all`, ...
HOST_COLLECTIVE_PREFIXES: Final = ("nccl:", "rccl:")
# Collectives executed on the host (CPU traces): `gloo:all_reduce` on gloo's worker threads.
CPU_COLLECTIVE_PREFIXES: Final = ("gloo:",)
# Host operators that enqueue or wait for communication: not compute on a CPU trace.
CPU_COMM_OP_PREFIXES: Final = (
    "c10d::",
    "_c10d_functional::",
    "c10d_functional::",
    "record_param_comms",
    "nccl:",
    "gloo:",
)

COLLECTIVES: Final = (
    "AllReduce",
    "AllGather",
    "ReduceScatter",
    "AllToAll",
    "SendRecv",
    "Broadcast",
    "Reduce",
    "Gather",
    "Scatter",
    "Barrier",
    "Other",
)
OTHER: Final = "Other"
COLLECTIVE_INDEX: Final = {name: i for i, name in enumerate(COLLECTIVES)}

# Order matters: longer names first ("reducescatter" before "reduce", "allgather" before "gather").
_COLLECTIVE_KEYS: Final = (
    ("allreduce", "AllReduce"),
    ("allgather", "AllGather"),
    ("reducescatter", "ReduceScatter"),
    ("alltoall", "AllToAll"),
    ("sendrecv", "SendRecv"),
    ("broadcast", "Broadcast"),
    ("reduce", "Reduce"),
    ("gather", "Gather"),
    ("scatter", "Scatter"),
    ("barrier", "Barrier"),
    ("send", "SendRecv"),
    ("recv", "SendRecv"),
)
_NON_LETTERS: Final = re.compile(r"[^a-z]")


# Communication kernels that are not NCCL's: PyTorch symmetric memory (`c10d::symmetric_memory::
# multimem_all_reduce_kernel`, one-/two-shot all-reduce, all-gather), NVSHMEM, and the custom
# all-reduce kernels of inference and training stacks (vLLM, TensorRT-LLM, FlashInfer, DeepEP).
# Matched on the lower-cased name.
OTHER_COMM_KERNEL_MARKERS: Final = (
    "symmetric_memory",
    "multimem_",
    "nvshmem",
    "one_shot_all_reduce",
    "two_shot_all_reduce",
    "oneshotallreduce",
    "twoshotallreduce",
    "cross_device_reduce",
    "custom_all_reduce",
    "customallreduce",
    "allreduce_fusion",
    "lamport",
    "deep_ep",
)


@functools.lru_cache(maxsize=16384)
def is_comm_kernel(name: str) -> bool:
    """A communication kernel: NCCL/RCCL (RCCL keeps NCCL's kernel names: `nccl...` or
    `...ncclKernel...`), or symmetric-memory, NVSHMEM and custom all-reduce kernels."""
    if name.startswith(("nccl", "rccl")) or "ncclKernel" in name:
        return True
    lower = name.lower()
    return any(marker in lower for marker in OTHER_COMM_KERNEL_MARKERS)


@functools.lru_cache(maxsize=4096)
def collective_from_label(label: str) -> str | None:
    """The canonical collective for a PyTorch-level label.

    Accepts `Collective name` args (`allreduce`, `_allgather_base`, `all_to_all`), host annotations
    (`nccl:reduce_scatter`, `gloo:all_reduce`) and c10d op names; None when it names no collective.
    """
    text = label.lower()
    for sep in ("::", ":"):
        if sep in text:
            text = text.rsplit(sep, 1)[1]
    key = _NON_LETTERS.sub("", text)
    for prefix, collective in _COLLECTIVE_KEYS:
        if key.startswith(prefix):
            return collective
    return None


def collective_from_kernel(name: str) -> str | None:
    """The collective in an NCCL kernel name: `ncclKernel_AllReduce_RING_LL_Sum_float(...)` ->
    AllReduce; None for names without one (`ncclDevKernel_Generic`)."""
    # `(anonymous namespace)` is no parameter list: `c10d::symmetric_memory::(anonymous
    # namespace)::multimem_all_reduce_kernel<...>(...)` is PyTorch's own spelling.
    name = name.replace("(anonymous namespace)::", "")
    head = name.split("(", 1)[0].split("<", 1)[0]
    parts = head.split("_")
    if len(parts) >= 2:  # ncclKernel_AllReduce_RING_LL_Sum_float
        found = collective_from_label(parts[1])
        if found is not None:
            return found
    # Other communication kernels name the collective somewhere: multimem_all_reduce_kernel,
    # two_shot_all_reduce_kernel, cross_device_reduce_2stage, nvshmem ... alltoall ...
    key = _NON_LETTERS.sub("", head.rsplit("::", 1)[-1].lower())
    for marker, collective in _KERNEL_MARKERS:
        if marker in key:
            return collective
    return None


_KERNEL_MARKERS: Final = (
    ("reducescatter", "ReduceScatter"),
    ("allreduce", "AllReduce"),
    ("crossdevicereduce", "AllReduce"),
    ("allgather", "AllGather"),
    ("alltoall", "AllToAll"),
    ("broadcast", "Broadcast"),
    ("sendrecv", "SendRecv"),
    ("barrier", "Barrier"),
)


def is_cpu_comm_op(name: str) -> bool:
    """A host operator that enqueues or waits for a collective (c10d, functional collectives)."""
    return name.startswith(CPU_COMM_OP_PREFIXES)


# Kernel classes for the kernel breakdown, decided on the kernel's *name* (`kernel_name`): never
# on its namespaces, template arguments or parameter types, which name libraries and types, not
# what the kernel does (`fbgemm_gpu::` is no GEMM, a `cutlass::` template argument does not make a
# MoE finalize kernel one). Name markers, matched on the lower-cased name, class by class in this
# order: KV-cache writes and quantisation before attention (`reshape_and_cache_flash` writes the
# cache; it computes no attention), attention before GEMM (flash-attention names hold GEMM-like
# words), embedding before GEMM.
KERNEL_CLASSES: Final = (
    "GEMM",
    "attention",
    "embedding",
    "quantisation",
    "KV cache",
    "element-wise",
    "communication",
    "memory",
    "other",
)
_CLASS_MARKERS: Final = (
    (
        "KV cache",
        # vLLM reshape_and_cache(_flash), concat_and_cache_mla; FlashInfer AppendPagedKVCache;
        # TensorRT-LLM's KV-cache update kernels; copy_blocks / swap_blocks (block tables).
        ("kv_cache", "kvcache", "reshape_and_cache", "concat_and_cache", "copy_blocks"),
    ),
    (
        "quantisation",
        # quantize / dequant / scaled_fp8_quant / per_token_group_quant / cvt_fp16_to_fp4 ...
        ("quant", "cvt_fp", "fp4_cast", "fp8_cast", "cast_to_fp8"),
    ),
    (
        "attention",
        ("flash", "fmha", "attention", "attn", "sdpa", "mha_", "_mha", "paged_kv", "cudnn_mha"),
    ),
    (
        "embedding",
        # FBGEMM's table-batched embeddings (split_embedding_codegen_*, batched_embedding_*),
        # PyTorch's embedding / embedding_bag kernels.
        ("embedding", "embeddingbag", "embedding_bag"),
    ),
    (
        "GEMM",
        (
            "gemm",
            "xmma",
            "cutlass",
            "matmul",
            "nvjet",
            "cublas",
            "gemv",
            "cijk_",
            "wgmma",
            "hgemm",
            "sgemm",
            "dot_kernel",
            "splitkreduce",
            "gemvx::kernel",  # cuBLAS's GEMV (a generic `kernel<int, ...>` launcher)
            "epilogue::impl::globalkernel",  # cuBLASLt's GEMM epilogue (bias, split-K)
            "bmm",  # batched GEMM: TensorRT-LLM's trtllm-gen `bmm_E4m3...` MoE matmuls
            "groupedgemm",
            "grouped_mm",
        ),
    ),
    ("memory", ("memcpy", "memset", "copy_kernel", "copykernel", "cat_array", "fill_kernel")),
    (
        "element-wise",
        (
            "elementwise",
            "element_wise",
            "vectorized",
            "pointwise",
            "triton_poi",
            "multi_tensor_apply",
            "unrolled",
            "activation",
            "gelu",
            "silu",
            "relu",
        ),
    ),
)


# The markers in the order they are tried: class by class, as listed (one loop, no generator).
_MARKERS_IN_ORDER: Final = tuple((m, cls) for cls, markers in _CLASS_MARKERS for m in markers)

# Generic launchers whose own name says nothing: the kernel is their first template argument
# (`cutlass::Kernel2<cutlass_80_tensorop_s16816gemm_...>`, `cutlass::device_kernel<flash::
# enable_sm90_or_later<flash::FlashAttnFwdSm90<...>>>`); where that is a plain type (`int`), the
# launcher's qualified name stands (`internal::gemvx::kernel`: cuBLAS's GEMV).
_LAUNCHERS: Final = frozenset(
    {"kernel", "kernel2", "device_kernel", "kernelimpl", "generic_kernel", "globalkernel"}
)
_PLAIN_TYPES: Final = frozenset(
    {"int", "long", "short", "char", "bool", "float", "double", "half", "unsigned", "signed"}
)


@functools.lru_cache(maxsize=8192)
def kernel_name(signature: str) -> str:
    """A kernel's own name from its demangled signature: without return type, namespaces,
    template arguments and parameter list (`void fbgemm_gpu::split_embedding_codegen_forward_
    kernel<...>(...)` -> `split_embedding_codegen_forward_kernel`); for a generic launcher, the
    name of the operator it launches (its first template argument, likewise)."""
    text = signature.replace("(anonymous namespace)::", "").replace("(anonymous namespace)", "")
    text = text.strip()
    if text.endswith(")"):  # the parameter list
        text = text[: _opening(text, "(", ")")].rstrip()
    template = ""
    if text.endswith(">"):  # the template arguments
        start = _opening(text, "<", ">")
        template, text = text[start + 1 : -1], text[:start].rstrip()
    qualified = text.rsplit(" ", 1)[-1] if text else text  # after any return type
    base = qualified.rsplit("::", 1)[-1]
    lower = base.lower()
    if lower in _LAUNCHERS or lower.startswith("enable_sm"):
        inner = kernel_name(_first_argument(template)) if template else ""
        plain = inner.lower().removeprefix("unsigned ").strip() in _PLAIN_TYPES
        if inner and not plain and not inner[:1].isdigit():
            return inner
        return qualified
    return base


def _opening(text: str, open_ch: str, close_ch: str) -> int:
    """Where the bracket that closes `text` (its last character) opens; 0 if unbalanced."""
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        ch = text[i]
        if ch == close_ch:
            depth += 1
        elif ch == open_ch:
            depth -= 1
            if depth == 0:
                return i
    return 0


def _first_argument(template: str) -> str:
    depth = 0
    for i, ch in enumerate(template):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            return template[:i].strip()
    return template.strip()


def kernel_class(name: str, kind: int) -> str:
    """The class of a device event: communication and copies by kind, kernels by their name
    (`kernel_name`, not their signature)."""
    if kind == COMM:
        return "communication"
    if kind == COPY:
        return "memory"
    lower = kernel_name(name).lower()
    for marker, cls in _MARKERS_IN_ORDER:
        if marker in lower:
            return cls
    return "other"


HostSpans = dict[Any, list[tuple[float, float, int]]]


def host_collective_spans(
    host_colls: Sequence[tuple[Any, Any, Any, str]], number: Callable[[Any], float]
) -> HostSpans:
    """Per host thread, the sorted (start, end, COLLECTIVE_INDEX) of the annotations that name a
    collective; `number` turns a trace's ts or dur into a float (or refuses it)."""
    by_tid: HostSpans = {}
    for tid, ts, dur, name in host_colls:
        found = collective_from_label(name)
        if found is not None:
            start = number(ts)
            by_tid.setdefault(tid, []).append(
                (start, start + (number(dur) or 0.0), COLLECTIVE_INDEX[found])
            )
    for spans in by_tid.values():
        spans.sort()
    return by_tid


def collective_codes(
    names: Sequence[str],
    labels: Sequence[str | None],
    launch_ts: Sequence[float],
    launch_tids: Sequence[Any],
    host_spans: HostSpans,
) -> list[int]:
    """The collective (index into COLLECTIVES) of each communication kernel, from the best
    evidence the trace has.

    1. the kernel's own `Collective name` arg (recent PyTorch);
    2. the host annotation (`nccl:all_to_all`, ...) that encloses its launch call (`launch_ts`, NaN
       when none) on the same thread: the only way to tell an all-to-all, which NCCL runs as
       SendRecv kernels;
    3. the collective in the kernel name (`ncclKernel_AllReduce_...`);
    4. Other.
    """
    result = [COLLECTIVE_INDEX[OTHER]] * len(names)
    unresolved: list[int] = []
    for i, label in enumerate(labels):
        found = collective_from_label(label) if label is not None else None
        if found is None:
            unresolved.append(i)
        else:
            result[i] = COLLECTIVE_INDEX[found]
    if unresolved and host_spans:
        still: list[int] = []
        for i in unresolved:
            spans = host_spans.get(launch_tids[i])
            t = launch_ts[i]
            if spans is not None and t == t:  # NaN: no launch call, inside no span
                k = bisect_right(spans, t, key=itemgetter(0)) - 1
                if k >= 0 and t <= spans[k][1]:
                    result[i] = spans[k][2]
                    continue
            still.append(i)
        unresolved = still
    by_name: dict[str, int] = {}
    for i in unresolved:
        name = names[i]
        code = by_name.get(name)
        if code is None:
            code = COLLECTIVE_INDEX[collective_from_kernel(name) or OTHER]
            by_name[name] = code
        result[i] = code
    return result
