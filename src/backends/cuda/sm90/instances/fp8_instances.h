// Internal: the compiled instances of the FP8 grouped GEMMs (kernel/fp8_kernel.cuh), defined in
// instances/kernels_fp8_*.cu and picked by device/grouped_gemm_sm90.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "backends/cuda/sm90/device/fp8_gemm_sm90.h"

namespace moekit::cuda::sm90 {

struct Fp8GroupMInstance {
  const char* name;  // "e4m3 x e4m3 -> bf16 pingpong 128x128x128 cluster 1x2, fast accumulation"
  size_t (*workspace_bytes)(const Fp8GroupMProblem& p);
  void (*run)(const Fp8GroupMProblem& p, void* workspace, cudaStream_t stream);
};
struct Fp8GroupKInstance {
  const char* name;
  size_t (*workspace_bytes)(const Fp8GroupKProblem& p);
  void (*run)(const Fp8GroupKProblem& p, void* workspace, cudaStream_t stream);
};

// group-M: fprop (e4m3 x e4m3, fast accumulation; _coop256 for large groups:
// kernels_fp8_fast_coop256.cu); dgrad (dy e4m3 or e5m2 x W e4m3, promoted); bf16 out, or f16
// (_f16: kernels_fp8_f16.cu).
extern const Fp8GroupMInstance fp8_group_m_e4m3_fast, fp8_group_m_e4m3_promoted,
    fp8_group_m_e5m2_promoted, fp8_group_m_e4m3_fast_f16, fp8_group_m_e4m3_promoted_f16,
    fp8_group_m_e5m2_promoted_f16, fp8_group_m_e4m3_fast_coop256, fp8_group_m_e4m3_fast_coop256_f16;
// group-K: dy e4m3 or e5m2 x x e4m3 into an f32 (main_grad), a bf16 or an f16 dw.
extern const Fp8GroupKInstance fp8_group_k_e4m3_f32, fp8_group_k_e4m3_bf16, fp8_group_k_e5m2_f32,
    fp8_group_k_e5m2_bf16, fp8_group_k_e4m3_f16, fp8_group_k_e5m2_f16;
// Block scales (fp8-block; kernels_fp8_block_group_{m,k}.cu, kernels_fp8_block_f16.cu): fprop,
// dgrad (dy e4m3 or e5m2) into bf16 or f16; wgrad into an f32, a bf16 or an f16 dw.
extern const Fp8GroupMInstance fp8_block_group_m_fprop, fp8_block_group_m_dgrad_e4m3,
    fp8_block_group_m_dgrad_e5m2, fp8_block_group_m_fprop_f16, fp8_block_group_m_dgrad_e4m3_f16,
    fp8_block_group_m_dgrad_e5m2_f16;
extern const Fp8GroupKInstance fp8_block_group_k_e4m3_f32, fp8_block_group_k_e4m3_bf16,
    fp8_block_group_k_e5m2_f32, fp8_block_group_k_e5m2_bf16, fp8_block_group_k_e4m3_f16,
    fp8_block_group_k_e5m2_f16;

}  // namespace moekit::cuda::sm90
