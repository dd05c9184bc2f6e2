"""Which kernels are communication, and which collective they are."""

from __future__ import annotations

import pytest

from scalelab.trace.classify import (
    COMPUTE,
    collective_from_kernel,
    collective_from_label,
    is_comm_kernel,
    is_cpu_comm_op,
    kernel_class,
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


@pytest.mark.parametrize(
    ("name", "kernel_class_expected"),
    [
        # TensorRT-LLM's trtllm-gen batched GEMMs on B200 (the two largest MoE matmuls): GEMM,
        # not "other".
        (
            "bmm_E4m3_E4m3E4m3_Fp32_t128x8x128u2_s6_et64x8_m64x8x32_cga1x1x1_16dp256b_TN_"
            "transOut_schedS_sm100f",
            "GEMM",
        ),
        # A MoE finalize kernel whose template argument mentions cutlass: not GEMM.
        (
            "void tensorrt_llm::kernels::cutlass_kernels::finalizeMoeRoutingKernel<"
            "__nv_bfloat16, __nv_bfloat16, cutlass::epilogue::thread::Identity>(int const*)",
            "other",
        ),
        # FBGEMM embeddings: the namespace (fbgemm_gpu) and an argument type (FixedDivisor) are
        # no GEMM.
        (
            "void fbgemm_gpu::split_embedding_codegen_forward_unweighted_kernel<float, float, "
            "fbgemm_gpu::FixedDivisor>(at::PackedTensorAccessor64<float, 1>, "
            "fbgemm_gpu::FixedDivisor)",
            "embedding",
        ),
        (
            "void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_"
            "row_1<c10::Half, float, c10::Half, 2ul>(at::GenericPackedTensorAccessor<c10::Half>)",
            "embedding",
        ),
        # Quantisation and KV-cache writes with attention words in them: not attention.
        (
            "void vllm::scaled_fp8_quant_kernel<c10::BFloat16, c10::Float8_e4m3fn>(int)",
            "quantisation",
        ),
        (
            "void flashinfer::per_token_group_quant_8bit_kernel<__nv_bfloat16>(__nv_bfloat16*)",
            "quantisation",
        ),
        (
            "void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, "
            "(vllm::Fp8KVCacheDataType)0>(__nv_bfloat16 const*)",
            "KV cache",
        ),
        (
            "void flashinfer::AppendPagedKVCacheKernel<8, 16, __nv_bfloat16, int>(int*)",
            "KV cache",
        ),
        # Generic launchers: the operator they run names the kernel.
        (
            "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_"
            "align8>(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)",
            "GEMM",
        ),
        (
            "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<"
            "flash::CollectiveMainloopFwdSm90<2, cute::tuple<> > > > >(flash::Params)",
            "attention",
        ),
        (
            "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128> >(Flash_fwd_params)",
            "attention",
        ),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "GEMM"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >(int)",
            "element-wise",
        ),
    ],
)
def test_kernel_class_from_the_kernels_name(name: str, kernel_class_expected: str) -> None:
    assert kernel_class(name, COMPUTE) == kernel_class_expected


def test_multimem_all_reduce_in_an_anonymous_namespace_is_all_reduce() -> None:
    name = (
        "void c10d::symmetric_memory::(anonymous namespace)::multimem_all_reduce_kernel<float, 16,"
        " 8>(float*, unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long)"
    )
    assert is_comm_kernel(name)
    assert collective_from_kernel(name) == "AllReduce"
