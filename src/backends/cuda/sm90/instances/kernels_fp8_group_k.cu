// The compiled FP8 group-K instances (kernel/fp8_kernel.cuh), the weight gradient: promoted
// accumulation (TE's split accumulator), an f32 (main_grad) or bf16 dw.
#include "backends/cuda/sm90/kernel/fp8_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_FP8_GROUP_K_INSTANCE(fp8_group_k_e4m3_f32, E4M3, E4M3, DType::F32, ConfigFp8, Fp8PerGroupScales,
                                 "e4m3 x e4m3 -> f32 cooperative 128x128x128 cluster 1x2, promoted accumulation")
MOEKIT_SM90_FP8_GROUP_K_INSTANCE(fp8_group_k_e4m3_bf16, E4M3, E4M3, DType::BF16, ConfigFp8, Fp8PerGroupScales,
                                 "e4m3 x e4m3 -> bf16 cooperative 128x128x128 cluster 1x2, promoted accumulation")
MOEKIT_SM90_FP8_GROUP_K_INSTANCE(fp8_group_k_e5m2_f32, E5M2, E4M3, DType::F32, ConfigFp8, Fp8PerGroupScales,
                                 "e5m2 x e4m3 -> f32 cooperative 128x128x128 cluster 1x2, promoted accumulation")
MOEKIT_SM90_FP8_GROUP_K_INSTANCE(fp8_group_k_e5m2_bf16, E5M2, E4M3, DType::BF16, ConfigFp8, Fp8PerGroupScales,
                                 "e5m2 x e4m3 -> bf16 cooperative 128x128x128 cluster 1x2, promoted accumulation")
}  // namespace moekit::cuda::sm90
