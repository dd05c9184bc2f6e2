"""Which kernels are communication, and which collective they are."""

from __future__ import annotations

import pytest

from scalelab.trace.classify import (
    collective_from_kernel,
    collective_from_label,
    is_comm_kernel,
    is_cpu_comm_op,
)


@pytest.mark.parametrize(
    ("name", "is_comm"),
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", True),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", True),
        ("void ncclKernel_SendRecv(...)", True),  # the reference rule: contains ncclKernel
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", False),
        ("void at::native::vectorized_elementwise_kernel<4>", False),
        ("Memcpy DtoD (Device -> Device)", False),
    ],
)
def test_communication_kernels(name: str, is_comm: bool) -> None:
    assert is_comm_kernel(name) is is_comm


@pytest.mark.parametrize(
    ("name", "collective"),
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "AllReduce"),
        ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long)", "Broadcast"),
        (
            "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "ReduceScatter",
        ),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "AllGather"),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", "SendRecv"),
        ("ncclKernel_Reduce_RING_LL_Sum_float(ncclWorkElem)", "Reduce"),
        ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", None),
    ],
)
def test_collective_from_kernel_name(name: str, collective: str | None) -> None:
    assert collective_from_kernel(name) == collective


@pytest.mark.parametrize(
    ("label", "collective"),
    [
        ("allreduce", "AllReduce"),
        ("_allgather_base", "AllGather"),
        ("all_gather_into_tensor_coalesced", "AllGather"),
        ("_reduce_scatter_base", "ReduceScatter"),
        ("nccl:all_to_all", "AllToAll"),
        ("alltoall_base", "AllToAll"),
        ("nccl:broadcast", "Broadcast"),
        ("gloo:all_reduce", "AllReduce"),
        ("gloo:barrier", "Barrier"),
        ("send", "SendRecv"),
        ("recv", "SendRecv"),
        ("c10d::reduce_", "Reduce"),
        ("_c10d_functional::wait_tensor", None),
    ],
)
def test_collective_from_label(label: str, collective: str | None) -> None:
    assert collective_from_label(label) == collective


def test_host_communication_ops() -> None:
    assert is_cpu_comm_op("c10d::allreduce_")
    assert is_cpu_comm_op("_c10d_functional::wait_tensor")
    assert not is_cpu_comm_op("aten::mm")


@pytest.mark.parametrize(
    ("name", "collective"),
    [
        (
            "void c10d::symmetric_memory::multimem_all_reduce_kernel<float, 16, 8>(float*, "
            "unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long)",
            "AllReduce",
        ),
        ("void c10d::symmetric_memory::two_shot_all_reduce_kernel<bf16, 8>(...)", "AllReduce"),
        ("void c10d::symmetric_memory::multimem_all_gather_kernel<8>(...)", "AllGather"),
        ("void vllm::cross_device_reduce_2stage<__nv_bfloat16, 8>(...)", "AllReduce"),
        ("void nvshmemi_alltoall_kernel(...)", "AllToAll"),
        ("void tensorrt_llm::kernels::oneShotAllReduceKernel<half, 8>(...)", "AllReduce"),
    ],
)
def test_non_nccl_communication_kernels(name: str, collective: str) -> None:
    """Symmetric-memory, NVSHMEM and custom all-reduce kernels are communication, not compute."""
    assert is_comm_kernel(name)
    assert collective_from_kernel(name) == collective


def test_gemm_and_elementwise_kernels_stay_compute() -> None:
    for name in (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n",
        "void at::native::reduce_kernel<512, 1>(...)",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel(...)",
    ):
        assert not is_comm_kernel(name)
