// Internal: the compiled instances of the FP8 grouped GEMMs (kernel/fp8_kernel.cuh), defined in
// kernels_fp8_group_m.cu and kernels_fp8_group_k.cu and picked by device/fp8_gemm_sm90.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "backends/cuda/sm90/device/fp8_gemm_sm90.h"

namespace moekit::cuda::sm90 {

struct Fp8GroupMInstance {
  const char* name;  // "e4m3 x e4m3 -> bf16 pingpong 128x128x128 cluster 1x2 fast accumulation"
  size_t (*workspace_bytes)(const Fp8GroupMProblem& p);
  void (*run)(const Fp8GroupMProblem& p, void* workspace, cudaStream_t stream);
};
struct Fp8GroupKInstance {
  const char* name;
  size_t (*workspace_bytes)(const Fp8GroupKProblem& p);
  void (*run)(const Fp8GroupKProblem& p, void* workspace, cudaStream_t stream);
};

// group-M: fprop (e4m3 x e4m3, fast accumulation); dgrad (dy e4m3 or e5m2 x W e4m3, promoted).
extern const Fp8GroupMInstance fp8_group_m_e4m3_fast, fp8_group_m_e4m3_promoted,
    fp8_group_m_e5m2_promoted;
// group-K: dy e4m3 or e5m2 x x e4m3 into an f32 (main_grad) or a bf16 dw.
extern const Fp8GroupKInstance fp8_group_k_e4m3_f32, fp8_group_k_e4m3_bf16, fp8_group_k_e5m2_f32,
    fp8_group_k_e5m2_bf16;
// Block scales (fp8-block; kernels_fp8_block_group_{m,k}.cu): fprop, dgrad (dy e4m3 or e5m2);
// wgrad into an f32 or a bf16 dw.
extern const Fp8GroupMInstance fp8_block_group_m_fprop, fp8_block_group_m_dgrad_e4m3,
    fp8_block_group_m_dgrad_e5m2;
extern const Fp8GroupKInstance fp8_block_group_k_e4m3_f32, fp8_block_group_k_e4m3_bf16,
    fp8_block_group_k_e5m2_f32, fp8_block_group_k_e5m2_bf16;

}  // namespace moekit::cuda::sm90
