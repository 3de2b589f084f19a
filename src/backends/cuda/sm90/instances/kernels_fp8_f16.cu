// The compiled FP8 instances with per-group scales (kernel/fp8_kernel.cuh, fp8-current) for f16
// layers: fprop, dgrad and a 16-bit wgrad writing f16 (an f16 layer's main_grad is f32: the f32
// instances of kernels_fp8_group_k.cu). A TU of their own, beside the bf16 ones, so the two
// compile in parallel.
#include "backends/cuda/sm90/kernel/fp8_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_FP8_GROUP_M_INSTANCE(fp8_group_m_e4m3_fast_f16, E4M3, E4M3, DType::F16, ConfigFp8Fast, Fp8PerGroupScales,
                                 "e4m3 x e4m3 -> f16 pingpong 128x128x128 cluster 1x2, fast accumulation")
MOEKIT_SM90_FP8_GROUP_M_INSTANCE(fp8_group_m_e4m3_promoted_f16, E4M3, E4M3, DType::F16, ConfigFp8, Fp8PerGroupScales,
                                 "e4m3 x e4m3 -> f16 cooperative 128x128x128 cluster 1x2, promoted accumulation")
MOEKIT_SM90_FP8_GROUP_M_INSTANCE(fp8_group_m_e5m2_promoted_f16, E5M2, E4M3, DType::F16, ConfigFp8, Fp8PerGroupScales,
                                 "e5m2 x e4m3 -> f16 cooperative 128x128x128 cluster 1x2, promoted accumulation")
MOEKIT_SM90_FP8_GROUP_K_INSTANCE(fp8_group_k_e4m3_f16, E4M3, E4M3, DType::F16, ConfigFp8, Fp8PerGroupScales,
                                 "e4m3 x e4m3 -> f16 cooperative 128x128x128 cluster 1x2, promoted accumulation")
MOEKIT_SM90_FP8_GROUP_K_INSTANCE(fp8_group_k_e5m2_f16, E5M2, E4M3, DType::F16, ConfigFp8, Fp8PerGroupScales,
                                 "e5m2 x e4m3 -> f16 cooperative 128x128x128 cluster 1x2, promoted accumulation")
}  // namespace moekit::cuda::sm90
